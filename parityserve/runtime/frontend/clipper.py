"""Codec for the Clipper-style JSON bodies (``POST /{name}/predict`` and ``/{name}/update``).

A predict body is an object with exactly one of ``input`` (one query) and ``input_batch`` (a
non-empty list of queries); its other keys are parameters (``uid``; a graph's stream key,
``label``, ``streams``, ``labels``). ``predict_request`` turns one into the serving system's
``InferenceRequest`` without knowing what it names: bodies of plain numbers by the fast path
(``edge_json``), every other by the general one here (orjson, then the request limits over
the whole body). What the name is (an application or a graph), and the checks that follow from
it, are the serving face's (``runtime/serving/face.py``).
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from parityserve.config import Limits
from parityserve.core.inputs import depth_error, scan, take_elements
from parityserve.errors import MalformedRequest
from parityserve.runtime.frontend.edge_json import decode_predict
from parityserve.runtime.serving.api import InferenceRequest

__all__ = ["check_body", "json_object", "json_value", "optional_str", "predict_items",
           "predict_request", "update_fields"]

INPUTS = ("input", "input_batch")


def predict_request(raw: bytes, target: str, limits: Limits) -> InferenceRequest:
    """The request a predict body of ``target`` makes (limits on the body checked)."""
    fast = decode_predict(raw, limits)
    if fast is not None:
        return InferenceRequest("clipper", target, queries=fast.items, batched=fast.batched,
                                parameters={} if fast.uid is None else {"uid": fast.uid})
    body = json_object(raw, limits)
    queries, batched = predict_items(body, limits, len(raw))
    parameters = {k: v for k, v in body.items() if k not in INPUTS}
    return InferenceRequest("clipper", target, queries=queries, batched=batched,
                            parameters=parameters)


def json_value(body: bytes, limits: Limits | None = None) -> Any:
    """``body`` decoded; beyond orjson's own depth cap, the ``max_json_depth`` error."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if limits is not None and str(exc).startswith("depth limit exceeded"):
            raise depth_error(limits.max_json_depth) from exc  # orjson's own cap, 1024
        raise MalformedRequest(f"invalid JSON body: {exc}") from exc


def json_object(body: bytes, limits: Limits | None = None) -> dict[str, Any]:
    """``body`` decoded, refused unless it is a JSON object."""
    data = json_value(body, limits)
    if not isinstance(data, dict):
        raise MalformedRequest(f"the body must be a JSON object, got {type(data).__name__}")
    return data


def predict_items(body: dict[str, Any], limits: Limits, size: int | None = None
                  ) -> tuple[list[Any], bool]:
    """The queries in a predict body of ``size`` bytes, and whether it was a batch, with the
    limits on the whole body checked (how many queries a target takes is the serving face's:
    an application's queries and a graph's rows are counted there)."""
    has_one, has_batch = "input" in body, "input_batch" in body
    if has_one == has_batch:
        raise MalformedRequest("the body must have exactly one of 'input' and 'input_batch'")
    check_body(body, limits, size)
    if has_one:
        return [body["input"]], False
    batch = body["input_batch"]
    if not isinstance(batch, list) or not batch:
        raise MalformedRequest("'input_batch' must be a non-empty list")
    return batch, True


def check_body(body: dict[str, Any], limits: Limits, size: int | None = None) -> None:
    """Depth and element limits over a body's other values (a label, unknown keys), and
    ``max_request_elements`` over all its values (lists and objects included) when its
    ``size`` (bytes) could hold more.

    Inputs are scanned once more, by the system, where the same pass checks them against the
    model's signature (runtime/serving/router.py ``_coerce_for``): this pass is skipped for a
    body too short to hold more than the limit (n values take at least 2n - 1 bytes), most of
    them.
    """
    for key, value in body.items():
        if key not in INPUTS:
            scan(value, max_depth=limits.max_json_depth,
                 max_elements=limits.max_input_elements, depth=2)
    if size is None or size >= 2 * limits.max_request_elements:
        leaves = scan(body, max_depth=limits.max_json_depth, max_elements=sys.maxsize)
        take_elements(0, leaves.count + leaves.containers, limit=limits.max_request_elements,
                      what="the body")


def optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise MalformedRequest(f"{key!r} must be a non-empty string")
    return value


def update_fields(body: dict[str, Any]) -> tuple[str, Any, Any]:
    """``uid``, ``input`` and ``label`` of a feedback body."""
    missing = [k for k in ("uid", "input", "label") if k not in body]
    if missing:
        raise MalformedRequest(f"update body is missing {missing}")
    uid = body["uid"]
    if not isinstance(uid, str) or not uid:
        raise MalformedRequest("'uid' must be a non-empty string")
    return uid, body["input"], body["label"]
