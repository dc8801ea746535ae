"""The admin stream's pure decisions: entries, signatures, what a group applies, and that
groups applying concurrent changes in any interleaving end in the stream's order."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.runtime.cluster.peer_log import (
    ZERO,
    Action,
    BadEntry,
    Change,
    Cursor,
    advance,
    decide,
    decode,
    encode,
    id_key,
    lost,
    next_id,
    stream_key,
)

CHANGE = Change("host-a", "POST", "/admin/models/m/parallelism?x=1", b'{"parallelism": 2}',
                "17-0", "host-a/1f2e", 3)
AT = "18-0"  # the entry's id in the stream


def test_ids_sort_as_redis_orders_them() -> None:
    assert id_key("9-5") < id_key("10-0") < id_key("10-1")
    assert id_key(ZERO) < id_key("0-1")
    assert stream_key("prod") == "parityserve:prod:admin"


def test_an_entry_round_trips_with_its_signature() -> None:
    fields = encode(CHANGE, AT, "prod", "token")
    assert decode(AT, fields, "prod", "token") == CHANGE


def test_there_is_no_unsigned_entry() -> None:
    with pytest.raises(ValueError, match="signing key"):
        encode(CHANGE, AT, "prod", "")  # an open admin API still signs (peers.signing_key)
    unsigned = {**encode(CHANGE, AT, "prod", "token"), b"sig": b""}
    with pytest.raises(BadEntry, match="signature"):
        decode(AT, unsigned, "prod", "token")


@pytest.mark.parametrize(("entry_id", "namespace", "key"), [
    (AT, "prod", "another-token"),  # a frontend with another token
    (AT, "staging", "token"),  # replayed from another namespace
    ("18-1", "prod", "token"),  # a copy appended again: Redis gives it a later id
    ("99-0", "prod", "token"),
])
def test_an_entry_signed_otherwise_or_elsewhere_is_refused(entry_id: str, namespace: str,
                                                           key: str) -> None:
    with pytest.raises(BadEntry, match="signature"):
        decode(entry_id, encode(CHANGE, AT, "prod", "token"), namespace, key)


def test_any_field_changed_breaks_the_signature() -> None:
    for name, value in [(b"body", b'{"parallelism": 9}'), (b"after", b"99-0"),
                        (b"target", b"/admin/models/n/parallelism"), (b"origin", b"host-b"),
                        (b"method", b"DELETE"), (b"writer", b"host-a/0000"), (b"seq", b"4")]:
        fields = {**encode(CHANGE, AT, "prod", "token"), name: value}
        with pytest.raises(BadEntry, match="signature"):
            decode(AT, fields, "prod", "token")


@pytest.mark.parametrize(("fields", "error"), [
    ({b"origin": b"a"}, "missing"),
    ({**encode(CHANGE, AT, "p", "t"), b"after": b"soon"}, "malformed"),
    ({**encode(CHANGE, AT, "p", "t"), b"origin": b"\xff"}, "malformed"),
    ({**encode(CHANGE, AT, "p", "t"), b"seq": b"three"}, "malformed"),
    ({**encode(CHANGE, AT, "p", "t"), b"seq": b"0"}, "not a count"),
    (encode(Change("a", "POST", "/v2/models/m/infer", b"", ZERO, "a/1", 1), AT, "p", "t"),
     "not an admin"),
])
def test_a_malformed_entry_says_what_is_wrong(fields: dict[bytes, bytes], error: str) -> None:
    with pytest.raises(BadEntry, match=error):
        decode(AT, fields, "p", "t")


@pytest.mark.parametrize(("last", "now_ms", "expected"), [
    (ZERO, 1700, "1700-0"),  # a new stream
    ("1600-4", 1700, "1700-0"),  # the clock moved on
    ("1700-4", 1700, "1700-5"),  # within the same ms
    ("1800-4", 1700, "1800-5"),  # the stream is ahead of this host's clock
])
def test_a_writer_picks_the_id_redis_would(last: str, now_ms: int, expected: str) -> None:
    assert next_id(last, now_ms) == expected
    assert id_key(next_id(last, now_ms)) > id_key(last)


@pytest.mark.parametrize("origin", ["host-a", "host-b"])  # its own group's, or another's
def test_a_writers_change_at_or_below_the_last_taken_is_a_replay(origin: str) -> None:
    cursor = Cursor("5-0", "3-0", taken={CHANGE.writer: 3, "host-b/9": 7})
    assert decide(CHANGE, origin, cursor) is Action.REPLAYED
    assert decide(replace(CHANGE, seq=2), origin, cursor) is Action.REPLAYED
    fresh = replace(CHANGE, seq=4)
    assert decide(fresh, origin, cursor) is not Action.REPLAYED
    # a replay moves only the read mark; a change taken counts for its writer
    assert advance(cursor, "6-0", Action.REPLAYED, CHANGE) == Cursor("6-0", "3-0", 1,
                                                                     cursor.taken)
    moved = advance(cursor, "6-0", decide(fresh, origin, cursor), fresh)
    assert moved.taken == {CHANGE.writer: 4, "host-b/9": 7}


def test_a_new_writer_is_not_a_replay_and_knowing_keeps_the_higher() -> None:
    assert decide(CHANGE, "host-b", Cursor()) is Action.APPLY
    cursor = Cursor(taken={"w/1": 5, "w/2": 1}).knowing({"w/1": 3, "w/2": 4, "w/3": 2})
    assert cursor.taken == {"w/1": 5, "w/2": 4, "w/3": 2}


def test_another_groups_change_is_applied_and_moves_both_marks() -> None:
    cursor = Cursor("5-0", "3-0")
    assert decide(CHANGE, "host-b", cursor) is Action.APPLY
    assert advance(cursor, "20-0", Action.APPLY) == Cursor("20-0", "20-0", 1)


@pytest.mark.parametrize(("changed", "action"), [
    ("17-0", Action.SKIP),  # nothing applied here since the change was made
    ("10-0", Action.SKIP),
    ("17-1", Action.REAPPLY),  # an entry the stream puts first was applied after it
])
def test_own_change_is_skipped_unless_an_earlier_entry_was_applied_after_it(
        changed: str, action: Action) -> None:
    cursor = Cursor("18-0", changed)
    assert decide(CHANGE, "host-a", cursor) is action
    moved = "20-0" if action is Action.REAPPLY else changed  # a reapplication counts too
    assert advance(cursor, "20-0", action) == Cursor("20-0", moved, 1)


def test_a_bad_entry_moves_only_the_read_mark() -> None:
    assert advance(Cursor("5-0", "3-0"), "6-0", Action.IGNORE) == Cursor("6-0", "3-0", 1)


@pytest.mark.parametrize("seq", [12, None])
def test_a_cursor_survives_its_file(seq: int | None) -> None:
    cursor = Cursor("20-3", "19-0", seq, {"host-a/1f2e": 3})
    assert Cursor.from_json(cursor.to_json()) == cursor


@pytest.mark.parametrize(("seq", "added", "length", "why"), [
    (None, 9, 3, None),  # a Redis before 7: cannot tell
    (0, None, 3, None),
    (0, 0, 0, None),  # an empty stream
    (0, 5, 5, None),  # a late joiner, nothing trimmed yet
    (0, 9, 5, "4 of the changes were trimmed"),  # a late joiner: the first 4 are gone
    (6, 9, 5, None),  # trimmed only what was read
    (3, 9, 5, "1 of the changes were trimmed"),  # a follower cut off while they were trimmed
    (6, 2, 2, "made anew"),  # Redis restarted empty, and 2 changes came since
])
def test_lost_entries_are_noticed(seq: int | None, added: int | None, length: int,
                                  why: str | None) -> None:
    said = lost(seq, added, length)
    assert said is None if why is None else why in str(said)


def test_every_entry_taken_counts_even_a_skipped_one() -> None:
    cursor = Cursor("5-0", "3-0", 7)
    for entry_id, action in [("6-0", Action.SKIP), ("7-0", Action.IGNORE), ("8-0", Action.APPLY)]:
        cursor = advance(cursor, entry_id, action)
    assert cursor == Cursor("8-0", "8-0", 10)
    assert advance(Cursor(seq=None), "1-0", Action.APPLY).seq is None


# -- groups in any interleaving converge ------------------------------------------------------


@dataclass
class Group:
    """A frontend group: settings it applies, its cursor, and changes made but not yet
    published (the window in which another group's change can overtake them)."""

    origin: str
    state: dict[str, int] = field(default_factory=dict)
    cursor: Cursor = Cursor()
    unpublished: list[Change] = field(default_factory=list)
    written: int = 0

    def change(self, key: str, value: int) -> None:
        after = self.cursor.applied  # read before applying, as runtime/cluster/peers.py does
        self.state[key] = value
        self.written += 1
        self.unpublished.append(Change(self.origin, "POST", key, str(value).encode(), after,
                                       f"{self.origin}/w", self.written))

    def publish(self, stream: list[Change]) -> None:
        if self.unpublished:
            stream.append(self.unpublished.pop(0))

    def follow(self, stream: list[Change]) -> None:
        done = id_key(self.cursor.applied)[0]
        if done < len(stream):
            entry = stream[done]
            action = decide(entry, self.origin, self.cursor)
            if action not in (Action.SKIP, Action.REPLAYED):
                self.state[entry.target] = int(entry.body)
            self.cursor = advance(self.cursor, f"{done + 1}-0", action, entry)


STEP = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["change", "publish",
                                                                    "follow", "copy"]),
                 st.sampled_from(["x", "y"]), st.integers(0, 9))


@settings(max_examples=1000, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_every_group_ends_in_the_state_of_the_stream_applied_in_order(steps: list) -> None:
    groups = {name: Group(name) for name in "abc"}
    stream: list[Change] = []
    for name, kind, key, value in steps:
        group = groups[name]
        if kind == "change":
            group.change(key, value)
        elif kind == "publish":
            group.publish(stream)
        elif kind == "copy" and stream:  # a Redis writer appends an old entry again
            stream.append(stream[value % len(stream)])
        else:
            group.follow(stream)
    for group in groups.values():  # every change reaches the stream, every group reads it
        while group.unpublished:
            group.publish(stream)
    for group in groups.values():
        while id_key(group.cursor.applied)[0] < len(stream):
            group.follow(stream)
    originals = {(e.writer, e.seq): e for e in stream}.values()  # each at its first place
    in_order = {entry.target: int(entry.body) for entry in originals}
    for group in groups.values():
        assert group.state == in_order, group.origin
