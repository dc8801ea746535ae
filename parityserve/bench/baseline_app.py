"""The baseline: a bare Starlette app that calls the model in-process, one query at a time.

This is what a user would write without a serving system: no queue, no batching, no
replicas, no cache. It speaks the same Clipper-style route as parityserve
(``POST /{app}/predict`` with ``{"input": [...]}``), so one load generator drives both and
the benchmarks can report ratios against it.

    python -m parityserve.bench.baseline_app --source zoo:noop [--weights F] --port 8001

prints ``ready`` on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from parityserve.errors import (
    InvalidInput,
    MalformedRequest,
    ModelError,
    ParityServeError,
    PredictError,
    RequestError,
)

__all__ = ["BUILTIN_SOURCES", "create_baseline_app", "create_route_app", "load_predict", "main"]

Predict = Callable[[np.ndarray], Any]
AsyncPredict = Callable[[np.ndarray], Awaitable[Any]]

# Sources served without the model loader: "builtin:noop" echoes its input, so a benchmark can
# measure pure serving overhead and check every answer.
BUILTIN_SOURCES: dict[str, Predict] = {"builtin:noop": lambda batch: batch}


def create_baseline_app(predict: Predict, input_dtype: str = "float32", *,
                        offload: bool = False) -> Starlette:
    """``POST /{app}/predict`` -> ``{"query_id", "output", "default": false}``; ``GET /healthz``.

    By default ``predict`` runs on the event loop, as the simplest hand-written server would.
    ``offload=True`` runs it in Starlette's thread pool instead (models that release the GIL).
    """
    async def run(batch: np.ndarray) -> Any:
        return await run_in_threadpool(predict, batch) if offload else predict(batch)

    return create_route_app(run, input_dtype)


def create_route_app(run: AsyncPredict, input_dtype: str = "float32") -> Starlette:
    """The baseline's routes around any ``await run(batch)``: the same parsing, answers and
    errors whether the model runs in-process or behind a worker hop (``floor_app``)."""
    dtype = np.dtype(input_dtype)
    ids = itertools.count()

    async def predict_route(request: Request) -> Response:
        try:
            batch = _parse_input(await request.body(), dtype)
            answer = _first_output(await run(batch))
        except ParityServeError as exc:
            return _error(exc)
        except Exception as exc:  # the model's own failure is the server's fault: a 500
            return _error(PredictError(f"{type(exc).__name__}: {exc}"))
        return _json({"query_id": str(next(ids)), "output": answer, "default": False})

    async def healthz(request: Request) -> Response:
        return Response("ok", media_type="text/plain")

    return Starlette(routes=[
        Route("/{app}/predict", predict_route, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])


def _parse_input(body: bytes, dtype: np.dtype[Any]) -> np.ndarray:
    """One query's input as a batch of one, cast to ``dtype``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or "input" not in doc:
        raise MalformedRequest('body must be a JSON object with an "input" field')
    try:
        return np.asarray(doc["input"], dtype=dtype)[None]
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"input is not a {dtype} array: {exc}") from exc


def _first_output(output: Any) -> Any:
    try:
        first = output[0]
    except (TypeError, IndexError, KeyError) as exc:
        raise PredictError(f"predict returned {type(output).__name__}, not a batch") from exc
    if isinstance(first, np.ndarray):
        return np.ascontiguousarray(first)  # orjson serialises only C-contiguous arrays
    return first.item() if isinstance(first, np.generic) else first


def _error(exc: ParityServeError) -> Response:
    status = exc.status_code if isinstance(exc, RequestError) else 500
    code = getattr(exc, "code", "predict_error" if isinstance(exc, ModelError) else "error")
    return _json({"error": code, "message": str(exc)}, status)


def _json(doc: dict[str, Any], status: int = 200) -> Response:
    body = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY, default=_to_list)
    return Response(body, status_code=status, media_type="application/json")


def _to_list(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


# --- command line -------------------------------------------------------------------------


def load_predict(source: str, weights: str | None = None, threads: int = 1) -> Predict:
    """A batch predict function for ``source``: a builtin, else parityserve's model loader.

    ``threads`` is the model's intra-op thread count; match the serving system's setting
    so the comparison is fair.
    """
    if source in BUILTIN_SOURCES:
        return BUILTIN_SOURCES[source]
    # Imported here so this module (and its builtin sources) work without the loader.
    from parityserve.models.loader import load_model

    model = load_model(source, weights=weights, options={}, threads=threads)
    return model.predict


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m parityserve.bench.baseline_app",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True,
                        help=f"model source for the loader, or one of {sorted(BUILTIN_SOURCES)}")
    parser.add_argument("--weights", default=None, help="weights file for the model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=1, help="model intra-op threads")
    parser.add_argument("--input-dtype", default="float32")
    parser.add_argument("--die-with-parent", action="store_true",
                        help="exit when the process that started this app exits")
    parser.add_argument("--offload", action="store_true",
                        help="run predict in a thread pool instead of on the event loop")
    return parser.parse_args(argv)


async def _serve(app: Starlette, host: str, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            http=_http_impl(), lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():  # failed to start (port taken, ...): surface its error
            await serving
            raise SystemExit(f"baseline_app could not listen on {host}:{port}")
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await serving


def _http_impl() -> str:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _run(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.die_with_parent:
        from parityserve.runtime.workers.worker import _die_with_parent

        _die_with_parent(os.getppid())  # a killed benchmark must not leave this app behind
    try:
        predict = load_predict(args.source, args.weights, args.threads)
    except (ParityServeError, ImportError) as exc:
        print(f"baseline_app: cannot load {args.source!r}: {exc}", file=sys.stderr)
        return 2
    app = create_baseline_app(predict, args.input_dtype, offload=args.offload)
    _run(_serve(app, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
