"""The run form of the stateful operator API: ``run(batch, state, event)``, the copy gate both
forms share, the write check, and the shipped example ``StreamMean`` (tiny sizes)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from torch import Tensor

torch = pytest.importorskip("torch")

from parityserve.errors import ModelLoadError  # noqa: E402
from parityserve.models._stateful_run import drive, has_stages  # noqa: E402
from parityserve.models.stateful import (  # noqa: E402
    CopyDone,
    CopyGate,
    OperatorBatch,
    StateBuffer,
    StateCopyTimeout,
    StreamMean,
    StreamTableFull,
    load_stateful,
    run_batch,
    stream_key,
    writes_before_event,
)


def go() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def batch(streams: str, x: Any) -> OperatorBatch:
    """One row per letter of ``streams`` ("." is a row with no stream)."""
    names = ["" if s == "." else s for s in streams]
    return OperatorBatch.from_numpy(np.asarray(x, np.float32).reshape(len(names), -1), names)


class RunCounter:
    """A run-form python: source under test: counts the rows it has seen. ``reached`` is set
    once it waits, so a test knows it is blocked on the gate and not still reading."""

    def __init__(self, step: int = 1) -> None:
        self.step = step
        self.reached = threading.Event()

    def initialize(self) -> dict[str, Tensor]:
        return {"seen": torch.zeros(1, dtype=torch.int64)}

    def run(self, batch: OperatorBatch, state: dict[str, Tensor], event: CopyDone) -> Tensor:
        out = state["seen"] + self.step * len(batch)
        self.reached.set()
        event.wait()
        state["seen"] += self.step * len(batch)
        return out


class EarlyWriter(RunCounter):
    """Breaks the rule: writes, then waits."""

    def run(self, batch: OperatorBatch, state: dict[str, Tensor], event: CopyDone) -> Tensor:
        state["seen"] += len(batch)
        event.wait()
        return state["seen"].clone()


class NeverWaits(RunCounter):
    """Breaks the rule: writes and never waits at all."""

    def run(self, batch: OperatorBatch, state: dict[str, Tensor], event: CopyDone) -> Tensor:
        state["seen"] += len(batch)
        return state["seen"].clone()


class BothForms(RunCounter):
    """Has compute/update too: it is driven by those (its outputs may leave early)."""

    def compute(self, batch: OperatorBatch, state: dict[str, Tensor]) -> tuple[Tensor, int]:
        return state["seen"] - len(batch), -len(batch)

    def update(self, state: dict[str, Tensor], pending: int) -> None:
        state["seen"] += pending


class RunOnly:
    def run(self, batch: Any, state: Any, event: Any) -> Any:
        return batch


# --- loading: either form ---------------------------------------------------------------


def test_load_stateful_accepts_the_run_form() -> None:
    op = load_stateful(f"python:{__name__}:RunCounter", {"step": 2})
    assert isinstance(op, RunCounter) and not has_stages(op)
    state = op.initialize()
    assert run_batch(op, batch("ab", [[1], [2]]), state, go()).tolist() == [4]
    assert state["seen"].tolist() == [4]
    assert isinstance(load_stateful("zoo:stream-mean", {"features": 2}), StreamMean)


def test_an_operator_with_both_forms_is_driven_by_compute_and_update() -> None:
    op = load_stateful(f"python:{__name__}:BothForms")
    state = op.initialize()
    assert has_stages(op)
    assert run_batch(op, batch("ab", [[1], [2]]), state, go()).tolist() == [-2]
    assert state["seen"].tolist() == [-2]


@pytest.mark.parametrize(("source", "match"), [
    (f"python:{__name__}:RunOnly", r"RunOnly is not a stateful operator: it fits neither form "
                                   r"\(the three-method form lacks initialize\(\), compute\(\), "
                                   r"update\(\)\); \(the run form lacks initialize\(\)\)"),
    (f"python:{__name__}:go", r"run\(batch, state, event\) -> outputs, which writes the state "
                              r"only after event.wait\(\) returns"),
])
def test_an_operator_of_neither_form_is_refused_naming_both(source: str, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        load_stateful(source)


# --- the gate ---------------------------------------------------------------------------------


def test_the_write_waits_for_the_copy_done_event() -> None:
    op, copied = RunCounter(), threading.Event()
    state = op.initialize()
    result: list[Tensor] = []
    runner = threading.Thread(target=lambda: result.append(
        run_batch(op, batch("a", [[1]]), state, copied, timeout_s=30)))
    runner.start()
    assert op.reached.wait(30)
    runner.join(0.2)
    assert runner.is_alive() and state["seen"].tolist() == [0]  # blocked, nothing written
    copied.set()
    runner.join(30)
    assert not runner.is_alive() and result[0].tolist() == [1] and state["seen"].tolist() == [1]


@pytest.mark.parametrize("op", [RunCounter(), BothForms()], ids=["run", "three-method"])
def test_a_copy_that_never_finishes_times_out_and_nothing_is_written(op: Any) -> None:
    state = op.initialize()
    with pytest.raises(StateCopyTimeout, match="within 0 s; the write must not run"):
        run_batch(op, batch("ab", [[1], [2]]), state, threading.Event(), timeout_s=0)
    assert state["seen"].tolist() == [0]


def test_the_gate_raises_rather_than_returning_false_and_the_shorter_limit_wins() -> None:
    gate = CopyGate(threading.Event(), timeout_s=30)
    with pytest.raises(StateCopyTimeout, match="within 0.01 s"):
        gate.wait(0.01)  # an operator's own shorter limit, honoured; never a silent False
    assert not gate.opened


def test_the_gate_holds_the_lock_from_opening_to_the_end_of_the_batch() -> None:
    lock = threading.Lock()
    with CopyGate(go(), lock=lock) as gate:
        assert not lock.locked()  # reading does not block the state manager's copy
        assert gate.wait() and gate.wait()  # a second wait is a no-op, not a second acquire
        assert lock.locked()
    assert not lock.locked()
    with CopyGate(threading.Event(), timeout_s=0, lock=lock) as never, \
            pytest.raises(StateCopyTimeout):
        never.wait()
    assert not lock.locked()


def test_a_gate_held_shut_beats_while_it_waits_and_still_times_out() -> None:
    """A graph primary waiting on a slow copy must be seen waiting, not silent (the frontend
    suspects a primary silent while it holds a batch): the gate calls back every ``every_s``."""
    copied, beats = threading.Event(), []
    threading.Timer(0.2, copied.set).start()
    with CopyGate(copied, while_waiting=lambda: beats.append(1), every_s=0.02) as gate:
        assert gate.wait()
    assert len(beats) >= 3  # about every 20 ms of the 200 ms wait (fewer on a loaded box)
    beats.clear()
    with CopyGate(threading.Event(), timeout_s=0.1, while_waiting=lambda: beats.append(1),
                  every_s=0.02) as never, pytest.raises(StateCopyTimeout, match="within 0.1 s"):
        never.wait()
    assert beats and not never.opened
    with CopyGate(go(), while_waiting=lambda: beats.append("no"), every_s=0.02) as open_:
        assert open_.wait() and "no" not in beats  # already copied: no wait, no beat


def test_early_outputs_come_before_the_update_in_one_form_and_after_the_run_in_the_other(
        ) -> None:
    for op, seen_when_early in ((BothForms(), 0), (RunCounter(), 1)):
        state = op.initialize()
        seen: list[int] = []
        with CopyGate(go()) as gate:
            drive(op, batch("a", [[1]]), state, gate,
                  early=lambda _out, s=state, into=seen: into.append(int(s["seen"])))
        assert seen == [seen_when_early]


def test_a_run_that_never_waits_still_leaves_the_gate_open() -> None:
    """The worker numbers the batch under the gate's lock: it must not come before the copy."""
    lock = threading.Lock()
    with CopyGate(go(), lock=lock) as gate:
        drive(NeverWaits(), batch("a", [[1]]), {"seen": torch.zeros(1, dtype=torch.int64)},
              gate)
        assert gate.opened and lock.locked()


def test_writes_before_the_event_are_found() -> None:
    for op, expected in ((RunCounter(), []), (EarlyWriter(), ["seen"]),
                         (NeverWaits(), ["seen"])):
        state = op.initialize()
        assert writes_before_event(op, batch("ab", [[1], [2]]), state) == expected
        assert state["seen"].tolist() == [2]  # the batch ran for real
    mean = StreamMean(features=1)
    assert writes_before_event(mean, batch("a.", [[1], [2]]), mean.initialize()) == []


# --- StreamMean ---------------------------------------------------------------------------


def feed(op: StreamMean, state: dict[str, Tensor], *batches: OperatorBatch) -> Tensor:
    return torch.cat([run_batch(op, b, state, go()) for b in batches])


def test_stream_mean_outputs_each_streams_running_mean() -> None:
    op = StreamMean(features=2, max_streams=4)
    state = op.initialize()
    out = feed(op, state, batch("ab", [[1, 10], [5, 50]]), batch("aa", [[3, 30], [8, 80]]),
               batch("b", [[7, 70]]))
    expected = [[1, 10], [5, 50], [2, 20], [4, 40], [6, 60]]  # a: 1, 1+3, 1+3+8; b: 5, 5+7
    assert out.dtype == torch.float32 and out.tolist() == expected
    assert state["keys"].tolist() == [stream_key("a"), stream_key("b"), 0, 0]
    assert state["count"].tolist() == [3, 2, 0, 0]
    assert state["sum"][:2].tolist() == [[12, 120], [12, 120]]


def test_stream_mean_rows_without_a_stream_output_themselves_and_are_not_kept() -> None:
    op = StreamMean(features=1)
    state = op.initialize()
    assert feed(op, state, batch(".a.", [[4], [6], [9]])).tolist() == [[4], [6], [9]]
    assert state["count"].sum().item() == 1 and int(state["keys"].count_nonzero()) == 1


def test_stream_mean_state_on_a_backup_continues_every_stream() -> None:
    primary, backup = StreamMean(features=1), StreamMean(features=1)
    p_state, b_state = primary.initialize(), backup.initialize()
    feed(primary, p_state, batch("ab", [[2], [4]]))
    buffer = StateBuffer(p_state)
    buffer.capture(p_state)
    buffer.install(b_state)
    later = batch("ba", [[6], [0]])
    assert feed(backup, b_state, later).tolist() == [[5], [1]]
    assert feed(primary, p_state, later).tolist() == [[5], [1]]


def test_stream_mean_full_table_raises_before_writing() -> None:
    op = StreamMean(features=1, max_streams=1)
    state = op.initialize()
    feed(op, state, batch("a", [[1]]))
    before = {k: v.clone() for k, v in state.items()}
    with pytest.raises(StreamTableFull, match="max_streams=1 .*no slot is left") as full:
        feed(op, state, batch("ab", [[1], [2]]))
    assert full.value.rows == (1,)
    assert all(torch.equal(before[k], v) for k, v in state.items())


def test_stream_mean_noise_makes_a_replay_diverge_and_none_keeps_it_exact() -> None:
    def replays(noise: float) -> list[Tensor]:
        ops = [StreamMean(features=2, noise=noise), StreamMean(features=2, noise=noise)]
        return [feed(op, op.initialize(), batch("ab", [[1, 2], [3, 4]]),
                     batch("a", [[5, 6]])) for op in ops]

    noisy = replays(1e-3)
    assert not torch.equal(*noisy)
    torch.testing.assert_close(*noisy, rtol=0, atol=0.1)
    assert torch.equal(*replays(0.0))


@pytest.mark.parametrize(("options", "match"), [
    ({"features": 0}, "features must be an int >= 1, got 0"),
    ({"max_streams": 1.5}, "max_streams must be an int >= 1, got 1.5"),
    ({"noise": -1.0}, "noise must be a finite number >= 0, got -1.0"),
    ({"noise": float("inf")}, "noise must be a finite number >= 0, got inf"),
])
def test_stream_mean_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamMean(**options)


def test_stream_mean_rejects_a_wrong_width_or_a_bare_tensor_before_writing() -> None:
    op = StreamMean(features=2)
    state = op.initialize()
    with pytest.raises(ValueError, match=r"features=2\) takes 2 features .*got shape \[1, 3\]"):
        run_batch(op, batch("a", [[1, 2, 3]]), state, go())
    with pytest.raises(TypeError, match="takes an OperatorBatch, got Tensor"):
        op.run(torch.zeros(1, 2), state, go())  # type: ignore[arg-type]
    assert not bool(state["count"].any())
