"""Fair batch formation (parityserve.core.fair_queue and RequestManager.form_batch): one
client's big request never puts another client's query behind all of its rows."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from parityserve.core.fair_queue import FairQueue
from parityserve.core.hams.lineage import FRONTEND
from parityserve.core.hams.requests import Arrival, RequestManager


def test_a_one_row_request_rides_the_next_batch_behind_a_1024_row_flood() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(1024):
        queue.append("flood", f"f{i}")
    queue.append("good", "g")
    first = queue.take(64)
    assert "g" in first  # FIFO: it would wait for sixteen full batches
    assert first[:2] == ["f0", "g"]
    assert len(first) == 64 and len(queue) == 1024 - 63


def test_without_origins_it_is_a_fifo() -> None:
    queue: FairQueue[int] = FairQueue((None, i) for i in range(10))
    assert queue.take(4) == [0, 1, 2, 3]
    assert list(queue) == [4, 5, 6, 7, 8, 9]


def test_an_odd_kind_sits_the_batch_out_without_cutting_it_short() -> None:
    queue: FairQueue[tuple[int, ...]] = FairQueue()
    queue.append("a", (4,))
    queue.append("odd", (2,))
    queue.append("b", (4,))
    queue.append("a", (4,))
    batch = queue.take(8, kind=lambda shape: shape[0])
    assert batch == [(4,), (4,), (4,)]
    assert queue.take(8, kind=lambda shape: shape[0]) == [(2,)]
    assert len(queue) == 0 and queue.lanes() == 0


def test_remove_keeps_turns_and_empties_lanes() -> None:
    queue: FairQueue[int] = FairQueue([("a", 1), ("b", 2), ("a", 3), ("c", 4)])
    assert queue.remove(lambda x: x % 2 == 0) == [2, 4]
    assert len(queue) == 2 and queue.lanes() == 1
    assert queue.take(5) == [1, 3]


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), max_size=60),
       st.integers(1, 9), st.booleans())
def test_every_item_leaves_once_in_its_lanes_order_and_lanes_share_batches(
        items: list[tuple[int, int]], limit: int, by_kind: bool) -> None:
    queue: FairQueue[tuple[int, int, int]] = FairQueue()
    for n, (origin, kind) in enumerate(items):
        queue.append(origin, (origin, kind, n))
    out: list[tuple[int, int, int]] = []
    while len(queue):
        before = Counter(item[0] for item in queue)
        batch = queue.take(limit, kind=(lambda item: item[1]) if by_kind else None)
        assert batch and len(batch) <= limit
        if by_kind:
            assert len({item[1] for item in batch}) == 1
        else:  # turns: a lane got two fewer than another only if it ran out
            got = Counter(item[0] for item in batch)
            most = max(got.values())
            for origin, waiting in before.items():
                assert got[origin] >= most - 1 or got[origin] == waiting
        out.extend(batch)
    assert sorted(n for *_, n in out) == list(range(len(items)))
    for origin in {o for o, _ in items}:
        mine = [n for o, _, n in out if o == origin]
        assert mine == sorted(mine)


def _arrival(client: int, origin: object) -> Arrival[int]:
    return Arrival((), ((FRONTEND, client),), client, origin)


def test_an_operator_batch_takes_turns_between_requests_and_numbers_in_execution_order() -> None:
    rm: RequestManager[int] = RequestManager("feat")
    flood, good = object(), object()
    for client in range(1, 201):
        rm.offer(_arrival(client, flood))
    rm.offer(_arrival(500, good))
    batch = rm.form_batch(64)
    assert [e.arrival.payload for e in batch[:2]] == [1, 500]
    assert [e.seq for e in batch] == list(range(1, 65))
    assert rm.queued() == 201 - 64
