"""Overload and bad numbers on a real server with real workers.

The overload scenario is ``benchmarks/diagnostics/overload.py`` (the same code that measured
the before/after counts): one ``zoo:echo`` replica slowed to 20 queries/s by an injected
50 ms per batch, offered 5x that for 20 s, open-loop, half on the Clipper route and half on V2.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.diagnostics import overload as diagnostic
from parityserve.runtime.frontend import v2

pytestmark = pytest.mark.integration

RSS_BOUND_MIB = 64  # frontend growth over 2,000 queries at 5x; measured ~5 MiB
VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}



@pytest.mark.timeout(180)
def test_five_times_capacity_sheds_with_retry_after_and_answers_every_query_once(
        tmp_path: Path) -> None:
    report = diagnostic.run(factor=5.0, duration_s=20.0, base_dir=tmp_path)
    counts = report["counts"]
    print(report)  # the counts, for the record (pytest -s)
    answers = {k: v for k, v in counts.items() if k != "sent"}
    assert set(answers) <= {"prediction", "default", "shed", "deadline"}, counts
    assert sum(answers.values()) == counts["sent"] == 2000  # exactly one answer each
    assert counts["shed"] > counts["sent"] / 2  # 80% of the offer cannot be served
    served = report["capacity_qps"] * report["duration_s"]  # 400 at full use
    assert counts.get("prediction", 0) >= served / 4, counts  # shedding keeps it working
    assert report["rss_growth_mib"] < RSS_BOUND_MIB, report


@pytest.fixture(scope="module")
def served(server_factory):
    return server_factory({
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000},
        "models": [
            {"name": "vec", "source": "zoo:echo", "replicas": 1, "input": VECTOR},
            {"name": "lenient", "source": "zoo:echo", "replicas": 1, "input": VECTOR,
             "allow_nonfinite": True},
            {"name": "free", "source": "zoo:echo", "replicas": 1},  # no input spec
            {"name": "sleepy", "source": "zoo:echo", "replicas": 1, "input": VECTOR,
             "timeout_ms": 100, "faults": {"all": {"delay_ms": 400}}},
        ],
        "applications": [
            {"name": "vecapp", "models": ["vec"], "slo_ms": 5000, "default_output": "D"},
            {"name": "freeapp", "models": ["free"], "slo_ms": 5000, "default_output": "D"},
        ],
    })


def _json_infer(url: str, model: str, data: object, shape: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "data": data}]}
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


def _binary_infer(url: str, model: str, array: np.ndarray) -> httpx.Response:
    body, headers = v2.encode_infer_request([("input", array)], binary=True)
    return httpx.post(f"{url}/v2/models/{model}/infer", content=body, headers=headers,
                      timeout=30)


def _assert_400(response: httpx.Response, words: str) -> None:
    assert response.status_code == 400, response.text
    assert words in response.json()["error"], response.json()


def test_v2_tensor_with_zero_rows_is_a_400(served) -> None:
    response = _json_infer(served.url, "vec", [], [0, 4])
    _assert_400(response, "zero rows")


def test_v2_scalar_tensor_on_a_model_without_a_spec_is_a_400(served) -> None:
    _assert_400(_json_infer(served.url, "free", 1.0, []), "scalar")


def test_v2_deadline_passed_is_a_504_with_a_json_error(served) -> None:
    response = _json_infer(served.url, "sleepy", [1.0, 2.0, 3.0, 4.0], [1, 4])
    assert response.status_code == 504, response.text
    assert response.json()["code"] == "deadline_exceeded"


@pytest.mark.parametrize(("data", "words"), [
    ([1e39, 0.0, 0.0, 0.0], "non-finite"),
    ([None, 0.0, 0.0, 0.0], "null"),
    (["1", 0.0, 0.0, 0.0], "strings"),
    ([True, 0.5, 0.0, 0.0], "booleans"),
])
def test_v2_json_refuses_numbers_that_are_not_numbers(served, data, words) -> None:
    _assert_400(_json_infer(served.url, "vec", data, [1, 4]), words)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_v2_binary_refuses_nonfinite_unless_the_model_allows_it(served, bad) -> None:
    array = np.array([[bad, 1.0, 2.0, 3.0]], dtype=np.float32)
    _assert_400(_binary_infer(served.url, "vec", array), "allow_nonfinite")
    allowed = _binary_infer(served.url, "lenient", array)
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize(("item", "words"), [
    ([1e39, 0.0, 0.0, 0.0], "non-finite"),
    ([None, 0.0, 0.0, 0.0], "null"),
    (["1", 0.0, 0.0, 0.0], "strings"),
    ([True, 0.5, 0.0, 0.0], "booleans"),
])
def test_clipper_route_refuses_numbers_that_are_not_numbers(served, item, words) -> None:
    response = httpx.post(f"{served.url}/vecapp/predict", json={"input": item}, timeout=30)
    _assert_400(response, words)


def test_a_model_without_an_input_spec_still_takes_what_it_took(served) -> None:
    response = httpx.post(f"{served.url}/freeapp/predict",
                          json={"input": ["text", None, True, 1e39]}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["output"] == ["text", None, True, 1e39]
