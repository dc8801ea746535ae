"""Micro-timing of the hot path's input handling for one 784-float query (no server).

Times what the predict and infer handlers do to a body before queueing it: parse, the
request limits, and the model-signature coercion (leaf types, non-finite check). Run it with
``PYTHONPATH`` at two checkouts to compare; it detects which signatures the code has.

    PYTHONPATH=. python benchmarks/diagnostics/input_checks_cost.py
"""

from __future__ import annotations

import inspect
import json
import timeit

import numpy as np
import orjson

from parityserve.config import TensorSpec
from parityserve.runtime.frontend import http, v2
from parityserve.runtime.modelpath import tensors

SPEC = TensorSpec(name="x", datatype="FP32", shape=(784,))


try:
    from parityserve.config import Limits
    LIMITS = Limits()
except ImportError:  # before the limits existed
    LIMITS = None
try:  # the Clipper codec's public names
    from parityserve.runtime.frontend.clipper import json_object, predict_items
except ImportError:  # a checkout from before runtime/frontend/clipper.py: http.py's own
    json_object, predict_items = http._object, http._predict_items  # type: ignore[attr-defined]
NEW_HTTP = "limits" in inspect.signature(predict_items).parameters
NEW_V2 = "limits" in inspect.signature(v2.decode_infer_request).parameters


def _clipper(body: bytes) -> None:
    if NEW_HTTP:  # the limits and the signature check share one scan, as the system does
        from parityserve.core.inputs import scan
        items, _ = predict_items(json_object(body, LIMITS), LIMITS)
        leaves = scan(items[0], max_depth=LIMITS.max_json_depth,
                      max_elements=LIMITS.max_input_elements, depth=3)
        tensors.coerce_item(items[0], SPEC, where="m", leaves=leaves)
    else:
        items, _ = predict_items(json_object(body))
        tensors.coerce_item(items[0], SPEC, where="m")


def _v2(body: bytes, length: int | None) -> None:
    if NEW_V2:
        array = v2.decode_infer_request(body, length, LIMITS).inputs[0].array
        np.isfinite(array).all()  # infer_detailed adds it (serving/system.py _check_finite)
    else:
        v2.decode_infer_request(body, length)


def main() -> None:
    x = np.random.default_rng(0).random((1, 784)).astype(np.float32)
    clipper = orjson.dumps({"input": x[0].tolist()})
    json_body, _ = v2.encode_infer_request([("x", x)], binary=False)
    bin_body, headers = v2.encode_infer_request([("x", x)], binary=True)
    length = int(headers[v2.HEADER_LENGTH])
    cases = {"clipper_json": lambda: _clipper(clipper), "v2_json": lambda: _v2(json_body, None),
             "v2_binary": lambda: _v2(bin_body, length)}
    out = {}
    for name, fn in cases.items():
        runs = timeit.repeat(fn, number=2000, repeat=7)
        out[name + "_us"] = round(min(runs) / 2000 * 1e6, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
