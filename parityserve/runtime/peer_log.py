"""The decisions behind the admin stream that frontends on several hosts share (pure; the
Redis side is runtime/peers.py, whose docstring tells the whole story).

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
  property test in tests/unit/test_peer_log.py tries any interleaving of three groups). A
  reapplied change that the server refuses (a deploy of a version it already serves) leaves
  it as it is, which is also what the stream's order gives.

Entries are signed with the admin token (HMAC-SHA256 over the namespace and every field), so
that writing to Redis is not enough to make a frontend run an admin change: an entry whose
signature does not match this frontend's token is skipped and logged.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass

import orjson

__all__ = ["ZERO", "Action", "BadEntry", "Change", "Cursor", "advance", "decide", "decode",
           "encode", "id_key", "lost", "stream_key"]

ZERO = "0-0"  # before every entry: where a frontend that starts reads from
_FIELDS = (b"origin", b"method", b"target", b"after", b"body", b"sig")


def stream_key(namespace: str) -> str:
    """The Redis key of a namespace's admin stream."""
    return f"parityserve:{namespace}:admin"


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream id ('ms-seq') as a tuple that sorts as Redis orders the ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class Change:
    """One admin change as a peer replays it: the request, who made it, and what its group
    had applied from the stream when it did."""

    origin: str
    method: str
    target: str  # path and query
    body: bytes
    after: str  # a stream id


class BadEntry(ValueError):
    """A stream entry that must not be applied (malformed, or not signed with our token)."""


def _signature(change: Change, namespace: str, token: str | None) -> bytes:
    if token is None:  # admin is open (loopback only): nothing to sign with
        return b""
    head = orjson.dumps([namespace, change.origin, change.method, change.target, change.after])
    return hmac.new(token.encode(), head + b"\n" + change.body, hashlib.sha256
                    ).hexdigest().encode()


def encode(change: Change, namespace: str, token: str | None) -> dict[bytes, bytes]:
    """The stream entry's fields for ``change``, signed."""
    return {b"origin": change.origin.encode(), b"method": change.method.encode(),
            b"target": change.target.encode(), b"after": change.after.encode(),
            b"body": change.body, b"sig": _signature(change, namespace, token)}


def decode(fields: dict[bytes, bytes], namespace: str, token: str | None) -> Change:
    """The change an entry holds; ``BadEntry`` when it is malformed or signed otherwise."""
    missing = [f.decode() for f in _FIELDS if f not in fields]
    if missing:
        raise BadEntry(f"fields {missing} are missing")
    try:
        change = Change(fields[b"origin"].decode(), fields[b"method"].decode(),
                        fields[b"target"].decode(), fields[b"body"], fields[b"after"].decode())
        id_key(change.after)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadEntry(f"malformed ({exc})") from None
    if not change.target.startswith("/admin/"):
        raise BadEntry(f"target {change.target!r} is not an admin route")
    if not hmac.compare_digest(fields[b"sig"], _signature(change, namespace, token)):
        raise BadEntry("its signature does not match this frontend's admin token (a frontend "
                       "with another token, or a write that did not come from a frontend)")
    return change


@dataclass(frozen=True)
class Cursor:
    """How far a group has applied the stream: the last entry it took (``applied``), the
    last one it applied here (``changed``: another group's, or its own again), and how many
    entries the stream had gained up to ``applied`` (``seq``; None where Redis, before 7,
    does not count them), which tells whether any it has not read were trimmed."""

    applied: str = ZERO
    changed: str = ZERO
    seq: int | None = 0

    def to_json(self) -> bytes:
        return orjson.dumps({"applied": self.applied, "changed": self.changed, "seq": self.seq})

    @classmethod
    def from_json(cls, data: bytes) -> Cursor:
        raw = orjson.loads(data)
        seq = raw["seq"]
        return cls(str(raw["applied"]), str(raw["changed"]), None if seq is None else int(seq))


class Action(enum.Enum):
    APPLY = "apply"  # another group's change
    SKIP = "skip"  # our own, already applied in the stream's order
    REAPPLY = "reapply"  # our own, overtaken here by an entry the stream puts first
    IGNORE = "ignore"  # a bad entry


def decide(change: Change, origin: str, cursor: Cursor) -> Action:
    """What a group with ``origin``, at ``cursor``, does with the next entry, ``change``."""
    if change.origin != origin:
        return Action.APPLY
    if id_key(cursor.changed) > id_key(change.after):
        return Action.REAPPLY
    return Action.SKIP


def advance(cursor: Cursor, entry_id: str, action: Action) -> Cursor:
    """The cursor once the entry ``entry_id`` was taken with ``action``."""
    changed = action in (Action.APPLY, Action.REAPPLY)
    return Cursor(entry_id, entry_id if changed else cursor.changed,
                  None if cursor.seq is None else cursor.seq + 1)


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
