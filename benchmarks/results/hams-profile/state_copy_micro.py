"""Microseconds per call of the state copy's steps for one 64-row delta of the stocks graph's
LSTM (1,024 slots of h, c: 32 floats): the primary's capture, the message, the backup's
install; then a cProfile of capture + install. ``python
benchmarks/results/hams-profile/state_copy_micro.py`` from the project root."""
import sys, timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from parityserve.models._stream_lstm import StreamLSTM
from parityserve.runtime.graphs.hams_state import FlatDelta, FlatState
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.workers import wire
from parityserve.runtime.graphs.hams_worker import _received, _state_link
m = StreamLSTM(input_size=4, hidden=32, outputs=4)
state = m.initialize()
names = tuple(state)
print({k: (tuple(v.shape), v.dtype) for k, v in state.items()})
rows = sorted(np.random.default_rng(0).choice(1024, 64, replace=False).tolist())
def cap(): return FlatDelta.capture(5, 4, state, rows, names)
d = cap()
def enc(): 
    h, f = hm.State(d.seq, list(d.layout), (), tuple(d.frames()), False, d.base).to_wire()
    return wire.encode(h, f)
frames = enc()
import zmq
zf = [zmq.Frame(bytes(f)) for f in frames]
def dec(): return _state_link(zf, "x")
st = dec()
def rec(): return _received(st)
r = rec()[0]
def inst(): r.install(state)
def receipt():
    return wire.encode(*hm.Applied(5).to_wire())
rz = [zmq.Frame(bytes(f)) for f in receipt()]
def parse_receipt(): return _state_link(rz, "x")
for name, f in [("capture", cap), ("encode", enc), ("decode", dec), ("received", rec), ("install", inst), ("receipt enc", receipt), ("receipt parse", parse_receipt)]:
    n = 2000; t = timeit.timeit(f, number=n) / n
    print(f"{name:15s} {t*1e6:8.1f} us")
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(3000): cap(); inst()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
