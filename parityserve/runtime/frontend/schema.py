"""Pydantic models of the documents the hot paths parse by hand, for the OpenAPI document.

The predict, update and V2 infer handlers never touch these models (they parse with orjson
for speed); the models exist so ``/openapi.json`` describes exactly what those parsers accept.
``tests/unit/runtime/frontend/test_openapi.py`` checks the two agree on generated bodies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ErrorBody",
    "InferParameters",
    "InferRequestBody",
    "InferResponseBody",
    "LiveResponse",
    "ModelMetadataResponse",
    "PredictBody",
    "Prediction",
    "ReadyResponse",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "ServerMetadataResponse",
    "TensorMetadata",
    "UpdateBody",
]

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                   "INT64", "FP16", "FP32", "FP64", "BYTES"]
_NonEmpty = Field(min_length=1)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: what went wrong, and a stable machine-readable code."""

    error: str
    code: str


class PredictBody(_Doc):
    """``POST /{app}/predict``: exactly one of ``input`` and ``input_batch``."""

    input: Any = None
    input_batch: list[Any] | None = Field(default=None, min_length=1)
    uid: str | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _one_of(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("input" in data) == ("input_batch" in data):
            raise ValueError("exactly one of 'input' and 'input_batch'")
        if isinstance(data, dict) and data.get("input_batch", [0]) is None:
            raise ValueError("'input_batch' must be a non-empty list")  # null is not absent
        return data


class Prediction(_Doc):
    """One answer of ``/{app}/predict`` (a batch answers with a list of these)."""

    query_id: str | None = None
    output: Any = None
    default: bool = False


class UpdateBody(_Doc):
    """``POST /{app}/update``: feedback for one query."""

    uid: str = Field(min_length=1)
    input: Any
    label: Any
    query_id: str | None = Field(default=None, min_length=1)


class InferParameters(_Doc):
    binary_data: bool | None = None
    binary_data_size: int | None = Field(default=None, ge=0)
    binary_data_output: bool | None = None


class RequestInput(BaseModel):
    """A V2 input tensor; ``data`` is absent when ``parameters.binary_data_size`` is set."""

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: InferParameters | None = None
    data: Any = None


class RequestOutput(BaseModel):
    name: str
    parameters: InferParameters | None = None


class InferRequestBody(BaseModel):
    """The JSON header of ``POST /v2/models/{model}/infer`` (KServe V2 / Open Inference)."""

    id: str | None = None
    parameters: InferParameters | None = None
    inputs: list[RequestInput] = _NonEmpty
    outputs: list[RequestOutput] = []


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: InferParameters | None = None
    data: Any = None


class InferResponseBody(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[ResponseOutput]


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadataResponse(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadataResponse(BaseModel):
    name: str
    version: str
    extensions: list[str]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool
