"""The graph door's stream gate (parityserve.core.hams.door.StreamGate): while a stateful
operator says its stream table has no room, a row of a stream it does not hold is refused at
the door; streams it holds, streamless rows and everything after the retry time pass."""

from __future__ import annotations

import pytest

from parityserve.core.hams.door import Closed, StreamGate


def test_open_until_an_operator_refuses() -> None:
    gate = StreamGate(["seq1", "seq2"])
    assert gate.closed(["a", "b"], now=0.0) is None


def test_a_new_stream_is_refused_until_the_retry_time_and_held_streams_pass() -> None:
    gate = StreamGate(["seq1", "seq2"])
    gate.took("seq1", "old")
    gate.refused("seq1", now=10.0, retry_after_s=5.0)
    assert gate.closed(["old", ""], now=11.0) is None
    assert gate.closed(["old", "new"], now=11.0) == Closed("seq1", 1, "new", 4.0, "")
    assert gate.closing() == {"seq1": 15.0}
    assert gate.closed(["new"], now=15.0) is None  # a slot may be free: the operator decides
    assert gate.closing() == {}


def test_each_operator_has_its_own_table() -> None:
    gate = StreamGate(["seq1", "seq2"])
    gate.took("seq1", "s")  # seq1 took it; seq2 refused before it got there
    gate.refused("seq2", now=0.0, retry_after_s=3.0)
    closed = gate.closed(["s"], now=1.0)
    assert closed is not None and closed.op == "seq2"
    gate.took("seq2", "s")
    assert gate.closed(["s"], now=1.0) is None


def test_a_later_refusal_extends_and_an_earlier_one_does_not_shorten() -> None:
    gate = StreamGate(["seq1"])
    gate.refused("seq1", now=0.0, retry_after_s=10.0)
    gate.refused("seq1", now=1.0, retry_after_s=2.0)
    assert gate.closing() == {"seq1": 10.0}


def test_memory_is_bounded_least_recently_used_first() -> None:
    gate = StreamGate(["seq1"], capacity=2)
    for stream in ("a", "b", "a", "c"):  # b is the least recently used when c comes
        gate.took("seq1", stream)
    gate.refused("seq1", now=0.0, retry_after_s=1.0)
    assert gate.closed(["a", "c"], now=0.5) is None
    assert gate.closed(["b"], now=0.5) == Closed("seq1", 0, "b", 0.5, "")


def test_unknown_operators_zero_waits_and_bad_capacity() -> None:
    gate = StreamGate(["seq1"])
    gate.refused("feat", now=0.0, retry_after_s=9.0)  # stateless: no table
    gate.refused("seq1", now=0.0, retry_after_s=0.0)  # "retry now": nothing to repeat
    gate.took("feat", "x")
    assert gate.closed(["x"], now=0.0) is None
    with pytest.raises(ValueError, match="capacity"):
        StreamGate(["seq1"], capacity=0)


def test_the_door_repeats_the_operators_own_words() -> None:
    gate = StreamGate(["seq1"])
    gate.refused("seq1", now=0.0, retry_after_s=2.0, reason="seq1: stream table full")
    closed = gate.closed(["x"], now=0.5)
    assert closed is not None and closed.reason == "seq1: stream table full"
