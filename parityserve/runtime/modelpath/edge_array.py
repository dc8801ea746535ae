"""One query's input as the HTTP edge decoded it: a numpy array made straight from JSON numbers.

``runtime/frontend/edge_json.py`` makes an ``EdgeArray`` at the edge; the router and the model
path's coercion (``runtime/modelpath/tensors.py``) take it where the general path would have made
the same array. It lives here, below both, so that the model path never imports the HTTP edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from parityserve.core.inputs import Leaves

__all__ = ["EdgeArray", "json_value"]


@dataclass(frozen=True, slots=True, eq=False)
class EdgeArray:
    """One query's input, decoded from JSON numbers at the edge: int64 when every number was
    written as an integer, else float64; ``leaves`` is what ``scan`` says of the JSON value.
    ``as_decoded`` is that value as the general path decodes it (lists of Python numbers)."""

    array: np.ndarray[Any, Any]
    leaves: Leaves
    body: bytes
    key: str
    index: int | None = None

    def as_decoded(self) -> Any:
        value = orjson.loads(self.body)[self.key]
        return value if self.index is None else value[self.index]


def json_value(item: Any) -> Any:
    """A query as the general path decodes it, whichever path it took."""
    return item.as_decoded() if isinstance(item, EdgeArray) else item
