"""The graph runtime's batch isolation, its send path and its watchdog, without processes
(issue 38, items 1 and 2).

``GraphRuntime`` runs with a fake link (``WorkerLink`` replaced) and a fake primary that
answers each batch the way ``hams_worker`` does: outputs for the rows it takes, a refusal
for each row of the wrong width. A fake model path serves the stateless operator. The
clock is a number the test moves. Each test checks what a client sees (a prediction, or
its own row's error) and that nothing is left behind: no batch in flight, no per-request
record, and the graph still answers.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Coroutine
from typing import Any, cast

import numpy as np
import pytest

from parityserve.config import Deployment, Graph, GraphOperator
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    PredictError,
    TooManyStreams,
    WorkerError,
)
from parityserve.runtime.graphs import hams_graph
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_graph import GraphAnswer, GraphRuntime
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_replay import ReplayLog
from parityserve.runtime.workers import wire

WID = "g/seq/primary-1"
GOOD, BAD = [1.0, 2.0, 3.0, 4.0], [1.0, 2.0]


class FakeLink:
    """Stands in for ``WorkerLink``: records what is sent and lets a test fail a send."""

    instances: list[FakeLink] = []

    def __init__(self, *_: Any, **__: Any) -> None:
        self.address = "tcp://fake"
        self.sent: list[tuple[str, dict[str, Any], list[Any]]] = []
        self.on_send: Callable[[dict[str, Any], list[Any]], None] | None = None
        self.fail_sends = 0
        FakeLink.instances.append(self)

    def send(self, worker_id: str, header: dict[str, Any], buffers: list[Any] | None = None
             ) -> None:
        if self.fail_sends:
            self.fail_sends -= 1
            raise WorkerError(f"cannot reach replica {worker_id}")
        self.sent.append((worker_id, header, list(buffers or [])))
        if self.on_send is not None:
            self.on_send(header, list(buffers or []))

    def start(self, handler: Any) -> None: ...

    def forget(self, worker_id: str) -> None: ...

    def expect(self, worker_id: str, key: bytes) -> None: ...

    async def close(self) -> None: ...


class FakePopen:
    pid = 4242

    def poll(self) -> int | None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def echo_infer(model: str, rows: np.ndarray) -> np.ndarray:
    """The stateless operator: an echo that, like a model without a signature, cannot stack
    rows of two widths; here it also refuses rows holding 666."""
    if (rows == 666).any():
        raise InvalidInput(f"model {model!r}: 666 is not a feature")
    return rows.copy()


class Harness:
    """A graph ``feat`` (stateless) -> ``seq`` (stateful) with a fake primary."""

    def __init__(self, mode: str = "bare", infer: Any = echo_infer,
                 input_shape: tuple[int, ...] | None = None) -> None:
        self.clock = Clock()
        graph = Graph(name="g", fault_tolerance=mode, timeout_ms=1000, max_batch=8,
                      input_shape=input_shape,
                      operators=[GraphOperator(name="feat", model="features",
                                               inputs=["frontend"]),
                                 GraphOperator(name="seq", model="lstm", inputs=["feat"],
                                               stateful=True)],
                      output="seq")
        models = {"features": Deployment(name="features", source="zoo:echo"),
                  "lstm": Deployment(name="lstm", source="zoo:stream-lstm")}
        self.runtime = GraphRuntime(graph, models, infer, keys=None, clock=self.clock)
        self.link = cast(FakeLink, self.runtime.link)
        self.answering = True
        self.busy_streams: set[str] = set()
        hello: asyncio.Future[hm.Hello] = asyncio.get_running_loop().create_future()
        hello.set_result(hm.Hello("primary", FakePopen.pid))
        spec = hp.OperatorSpec(worker_id=WID, op="seq", source="zoo:stream-lstm",
                               role="primary", mode=mode)
        member = Member(spec, cast(subprocess.Popen, FakePopen()), None, 0.0, hello)
        self.runtime.pairs["seq"].primary = member
        self.runtime.members.by_id[WID] = ("seq", member)
        self.link.on_send = self._worker

    def _worker(self, header: dict[str, Any], buffers: list[Any]) -> None:
        """The primary: doubles rows of width 4, refuses the others (as hams_worker does),
        and has no room for the streams in ``busy_streams``."""
        if header["t"] != hp.BATCH or not self.answering:
            return
        inputs = np.array(wire.unpack_payload(header["inputs"], buffers[:1]))
        ok = [i for i, row in enumerate(inputs) if row.shape == (4,)
              and header["streams"][i] not in self.busy_streams]
        refused = [[i, "busy", "StreamTableFull: no slot", 7.0]
                   if header["streams"][i] in self.busy_streams
                   else [i, "bad_input", f"ValueError: got shape {list(inputs[i].shape)}", 0.0]
                   for i in range(len(inputs)) if i not in ok]
        reply: dict[str, Any] = {"t": hp.OUT, "bid": header["bid"], "refused": refused}
        frames: list[Any] = []
        if ok:
            reply["outputs"], frames = wire.pack_payload(np.stack([inputs[i] * 2 for i in ok]))
            reply["rows"] = ok
        loop = asyncio.get_running_loop()
        loop.call_soon(self.runtime.inbox.on_message, WID, reply, [bytes(f) for f in frames])

    async def ask(self, *rows: list[float], streams: list[str] | None = None
                  ) -> list[GraphAnswer | BaseException]:
        """Each row as its own request, all at once; each one's answer or error."""
        names = streams or [f"s{i}" for i in range(len(rows))]
        calls = [self.runtime.predict([np.asarray(r, dtype=np.float32)], [name], [-1], 5.0)
                 for r, name in zip(rows, names, strict=True)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        return [r[0] if isinstance(r, list) else r for r in results]

    def left_behind(self) -> dict[str, Any]:
        stats = self.runtime.statistics()
        return {"inflight": {op: s["inflight"] for op, s in stats["operators"].items()
                             if s["inflight"]},
                "queued": {op: s["queued"] for op, s in stats["operators"].items()
                           if s["queued"]},
                "waiting": stats["waiting"], "records": stats["records"]}


NOTHING = {"inflight": {}, "queued": {}, "waiting": 0, "records": 0}


def run(test: Callable[[], Coroutine[Any, Any, None]], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr(hams_graph, "WorkerLink", FakeLink)
    asyncio.run(test())


def answered(result: Any, row: list[float]) -> bool:
    return isinstance(result, GraphAnswer) and result.output.tolist() == [2 * x for x in row]


# --- bad rows fail alone ----------------------------------------------------------------------


def test_rows_of_two_widths_share_no_batch_and_only_the_bad_ones_fail(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        rows = [GOOD, BAD, GOOD, BAD, GOOD, GOOD]
        results = await h.ask(*rows)
        for row, result in zip(rows, results, strict=True):
            if row is GOOD:
                assert answered(result, row), result
            else:  # refused by the stateful primary, naming the operator and the shape
                assert isinstance(result, InvalidInput) and "seq: ValueError: got shape [2]" \
                    in str(result)
        assert h.left_behind() == NOTHING
        # nothing declared, nothing learned from the rows answered: a client could choose it
        assert h.runtime.input_shape is None
        later = await h.ask(BAD, GOOD)
        assert isinstance(later[0], InvalidInput) and "seq: " in str(later[0])
        assert answered(later[1], GOOD)
        batches = [h for _, h, _ in h.link.sent if h["t"] == hp.BATCH]
        widths = [{len(r) for r in np.array(wire.unpack_payload(b["inputs"], f[:1]))}
                  for (_, b, f) in [x for x in h.link.sent if x[1]["t"] == hp.BATCH]]
        assert batches and all(len(w) == 1 for w in widths)  # never two widths in a batch

    run(test, monkeypatch)


def test_a_declared_input_shape_refuses_other_shapes_before_any_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness(input_shape=(4,))
        assert h.runtime.input_shape == (4,)
        for row in (BAD, [[1.0, 2.0], [3.0, 4.0]]):
            with pytest.raises(InvalidInput, match=r"takes rows of shape \[4\].* has shape"):
                await h.runtime.predict([np.asarray(row, np.float32)], ["x"], [-1], 5.0)
        assert not h.link.sent  # refused at the door: no operator saw them
        assert answered((await h.ask(GOOD))[0], GOOD)
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)


def test_a_stateless_operator_batch_is_searched_for_the_rows_its_model_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def counting(model: str, rows: np.ndarray) -> np.ndarray:
        calls.append(len(rows))
        return await echo_infer(model, rows)

    async def test() -> None:
        h = Harness(infer=counting)
        rows = [GOOD, [666.0, 0, 0, 0], GOOD, GOOD]
        results = await h.ask(*rows)
        assert answered(results[0], GOOD) and answered(results[2], GOOD)
        assert isinstance(results[1], InvalidInput) and "666" in str(results[1])
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)
    assert len(calls) > 1  # the batch was split after its model raised


def test_a_row_without_room_in_the_stream_table_gets_429_and_its_batch_mates_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        h.busy_streams = {"new"}
        results = await h.ask(GOOD, GOOD, GOOD, streams=["old1", "new", "old2"])
        assert answered(results[0], GOOD) and answered(results[2], GOOD)
        assert isinstance(results[1], TooManyStreams) and results[1].retry_after_s == 7.0
        assert results[1].status_code == 429
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)


def test_a_request_of_several_rows_names_the_row_that_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        h.busy_streams = {"b"}
        rows = [np.asarray(GOOD, np.float32)] * 3
        with pytest.raises(TooManyStreams, match=r"^input_batch\[1\]: seq: StreamTableFull"):
            await h.runtime.predict(rows, ["a", "b", "c"], [-1, -1, -1], 5.0)
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)


# --- no exception on the send or answer path leaves a batch in flight -------------------------


def fail_once(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``target.name`` raises on its first call, then works."""
    real = getattr(target, name)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"injected: {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


STEPS = {  # step of the path -> (how to break it once, the mode, the error the rows get)
    "pack the inputs": (lambda h, mp: fail_once(wire, "pack_payload", mp), "bare",
                        PredictError),
    "build the header": (lambda h, mp: fail_once(h.runtime.dispatch, "batch_message", mp), "bare",
                         PredictError),
    "log the batch": (lambda h, mp: fail_once(ReplayLog, "logged", mp), "checkpoint-replay",
                      PredictError),
    "put it in flight": (lambda h, mp: fail_once(h.runtime.inflight["seq"], "add", mp), "bare",
                         PredictError),
    "read the answer": (lambda h, mp: fail_once(hm, "_outputs", mp), "bare",
                        PredictError),
    "deliver the outputs": (lambda h, mp: fail_once(h.runtime.router, "output", mp), "bare",
                            PredictError),
    "form the next batch": (lambda h, mp: fail_once(h.runtime.router, "batch", mp), "bare",
                            None),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_an_exception_at_any_step_of_the_send_path_leaves_no_batch_in_flight(
        step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        inject, mode, error = STEPS[step]
        h = Harness(mode=mode)
        inject(h, monkeypatch)
        results = await asyncio.wait_for(h.ask(GOOD, GOOD, GOOD), 5)
        if error is None:  # a batch never formed: its rows run with the next pump
            assert all(answered(r, GOOD) for r in results), results
        else:  # the batch it hit fails (a 500, the step named), and only that batch
            failed = [r for r in results if isinstance(r, Exception)]
            assert failed and all(isinstance(r, error) for r in failed), results
            assert all(answered(r, GOOD) for r in results if not isinstance(r, Exception))
        assert h.left_behind() == NOTHING
        assert all(answered(r, GOOD) for r in await h.ask(GOOD, GOOD))  # and it serves on

    run(test, monkeypatch)


# --- the watchdog and readiness -----------------------------------------------------------------


def test_work_left_queued_by_a_failed_pass_is_sent_by_the_next_watchdog_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        fail_once(h.runtime.router, "batch", monkeypatch)  # the only pass there will be
        asking = asyncio.ensure_future(h.ask(GOOD))
        while not h.runtime.router.managers["feat"].queued():
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not asking.done()  # nothing else would ever send it
        h.runtime.dispatch.expire(h.clock())
        assert answered((await asyncio.wait_for(asking, 5))[0], GOOD)
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)


def test_a_batch_that_never_comes_back_is_failed_counted_and_the_graph_heals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        expired: list[tuple[str, int]] = []
        h.runtime.on_expired = lambda op, n: expired.append((op, n))
        h.link.fail_sends = 1  # the first batch never reaches the primary
        asking = asyncio.ensure_future(h.ask(GOOD))
        while not h.runtime.inflight["seq"]:
            await asyncio.sleep(0)
        h.runtime.dispatch.expire(h.clock())
        assert h.runtime.ready()  # in flight, but not for long yet
        h.clock.now += 1.5  # past timeout_ms (1 s)
        assert not h.runtime.ready() and h.runtime.stalled() == ["seq"]
        h.runtime.dispatch.expire(h.clock())
        results = await asyncio.wait_for(asking, 5)
        assert all(isinstance(r, DeadlineExceeded) and "watchdog" in str(r) for r in results)
        assert expired == [("seq", 1)] and h.left_behind() == NOTHING
        assert h.runtime.statistics()["operators"]["seq"]["expired_batches"] == 1
        assert all(answered(r, GOOD) for r in await h.ask(GOOD))  # it serves again
        h.runtime.dispatch.expire(h.clock())
        assert h.runtime.ready()

    run(test, monkeypatch)


def test_an_operator_that_answers_nothing_stays_not_ready_while_it_has_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def test() -> None:
        h = Harness()
        h.answering = False  # a primary alive but mute: every batch expires

        async def one_more() -> asyncio.Future[Any]:
            out = len(h.runtime.inflight["seq"])
            asking = asyncio.ensure_future(h.ask(GOOD))
            while len(h.runtime.inflight["seq"]) == out:
                await asyncio.sleep(0)
            return asking

        asking = await one_more()
        assert h.runtime.ready()  # just sent
        for _ in range(3):
            h.clock.now += 1.5
            assert not h.runtime.ready()
            asking = await one_more()  # more work while the old batch is still out
            h.runtime.dispatch.expire(h.clock())  # the old one expires: failing is not progress,
            assert not h.runtime.ready()  # nor is the new batch sent
        h.answering = True
        assert all(answered(r, GOOD) for r in await h.ask(GOOD))  # it answers again
        h.clock.now += 1.5
        h.runtime.dispatch.expire(h.clock())  # the mute one's batch goes, the graph is ready
        assert isinstance((await asking)[0], DeadlineExceeded)
        assert h.runtime.ready() and h.left_behind() == NOTHING

    run(test, monkeypatch)


# --- a malformed message from an operator ---------------------------------------------------


def test_a_malformed_message_from_an_operator_is_dropped_counted_and_the_graph_answers_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed once at the edge (``hams_messages``): a message that does not parse is
    dropped and counted by the kind it claimed (an unknown kind as "unknown": a bounded
    label), and never reaches a handler. Before, a missing field raised inside one."""
    async def test() -> None:
        h = Harness()
        errors: list[str] = []
        h.runtime.on_protocol_error = errors.append
        for header in ({"t": hp.DURABLE}, {"t": hp.OUT, "bid": "1"}, {"t": "h.nonsense"},
                       {"t": hp.PROMOTED, "seq": 1.5}, {"t": hp.CHECKPOINT, "seq": None}):
            h.runtime.inbox.on_message(WID, header, [])
        assert errors == [hp.DURABLE, hp.OUT, "unknown", hp.PROMOTED, hp.CHECKPOINT]
        assert all(answered(r, GOOD) for r in await h.ask(GOOD, GOOD))
        assert h.left_behind() == NOTHING

    run(test, monkeypatch)


def test_an_unreadable_answer_fails_its_batch_at_once_and_is_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer whose batch is known but whose body does not parse: counted, and the
    batch's rows fail now (a 500 naming the operator), not at the watchdog."""
    async def test() -> None:
        h = Harness()
        errors: list[str] = []
        h.runtime.on_protocol_error = errors.append
        h.answering = False
        asking = asyncio.ensure_future(h.ask(GOOD))
        while not h.runtime.inflight["seq"]:
            await asyncio.sleep(0)
        bid = [b for _, b, _ in h.link.sent if b["t"] == hp.BATCH][-1]["bid"]
        h.runtime.inbox.on_message(WID, {"t": hp.OUT, "bid": bid, "outputs": {
            "k": "nd", "dtype": "<f4", "shape": [1, 4]}}, [b"\0" * 3])
        (result,) = await asyncio.wait_for(asking, 5)
        assert isinstance(result, PredictError) and "seq: its answer could not be read" \
            in str(result)
        assert errors == [hp.OUT] and h.left_behind() == NOTHING
        h.answering = True
        assert answered((await h.ask(GOOD))[0], GOOD)

    run(test, monkeypatch)


def test_the_metric_of_malformed_graph_messages_follows_the_naming_conventions() -> None:
    from parityserve.runtime.modelpath.metrics import Metrics

    metrics = Metrics()
    metrics.graph_protocol_error("stocks", hp.OUT)
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for m in metrics.registry.collect() for s in m.samples}
    assert found[("parityserve_graph_protocol_errors_total",
                  (("graph", "stocks"), ("kind", hp.OUT)))] == 1
