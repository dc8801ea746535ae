"""The architecture's floor: the bare baseline app with one worker-process hop per query.

The overhead target (the frontend adds < 1 ms to p50 over the raw predict call) is judged on
an architecture the serving core fixes: an HTTP frontend, and models in separate worker
processes reached over ZeroMQ (ROUTER in the frontend, DEALER in the worker). This app is the
least code that has both. It is the bare baseline's route and parsing (``baseline_app``),
then one round trip through parityserve's own RPC layer (``WorkerLink``: msgpack header, raw
numpy frames) to parityserve's own worker process, which calls the same model. There is no
queue, no batching, no deadline, no cache, no selection and no metrics.

So the three systems of ``bench overhead`` split the cost: bare app minus raw call is the
HTTP hop, this app minus the bare app is the process hop, and parityserve minus this app is
parityserve's own serving logic. Whatever this app adds over the raw call, any implementation
of the architecture pays on the same machine.

    python -m parityserve.bench.floor_app --source zoo:noop --port 8002

prints ``ready`` on stdout once its worker has said hello and it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from parityserve.bench.baseline_app import _run, _serve, create_route_app
from parityserve.errors import ModelLoadError, PredictError, WorkerError
from parityserve.runtime.fleet.launcher import LocalLauncher
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.rpc import WorkerLink
from parityserve.runtime.workers.worker import WorkerSpec

__all__ = ["WorkerHop", "main"]

_REPLICA = "floor-0"
_STARTUP_TIMEOUT_S = 120.0


class WorkerHop:
    """One worker process behind a ``WorkerLink``: ``await call(batch)`` is one round trip.

    Nothing else of the runtime: no queue, no supervisor (a worker that dies fails the calls
    waiting on it when the app stops), heartbeats ignored.
    """

    def __init__(self, link: WorkerLink) -> None:
        self.link = link
        self.ready = asyncio.Event()
        self.failure: str | None = None  # why the worker could not load its model
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()

    def on_message(self, rid: str, header: dict[str, Any], buffers: list[Any]) -> None:
        kind = header.get("t")
        if kind == wire.RESULT:
            self._settle(header, buffers)
        elif kind == wire.HELLO:
            self.ready.set()
        elif kind == wire.FAILED:
            self.failure = str(header.get("error"))
            self.ready.set()

    def _settle(self, header: dict[str, Any], buffers: list[Any]) -> None:
        future = self._waiting.pop(header.get("bid", -1), None)
        if future is None or future.done():
            return
        if header.get("ok"):
            future.set_result(wire.unpack_payload(header["out"], buffers))
        else:
            future.set_exception(PredictError(f"the worker failed: {header.get('error')}"))

    async def call(self, batch: Any) -> Any:
        bid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        desc, frames = wire.pack_payload(batch)
        self._waiting[bid] = future
        try:
            self.link.send(_REPLICA, {"t": wire.PREDICT, "bid": bid, "in": desc}, frames)
        except WorkerError:
            del self._waiting[bid]
            raise
        return await future

    async def wait_for_hello(self, exit_code: Callable[[], int | None]) -> None:
        """Wait for the worker's hello; a load failure or an early exit (``exit_code()`` not
        None) raises ``ModelLoadError`` with why."""
        deadline = asyncio.get_running_loop().time() + _STARTUP_TIMEOUT_S
        while not self.ready.is_set():
            if exit_code() is not None:
                raise ModelLoadError(f"the worker exited with status {exit_code()} before hello")
            if asyncio.get_running_loop().time() > deadline:
                raise ModelLoadError(f"no hello from the worker in {_STARTUP_TIMEOUT_S:g} s")
            await asyncio.sleep(0.02)
        if self.failure is not None:
            raise ModelLoadError(self.failure)

    def fail_waiting(self, reason: str) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(WorkerError(reason))
        self._waiting.clear()


async def _serve_with_worker(args: argparse.Namespace) -> None:
    link = WorkerLink()
    hop = WorkerHop(link)
    link.start(hop.on_message)
    spec = WorkerSpec(replica_id=_REPLICA, model="floor", version=1, source=args.source,
                      weights=args.weights, threads=args.threads)
    worker = LocalLauncher(link.address).start(spec)
    try:
        await hop.wait_for_hello(worker.exit_code)
        await _serve(create_route_app(hop.call, args.input_dtype), args.host, args.port)
    finally:
        hop.fail_waiting("the floor app is stopping")
        LocalLauncher.stop_all([worker])
        await link.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m parityserve.bench.floor_app",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True,
                        help="model source for the worker's loader, e.g. zoo:noop")
    parser.add_argument("--weights", default=None, help="weights file for the model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--threads", type=int, default=1, help="model intra-op threads")
    parser.add_argument("--input-dtype", default="float32")
    parser.add_argument("--die-with-parent", action="store_true",
                        help="exit when the process that started this app exits")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.die_with_parent:
        from parityserve.runtime.workers.worker import _die_with_parent

        _die_with_parent(os.getppid())  # a killed benchmark must not leave this app behind
    try:
        _run(_serve_with_worker(args))
    except ModelLoadError as exc:
        print(f"floor_app: cannot serve {args.source!r}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
