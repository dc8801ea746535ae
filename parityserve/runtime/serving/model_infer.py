"""A V2 inference request straight to one model: every row of the batch is a query.

The request is admitted whole or shed whole, each row goes through the model path (cache,
queue, batching, redundancy), and the answer is all rows or an error: 504 past the deadline,
503 when a worker failed, the model's own error otherwise. Rows rebuilt by decoding are named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    Overloaded,
    QueueFull,
    Unavailable,
    WorkerError,
)
from parityserve.runtime.modelpath.dispatch import ModelPath, QueryExpired
from parityserve.runtime.serving.settle import settle

__all__ = ["infer_rows"]


async def infer_rows(path: ModelPath, batch: np.ndarray, clock: Callable[[], float],
                     timeout_s: float | None = None, *, cache: bool = True
                     ) -> tuple[np.ndarray, dict[int, str]]:
    """The stacked outputs, and which rows were rebuilt by decoding (row -> method). The
    deadline is the deployment's ``timeout_ms``, or the client's own ``timeout_s`` when that
    ends first: rows still queued when the client has given up are dropped, not computed.
    ``cache=False``: the prediction cache is neither read nor filled."""
    _check_batch(path, batch)
    allowed = path.deployment.timeout_ms / 1000
    if timeout_s is not None:
        if timeout_s <= 0:
            raise DeadlineExceeded(f"model {path.name!r}: the client's deadline had passed "
                                   "when the request was read")
        allowed = min(allowed, timeout_s)
    deadline = clock() + allowed
    path.admit(len(batch), deadline)  # all rows or none: a request is shed whole
    futures = [_submit_row(path, row, deadline, cache) for row in batch]
    await settle(futures, max(0.0, deadline - clock()))
    for row, future in enumerate(futures):
        _raise_failure(future, path, row, allowed * 1000)
    rebuilt = {i: m for i, f in enumerate(futures)
               if (m := path.reconstruction(f)) is not None}
    return _stacked([np.asarray(f.result()) for f in futures]), rebuilt


def _stacked(rows: list[np.ndarray]) -> np.ndarray:
    # One row is most requests: a view with a batch axis costs 0.1 us, np.stack 2.4 us.
    return rows[0][np.newaxis] if len(rows) == 1 else np.stack(rows)


def _check_batch(path: ModelPath, batch: np.ndarray) -> None:
    if not path.has_capacity():
        raise Unavailable(f"model {path.name!r} has no running replica")
    if batch.ndim == 0:
        raise InvalidInput(f"model {path.name!r}: the input tensor is a scalar (shape []); "
                           "its first axis is the batch, so send shape [1, ...]")
    if len(batch) == 0:
        raise InvalidInput(f"model {path.name!r}: the input tensor has zero rows; send at "
                           "least one")
    _check_finite(batch, path)


def _check_finite(batch: np.ndarray, path: ModelPath) -> None:
    """NaN and infinity are refused unless the deployment sets ``allow_nonfinite``."""
    if path.deployment.allow_nonfinite or batch.dtype.kind not in "fc":
        return
    if not np.isfinite(batch).all():
        bad = int(np.count_nonzero(~np.isfinite(batch)))
        raise InvalidInput(f"model {path.name!r}: the input holds {bad} non-finite values "
                           "(NaN or infinity); set allow_nonfinite: true on the deployment "
                           "to accept them")


def _submit_row(path: ModelPath, row: Any, deadline: float, cache: bool
                ) -> asyncio.Future[Any]:
    try:
        future: asyncio.Future[Any] = path.submit(row, deadline, admitted=True,
                                                  cache=cache)[0]
    except QueueFull as exc:  # an explicit server.max_queue is full
        path.shed += 1
        raise Overloaded(f"model {path.name!r} is overloaded: {exc}", model=path.name,
                         depth=len(path.queue), retry_after_s=1.0) from exc
    return future


def _raise_failure(future: asyncio.Future[Any], path: ModelPath, row: int,
                   timeout: float) -> None:
    """The V2 answer for a row that did not succeed (``timeout``: the milliseconds it was
    given). A row the model raised on alone (its batch-mates, other clients' rows among
    them, were answered) is named."""
    if not future.done():
        raise DeadlineExceeded(f"model {path.name!r} did not answer within {timeout:g} ms")
    error = future.exception()
    if isinstance(error, QueryExpired):
        raise DeadlineExceeded(f"{error} (timeout {timeout:g} ms)") from error
    if isinstance(error, WorkerError):
        raise Unavailable(f"model {path.name!r}: {error}") from error
    if isinstance(error, InvalidInput):
        raise InvalidInput(f"row {row} of the input: {error}") from error
    if error is not None:
        raise error
