"""Typed records for what a stateful graph's processes say, and the parsers that build them:
the HAMS twin of ``workers/messages.py``.

Three links, one parser each, every record with its own wire form (``to_wire``):

* an operator to the frontend (``parse_report``): what the graph runtime acts on;
* the frontend to an operator (``parse_order``);
* a primary to its backup and back (``parse_state_link``).

A parser returns a record or raises ``ProtocolError``; nothing else escapes (a property test
feeds them random headers). The receiver drops and counts what does not parse. On the wire
a message is what it was before these records: one msgpack header whose ``t`` names the
kind (``hams_protocol``), the same fields, then raw frames (``workers/wire.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from parityserve.core.hams import Lineage
from parityserve.errors import ProtocolError
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.fields import boolean, integer, number, optional, text

__all__ = ["Allow", "Allowed", "Applied", "Attach", "BadAnswer", "BadBatch", "Batch", "Beat",
           "Checkpointed", "Digest", "DigestAsk", "Durable", "Failed", "Hello", "Notify",
           "Order", "Out", "Promote", "Promoted", "Received", "Report", "Rollback", "Slow",
           "State", "StateLink", "Stop", "Unseed", "parse_order", "parse_report",
           "parse_state_link"]

Wire = tuple[dict[str, Any], list[Any]]


class _Record:
    KIND: ClassVar[str]

    def to_wire(self) -> Wire:  # a record without fields: its kind alone
        return {"t": self.KIND}, []


class BadAnswer(ProtocolError):
    """An operator's answer to batch ``bid`` that cannot be read: the batch fails."""

    def __init__(self, bid: int, detail: str) -> None:
        super().__init__(detail)
        self.bid = bid


class BadBatch(ProtocolError):
    """A batch whose rows cannot be read: the operator refuses each of its ``rows``."""

    def __init__(self, bid: int, rows: int, detail: str) -> None:
        super().__init__(detail)
        self.bid, self.rows = bid, rows


# ---- an operator to the frontend ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(_Record):
    KIND = hp.HELLO
    role: str
    pid: int
    restored: int = 0  # checkpoint-replay: the checkpoint it started from
    address: str | None = None  # a backup's: where its primary connects
    key: str = ""  # a backup's: its public key on that link

    def to_wire(self) -> Wire:
        header: dict[str, Any] = {"t": self.KIND, "role": self.role, "pid": self.pid,
                                  "restored": self.restored}
        if self.address is not None:
            header.update(address=self.address, key=self.key)
        return header, []


@dataclass(frozen=True, slots=True)
class Beat(_Record):
    KIND = hp.BEAT


@dataclass(frozen=True, slots=True)
class Out(_Record):
    """A whole batch's answer: ``outputs`` for ``rows`` (None: every row), a ``Refusal``
    for each other row, or ``error`` for every row at once."""

    KIND = hp.OUT
    bid: int
    outputs: np.ndarray | None = None
    rows: tuple[int, ...] | None = None
    refused: tuple[hp.Refusal, ...] = ()
    error: str | None = None
    bad_input: bool = False

    def to_wire(self) -> Wire:
        header: dict[str, Any] = {"t": self.KIND, "bid": self.bid}
        frames: list[Any] = []
        if self.error is not None:
            header.update(error=self.error, **({"bad_input": True} if self.bad_input else {}))
        if self.outputs is not None:
            header["outputs"], frames = wire.pack_payload(np.ascontiguousarray(self.outputs))
        if self.rows is not None:
            header["rows"] = list(self.rows)
        if self.refused:
            header["refused"] = [[r.row, r.kind, r.message, r.retry_after_s]
                                 for r in self.refused]
        return header, frames

    def outcomes(self, n: int) -> list[Any]:
        """Each of the batch's ``n`` rows: its output row, or its ``Refusal``."""
        if self.error is not None:
            return [hp.Refusal(row, "bad_input" if self.bad_input else "error", self.error)
                    for row in range(n)]
        found: list[Any] = [None] * n
        rows = range(n) if self.rows is None else self.rows
        if any(not 0 <= row < n for row in (*rows, *(r.row for r in self.refused))):
            raise ProtocolError(f"an operator's answer names rows outside a batch of {n}")
        for refused in self.refused:
            found[refused.row] = refused
        if self.outputs is not None:
            if len(self.outputs) != len(rows):
                raise ProtocolError(f"an operator's answer has {len(self.outputs)} outputs "
                                    f"for {len(rows)} rows")
            for row, output in zip(rows, self.outputs, strict=True):
                found[row] = output
        if any(f is None for f in found):
            raise ProtocolError(f"an operator's answer leaves rows of a batch of {n} unanswered")
        return found


@dataclass(frozen=True, slots=True)
class Failed(_Record):
    KIND = hp.FAILED
    error: str | None  # why the model did not load

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "error": self.error}, []


@dataclass(frozen=True, slots=True)
class _Seq(_Record):
    seq: int

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "seq": self.seq}, []


@dataclass(frozen=True, slots=True)
class Checkpointed(_Seq):
    KIND = hp.CHECKPOINT  # the state after ``seq`` is stored


@dataclass(frozen=True, slots=True)
class Durable(_Seq):
    KIND = hp.DURABLE  # a backup applied the state after ``seq``


@dataclass(frozen=True, slots=True)
class Promoted(_Record):
    KIND = hp.PROMOTED  # the answer to PROMOTE and to ROLLBACK
    seq: int
    seeded: bool | None = None  # a promotion: the spare holds the state now

    def to_wire(self) -> Wire:
        extra = {} if self.seeded is None else {"seeded": self.seeded}
        return {"t": self.KIND, "seq": self.seq, **extra}, []


@dataclass(frozen=True, slots=True)
class Allowed(_Record):
    KIND = hp.ALLOW  # a backup admits its primary's key now


@dataclass(frozen=True, slots=True)
class Digest(_Record):
    KIND = hp.DIGEST
    seq: int
    digest: str
    shipped: dict[str, int] | None = None  # a primary's: full copies and deltas sent

    def to_wire(self) -> Wire:
        extra = {} if self.shipped is None else {"shipped": self.shipped}
        return {"t": self.KIND, "seq": self.seq, "digest": self.digest, **extra}, []


Report = Hello | Beat | Out | Failed | Checkpointed | Durable | Promoted | Allowed | Digest

# ---- the frontend to an operator ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch(_Record):
    KIND = hp.BATCH
    bid: int
    seqs: tuple[int, ...]
    inputs: np.ndarray
    streams: tuple[str, ...]
    labels: tuple[int, ...] | None
    needs: Lineage  # the highest number its rows carry at each operator its state needs
    at: float = 0.0  # the frontend's now: a stream table's idle time

    def to_wire(self) -> Wire:
        desc, frames = wire.pack_payload(self.inputs)
        return {"t": self.KIND, "bid": self.bid, "seqs": list(self.seqs), "inputs": desc,
                "streams": list(self.streams),
                "labels": None if self.labels is None else list(self.labels),
                "needs": hp.lineage_to_wire(self.needs), "at": self.at}, frames


@dataclass(frozen=True, slots=True)
class Attach(_Record):
    KIND = hp.ATTACH  # to a primary: send your states to this backup
    address: str
    key: str = ""

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "address": self.address, "key": self.key}, []


@dataclass(frozen=True, slots=True)
class Allow(_Record):
    KIND = hp.ALLOW  # to a backup: admit this key; upstream is durable this far
    key: str
    durable: dict[str, int]

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "key": self.key, "durable": self.durable}, []


@dataclass(frozen=True, slots=True)
class Notify(_Record):
    KIND = hp.NOTIFY  # to a backup: ``op``'s outputs (or state) up to ``seq`` are here
    op: str
    seq: int

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "op": self.op, "seq": self.seq}, []


@dataclass(frozen=True, slots=True)
class Promote(_Record):
    KIND = hp.PROMOTE  # to a backup: become the primary (and seed the spare at ``attach``)
    attach: str | None = None
    key: str = ""

    def to_wire(self) -> Wire:
        extra = {} if self.attach is None else {"attach": self.attach, "key": self.key}
        return {"t": self.KIND, **extra}, []


@dataclass(frozen=True, slots=True)
class Unseed(_Record):
    KIND = hp.UNSEED  # to a member taking over: the spare it seeds is lost, stop waiting


@dataclass(frozen=True, slots=True)
class Rollback(_Record):
    KIND = hp.ROLLBACK


@dataclass(frozen=True, slots=True)
class Stop(_Record):
    KIND = hp.STOP


@dataclass(frozen=True, slots=True)
class Slow(_Record):
    KIND = hp.SLOW  # fault injection: wait this long before each state leaves
    s: float

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "s": self.s}, []


@dataclass(frozen=True, slots=True)
class DigestAsk(_Record):
    KIND = hp.DIGEST


Order = (Batch | Attach | Allow | Notify | Promote | Unseed | Rollback | Stop | Slow
         | DigestAsk)

# ---- a primary and its backup ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class State(_Record):
    """A state copy: full (one frame), or a delta over ``delta_of`` (rows and their row
    numbers: two frames); ``base`` is the first full copy a new backup gets."""

    KIND = hp.STATE
    seq: int
    layout: list[Any]  # checked against the live state when installed (``hams_state``)
    lineages: tuple[Lineage, ...]
    frames: tuple[Any, ...]
    base: bool = False
    delta_of: int | None = None

    def to_wire(self) -> Wire:
        header: dict[str, Any] = {"t": self.KIND, "seq": self.seq, "base": self.base,
                                  "layout": self.layout,
                                  "lineages": [hp.lineage_to_wire(lin) for lin in self.lineages]}
        if self.delta_of is not None:
            header["delta_of"] = self.delta_of
        return header, list(self.frames)


@dataclass(frozen=True, slots=True)
class _Receipt(_Record):
    seq: int
    gap: bool = False  # a delta that did not fit: the next copy must be full

    def to_wire(self) -> Wire:
        return {"t": self.KIND, "seq": self.seq, **({"gap": True} if self.gap else {})}, []


@dataclass(frozen=True, slots=True)
class Received(_Receipt):
    KIND = hp.RECEIVED


@dataclass(frozen=True, slots=True)
class Applied(_Receipt):
    KIND = hp.APPLIED  # says RECEIVED too


StateLink = State | Received | Applied

# ---- parsing --------------------------------------------------------------------------------

_Parser = Callable[[dict[str, Any], list[Any]], Any]


def _parse(parsers: dict[str, _Parser], framed: tuple[str, ...], header: dict[str, Any],
           buffers: list[Any]) -> Any:
    kind = header.get("t")
    parser = parsers.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise ProtocolError(f"unknown message type {wire._short(kind)}")
    if kind not in framed and buffers:
        raise ProtocolError(f"a {kind!r} message came with {len(buffers)} buffer frames")
    return parser(header, buffers)


def parse_report(header: dict[str, Any], buffers: list[Any]) -> Report:
    """What an operator said to the frontend. Raises ProtocolError (``BadAnswer``: an
    answer to a known batch that cannot be read)."""
    return _parse(_REPORTS, (hp.OUT,), header, buffers)


def parse_order(header: dict[str, Any], buffers: list[Any]) -> Order:
    """What the frontend told an operator. Raises ProtocolError (``BadBatch``: a batch
    whose rows cannot be read)."""
    return _parse(_ORDERS, (hp.BATCH,), header, buffers)


def parse_state_link(header: dict[str, Any], buffers: list[Any]) -> StateLink:
    """What a primary sent its backup, or the backup's receipt. Raises ProtocolError."""
    return _parse(_STATE_LINK, (hp.STATE,), header, buffers)


def _hello(h: dict[str, Any], _: list[Any]) -> Hello:
    return Hello(text(h, "role"), integer(h, "pid"), optional(h, "restored", integer) or 0,
                 optional(h, "address", text), optional(h, "key", text) or "")


def _out(h: dict[str, Any], buffers: list[Any]) -> Out:
    bid = integer(h, "bid")
    try:
        outputs = None if h.get("outputs") is None else _outputs(h["outputs"], buffers)
        if outputs is None and buffers:
            raise ProtocolError(f"an answer without outputs came with {len(buffers)} frames")
        rows = None if h.get("rows") is None else _ints(h["rows"], "rows")
        refused = tuple(_refusal(raw) for raw in _list(h.get("refused") or [], "refused"))
        return Out(bid, outputs, rows, refused, optional(h, "error", text),
                   optional(h, "bad_input", boolean) or False)
    except Exception as exc:  # whatever it was: the batch's answer is unreadable
        raise BadAnswer(bid, f"{type(exc).__name__}: {exc}") from exc


def _outputs(desc: Any, buffers: list[Any]) -> np.ndarray:
    """An operator's outputs, one row per answered row of the batch."""
    outputs = np.array(wire.unpack_payload(desc, buffers))
    if outputs.ndim < 1 or outputs.dtype == object:
        raise ProtocolError(f"outputs must be an array of rows, got {outputs.dtype} "
                            f"of shape {list(outputs.shape)}")
    return outputs


def _refusal(raw: Any) -> hp.Refusal:
    if not isinstance(raw, list) or len(raw) != 4:
        raise ProtocolError(f"a refusal must be [row, kind, message, retry_after_s], got "
                            f"{wire._short(raw)}")
    fields = dict(zip(("row", "kind", "message", "wait"), raw, strict=True))
    return hp.Refusal(integer(fields, "row"), text(fields, "kind"), text(fields, "message"),
                      number(fields, "wait"))


def _digest(h: dict[str, Any], _: list[Any]) -> Digest:
    shipped = h.get("shipped")
    if shipped is not None and (not isinstance(shipped, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in shipped.items())):
        raise ProtocolError(f"'shipped' must map names to counts, got {wire._short(shipped)}")
    return Digest(integer(h, "seq"), text(h, "digest"), shipped)


def _promoted(h: dict[str, Any], _: list[Any]) -> Promoted:
    return Promoted(integer(h, "seq"), optional(h, "seeded", boolean))


_REPORTS: dict[str, _Parser] = {
    hp.HELLO: _hello, hp.BEAT: lambda h, _: Beat(), hp.OUT: _out,
    hp.FAILED: lambda h, _: Failed(optional(h, "error", text)),
    hp.CHECKPOINT: lambda h, _: Checkpointed(integer(h, "seq")),
    hp.DURABLE: lambda h, _: Durable(integer(h, "seq")), hp.PROMOTED: _promoted,
    hp.ALLOW: lambda h, _: Allowed(), hp.DIGEST: _digest,
}


def _batch(h: dict[str, Any], buffers: list[Any]) -> Batch:
    bid, seqs = integer(h, "bid"), _ints(h.get("seqs"), "seqs")
    try:
        inputs = np.array(wire.unpack_payload(h.get("inputs"), buffers))
        if inputs.ndim < 1 or len(inputs) != len(seqs):
            raise ProtocolError(f"{len(seqs)} rows numbered, inputs of shape "
                                f"{list(inputs.shape)}")
        streams = h.get("streams") or [""] * len(seqs)
        if not isinstance(streams, list) or len(streams) != len(seqs) or not all(
                isinstance(s, str) for s in streams):
            raise ProtocolError("'streams' must hold one string per row")
        labels = None if h.get("labels") is None else _ints(h["labels"], "labels")
        return Batch(bid, seqs, inputs, tuple(streams), labels,
                     hp.lineage_from_wire(h.get("needs")), optional(h, "at", number) or 0.0)
    except ProtocolError as exc:
        raise BadBatch(bid, len(seqs), str(exc)) from exc


def _durable(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in raw.items()):
        raise ProtocolError(f"'durable' must map operators to numbers, got {wire._short(raw)}")
    return raw


_ORDERS: dict[str, _Parser] = {
    hp.BATCH: _batch,
    hp.ATTACH: lambda h, _: Attach(text(h, "address"), optional(h, "key", text) or ""),
    hp.ALLOW: lambda h, _: Allow(text(h, "key"), _durable(h.get("durable") or {})),
    hp.NOTIFY: lambda h, _: Notify(text(h, "op"), integer(h, "seq")),
    hp.PROMOTE: lambda h, _: Promote(optional(h, "attach", text), optional(h, "key", text)
                                     or ""),
    hp.ROLLBACK: lambda h, _: Rollback(), hp.STOP: lambda h, _: Stop(),
    hp.UNSEED: lambda h, _: Unseed(),
    hp.SLOW: lambda h, _: Slow(optional(h, "s", number) or 0.0),
    hp.DIGEST: lambda h, _: DigestAsk(),
}


def _state(h: dict[str, Any], buffers: list[Any]) -> State:
    delta_of = optional(h, "delta_of", integer)
    if len(buffers) != (1 if delta_of is None else 2):
        raise ProtocolError(f"a state came with {len(buffers)} frames")
    layout = h.get("layout")
    if not isinstance(layout, list):
        raise ProtocolError(f"a state layout must be a list, got {wire._short(layout)}")
    lineages = tuple(hp.lineage_from_wire(lin) for lin in _list(h.get("lineages") or [],
                                                                 "lineages"))
    return State(integer(h, "seq"), layout, lineages, tuple(buffers),
                 optional(h, "base", boolean) or False, delta_of)


_STATE_LINK: dict[str, _Parser] = {
    hp.STATE: _state,
    hp.RECEIVED: lambda h, _: Received(integer(h, "seq"), optional(h, "gap", boolean) or False),
    hp.APPLIED: lambda h, _: Applied(integer(h, "seq"), optional(h, "gap", boolean) or False),
}


def _list(raw: Any, key: str) -> list[Any]:
    if not isinstance(raw, list):
        raise ProtocolError(f"field {key!r} must be a list, got {type(raw).__name__}")
    return raw


def _ints(raw: Any, key: str) -> tuple[int, ...]:
    if not isinstance(_list(raw, key), list) or not all(type(v) is int for v in raw):
        raise ProtocolError(f"field {key!r} must be a list of integers")
    return tuple(raw)
