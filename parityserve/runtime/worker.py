"""The model-container process: load a model, then serve batches over a ZeroMQ DEALER socket.

One loop, one socket, no threads: heartbeats are sent from the same loop that runs ``predict``,
so a worker that hangs inside a batch also stops heartbeating, which is exactly what the
supervisor watches for. The heartbeat timeout must therefore exceed the longest batch.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zmq

from parityserve.core.faults import FaultPlan, FaultSpec
from parityserve.runtime import wire

__all__ = ["WorkerSpec", "main", "run_worker"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to start; travels as JSON on the command line."""

    replica_id: str
    model: str
    version: int
    source: str
    weights: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    base_dir: str | None = None
    data_dir: str | None = None
    threads: int = 1
    faults: dict[str, Any] = field(default_factory=dict)
    heartbeat_interval_s: float = 0.2

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**orjson.loads(text))


class _Worker:
    def __init__(self, spec: WorkerSpec, model: Any, sock: zmq.Socket) -> None:
        self.spec = spec
        self.model = model
        self.sock = sock
        self.served = 0
        self.plan = self._make_plan(spec.faults)
        self.last_beat = 0.0
        self.running = True

    def _make_plan(self, faults: dict[str, Any]) -> FaultPlan | None:
        if not faults:
            return None
        spec = FaultSpec.from_mapping(faults)
        seed = spec.seed if spec.seed is not None else os.getpid()
        return FaultPlan(spec, np.random.default_rng(seed), time.monotonic())

    def send(self, header: dict[str, Any], buffers: list[Any] | None = None) -> None:
        self.sock.send_multipart(wire.encode(header, buffers), copy=False)

    def hello(self) -> None:
        spec = self.model
        self.send(
            {
                "t": wire.HELLO,
                "replica": self.spec.replica_id,
                "model": self.spec.model,
                "version": self.spec.version,
                "pid": os.getpid(),
                "platform": spec.platform,
                "input": _spec_dict(spec.input_spec),
                "output": _spec_dict(spec.output_spec),
            }
        )

    def beat(self) -> None:
        self.last_beat = time.monotonic()
        self.send({"t": wire.HEARTBEAT, "served": self.served})

    def loop(self) -> None:
        interval_ms = int(self.spec.heartbeat_interval_s * 1000)
        while self.running:
            if self.sock.poll(interval_ms):
                self.handle(self.sock.recv_multipart(copy=False))
            if time.monotonic() - self.last_beat >= self.spec.heartbeat_interval_s:
                self.beat()

    def handle(self, frames: list[Any]) -> None:
        header, buffers = wire.decode(frames)
        kind = header["t"]
        if kind == wire.PREDICT:
            self.predict(header, buffers)
        elif kind == wire.FAULT:
            self.plan = self._make_plan(header.get("spec") or {})
        elif kind == wire.STOP:
            self.running = False

    def predict(self, header: dict[str, Any], buffers: list[Any]) -> None:
        action = self.plan.next_batch(time.monotonic()) if self.plan else None
        if action is not None and action.crash:
            os._exit(70)  # an injected crash: die mid-batch without answering
        if action is not None and action.hang:
            _hang_forever()
        started = time.perf_counter()
        reply = self.run_batch(header, buffers)
        if action is not None and action.delay_s > 0:
            time.sleep(action.delay_s)
        reply[0]["ms"] = (time.perf_counter() - started) * 1000
        self.served += 1
        self.send(*reply)

    def run_batch(
        self, header: dict[str, Any], buffers: list[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        base = {"t": wire.RESULT, "bid": header["bid"]}
        try:
            batch = wire.unpack_payload(header["in"], buffers)
            outputs = self.model.predict(batch)
        except Exception as exc:  # a user model may raise anything; report it, keep serving
            return {**base, "ok": False, "error": f"{type(exc).__name__}: {exc}"}, []
        corrupted = 0
        if self.plan is not None and isinstance(outputs, np.ndarray):
            outputs, mask = self.plan.corrupt(outputs)
            corrupted = int(mask.sum())
        desc, frames = wire.pack_payload(outputs)
        return {**base, "ok": True, "out": desc, "corrupted": corrupted}, frames


def _spec_dict(spec: Any) -> dict[str, Any] | None:
    return (
        None
        if spec is None
        else {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
    )


def _hang_forever() -> None:
    while True:  # an injected hang: stop answering and stop heartbeating
        time.sleep(3600)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the launching frontend dies, so no worker is orphaned."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_worker(spec: WorkerSpec, connect: str) -> int:
    """Load the model, connect, say hello, and serve until told to stop."""
    from parityserve.models.loader import load_model

    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    model = load_model(
        spec.source,
        weights=spec.weights,
        options=spec.options,
        threads=spec.threads,
        base_dir=Path(spec.base_dir) if spec.base_dir else None,
        data_dir=Path(spec.data_dir) if spec.data_dir else None,
    )
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, spec.replica_id.encode())
    sock.setsockopt(zmq.LINGER, 500)
    sock.connect(connect)
    worker = _Worker(spec, model, sock)
    worker.hello()
    worker.beat()
    try:
        worker.loop()
        worker.send({"t": wire.BYE})
    finally:
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parityserve-worker", description=__doc__)
    parser.add_argument("--connect", required=True, help="frontend RPC address, tcp://HOST:PORT")
    parser.add_argument("--spec", required=True, help="WorkerSpec as JSON")
    parser.add_argument("--die-with-parent", action="store_true")
    args = parser.parse_args(argv)
    if args.die_with_parent:
        _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return run_worker(WorkerSpec.from_json(args.spec), args.connect)


if __name__ == "__main__":
    sys.exit(main())
