"""The admin stream's pure decisions: entries, signatures, what a group applies, and that
groups applying concurrent changes in any interleaving end in the stream's order."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.runtime.peer_log import (
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
    stream_key,
)

CHANGE = Change("host-a", "POST", "/admin/models/m/parallelism?x=1", b'{"parallelism": 2}',
                "17-0")


def test_ids_sort_as_redis_orders_them() -> None:
    assert id_key("9-5") < id_key("10-0") < id_key("10-1")
    assert id_key(ZERO) < id_key("0-1")
    assert stream_key("prod") == "parityserve:prod:admin"


def test_an_entry_round_trips_with_its_signature() -> None:
    fields = encode(CHANGE, "prod", "token")
    assert decode(fields, "prod", "token") == CHANGE
    assert decode(encode(CHANGE, "prod", None), "prod", None) == CHANGE  # open admin


@pytest.mark.parametrize(("namespace", "token"), [
    ("prod", "another-token"),  # a frontend with another token
    ("staging", "token"),  # replayed from another namespace
    ("prod", None),  # signed, but this frontend has no token to check it with
])
def test_an_entry_signed_otherwise_is_refused(namespace: str, token: str | None) -> None:
    with pytest.raises(BadEntry, match="signature"):
        decode(encode(CHANGE, "prod", "token"), namespace, token)


def test_any_field_changed_breaks_the_signature() -> None:
    for name, value in [(b"body", b'{"parallelism": 9}'), (b"after", b"99-0"),
                        (b"target", b"/admin/models/n/parallelism"), (b"origin", b"host-b"),
                        (b"method", b"DELETE")]:
        fields = {**encode(CHANGE, "prod", "token"), name: value}
        with pytest.raises(BadEntry, match="signature"):
            decode(fields, "prod", "token")


def test_an_unsigned_entry_is_refused_by_a_frontend_with_a_token() -> None:
    with pytest.raises(BadEntry, match="signature"):
        decode(encode(CHANGE, "prod", None), "prod", "token")


@pytest.mark.parametrize(("fields", "error"), [
    ({b"origin": b"a"}, "missing"),
    ({**encode(CHANGE, "p", "t"), b"after": b"soon"}, "malformed"),
    ({**encode(CHANGE, "p", "t"), b"origin": b"\xff"}, "malformed"),
    (encode(Change("a", "POST", "/v2/models/m/infer", b"", ZERO), "p", "t"), "not an admin"),
])
def test_a_malformed_entry_says_what_is_wrong(fields: dict[bytes, bytes], error: str) -> None:
    with pytest.raises(BadEntry, match=error):
        decode(fields, "p", "t")


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
    cursor = Cursor("20-3", "19-0", seq)
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

    def change(self, key: str, value: int) -> None:
        after = self.cursor.applied  # read before applying, as runtime/peers.py does
        self.state[key] = value
        self.unpublished.append(Change(self.origin, "POST", key, str(value).encode(), after))

    def publish(self, stream: list[Change]) -> None:
        if self.unpublished:
            stream.append(self.unpublished.pop(0))

    def follow(self, stream: list[Change]) -> None:
        done = id_key(self.cursor.applied)[0]
        if done < len(stream):
            entry = stream[done]
            action = decide(entry, self.origin, self.cursor)
            if action is not Action.SKIP:
                self.state[entry.target] = int(entry.body)
            self.cursor = advance(self.cursor, f"{done + 1}-0", action)


STEP = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["change", "publish",
                                                                    "follow"]),
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
        else:
            group.follow(stream)
    for group in groups.values():  # every change reaches the stream, every group reads it
        while group.unpublished:
            group.publish(stream)
    for group in groups.values():
        while id_key(group.cursor.applied)[0] < len(stream):
            group.follow(stream)
    in_order = {entry.target: int(entry.body) for entry in stream}
    for group in groups.values():
        assert group.state == in_order, group.origin
