"""The prediction cache's byte count covers what its entries hold (issue 38: frontend memory
bounded). ``server.cache_bytes`` is the budget the cache evicts against, so an entry must be
counted at what it costs: its value, its key and the cache's bookkeeping. Before, a 4-float
row counted 80 bytes and held about 500, so the 64 MiB default could hold some 400 MiB.
Measured with tracemalloc, which sees CPython's and numpy's allocations."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from parityserve.core.cache import ClockCache, cache_key, input_digest
from parityserve.runtime.modelpath.dispatch import _nbytes, _own


def _held_and_counted(output: Callable[[int], Any], inputs: np.ndarray) -> tuple[int, int]:
    """Bytes traced while each input's output is made and cached, and the bytes counted."""
    cache: ClockCache[tuple[str, int, bytes], Any] = ClockCache(1 << 40)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, x in enumerate(inputs):
            value = _own(output(i))  # what dispatch caches: its own copy of the row
            cache.put(cache_key("vec", 1, input_digest(x)), (value,), _nbytes(value))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held, cache.statistics().bytes_used


@pytest.mark.parametrize("width", [1, 4, 1000])
def test_an_array_entry_is_counted_at_what_it_holds(width: int) -> None:
    rng = np.random.default_rng(width)
    inputs = rng.standard_normal((5000, 4)).astype(np.float32)
    batch = rng.standard_normal((5000, width)).astype(np.float32)  # one batch's outputs
    held, counted = _held_and_counted(lambda i: batch[i], inputs)
    assert 0.9 * held <= counted <= 1.5 * held, (held / 5000, counted / 5000)


def test_other_outputs_are_counted_at_what_they_hold() -> None:
    inputs = np.random.default_rng(1).standard_normal((3000, 4)).astype(np.float32)
    held, counted = _held_and_counted(
        lambda i: {"label": f"class-{i % 10}", "score": float(i)}, inputs)
    assert 0.9 * held <= counted <= 1.5 * held, (held / 3000, counted / 3000)


def test_a_string_output_is_not_counted_twice() -> None:
    inputs = np.random.default_rng(2).standard_normal((2000, 4)).astype(np.float32)
    held, counted = _held_and_counted(lambda i: f"label-{i}-" + "x" * 2000, inputs)
    assert 0.9 * held <= counted <= 1.5 * held, (held / 2000, counted / 2000)
