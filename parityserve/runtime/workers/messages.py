"""Typed records for what workers send the frontend, and the one parser that builds them.

A worker is another process, maybe on another host: everything it sends is checked here before
the frontend acts on it. ``decode(frames)`` returns one of the records below or raises
``ProtocolError``; nothing else escapes (a property test feeds it random bytes and values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from parityserve.config import TensorSpec
from parityserve.errors import ProtocolError
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.fields import boolean as _bool
from parityserve.runtime.workers.fields import integer as _int
from parityserve.runtime.workers.fields import number as _number
from parityserve.runtime.workers.fields import optional as _opt
from parityserve.runtime.workers.fields import text as _text

__all__ = [
    "Bye",
    "Failed",
    "Heartbeat",
    "Hello",
    "MAX_THREADS",
    "Message",
    "Result",
    "decode",
    "parse",
]

MAX_THREADS = 4096  # a thread count a worker reports; anything larger is a bad message


@dataclass(frozen=True, slots=True)
class Hello:
    replica: str
    model: str
    version: int
    pid: int | None
    platform: str | None
    input: TensorSpec | None
    output: TensorSpec | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    served: int
    threads: int | None = None  # intra-op threads the worker runs batches with (None: unsaid)


@dataclass(frozen=True, slots=True)
class Result:
    bid: int
    ok: bool
    outputs: Any = None  # a numpy array or an inline msgpack value; None when not ok
    error: str = ""
    ms: float | None = None  # the worker's own time for the batch
    corrupted: int = 0  # rows a fault plan corrupted on purpose (tests only)
    bad_input: bool = False  # not ok: the model raised a ValueError or TypeError (its input)


@dataclass(frozen=True, slots=True)
class Bye:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    error: str  # the model did not load; the frontend knows which model the replica runs


Message = Hello | Heartbeat | Result | Bye | Failed


def decode(frames: list[Any]) -> Message:
    """One worker message from its frames (header first). Raises ProtocolError."""
    header, buffers = wire.decode(frames)
    return parse(header, buffers)


def parse(header: dict[str, Any], buffers: list[Any]) -> Message:
    kind = header.get("t")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise ProtocolError(f"unknown message type {wire._short(kind)}")
    if kind != wire.RESULT and buffers:
        raise ProtocolError(f"a {kind!r} message came with {len(buffers)} buffer frames")
    return parser(header, buffers)


def _hello(h: dict[str, Any], _: list[Any]) -> Hello:
    return Hello(_text(h, "replica"), _text(h, "model"), _int(h, "version"),
                 _opt(h, "pid", _int), _opt(h, "platform", _text),
                 _tensor(h.get("input")), _tensor(h.get("output")))


def _heartbeat(h: dict[str, Any], _: list[Any]) -> Heartbeat:
    return Heartbeat(_opt(h, "served", _int) or 0, _opt(h, "threads", _threads))


def _result(h: dict[str, Any], buffers: list[Any]) -> Result:
    bid, ok = _int(h, "bid"), h.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError("result without a boolean 'ok'")
    ms, corrupted = _opt(h, "ms", _number), _opt(h, "corrupted", _int) or 0
    if not ok:
        if buffers:
            raise ProtocolError("an error result came with buffer frames")
        return Result(bid, False, error=_opt(h, "error", _text) or "unknown error", ms=ms,
                      bad_input=_opt(h, "bad_input", _bool) or False)
    return Result(bid, True, wire.unpack_payload(h.get("out"), buffers), ms=ms,
                  corrupted=corrupted)


def _bye(h: dict[str, Any], _: list[Any]) -> Bye:
    return Bye()


def _failed(h: dict[str, Any], _: list[Any]) -> Failed:
    return Failed(_opt(h, "error", _text) or "unknown error")


_PARSERS: dict[str, Callable[[dict[str, Any], list[Any]], Message]] = {
    wire.HELLO: _hello, wire.HEARTBEAT: _heartbeat, wire.RESULT: _result, wire.BYE: _bye,
    wire.FAILED: _failed,
}


def _threads(h: dict[str, Any], key: str) -> int:
    value = _int(h, key)
    if not 1 <= value <= MAX_THREADS:
        raise ProtocolError(f"field {key!r} must be between 1 and {MAX_THREADS}, got {value}")
    return value


def _tensor(raw: Any) -> TensorSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProtocolError("a tensor signature must be a map")
    try:
        return TensorSpec.model_validate(raw)
    except (ValidationError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad tensor signature: {wire._short(raw)}") from exc
