"""The bare app's in-process batcher (benchmarks/frontend_batcher.py): the baseline's batching
must be right before parityserve is held to it."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from benchmarks.frontend_batcher import Batcher, BatchQueue, split_outputs


def test_queue_takes_the_oldest_up_to_the_max_and_one_batch_at_a_time() -> None:
    queue: BatchQueue[str] = BatchQueue(2)
    assert queue.next_batch() == []  # nothing waits
    for item in "abcde":
        queue.submit(item)
    assert queue.next_batch() == ["a", "b"]
    assert queue.next_batch() == []  # the model is busy
    queue.submit("f")
    queue.batch_done()
    assert queue.next_batch() == ["c", "d"]
    queue.batch_done()
    assert queue.next_batch() == ["e", "f"] and len(queue) == 0


def test_queue_refuses_a_max_below_one() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchQueue(0)


def test_split_outputs_refuses_a_wrong_number_of_rows() -> None:
    assert split_outputs(np.arange(3), 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="2 outputs for a batch of 3"):
        split_outputs(np.arange(2), 3)


class _Model:
    """Ten times each input; records each batch's first column; fails a batch holding -1."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        self.batches.append(rows[:, 0].tolist())
        if (rows == -1).any():
            raise RuntimeError("bad batch")
        return rows * 10


def _as(run: str, model: _Model) -> object:
    """The model as the batcher of ``run`` calls it: ``hop`` awaits a coroutine (the floor
    app's round trip to a worker process), the others call it."""
    if run != "hop":
        return model

    async def round_trip(rows: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0)  # the loop runs on while the "worker" computes
        return model(rows)

    return round_trip


async def _ask(batcher: Batcher, values: list[float]) -> list[object]:
    return await asyncio.gather(*(batcher(np.array([v, v])) for v in values),
                                return_exceptions=True)


@pytest.mark.parametrize("run", ["inline", "thread", "hop"])
def test_each_query_gets_its_own_answer_in_batches_of_at_most_the_max(run: str) -> None:
    model = _Model()
    answers = asyncio.run(_ask(Batcher(_as(run, model), 2, run), [1, 2, 3, 4, 5]))  # type: ignore[arg-type]
    assert [a.tolist() for a in answers] == [[v * 10, v * 10] for v in (1, 2, 3, 4, 5)]
    assert model.batches == [[1, 2], [3, 4], [5]]


@pytest.mark.parametrize("run", ["inline", "thread", "hop"])
def test_a_failing_batch_fails_only_its_own_queries(run: str) -> None:
    model = _Model()
    answers = asyncio.run(_ask(Batcher(_as(run, model), 2, run), [1, 2, -1, 4, 5]))  # type: ignore[arg-type]
    assert model.batches == [[1, 2], [-1, 4], [5]]
    assert [a.tolist() for a in answers[:2]] == [[10, 10], [20, 20]]  # type: ignore[union-attr]
    assert all(isinstance(a, RuntimeError) for a in answers[2:4])
    assert answers[4].tolist() == [50, 50]  # type: ignore[union-attr]


def test_a_model_answering_the_wrong_number_of_rows_fails_that_batch() -> None:
    answers = asyncio.run(_ask(Batcher(lambda rows: rows[:1], 4), [1, 2]))
    assert all(isinstance(a, ValueError) for a in answers)


def test_queries_arriving_while_a_batch_runs_make_the_next_batch() -> None:
    started, release = threading.Event(), threading.Event()
    model = _Model()

    def slow(rows: np.ndarray) -> np.ndarray:
        started.set()
        release.wait(10)
        return model(rows)

    async def scenario() -> list[object]:
        batcher = Batcher(slow, 8, "thread")
        first = asyncio.ensure_future(batcher(np.array([1.0, 1.0])))
        await asyncio.to_thread(started.wait, 10)  # the first batch is in the model
        rest = [asyncio.ensure_future(batcher(np.array([v, v]))) for v in (2.0, 3.0, 4.0)]
        await asyncio.sleep(0)  # a yield, no wait: they queue behind the running batch
        release.set()
        return [await first, *[await r for r in rest]]

    answers = asyncio.run(scenario())
    assert model.batches == [[1], [2, 3, 4]]
    assert [a.tolist()[0] for a in answers] == [10, 20, 30, 40]  # type: ignore[attr-defined]
