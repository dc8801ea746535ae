"""The KServe V2 tensor datatype names and their numpy dtypes: one table, in a leaf module.

Models declare tensors by V2 datatype name and the V2 codec reads and writes them, so both
``models/`` and ``runtime/`` need this table; it lives here so that a model never imports
how it is served.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parityserve.errors import InvalidInput

__all__ = ["DATATYPES", "datatype_to_dtype", "dtype_to_datatype"]

# Little-endian, as the V2 binary extension sends numbers.
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
DATATYPES: tuple[str, ...] = tuple(_DTYPES)
# (kind, itemsize) -> datatype, so big-endian arrays map to the same name as native ones.
_BY_KIND = {(d.kind, d.itemsize): name for name, d in _DTYPES.items() if name != "BYTES"}


def datatype_to_dtype(datatype: str) -> np.dtype[Any]:
    try:
        return _DTYPES[datatype]
    except KeyError:
        raise InvalidInput(f"unknown datatype {datatype!r}; expected one of "
                           f"{', '.join(DATATYPES)}") from None


def dtype_to_datatype(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _BY_KIND[dtype.kind, dtype.itemsize]
    except KeyError:
        raise InvalidInput(f"numpy dtype {dtype} has no V2 datatype") from None
