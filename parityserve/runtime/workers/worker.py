"""The model-container process: load a model, then serve batches over a ZeroMQ DEALER socket.

One loop, one socket, no threads: heartbeats are sent from the same loop that runs ``predict``,
so a worker that hangs inside a batch also stops heartbeating, which is exactly what the
supervisor watches for. The heartbeat timeout must therefore exceed the longest batch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zmq

from parityserve.core.emulation import ServiceProfile, draw_service_s
from parityserve.core.faults import FaultPlan, FaultSpec
from parityserve.errors import ModelLoadError, PredictError, WorkerError
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.handshake import JOIN_TIMEOUT_S, await_handshake, watch_handshake
from parityserve.runtime.workers.keys import ENV_VAR, ClientKeys
from parityserve.runtime.workers.niceness import take_niceness

__all__ = ["EXIT_LOAD_FAILED", "WorkerSpec", "apply_threads", "keys_from_env", "main",
           "run_worker"]

EXIT_LOAD_FAILED = 3  # exit status of a launched worker whose model did not load
EXIT_LAUNCHER_DIED = 4  # the process that launched this worker died under it


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
    # An emulated accelerator (config.EmulationConfig): the profile's fields and a seed.
    emulation: dict[str, Any] = field(default_factory=dict)

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
        self.last_rows = 1  # queries in the batch being served
        self.plans_made = 0
        self.plan = self._make_plan(spec.faults)
        self.last_beat = 0.0
        self.running = True
        self.refused: str | None = None
        self.threads = spec.threads  # what batches run with now; every heartbeat reports it
        self.emulator = _Emulator.from_spec(spec)

    def _make_plan(self, faults: dict[str, Any]) -> FaultPlan | None:
        if not faults:
            return None
        spec = FaultSpec.from_mapping(faults)
        seed = spec.seed if spec.seed is not None else os.getpid()
        # Each plan this worker makes gets its own stream: seeded by the seed alone, every
        # re-set of a fault (a testbed switches one on and off hundreds of times) replayed
        # the very same draws, so the k-th batch of every window got the same delay.
        self.plans_made += 1
        rng = np.random.default_rng([seed, self.plans_made])
        return FaultPlan(spec, rng, time.monotonic())

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
        self.send({"t": wire.HEARTBEAT, "served": self.served, "threads": self.threads})

    def sleep_beating(self, seconds: float) -> None:
        """An injected delay models a slow replica, not a dead one: keep heartbeating."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, self.spec.heartbeat_interval_s))
            if time.monotonic() - self.last_beat >= self.spec.heartbeat_interval_s:
                self.beat()

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
        elif kind == wire.THREADS:
            self.set_threads(header.get("n"))
        elif kind == wire.STOP:
            self.running = False
            self.refused = header.get("error")  # set when the frontend turned us away

    def set_threads(self, n: Any) -> None:
        """Between batches (this loop runs one thing at a time), then acknowledge at once with
        a heartbeat, so the frontend sees the change without waiting for the next beat."""
        if type(n) is int and n >= 1:
            self.threads = apply_threads(n)
        self.beat()

    def predict(self, header: dict[str, Any], buffers: list[Any]) -> None:
        action = self.plan.next_batch(time.monotonic()) if self.plan else None
        if action is not None and action.crash:
            os._exit(70)  # an injected crash: die mid-batch without answering
        if action is not None and action.hang:
            _hang_forever()
        started = time.perf_counter()
        reply = self.run_batch(header, buffers)
        if self.emulator is not None:  # hold the batch as an accelerator would, off the CPU
            self.sleep_beating(self.emulator.hold_s(self.last_rows, started))
        if action is not None and action.delay_s > 0:
            self.sleep_beating(action.delay_s)
        reply[0]["ms"] = (time.perf_counter() - started) * 1000
        self.served += 1
        try:
            frames = wire.encode(*reply)
        except Exception as exc:  # outputs msgpack cannot carry (any error): report, keep serving
            self.send({"t": wire.RESULT, "bid": header["bid"], "ok": False,
                       "error": f"model outputs cannot be sent: {type(exc).__name__}: {exc}"})
            return
        self.sock.send_multipart(frames, copy=False)

    def run_batch(
        self, header: dict[str, Any], buffers: list[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        base = {"t": wire.RESULT, "bid": header["bid"]}
        try:
            batch = wire.unpack_payload(header["in"], buffers)
            self.last_rows = len(batch) if hasattr(batch, "__len__") else 1
            outputs = self.model.predict(batch)
        except Exception as exc:  # a user model may raise anything; report it, keep serving
            return {**base, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                    "bad_input": _blames_input(exc)}, []
        corrupted = 0
        if self.plan is not None:
            outputs, corrupted = _corrupt(self.plan, outputs)
        desc, frames = wire.pack_payload(outputs)
        return {**base, "ok": True, "out": desc, "corrupted": corrupted}, frames


def _blames_input(exc: BaseException) -> bool:
    """Did the model raise because of its input? A ValueError or TypeError (numpy's shape and
    dtype errors among them), maybe wrapped by the model loader: the frontend answers a row
    that raises one alone with a 400, not a server error (the graph workers' rule too)."""
    if isinstance(exc, PredictError) and exc.__cause__ is not None:
        exc = exc.__cause__  # LoadedModel's wrapping of what the model raised
    return isinstance(exc, ValueError | TypeError)


def apply_threads(n: int) -> int:
    """Run later batches with ``n`` intra-op threads; returns the count now in effect.

    torch (when a model loaded it) and threadpoolctl's BLAS pools change live. Other backends
    (an ONNX session fixes its threads when created, a plain Python model has none) cannot:
    the count is recorded, so the frontend still knows what was asked."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
        return int(torch.get_num_threads())
    threadpoolctl = sys.modules.get("threadpoolctl")
    if threadpoolctl is not None:
        threadpoolctl.threadpool_limits(limits=n)
    return n


class _Emulator:
    """Service times of an emulated accelerator, drawn per batch (core.emulation)."""

    def __init__(self, profile: ServiceProfile, rng: np.random.Generator) -> None:
        self.profile, self.rng = profile, rng
        self.overruns = 0

    @classmethod
    def from_spec(cls, spec: WorkerSpec) -> _Emulator | None:
        if not spec.emulation:
            return None
        fields = dict(spec.emulation)
        seed = fields.pop("seed", None)
        # Each replica slot gets its own stream; the part after '#' changes on every restart.
        slot = zlib.crc32(spec.replica_id.split("#")[0].encode())
        rng = np.random.default_rng([seed if seed is not None else os.getpid(), slot])
        return cls(ServiceProfile(**fields), rng)

    def hold_s(self, rows: int, started: float) -> float:
        """How much longer to hold a batch of ``rows`` queries that began at ``started``."""
        service = draw_service_s(self.profile, rows, self.rng)
        left = service - (time.perf_counter() - started)
        if left < 0:  # the real compute took longer than the emulated device would
            self.overruns += 1
            if self.overruns == 1 or self.overruns % 100 == 0:
                print(f"emulation: {self.overruns} batch(es) computed for longer than the drawn "
                      f"service time ({service * 1000:.2f} ms); those took the real time",
                      file=sys.stderr, flush=True)
        return max(0.0, left)


def _corrupt(plan: FaultPlan, outputs: Any) -> tuple[Any, int]:
    """Inject the plan's wrong answers where the outputs are numeric rows; anything else (text
    labels, ragged or object outputs) is served uncorrupted rather than failing the batch."""
    rows = outputs
    if isinstance(outputs, list) and plan.spec.wrong_probability > 0:
        with contextlib.suppress(TypeError, ValueError):  # a model without a signature
            rows = np.asarray(outputs)
    if not isinstance(rows, np.ndarray) or rows.ndim == 0 or not (
            np.issubdtype(rows.dtype, np.number) or rows.dtype == np.bool_):
        return outputs, 0
    corrupted, mask = plan.corrupt(rows)
    return corrupted, int(mask.sum())


def _spec_dict(spec: Any) -> dict[str, Any] | None:
    return (
        None
        if spec is None
        else {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
    )


def _hang_forever() -> None:
    while True:  # an injected hang: stop answering and stop heartbeating
        time.sleep(3600)


def _die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGTERM us when the launching frontend dies, so no worker is orphaned."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(0)  # the frontend died before the request above took effect


_launcher_pid: int | None = None  # with --die-with-parent: the process that launched us
_never_bye = False  # --no-bye: every SIGTERM means this replica was lost


def _exit_on_signal(_signum: int, _frame: Any) -> None:
    if _never_bye or _launcher_pid is not None and os.getppid() != _launcher_pid:
        # Our launcher died (the SIGTERM asked for in _die_with_parent): no BYE. A frontend
        # forgets a replica that says BYE, but this one was lost (a Ray actor or its node
        # died), so the frontend must see it fail and start a replacement.
        os._exit(EXIT_LAUNCHER_DIED)
    sys.exit(0)  # unwinds through run_worker, which says BYE on the way out


def _load(spec: WorkerSpec) -> Any:
    """The model, or ModelLoadError naming the model and what went wrong."""
    from parityserve.models.loader import load_model

    try:
        return load_model(
            spec.source,
            weights=spec.weights,
            options=spec.options,
            threads=spec.threads,
            base_dir=Path(spec.base_dir) if spec.base_dir else None,
            data_dir=Path(spec.data_dir) if spec.data_dir else None,
        )
    except ModelLoadError as exc:
        raise ModelLoadError(f"model {spec.model!r} ({spec.source}) failed to load: {exc}") from exc
    except Exception as exc:  # user code (a class's setup, unpickling) may raise anything
        traceback.print_exc()
        raise ModelLoadError(
            f"model {spec.model!r} ({spec.source}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc


def _socket(spec: WorkerSpec, connect: str, keys: ClientKeys | None,
            join_timeout_s: float | None = None) -> zmq.Socket[bytes]:
    """A DEALER to the frontend; with keys, a CURVE client that also checks the server's key.

    With ``join_timeout_s``, returns only once the handshake has succeeded (see handshake).
    """
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, spec.replica_id.encode())
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret
    monitor = watch_handshake(sock) if join_timeout_s is not None else None
    sock.connect(connect)
    if monitor is not None and join_timeout_s is not None:
        try:
            await_handshake(sock, monitor, connect, curve=keys is not None,
                            timeout_s=join_timeout_s)
        except WorkerError:
            sock.close(linger=0)
            raise
    return sock


def keys_from_env() -> ClientKeys | None:
    """The keys a launcher handed over, removed from the environment so that nothing this
    worker starts (a user model may run subprocesses) inherits them."""
    text = os.environ.pop(ENV_VAR, None)
    return ClientKeys.from_env(text) if text else None


def run_worker(spec: WorkerSpec, connect: str, keys: ClientKeys | None = None,
               join_timeout_s: float = JOIN_TIMEOUT_S) -> int:
    """Load the model, connect, say hello, and serve until told to stop.

    Raises ModelLoadError (before connecting) when the model cannot be loaded, and
    WorkerError when the frontend refuses the connection or none answers in
    ``join_timeout_s``.
    """
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    model = _load(spec)
    sock = _socket(spec, connect, keys, join_timeout_s)
    sock.setsockopt(zmq.LINGER, 500)
    worker = _Worker(spec, model, sock)
    worker.hello()
    worker.beat()
    try:
        worker.loop()
    finally:  # also on SIGTERM or Ctrl-C: the frontend forgets us at once, not after a timeout
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart(wire.encode({"t": wire.BYE}), flags=zmq.NOBLOCK)
        sock.close()
    if worker.refused:
        raise WorkerError(f"the frontend at {connect} refused this worker: {worker.refused}")
    return 0


def _report_load_failure(spec: WorkerSpec, connect: str, error: ModelLoadError,
                         keys: ClientKeys | None = None) -> None:
    """Tell the frontend why this worker will never say hello (it then fails fast)."""
    print(f"parityserve worker {spec.replica_id}: {error}", file=sys.stderr, flush=True)
    sock = _socket(spec, connect, keys)
    header = {"t": wire.FAILED, "model": spec.model, "version": spec.version, "error": str(error)}
    with contextlib.suppress(zmq.ZMQError):
        sock.send_multipart(wire.encode(header), flags=zmq.NOBLOCK)
    sock.close(linger=2000)


def main(argv: list[str] | None = None, *, die_with_parent: bool = True) -> int:
    """Run a worker. ``die_with_parent`` False: forked by the server's zygote
    (``runtime/fleet/zygote.py``), whose death must not end this replica; ``--die-with-parent``
    is then ignored, and the replica dies with the frontend through its lifeline instead
    (``runtime/fleet/zygote_server.watch_lifeline``)."""
    parser = argparse.ArgumentParser(prog="parityserve-worker", description=__doc__)
    parser.add_argument("--connect", required=True, help="frontend RPC address, tcp://HOST:PORT")
    parser.add_argument("--spec", required=True, help="WorkerSpec as JSON")
    parser.add_argument("--die-with-parent", action="store_true")
    parser.add_argument("--parent-pid", type=int, help="exit at once if this is not our parent")
    parser.add_argument("--no-bye", action="store_true",
                        help="leave without BYE on SIGTERM: a Ray actor's worker, whose frontend "
                             "drops a replica before stopping it, so that a SIGTERM it did not "
                             "send (Ray killing the actor's process group) reads as a loss")
    args = parser.parse_args(argv)
    take_niceness()  # started by a Ray actor: its frontend's niceness, not Ray's 15
    global _never_bye
    _never_bye = args.no_bye
    if args.die_with_parent and die_with_parent:
        global _launcher_pid
        _launcher_pid = os.getppid()
        _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    spec = WorkerSpec.from_json(args.spec)
    keys = keys_from_env()
    try:
        return run_worker(spec, args.connect, keys)
    except ModelLoadError as exc:
        _report_load_failure(spec, args.connect, exc, keys)
        return EXIT_LOAD_FAILED
    finally:  # leaving anyway: a late SIGTERM must not raise inside interpreter shutdown
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
