"""Microseconds per call of the state copy's steps for one 64-row delta of the stocks graph's
LSTM (1,024 slots of h, c: 32 floats): the primary's capture, the message, the backup's
install; then a cProfile of capture + install. ``python
benchmarks/results/hams-profile/state_copy_micro.py`` from the project root."""

from __future__ import annotations

import cProfile
import pstats
import sys
import timeit
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from parityserve.models._stream_lstm import StreamLSTM  # noqa: E402
from parityserve.runtime.graphs import hams_messages as hm  # noqa: E402
from parityserve.runtime.graphs.hams_state import FlatDelta  # noqa: E402
from parityserve.runtime.graphs.hams_worker import _received, _state_link  # noqa: E402
from parityserve.runtime.workers import wire  # noqa: E402


def main() -> None:
    state = StreamLSTM(input_size=4, hidden=32, outputs=4).initialize()
    names = tuple(state)
    rows = sorted(np.random.default_rng(0).choice(1024, 64, replace=False).tolist())
    delta = FlatDelta.capture(5, 4, state, rows, names)
    header, frames = hm.State(delta.seq, list(delta.layout), (), tuple(delta.frames()), False,
                              delta.base).to_wire()
    received_frames = [zmq.Frame(bytes(f)) for f in wire.encode(header, frames)]
    message = _state_link(received_frames, "peer")
    assert isinstance(message, hm.State)
    installed = _received(message)[0]
    receipt = [zmq.Frame(bytes(f)) for f in wire.encode(*hm.Applied(5).to_wire())]
    steps = {
        "capture": lambda: FlatDelta.capture(5, 4, state, rows, names),
        "encode": lambda: wire.encode(*hm.State(delta.seq, list(delta.layout), (),
                                                tuple(delta.frames()), False,
                                                delta.base).to_wire()),
        "decode": lambda: _state_link(received_frames, "peer"),
        "received": lambda: _received(message),
        "install": lambda: installed.install(state),
        "receipt encode": lambda: wire.encode(*hm.Applied(5).to_wire()),
        "receipt parse": lambda: _state_link(receipt, "peer"),
    }
    for name, step in steps.items():
        print(f"{name:15s} {1e6 * timeit.timeit(step, number=2000) / 2000:8.1f} us")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3000):
        steps["capture"]()
        steps["install"]()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
