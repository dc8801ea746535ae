"""The comparison servers of ``frontend_wrk.py``, each serving the model in-process.

    python -m benchmarks.frontend_apps bare --port 9001
    python -m benchmarks.frontend_apps bare --port 9001 --model mlp --weights W.npz
    python -m benchmarks.frontend_apps floor --port 9003 [--model mlp --weights W.npz]
    python -m benchmarks.frontend_apps litserve --port 9002 [--model mlp --weights W.npz]

``bare`` is the ceiling: Starlette on uvicorn (httptools, uvloop) with the three routes
parityserve serves, each doing the same decoding parityserve does and nothing else:
``POST /{app}/predict`` (Clipper JSON, the input made a numpy array), and
``POST /v2/models/{m}/infer`` in V2 JSON or the binary tensor extension (parityserve's own
``runtime/frontend/v2`` codec, so the bare app pays the same binary decode). With ``--model noop``
it answers each query's first value; with ``--model mlp`` it runs the zoo MNIST MLP through the
in-process batcher of ``frontend_batcher.py`` (up to ``--max-batch`` queries per call, the
batch run ``--batch-run inline`` or in a thread). ``floor`` is the architecture's floor: the
bare app and the same batcher, but each batch makes one round trip to a parityserve worker
process through parityserve's RPC layer (``WorkerLink``, CURVE on as parityserve's default),
and nothing else of parityserve: what any frontend-plus-worker-process design pays on the
same core. ``litserve`` is LitServe with one worker,
its default ``/predict`` route taking ``{"input": [...]}``; for the MLP with LitServe's own
batching (``max_batch_size``, ``batch_timeout``).

Each prints ``ready`` on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from benchmarks.frontend_cases import LITSERVE_BATCH_TIMEOUT_S

# The model call each route awaits: one query's input row -> its output row.
Infer = Callable[[np.ndarray], Awaitable[np.ndarray]]


def bare_app(infer: Infer, output_name: str = "output",
             stats: Callable[[], dict[str, int]] | None = None) -> Any:
    """The routes; ``GET /stats`` answers ``stats()`` (the batcher's counts) when given."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from parityserve.runtime.frontend import v2

    ids = itertools.count()

    async def predict(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        out = await infer(np.asarray(doc["input"], dtype=np.float32))
        doc = {"query_id": str(next(ids)), "output": out.tolist(), "default": False}
        return Response(orjson.dumps(doc), media_type="application/json")

    async def infer_route(request: Request) -> Response:
        length = request.headers.get(v2.HEADER_LENGTH)
        decoded = v2.decode_infer_request(await request.body(),
                                          int(length) if length else None)
        x = decoded.inputs[0].array
        out = (await infer(x[0]))[None] if len(x) == 1 else np.stack(
            await asyncio.gather(*map(infer, x)))
        body, headers = v2.encode_infer_response(
            request.path_params["model"], "1", decoded.id, [(output_name, out)],
            {output_name: decoded.wants_binary(output_name)})
        return Response(body, headers=headers)

    async def stats_route(request: Request) -> Response:
        return Response(orjson.dumps(stats() if stats else {}), media_type="application/json")

    return Starlette(routes=[Route("/{app}/predict", predict, methods=["POST"]),
                             Route("/v2/models/{model}/infer", infer_route, methods=["POST"]),
                             Route("/stats", stats_route, methods=["GET"])])


async def _first_value(row: np.ndarray) -> np.ndarray:
    return row[:1]  # the no-op "model": nothing to compute, a tiny answer


def _load_mlp(weights: str) -> Callable[[np.ndarray], Any]:
    from parityserve.bench.baseline_app import load_predict

    # One intra-op thread, as parityserve's worker (threads_per_replica: 1).
    return load_predict("zoo:parm-mlp", weights, threads=1)


def serve_bare(port: int, args: argparse.Namespace) -> None:
    import uvloop

    async def main() -> None:
        if args.model == "mlp":
            from benchmarks.frontend_batcher import Batcher

            batcher = Batcher(_load_mlp(args.weights), args.max_batch, args.batch_run)
            _freeze_startup_objects()
            app = bare_app(batcher, output_name="logits", stats=lambda: {
                "batches": batcher.batches, "queries": batcher.queries})
        else:
            app = bare_app(_first_value)
        await _serve(app, port)

    uvloop.run(main())


_FLOOR_REPLICA = "floor-0"  # the id WorkerHop sends to


def serve_floor(port: int, args: argparse.Namespace) -> None:
    import uvloop

    from benchmarks.frontend_batcher import Batcher
    from parityserve.bench.floor_app import WorkerHop
    from parityserve.runtime.fleet.launcher import LocalLauncher
    from parityserve.runtime.workers.credentials import ReplicaCredentials
    from parityserve.runtime.workers.keys import ServerKeys
    from parityserve.runtime.workers.rpc import WorkerLink
    from parityserve.runtime.workers.worker import WorkerSpec

    async def main() -> None:
        keys = ServerKeys.in_memory()  # CURVE, as parityserve's local workers by default
        link = WorkerLink(keys=keys)
        hop = WorkerHop(link)
        link.start(hop.on_message)
        mlp = args.model == "mlp"
        spec = WorkerSpec(replica_id=_FLOOR_REPLICA, model="floor", version=1,
                          source="zoo:parm-mlp" if mlp else "zoo:noop",
                          weights=args.weights if mlp else None, threads=1)
        client_keys = ReplicaCredentials(keys, link).issue(_FLOOR_REPLICA)
        worker = LocalLauncher(link.address).start(spec, client_keys)
        try:
            await hop.wait_for_hello(worker.exit_code)
            batcher = Batcher(hop.call, args.max_batch, "hop")
            _freeze_startup_objects()
            stats = lambda: {"batches": batcher.batches, "queries": batcher.queries}  # noqa: E731
            # zoo:noop answers one float32 zero per query, as it does behind parityserve.
            app = bare_app(batcher, output_name="logits" if mlp else "output", stats=stats)
            await _serve(app, port)
        finally:
            LocalLauncher.stop_all([worker])
            await link.close()

    uvloop.run(main())


def _freeze_startup_objects() -> None:
    # torch leaves ~200,000 objects that every full cyclic-GC pass would walk (over 100 ms
    # here, stalling all 64 connections); take them out of the walks, as parityserve's
    # frontend does with what its startup built.
    gc.collect()
    gc.freeze()


async def _serve(app: Any, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            http="httptools", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise SystemExit(f"cannot listen on {port}")
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await task


try:  # module level: LitServe pickles the API into its worker process
    import litserve as ls

    class NoOpAPI(ls.LitAPI):  # type: ignore[misc]
        def setup(self, device: str) -> None:
            pass

        def decode_request(self, request):  # type: ignore[no-untyped-def]  # LitServe reads the annotation
            return np.asarray(request["input"], dtype=np.float32)

        def predict(self, x: np.ndarray) -> np.ndarray:
            return x

        def encode_response(self, output: np.ndarray) -> dict[str, Any]:
            return {"output": output[:1].tolist()}

    class MLPAPI(ls.LitAPI):  # type: ignore[misc]
        """The MLP with LitServe's batching: its default ``batch`` stacks the decoded arrays
        and its default ``unbatch`` splits the outputs by row."""

        def __init__(self, weights: str, max_batch_size: int) -> None:
            super().__init__(max_batch_size=max_batch_size,
                             batch_timeout=LITSERVE_BATCH_TIMEOUT_S)
            self.weights = weights

        def setup(self, device: str) -> None:
            self.model = _load_mlp(self.weights)

        def decode_request(self, request):  # type: ignore[no-untyped-def]  # LitServe reads the annotation
            return np.asarray(request["input"], dtype=np.float32)

        def predict(self, x: np.ndarray) -> np.ndarray:
            return self.model(x)

        def encode_response(self, output: np.ndarray) -> dict[str, Any]:
            return {"output": output.tolist()}
except ImportError:
    ls = None


def serve_litserve(port: int, args: argparse.Namespace) -> None:
    if ls is None:
        raise SystemExit("litserve is not installed: pip install litserve")
    api = MLPAPI(args.weights, args.max_batch) if args.model == "mlp" else NoOpAPI()
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(port=port, generate_client_file=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.frontend_apps",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=("bare", "floor", "litserve"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", choices=("noop", "mlp"), default="noop")
    parser.add_argument("--weights", help="the MLP's weights (parm-mnist-base-mlp.npz)")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="the largest batch (bare and floor batchers, LitServe's MLP)")
    parser.add_argument("--batch-run", choices=("inline", "thread"), default="inline",
                        help="bare MLP: run each batch on the event loop or in one thread")
    return parser


if __name__ == "__main__":
    args = _parser().parse_args()
    if args.model == "mlp" and not args.weights:
        raise SystemExit("--model mlp needs --weights")
    {"bare": serve_bare, "floor": serve_floor, "litserve": serve_litserve}[args.system](
        args.port, args)
    sys.exit(0)
