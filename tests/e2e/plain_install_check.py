"""Serve without the ``bench`` extra: ``parityserve start`` comes up and answers a prediction.

Run by ``tests/e2e/test_plain_install.py`` with the bench-only modules refused at import, and by
``make check-plain-install`` in a fresh venv where only ``pip install .`` ran. It needs nothing
but the standard library and a plain install of parityserve, and it first checks its premise:
a run where aiohttp or matplotlib can be imported proves nothing, so it fails.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH_ONLY = ("aiohttp", "matplotlib")
CONFIG = {
    "server": {"http_port": 0},
    "models": [{"name": "echo", "source": "zoo:echo", "replicas": 1}],
    "applications": [{"name": "echo", "models": ["echo"], "slo_ms": 5000}],
}


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def main() -> int:
    present = [name for name in BENCH_ONLY if importable(name)]
    if present:
        print(f"FAIL: {', '.join(present)} can be imported here; run this without the "
              "bench extra", file=sys.stderr)
        return 1
    from parityserve.bench.loadgen import (  # the demo's load path, on httpx
        HttpSender,
        json_sender,
        run_event_loop,
        run_open_loop,
    )
    from parityserve.bench.serverproc import ServerProcess, write_config
    from parityserve.client import Client

    async def open_loop(url: str) -> tuple[str, list[object]]:
        async with HttpSender(url) as http:
            send = json_sender(http, "/echo/predict", [b'{"input": [1.0, 2.0]}'])
            result = await run_open_loop(send, np.zeros(5), timeout_s=30.0)
            return http.client, result.results

    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(CONFIG, Path(tmp) / "serving.yaml")
        with ServerProcess(config) as server, Client(server.url) as client:
            answer = client.predict("echo", [1.0, 2.0, 3.0])
            http_client, load_answers = run_event_loop(open_loop(server.url))
    assert answer["output"] == [1.0, 2.0, 3.0] and answer["default"] is False, answer
    assert http_client == "httpx", http_client
    assert all(a is not None and a["default"] is False for a in load_answers), load_answers
    print(f"OK: served {answer['output']} without {' or '.join(BENCH_ONLY)}; the load "
          f"generator ran on {http_client}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
