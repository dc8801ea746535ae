"""The stateful graph's typed messages: each record survives its wire form, and whatever the
bytes, each of the three parsers returns a record or raises ProtocolError."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parityserve.core.hams import Hop
from parityserve.errors import ProtocolError
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.workers import wire

LINEAGE = (Hop("frontend", 3, "seq1", 7), Hop("seq1", 7, "seq2", 2))
ROWS = np.arange(6, dtype=np.float32).reshape(3, 2)

REPORTS: list[Any] = [
    hm.Hello("primary", 12, 4), hm.Hello("backup", 13, 0, "ipc:///tmp/x.sock", "KEY"),
    hm.Beat(), hm.Out(5, ROWS), hm.Out(5, ROWS[:2], (0, 2), (hp.Refusal(1, "busy", "no", 2.5),)),
    hm.Out(6, error="E", bad_input=True), hm.Out(7, refused=(hp.Refusal(0, "error", "x"),)),
    hm.Failed("no such file"), hm.Failed(None), hm.Checkpointed(9), hm.Durable(3),
    hm.Promoted(4), hm.Promoted(4, True), hm.Allowed(), hm.Digest(2, "ab12"),
    hm.Digest(2, "ab12", {"full": 1, "deltas": 5}),
]
ORDERS: list[Any] = [
    hm.Batch(8, (4, 5, 6), ROWS, ("a", "", "c"), (1, -1, 0), LINEAGE, 12.5),
    hm.Batch(8, (4, 5, 6), ROWS, ("a", "", "c"), None, (), 0.0),
    hm.Attach("tcp://h:1", "K"), hm.Allow("K", {"seq1": 3}), hm.Notify("seq1", 4),
    hm.Promote(), hm.Promote("ipc:///tmp/s.sock", "K"), hm.Rollback(), hm.Stop(),
    hm.Slow(0.25), hm.DigestAsk(),
]
LINK: list[Any] = [
    hm.State(3, [["w", "<f4", [2], 0]], (LINEAGE,), (b"\0" * 64,), True),
    hm.State(4, [["w", "<f4", [2], 0]], (), (b"\0" * 8, b"\0" * 8), delta_of=3),
    hm.Received(3), hm.Received(3, gap=True), hm.Applied(4),
]
PARSERS = {"report": hm.parse_report, "order": hm.parse_order, "link": hm.parse_state_link}


def through_the_wire(message: Any, parse: Any) -> Any:
    header, frames = message.to_wire()
    return parse(*wire.decode(wire.encode(header, [bytes(f) for f in frames])))


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif name == "frames":
            if [bytes(f) for f in x] != [bytes(f) for f in y]:
                return False
        elif x != y:
            return False
    return True


def _id(value: Any) -> str:
    """A test id that is the same in every process (pytest-xdist's workers must collect
    the same names; a function's repr carries its address)."""
    return value.__name__ if callable(value) else repr(value)


@pytest.mark.parametrize("message, parse", [(m, hm.parse_report) for m in REPORTS]
                         + [(m, hm.parse_order) for m in ORDERS]
                         + [(m, hm.parse_state_link) for m in LINK], ids=_id)
def test_every_record_round_trips_through_its_wire_form(message: Any, parse: Any) -> None:
    assert same(through_the_wire(message, parse), message)


def test_the_header_keeps_the_fields_both_sides_spoke_before_the_records() -> None:
    header, frames = hm.Out(5, ROWS[:2], (0, 2), (hp.Refusal(1, "busy", "no", 2.5),)).to_wire()
    assert header == {"t": hp.OUT, "bid": 5, "outputs": {"k": "nd", "dtype": "<f4",
                                                         "shape": [2, 2]},
                      "rows": [0, 2], "refused": [[1, "busy", "no", 2.5]]} and len(frames) == 1
    header, _ = hm.Batch(8, (4,), ROWS[:1], ("a",), (1,), LINEAGE, 1.0).to_wire()
    assert set(header) == {"t", "bid", "seqs", "inputs", "streams", "labels", "needs", "at"}
    assert header["needs"] == hp.lineage_to_wire(LINEAGE)
    assert hm.Promote("a", "k").to_wire()[0] == {"t": hp.PROMOTE, "attach": "a", "key": "k"}
    assert hm.Received(3, gap=True).to_wire()[0] == {"t": hp.RECEIVED, "seq": 3, "gap": True}


def test_an_answer_gives_each_row_its_output_or_refusal_and_must_cover_the_batch() -> None:
    out = hm.Out(5, ROWS[:2], (0, 2), (hp.Refusal(1, "busy", "no", 2.5),))
    rows = out.outcomes(3)
    assert rows[1] == hp.Refusal(1, "busy", "no", 2.5)
    np.testing.assert_array_equal(np.stack([rows[0], rows[2]]), ROWS[:2])
    for n in (2, 4):  # a row outside the batch, or one left unanswered
        with pytest.raises(ProtocolError):
            out.outcomes(n)
    with pytest.raises(ProtocolError, match="2 outputs for 1 rows"):
        hm.Out(5, ROWS[:2], (0,)).outcomes(1)


@pytest.mark.parametrize("parse, header, buffers", [
    (hm.parse_report, {"t": hp.DURABLE}, []),  # no seq
    (hm.parse_report, {"t": hp.DURABLE, "seq": "3"}, []),
    (hm.parse_report, {"t": hp.HELLO, "role": "primary"}, []),  # no pid
    (hm.parse_report, {"t": hp.OUT, "bid": 1.0}, []),
    (hm.parse_report, {"t": hp.PROMOTED, "seq": 1, "seeded": "yes"}, []),
    (hm.parse_report, {"t": hp.DIGEST, "seq": 1, "digest": "x", "shipped": {"full": "1"}}, []),
    (hm.parse_report, {"t": hp.BEAT}, [b"x"]),  # frames on a message that has none
    (hm.parse_report, {"t": hp.BATCH, "bid": 1}, []),  # an order, not a report
    (hm.parse_report, {"t": "h.nonsense"}, []),
    (hm.parse_order, {"t": hp.NOTIFY, "op": "seq1"}, []),
    (hm.parse_order, {"t": hp.ALLOW, "key": "k", "durable": {"seq1": 1.5}}, []),
    (hm.parse_order, {"t": hp.ATTACH, "key": "k"}, []),
    (hm.parse_order, {"t": hp.BATCH, "bid": 1, "seqs": "12"}, []),
    (hm.parse_order, {"t": hp.OUT, "bid": 1}, []),
    (hm.parse_state_link, {"t": hp.STATE, "seq": 1, "layout": []}, []),  # no frame
    (hm.parse_state_link, {"t": hp.STATE, "seq": 1, "layout": [], "delta_of": 0}, [b""]),
    (hm.parse_state_link, {"t": hp.STATE, "seq": 1, "layout": {}}, [b""]),
    (hm.parse_state_link, {"t": hp.APPLIED, "seq": None}, []),
])
def test_malformed_messages_are_refused(parse: Any, header: dict, buffers: list) -> None:
    with pytest.raises(ProtocolError):
        parse(header, buffers)


def test_an_unreadable_answer_names_its_batch_and_an_unreadable_batch_its_rows() -> None:
    bad = {"t": hp.OUT, "bid": 4, "outputs": {"k": "nd", "dtype": "<f4", "shape": [3]}}
    with pytest.raises(hm.BadAnswer) as answer:
        hm.parse_report(bad, [b"\0" * 4])  # 3 floats declared, 1 sent
    assert answer.value.bid == 4
    with pytest.raises(hm.BadAnswer):  # a refusal of the wrong form
        hm.parse_report({"t": hp.OUT, "bid": 4, "refused": [[0, "busy"]]}, [])
    header, frames = hm.Batch(8, (4, 5, 6), ROWS, ("a", "b", "c"), None, ()).to_wire()
    with pytest.raises(hm.BadBatch) as batch:
        hm.parse_order({**header, "streams": ["a", 1, "c"]}, frames)
    assert (batch.value.bid, batch.value.rows) == (8, 3)
    with pytest.raises(hm.BadBatch):  # two rows numbered, three sent
        hm.parse_order({**header, "seqs": [4, 5]}, frames)


# ---- whatever the bytes: a record or ProtocolError ------------------------------------------

_KINDS = [hp.HELLO, hp.BEAT, hp.BATCH, hp.OUT, hp.FAILED, hp.ATTACH, hp.ALLOW, hp.NOTIFY,
          hp.DURABLE, hp.PROMOTE, hp.PROMOTED, hp.ROLLBACK, hp.STOP, hp.STATE, hp.RECEIVED,
          hp.APPLIED, hp.SLOW, hp.CHECKPOINT, hp.DIGEST, "h.x", "hello"]
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                     st.text(max_size=8), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)
_desc = st.fixed_dictionaries({"k": st.sampled_from(["nd", "obj", "x"])}, optional={
    "dtype": st.one_of(st.sampled_from(["<f4", "|b1", "<U3", "O"]), _scalars),
    "shape": st.one_of(st.lists(st.integers(-3, 2**40), max_size=4), _scalars),
    "v": _values})
_fields = st.sampled_from(["bid", "seq", "seqs", "inputs", "outputs", "rows", "refused",
                           "error", "bad_input", "streams", "labels", "needs", "at", "role",
                           "pid", "restored", "address", "key", "durable", "op", "attach",
                           "seeded", "digest", "shipped", "s", "layout", "lineages", "base",
                           "delta_of", "gap"])
_headers = st.dictionaries(_fields, st.one_of(_values, _desc), max_size=8).flatmap(
    lambda h: st.builds(lambda t: {**h, "t": t}, st.sampled_from(_KINDS)))
_buffers = st.lists(st.binary(max_size=64), max_size=wire.MAX_FRAMES + 2)
_VALID = [r.to_wire() for r in REPORTS + ORDERS + LINK]


@st.composite
def _broken(draw: st.DrawFn) -> tuple[dict, list[bytes]]:
    """A valid message of any kind with one to three fields changed, and its frames or
    some others."""
    header, frames = draw(st.sampled_from(_VALID))
    keys = st.sampled_from([*header, "extra"])
    changes = draw(st.dictionaries(keys, st.one_of(_values, _desc), min_size=1, max_size=3))
    count = draw(st.one_of(st.just(len(frames)), st.integers(0, 3)))
    buffers = draw(st.lists(st.sampled_from([b"", b"\0" * 8, b"\0" * 24, b"\0" * 7]),
                            min_size=count, max_size=count))
    return {**header, **changes}, buffers


def _parses_or_refuses(frames: list[bytes]) -> None:
    for parse in PARSERS.values():
        try:
            message = parse(*wire.decode(frames))
        except ProtocolError:
            continue
        assert isinstance(message, hm._Record)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=256), max_size=wire.MAX_FRAMES + 2))
def test_random_bytes_parse_or_raise_protocol_error(frames: list[bytes]) -> None:
    _parses_or_refuses(frames)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(_headers, _buffers)
def test_random_headers_with_random_frames_parse_or_raise(header: dict, buffers: list) -> None:
    _parses_or_refuses([msgpack.packb(header, use_bin_type=True), *buffers])


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_broken())
def test_valid_messages_with_broken_fields_parse_or_raise(case: tuple[dict, list]) -> None:
    header, buffers = case
    _parses_or_refuses([msgpack.packb(header, use_bin_type=True), *buffers])
