"""The comparison servers of ``frontend_wrk.py``, each serving a no-op model in-process.

    python benchmarks/frontend_apps.py bare --port 9001
    python benchmarks/frontend_apps.py litserve --port 9002     (pip install litserve)

``bare`` is the ceiling: Starlette on uvicorn (httptools, uvloop) with the three routes
parityserve serves, each doing the same decoding parityserve does and nothing else:
``POST /{app}/predict`` (Clipper JSON, the input made a numpy array), and
``POST /v2/models/{m}/infer`` in V2 JSON or the binary tensor extension (parityserve's own
``runtime/v2`` codec, so the bare app pays the same binary decode). ``litserve`` is LitServe
with one worker, its default ``/predict`` route taking ``{"input": [...]}``.

Each prints ``ready`` on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from typing import Any

import numpy as np
import orjson


def bare_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from parityserve.runtime import v2

    ids = itertools.count()

    async def predict(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        x = np.asarray(doc["input"], dtype=np.float32)
        out = {"query_id": str(next(ids)), "output": x[:1].tolist(), "default": False}
        return Response(orjson.dumps(out), media_type="application/json")

    async def infer(request: Request) -> Response:
        length = request.headers.get(v2.HEADER_LENGTH)
        decoded = v2.decode_infer_request(await request.body(),
                                          int(length) if length else None)
        x = decoded.inputs[0].array
        name = "output"
        body, headers = v2.encode_infer_response(
            request.path_params["model"], "1", decoded.id, [(name, x[:, :1])],
            {name: decoded.wants_binary(name)})
        return Response(body, headers=headers)

    return Starlette(routes=[Route("/{app}/predict", predict, methods=["POST"]),
                             Route("/v2/models/{model}/infer", infer, methods=["POST"])])


def serve_bare(port: int) -> None:
    import uvicorn
    import uvloop

    async def main() -> None:
        config = uvicorn.Config(bare_app(), host="127.0.0.1", port=port, log_level="warning",
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

    uvloop.run(main())


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
except ImportError:
    ls = None


def serve_litserve(port: int) -> None:
    if ls is None:
        raise SystemExit("litserve is not installed: pip install litserve")
    server = ls.LitServer(NoOpAPI(), accelerator="cpu", workers_per_device=1)
    server.run(port=port, generate_client_file=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=("bare", "litserve"))
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    (serve_bare if args.system == "bare" else serve_litserve)(args.port)
    sys.exit(0)
