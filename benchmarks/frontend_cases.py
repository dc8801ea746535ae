"""The model cases of ``frontend_wrk.py``: what each system serves and what wrk sends it.

* ``noop``: ``zoo:noop`` behind parityserve with its prediction cache off, a no-op in the
  bare app and LitServe (neither caches); 2,000 random 784-float bodies and one fixed body,
  on every route (Clipper JSON, V2 JSON, V2 binary, and parityserve's gRPC).
* ``mlp``: the zoo MNIST MLP (``zoo:parm-mlp``, the ParM authors' published weights) with
  adaptive batching up to ``MAX_BATCH`` everywhere: parityserve's AIMD with one replica and the
  cache off (so every query runs the model), the bare app's in-process batcher
  (``frontend_batcher.py``) and LitServe's ``max_batch_size``; bodies are 2,000 distinct real
  MNIST test images on the Clipper JSON and V2 binary routes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.errors import DataError

__all__ = ["BATCHED_DELAY_MS", "BODIES", "LITSERVE_BATCH_TIMEOUT_S", "MAX_BATCH", "MODELS",
           "PARITYSERVE_SYSTEMS", "Case", "default_data_dir", "load_case"]

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("noop", "mlp")
# parityserve as it ships (no fixed batching delay: a query leaves as soon as a replica is
# free, but for the busy hold of ``batching.busy_delay_ms`` while the loop is saturated),
# and with the batching delay a throughput-minded deployment sets (``batching.max_delay_ms``,
# Triton's max_queue_delay): a partial batch waits up to that long for more queries.
BATCHED_DELAY_MS = 2.0
PARITYSERVE_SYSTEMS = {"parityserve": 0.0, "parityserve-batched": BATCHED_DELAY_MS}
MAX_BATCH = 64  # parityserve's default batching.max_batch_size, given to every system
BODIES = 2000  # distinct bodies per route
LITSERVE_BATCH_TIMEOUT_S = 0.001  # LitServe busy-polls its queue with 0; 1 ms is its floor
MLP_WEIGHTS = "parm-mnist-base-mlp.npz"
_MNIST_TEST = "mnist/t10k-images-idx3-ubyte.gz"
_NOOP_ROUTES = ("clipper-json", "v2-json", "v2-binary")
_MLP_ROUTES = ("clipper-json", "v2-binary")


@dataclass(frozen=True)
class Case:
    """One model as every system serves it, and the inputs wrk sends."""

    name: str
    rows: np.ndarray  # the distinct inputs, (BODIES, 784) float32
    kinds: tuple[str, ...]  # body sets: "distinct" rows, and "fixed" (one row, cacheable)
    weights: Path | None = None
    bare_batch_run: str = "inline"

    @property
    def v2_model(self) -> str:
        return self.name

    def routes(self, system: str) -> tuple[str, ...]:
        """HTTP routes measured with wrk (LitServe has only its Clipper-like ``/predict``)."""
        if system == "litserve":
            return ("clipper-json",)
        return _NOOP_ROUTES if self.name == "noop" else _MLP_ROUTES

    def has_grpc(self, system: str) -> bool:
        return system in PARITYSERVE_SYSTEMS and self.name == "noop"

    def app_args(self, system: str) -> list[str]:
        """``frontend_apps.py`` flags after ``SYSTEM --port N``."""
        if self.name == "noop":
            return []
        args = ["--model", "mlp", "--weights", str(self.weights), "--max-batch", str(MAX_BATCH)]
        return args + (["--batch-run", self.bare_batch_run] if system == "bare" else [])

    def parityserve_config(self, http_port: int, grpc_port: int,
                           max_delay_ms: float = 0.0) -> dict[str, Any]:
        # The cache is off: the 2,000 distinct bodies repeat every 2,000 requests, and with the
        # cache on (the default) all but the first pass would be cache hits that never reach
        # the worker. Every request here takes the whole dispatch path.
        server: dict[str, Any] = {"http_port": http_port, "grpc_port": grpc_port,
                                  "cache_bytes": 0}
        model: dict[str, Any] = {"name": self.name, "source": "zoo:noop", "replicas": 1}
        if self.name == "mlp":
            model.update(source="zoo:parm-mlp", weights=str(self.weights))
        if self.name == "mlp" or max_delay_ms:
            model["batching"] = {"max_batch_size": MAX_BATCH, "max_delay_ms": max_delay_ms}
        return {"server": server, "models": [model],
                "applications": [{"name": "app", "models": [self.name], "slo_ms": 1000}]}


def load_case(name: str, data_dir: Path | None, bare_batch_run: str = "inline") -> Case:
    if name == "noop":
        rows = np.random.default_rng(0).random((BODIES, 784), dtype=np.float32)
        return Case("noop", rows, ("distinct", "fixed"))
    if name == "mlp":
        if data_dir is None:
            raise DataError("the mlp case needs --data-dir or $PARITYSERVE_DATA")
        weights = _check_mlp_data(data_dir)
        return Case("mlp", _mnist_rows(data_dir), ("distinct",), weights, bare_batch_run)
    raise DataError(f"unknown model {name!r}; use {' or '.join(MODELS)}")


def default_data_dir() -> Path:
    """``$PARITYSERVE_DATA``, else ``../shared/data`` beside the project root."""
    env = os.environ.get("PARITYSERVE_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def _check_mlp_data(data_dir: Path) -> Path:
    """The MLP's weights file; a clear error now, not after the noop rounds, if anything the
    mlp case reads is missing."""
    missing = [p for p in (data_dir / _MNIST_TEST, data_dir / "weights" / MLP_WEIGHTS)
               if not p.is_file()]
    if missing:
        raise DataError(
            f"the mlp case needs the MNIST test set and the published MLP weights, missing: "
            f"{', '.join(map(str, missing))}; pass --data-dir (or set $PARITYSERVE_DATA) to "
            "the shared data folder (see its README.md), or run --models noop")
    return (data_dir / "weights" / MLP_WEIGHTS).resolve()


def _mnist_rows(data_dir: Path) -> np.ndarray:
    from parityserve.models.datasets import load_mnist

    x, _ = load_mnist("test", data_dir=data_dir)
    return np.ascontiguousarray(x[:: len(x) // BODIES][:BODIES])  # spread over the test set
