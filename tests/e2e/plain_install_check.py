"""A real install serves: ``make check-plain-install`` runs this in a fresh venv.

``plain`` (after ``pip install .``, no extras): checks its premise first (torch, onnxruntime,
ray, redis, matplotlib and aiohttp cannot be imported: a run where one can proves nothing),
then starts ``parityserve start`` on a ``python:`` class, a scikit-learn model and a zoo
model, answers a prediction from each and an open-loop burst through the load generator
(httpx, since aiohttp is absent), and checks that ``parityserve validate`` refuses the
README's stateful graph with the pip line that fixes it.

``torch`` (after ``pip install '.[torch]'`` in the same venv): a ``torch:`` model and the
README's stateful graph are served.

It needs nothing but the standard library and the install under test; run it from outside the
source tree, so that the installed package is the one imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

OPTIONAL = ("torch", "onnxruntime", "ray", "redis", "matplotlib", "aiohttp")
TORCH_HINT = "pip install 'parityserve[torch]'"

PLAIN_MODEL = '''
import numpy as np

class Doubler:
    def predict(self, batch):
        return [2.0 * np.asarray(x, dtype=np.float32) for x in batch]
'''

TORCH_MODEL = '''
import torch

class Triple(torch.nn.Module):
    def forward(self, x):
        return 3.0 * x
'''

STOCKS = {
    "models": [
        {"name": "features", "source": "zoo:echo"},
        {"name": "lstm1", "source": "zoo:stream-lstm",
         "options": {"input_size": 4, "outputs": 4, "seed": 1}},
        {"name": "lstm2", "source": "zoo:stream-lstm",
         "options": {"input_size": 4, "outputs": 1, "seed": 2}},
        {"name": "scorer", "source": "zoo:echo"},
    ],
    "graphs": [{
        "name": "stocks", "stream_key": "ticker", "fault_tolerance": "hams", "output": "score",
        "operators": [
            {"name": "feat", "model": "features", "inputs": ["frontend"]},
            {"name": "seq1", "model": "lstm1", "inputs": ["feat"], "stateful": True},
            {"name": "seq2", "model": "lstm2", "inputs": ["seq1"], "stateful": True},
            {"name": "score", "model": "scorer", "inputs": ["seq2"]},
        ],
    }],
}


def importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def apps_for(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": m["name"], "models": [m["name"]], "slo_ms": 5000} for m in models]


def plain_models(folder: Path) -> dict[str, Any]:
    """A deployment of what a plain install serves: a ``python:`` class, a scikit-learn model
    (both written into ``folder``) and ``zoo:echo``, one application each. Also used by
    ``test_plain_install.py``."""
    import joblib
    from sklearn.linear_model import LinearRegression

    (folder / "plainmodel.py").write_text(PLAIN_MODEL)
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    joblib.dump(LinearRegression().fit(x, x.sum(axis=1)), folder / "linear.joblib")
    models = [{"name": "double", "source": "python:plainmodel:Doubler"},
              {"name": "linear", "source": "sklearn:linear.joblib"},
              {"name": "echo", "source": "zoo:echo"}]
    return {"server": {"http_port": 0}, "models": models, "applications": apps_for(models)}


def check_plain(folder: Path) -> str:
    present = [name for name in OPTIONAL if importable(name)]
    if present:
        raise SystemExit(f"FAIL: {', '.join(present)} can be imported here; run the plain "
                         "check in a venv where only `pip install .` ran")
    from parityserve.bench.loadgen import HttpSender, json_sender, run_event_loop, run_open_loop
    from parityserve.bench.serverproc import ServerProcess, write_config
    from parityserve.client import Client

    config = write_config(plain_models(folder), folder / "serving.yaml")

    async def burst(url: str) -> tuple[str, list[Any]]:
        async with HttpSender(url) as http:
            send = json_sender(http, "/echo/predict", [b'{"input": [1.0, 2.0]}'])
            result = await run_open_loop(send, np.linspace(0, 0.5, 50), timeout_s=30.0)
            return http.client, result.results

    with ServerProcess(config) as server, Client(server.url) as client:
        double = client.predict("double", [1.0, 2.0, 3.0])
        linear = client.predict("linear", [1.0, 2.0, 3.0])
        echo = client.predict("echo", [1.0, 2.0, 3.0])
        http_client, answers = run_event_loop(burst(server.url))
    assert double["output"] == [2.0, 4.0, 6.0] and double["default"] is False, double
    assert abs(float(linear["output"]) - 6.0) < 1e-6, linear
    assert echo["output"] == [1.0, 2.0, 3.0], echo
    assert http_client == "httpx", http_client
    assert len(answers) == 50 and all(a is not None and a["default"] is False
                                      for a in answers), answers
    refusal = refused_graph(folder, write_config)
    return (f"OK plain: a python: class, a scikit-learn model and zoo:echo served, 50 open-loop "
            f"queries answered on {http_client}; the stateful graph refused with: {refusal}")


def refused_graph(folder: Path, write_config: Any) -> str:
    """``parityserve validate`` on the README's graph, without torch: exit 2, the pip line."""
    graph = write_config({"server": {"http_port": 0}, **STOCKS}, folder / "graph.yaml")
    cli = Path(sys.executable).with_name("parityserve")
    done = subprocess.run([str(cli), "validate", "-c", str(graph)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and TORCH_HINT in done.stderr and "Traceback" not in out, out
    return done.stderr.strip().splitlines()[-1]


def check_torch(folder: Path) -> str:
    if not importable("torch"):
        raise SystemExit("FAIL: torch cannot be imported; run after pip install '.[torch]'")
    from parityserve.bench.serverproc import ServerProcess, write_config
    from parityserve.client import Client

    (folder / "torchmodel.py").write_text(TORCH_MODEL)
    models = [{"name": "triple", "source": "torch:torchmodel:Triple"}]
    config = write_config({"server": {"http_port": 0},
                           "models": [*models, *STOCKS["models"]],
                           "applications": apps_for(models), "graphs": STOCKS["graphs"]},
                          folder / "serving.yaml")
    with ServerProcess(config) as server, Client(server.url) as client:
        triple = client.predict("triple", [1.0, 2.0])
        scored = client.predict_graph("stocks", [0.1, 0.2, 0.3, 0.4], stream="IBM",
                                      stream_key="ticker")
    assert triple["output"] == [3.0, 6.0], triple
    assert scored["durable"] is True and len(scored["output"]) == 1, scored
    return "OK torch: a torch: model and the README's stateful graph served"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["plain", "torch"])
    phase = parser.parse_args().phase
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        message = (check_plain if phase == "plain" else check_torch)(Path(tmp))
    print(f"{message} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
