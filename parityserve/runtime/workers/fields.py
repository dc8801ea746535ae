"""Reading one field of a peer's message header: the type checked, a ``ProtocolError`` if not.

The parsers of both worker protocols (``workers/messages.py`` for model workers,
``graphs/hams_messages.py`` for stateful graph operators) read headers with these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parityserve.errors import ProtocolError

__all__ = ["MAX_TEXT", "boolean", "integer", "number", "optional", "text"]

MAX_TEXT = 4096  # errors and names a peer sends are cut here (they end up in logs)


def text(h: dict[str, Any], key: str) -> str:
    value = h.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value[:MAX_TEXT]


def integer(h: dict[str, Any], key: str) -> int:
    value = h.get(key)
    if type(value) is not int:
        raise ProtocolError(f"field {key!r} must be an integer, got {type(value).__name__}")
    return value


def boolean(h: dict[str, Any], key: str) -> bool:
    value = h.get(key)
    if not isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be a boolean, got {type(value).__name__}")
    return value


def number(h: dict[str, Any], key: str) -> float:
    value = h.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be a number, got {type(value).__name__}")
    return float(value)


def optional(h: dict[str, Any], key: str, read: Callable[[dict[str, Any], str], Any]) -> Any:
    """``read``'s value, or None when the field is absent or null."""
    return None if h.get(key) is None else read(h, key)
