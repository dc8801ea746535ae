"""The decisions behind the admin stream that frontends on several hosts share (pure; the
Redis side is runtime/cluster/peers.py, whose docstring tells the whole story).

Each frontend *group* (one ``parityserve start``, however many shards) has an origin id. A
successful admin change is applied by the group that took it at once, then appended to the
stream with its origin and ``after``: the id of the last stream entry the group had applied
when the change was made. Every group applies the stream in its order (Redis assigns the
ids, so all groups see one total order):

- another group's change: **apply** it;
- its own change: **skip** it (it was applied when it was made), unless the group applied
  an entry after the one ``after`` names: another group's change, or one of its own again.
  That entry comes before this change in the stream but was applied after it here, so the
  group **reapplies** its own, which puts it back after that one, as every other group has
  them. Each reapplication counts in turn, so a later own change that it overtook is
  reapplied too. Every group then ends in the state of the stream applied in order (the
  property test in tests/unit/runtime/cluster/test_peer_log.py tries any interleaving of three
  groups). A reapplied change that the server refuses (a deploy of a version it already serves)
  leaves it as it is, which is also what the stream's order gives.

Entries are signed with the admin token (HMAC-SHA256), so that writing to Redis is not enough
to make a frontend run an admin change, and the signature binds where the entry sits, so
that a copy of an old entry appended again is not one either. It covers the namespace, every
field, the entry's own stream id (the writer picks it, ``next_id``, and appends with it: a
copy appended later gets a larger id, which Redis always gives, and no longer matches), and
the entry's *writer* (one process of the group: shards write concurrently, and a restarted one
numbers afresh under a new name) with its ``seq``, that writer's count of changes. A group
keeps the last ``seq`` it took from each writer and skips any entry at or below it
(``Action.REPLAYED``). There are no unsigned entries: one that does not match this frontend's
key is skipped and logged, whatever the admin setting.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import orjson

__all__ = ["ZERO", "Action", "BadEntry", "Change", "Cursor", "advance", "decide", "decode",
           "encode", "id_key", "lost", "next_id", "stream_key"]

ZERO = "0-0"  # before every entry: where a frontend that starts reads from
_FIELDS = (b"origin", b"writer", b"seq", b"method", b"target", b"after", b"body", b"sig")
_DOMAIN = "parityserve admin change v2"  # what is signed is an admin change, of this layout


def stream_key(namespace: str) -> str:
    """The Redis key of a namespace's admin stream."""
    return f"parityserve:{namespace}:admin"


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream id ('ms-seq') as a tuple that sorts as Redis orders the ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def next_id(last: str, now_ms: int) -> str:
    """The id a writer appends its entry with, after ``last`` (the stream's last generated
    id): as Redis would pick it (the clock's ms, or one more than ``last`` within its ms).
    Chosen before the append, so that the signature can cover it."""
    ms, seq = id_key(last)
    return f"{now_ms}-0" if now_ms > ms else f"{ms}-{seq + 1}"


@dataclass(frozen=True)
class Change:
    """One admin change as a peer replays it: the request, who made it, and what its group
    had applied from the stream when it did."""

    origin: str  # the group
    method: str
    target: str  # path and query
    body: bytes
    after: str  # a stream id
    writer: str  # the process of the group that wrote it
    seq: int  # its writer's count of changes, from 1


class BadEntry(ValueError):
    """A stream entry that must not be applied (malformed, or not signed with our key)."""


def _signature(entry_id: str, change: Change, namespace: str, key: str) -> bytes:
    if not key:  # an empty key would let anyone sign: there is no unsigned entry
        raise ValueError("admin stream entries need a signing key")
    head = orjson.dumps([_DOMAIN, namespace, entry_id, change.origin, change.writer,
                         change.seq, change.method, change.target, change.after])
    return hmac.new(key.encode(), head + b"\n" + change.body, hashlib.sha256
                    ).hexdigest().encode()


def encode(change: Change, entry_id: str, namespace: str, key: str) -> dict[bytes, bytes]:
    """The fields of the stream entry ``entry_id`` holding ``change``, signed with ``key``."""
    return {b"origin": change.origin.encode(), b"writer": change.writer.encode(),
            b"seq": str(change.seq).encode(), b"method": change.method.encode(),
            b"target": change.target.encode(), b"after": change.after.encode(),
            b"body": change.body, b"sig": _signature(entry_id, change, namespace, key)}


def decode(entry_id: str, fields: Mapping[bytes, bytes], namespace: str, key: str) -> Change:
    """The change the entry ``entry_id`` holds; ``BadEntry`` when it is malformed or not
    signed with ``key`` for this place in this namespace's stream."""
    missing = [f.decode() for f in _FIELDS if f not in fields]
    if missing:
        raise BadEntry(f"fields {missing} are missing (an unsigned entry, or one from an "
                       "older parityserve)")
    change = _parse(fields)
    if not change.target.startswith("/admin/"):
        raise BadEntry(f"target {change.target!r} is not an admin route")
    if not hmac.compare_digest(fields[b"sig"], _signature(entry_id, change, namespace, key)):
        raise BadEntry("its signature does not match this frontend's key for this place in "
                       "the stream (a frontend with another admin token, a copy of an entry "
                       "appended again, or a write that did not come from a frontend)")
    return change


def _parse(fields: Mapping[bytes, bytes]) -> Change:
    try:
        change = Change(fields[b"origin"].decode(), fields[b"method"].decode(),
                        fields[b"target"].decode(), fields[b"body"], fields[b"after"].decode(),
                        fields[b"writer"].decode(), int(fields[b"seq"]))
        id_key(change.after)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadEntry(f"malformed ({exc})") from None
    if change.seq < 1:
        raise BadEntry(f"malformed (seq {change.seq} is not a count)")
    return change


@dataclass(frozen=True)
class Cursor:
    """How far a group has applied the stream: the last entry it took (``applied``), the
    last one it applied here (``changed``: another group's, or its own again), how many
    entries the stream had gained up to ``applied`` (``seq``; None where Redis, before 7,
    does not count them), which tells whether any it has not read were trimmed, and the
    last ``seq`` it took from each writer (``taken``)."""

    applied: str = ZERO
    changed: str = ZERO
    seq: int | None = 0
    taken: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps({"applied": self.applied, "changed": self.changed, "seq": self.seq,
                             "taken": dict(self.taken)})

    @classmethod
    def from_json(cls, data: bytes) -> Cursor:
        raw = orjson.loads(data)
        seq = raw["seq"]
        return cls(str(raw["applied"]), str(raw["changed"]), None if seq is None else int(seq),
                   {str(w): int(n) for w, n in raw.get("taken", {}).items()})

    def knowing(self, taken: Mapping[str, int]) -> Cursor:
        """This cursor, having also taken each writer's changes up to ``taken``'s."""
        merged = dict(self.taken)
        for writer, seq in taken.items():
            merged[writer] = max(seq, merged.get(writer, 0))
        return replace(self, taken=merged)


class Action(enum.Enum):
    APPLY = "apply"  # another group's change
    SKIP = "skip"  # our own, already applied in the stream's order
    REAPPLY = "reapply"  # our own, overtaken here by an entry the stream puts first
    IGNORE = "ignore"  # a bad entry
    REPLAYED = "replayed"  # its writer's change of that number, or a later one, was taken


def decide(change: Change, origin: str, cursor: Cursor) -> Action:
    """What a group with ``origin``, at ``cursor``, does with the next entry, ``change``."""
    if change.seq <= cursor.taken.get(change.writer, 0):
        return Action.REPLAYED
    if change.origin != origin:
        return Action.APPLY
    if id_key(cursor.changed) > id_key(change.after):
        return Action.REAPPLY
    return Action.SKIP


def advance(cursor: Cursor, entry_id: str, action: Action,
            change: Change | None = None) -> Cursor:
    """The cursor once the entry ``entry_id`` (holding ``change``, None for a bad entry) was
    taken with ``action``."""
    changed = action in (Action.APPLY, Action.REAPPLY)
    taken = cursor.taken
    if change is not None and action is not Action.REPLAYED:
        taken = {**taken, change.writer: change.seq}
    return Cursor(entry_id, entry_id if changed else cursor.changed,
                  None if cursor.seq is None else cursor.seq + 1, taken)


def lost(seq: int | None, added: int | None, length: int) -> str | None:
    """Why entries after the ``seq``-th are gone before they were read, or None.

    ``added`` is how many entries the stream ever gained (Redis 7 counts them:
    ``entries-added``; None before 7, when nothing can be told) and ``length`` how many it
    holds. Only trimming removes entries (nothing here deletes one), so the first
    ``added - length`` are gone: those after the ``seq``-th were never read. A stream that
    gained fewer entries than were read was made anew (a Redis restarted without its data).
    """
    if seq is None or added is None:
        return None
    if added < seq:
        return (f"the stream holds {added} entries where {seq} were read: it was made anew "
                "(a Redis restarted without its data?), and changes made before are gone")
    trimmed = added - length
    if trimmed > seq:
        return f"{trimmed - seq} of the changes were trimmed away before they were read"
    return None
