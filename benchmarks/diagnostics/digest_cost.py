"""The cache key's cost per query: ``input_digest`` on the inputs JSON bodies decode to.

    PYTHONPATH=. python benchmarks/diagnostics/digest_cost.py

Run it with ``PYTHONPATH`` at an older checkout to time the code before a change (it uses only
``input_digest``, which every version has). Prints microseconds per digest, best of 5 runs
of 2,000, for a 784-value MNIST-sized row as Python floats, ints, a mix of both (what JSON
``[0, 0.5, ...]`` decodes to), a nested 28x28 list, and the same row as a numpy array.
"""

from __future__ import annotations

import json
import time

import numpy as np

from parityserve.core.cache import input_digest


def cases() -> dict[str, object]:
    rng = np.random.default_rng(0)
    row = rng.random(784)
    return {"784 floats": row.tolist(), "784 ints": list(range(784)),
            "784 mixed": [0] * 400 + row[:384].tolist(),
            "28x28 nested floats": row.reshape(28, 28).tolist(),
            "784 float32 array": row.astype(np.float32)}


def best_us(value: object, runs: int = 5, n: int = 2000) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(n):
            input_digest(value)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


if __name__ == "__main__":
    print(json.dumps({name: round(best_us(v), 1) for name, v in cases().items()}))
