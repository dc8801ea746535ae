"""The bare app's in-process batcher (``frontend_apps.py bare --model mlp``): the baseline that
parityserve's adaptive batching is held against under wrk (issue 17).

It batches the way a careful hand-written server would: queries that arrive while the model
runs wait, and the next batch takes up to ``max_batch_size`` of the oldest of them, so a busy
server batches and an idle one answers a lone query at once, with no timer. ``BatchQueue`` is
that rule with no I/O (unit-tested); ``Batcher`` drives it on the asyncio loop, running each
batch inline, in one thread, or (``hop``) as a coroutine: one round trip to a worker process,
for the ``floor`` app.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, Literal, TypeVar

import numpy as np

__all__ = ["BatchQueue", "Batcher", "RunMode", "split_outputs"]

T = TypeVar("T")
RunMode = Literal["inline", "thread", "hop"]


class BatchQueue(Generic[T]):
    """Who waits, and which batch runs next. One batch runs at a time (one model instance)."""

    def __init__(self, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self._waiting: deque[T] = deque()
        self.busy = False

    def submit(self, item: T) -> None:
        self._waiting.append(item)

    def next_batch(self) -> list[T]:
        """The oldest waiting items, at most ``max_batch_size``, and the model marked busy; or
        ``[]`` while a batch runs or none wait."""
        if self.busy or not self._waiting:
            return []
        take = min(len(self._waiting), self.max_batch_size)
        self.busy = True
        return [self._waiting.popleft() for _ in range(take)]

    def batch_done(self) -> None:
        self.busy = False

    def __len__(self) -> int:
        return len(self._waiting)


def split_outputs(outputs: Any, n: int) -> list[Any]:
    """One output per query of a batch of ``n``, in order; a model that returned a different
    number of rows is an error for the whole batch (which row belongs to whom is unknown)."""
    if len(outputs) != n:
        raise ValueError(f"the model returned {len(outputs)} outputs for a batch of {n}")
    return [outputs[i] for i in range(n)]


_Waiter = tuple[np.ndarray, "asyncio.Future[Any]"]


class Batcher:
    """``await batcher(row)`` -> that row's output, computed in a batch with its neighbours.

    ``inline`` runs ``predict`` on the event loop: nothing can arrive while it runs, but the
    requests that reached the socket meanwhile are parsed before the next batch starts (the
    batch starts from ``call_soon``, behind the handlers already runnable). ``thread`` runs it
    in one worker thread (torch releases the GIL), so the loop keeps parsing requests during
    the batch, at the price of a thread hand-off per batch. ``hop`` awaits ``predict(rows)``
    (a coroutine: a worker process computes the batch while the loop keeps parsing).
    """

    def __init__(self, predict: Callable[[np.ndarray], Any], max_batch_size: int,
                 run: RunMode = "inline") -> None:
        if run not in ("inline", "thread", "hop"):
            raise ValueError(f"run must be inline, thread or hop, got {run!r}")
        self._predict = predict
        self._run = run
        self._queue: BatchQueue[_Waiter] = BatchQueue(max_batch_size)
        self._pool = ThreadPoolExecutor(1, "batcher") if run == "thread" else None
        self._scheduled = False
        self.batches = 0  # for tests and a sanity check of the mean batch size
        self.queries = 0

    async def __call__(self, row: np.ndarray) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.submit((row, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        # Deferred, not started here: the handlers already runnable join this batch.
        if not self._scheduled and not self._queue.busy:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        batch = self._queue.next_batch()
        if not batch:
            return
        self.batches += 1
        self.queries += len(batch)
        rows = np.stack([row for row, _ in batch])
        if self._run == "hop":
            done = asyncio.ensure_future(self._predict(rows))
            done.add_done_callback(lambda f: self._finish(batch, *_outcome(f)))
            return
        if self._pool is None:
            self._finish(batch, *_call(self._predict, rows))
            return
        done = asyncio.get_running_loop().run_in_executor(self._pool, _call, self._predict, rows)
        done.add_done_callback(lambda f: self._finish(batch, *f.result()))

    def _finish(self, batch: Sequence[_Waiter], outputs: Any, error: BaseException | None
                ) -> None:
        if error is None:
            try:
                answers = split_outputs(outputs, len(batch))
            except ValueError as exc:
                error = exc
        for i, (_, future) in enumerate(batch):
            if future.done():  # its client went away
                continue
            if error is None:
                future.set_result(answers[i])
            else:
                future.set_exception(error)
        self._queue.batch_done()
        self._schedule()


def _outcome(done: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    if done.cancelled():
        return None, asyncio.CancelledError()
    error = done.exception()
    return (None, error) if error is not None else (done.result(), None)


def _call(predict: Callable[[np.ndarray], Any], rows: np.ndarray
          ) -> tuple[Any, BaseException | None]:
    """The model's outputs, or its exception as a value: one failed batch fails only its own
    queries, and the batcher goes on with the next."""
    try:
        return predict(rows), None
    except Exception as exc:
        return None, exc
