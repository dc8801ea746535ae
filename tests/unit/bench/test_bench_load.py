"""`parityserve bench load`'s pure parts: the sweep's search, the pass rule, the server's
split from /metrics, the closed loop on a fake server, and clear errors for bad flags."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import pytest

from parityserve.bench import load
from parityserve.bench.loadgen import LoadResult
from parityserve.errors import ConfigError, DataError


def test_the_sweep_doubles_until_a_step_fails_then_bisects() -> None:
    rate = lambda p, f, left=4: load.next_sweep_rate(p, f, start=50, maximum=1000,  # noqa: E731
                                                     steps_left=left)
    assert rate([], []) == 50
    assert rate([50], []) == 100 and rate([50, 100, 200, 400], []) == 800
    assert rate([50, 100, 200, 400, 800], []) == 1000 and rate([1000], []) is None
    assert rate([50, 100], [200]) == 150
    assert rate([50, 100], [200], left=0) is None
    assert rate([100], [101]) is None  # the gap is under 2%: done
    assert rate([], [50]) == 25 and rate([], [1]) is None


def _step(**overrides) -> dict:
    step = {"n": 1000, "errors": {}, "p99_ms": 10.0, "throughput_rps": 99.0,
            "offered_rps": 100.0}
    return {**step, **overrides}


@pytest.mark.parametrize(("step", "passes"), [
    (_step(), True),
    (_step(p99_ms=20.1), False),
    (_step(errors={"HTTP 503": 11}), False),
    (_step(errors={"HTTP 503": 10}), True),
    (_step(n=0), False),
])
def test_a_step_passes_within_the_slo_with_few_errors(step,
                                                                              passes) -> None:
    assert load.step_passes(step, slo_ms=20.0) is passes


_METRICS = """\
# TYPE parityserve_queue_time_seconds histogram
parityserve_queue_time_seconds_bucket{{model="m",le="+Inf"}} {n}
parityserve_queue_time_seconds_count{{model="m"}} {n}
parityserve_queue_time_seconds_sum{{model="m"}} {q}
# TYPE parityserve_request_latency_seconds histogram
parityserve_request_latency_seconds_bucket{{route="infer",le="+Inf"}} {n}
parityserve_request_latency_seconds_count{{route="infer"}} {n}
parityserve_request_latency_seconds_sum{{route="infer"}} {s}
"""


def test_the_server_split_is_the_mean_over_the_run_only() -> None:
    before = load.histogram_sums(_METRICS.format(n=10, q=1.0, s=2.0))
    after = load.histogram_sums(_METRICS.format(n=110, q=1.1, s=2.3))
    result = LoadResult(latencies_s=np.full(100, 0.005), ok=np.ones(100, bool), results=[],
                        errors={}, offered_rate=100.0, duration_s=1.0)  # type: ignore[arg-type]
    split = load.server_split(before, after, result)
    assert split is not None
    assert split["queue_ms"] == pytest.approx(1.0) and split["server_ms"] == pytest.approx(3.0)
    assert split["outside_ms"] == pytest.approx(2.0)
    assert load.server_split(None, after, result) is None
    assert load.server_split({}, {}, result) is None  # not a parityserve server


def test_the_closed_loop_keeps_its_clients_busy_and_counts_failures() -> None:
    in_flight, peak = 0, 0

    async def send(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        if i % 10 == 0:
            raise ConnectionResetError("boom")
        return i

    result = asyncio.run(load.run_closed_loop(send, 4, requests=100))
    assert result.n == 100 and peak == 4
    assert result.errors == {"ConnectionResetError": 10} and int(result.ok.sum()) == 90
    summary = load.summarise(result, cpu_s=0.01, slo_ms=1000.0, batch=2, split=None)
    assert summary["n"] == 100 and summary["samples"]["p50"] == 90
    assert summary["throughput_qps"] == pytest.approx(2 * summary["throughput_rps"])
    assert summary["tool_cpu_us_per_request"] == pytest.approx(100.0)


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    args = parser.parse_args(["http://127.0.0.1:1", "--model", "m", "--rate", "10"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize(("overrides", "message"), [
    ({"concurrency": 4}, "pick exactly one mode"),
    ({"rate": None}, "pick exactly one mode"),
    ({"rate": None, "sweep": True}, "--sweep needs --slo-ms"),
    ({"model": None}, "needs --model"),
    ({"protocol": "clipper"}, "needs --app"),
    ({"rate": -1.0}, "--rate must be positive"),
    ({"batch": 0}, "--batch must be positive"),
    ({"protocol": "grpc"}, "give HOST:PORT"),
])
def test_bad_flags_are_clear_errors(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load._check(_args(**overrides))


def test_inputs_come_from_a_file_or_the_declared_shape(tmp_path) -> None:
    spec = {"name": "x", "datatype": "INT32", "shape": [3]}
    random = load._inputs(_args(), spec)
    assert random.shape == (256, 3) and random.dtype == np.int32
    np.save(tmp_path / "x.npy", np.ones((5, 2), np.float32))
    assert load._inputs(_args(inputs=tmp_path / "x.npy"), spec).shape == (5, 2)
    np.savez(tmp_path / "x.npz", a=np.zeros((3, 1)), b=np.ones((4, 1)))
    assert load._inputs(_args(inputs=tmp_path / "x.npz", input_key="b"), None).shape == (4, 1)
    with pytest.raises(DataError, match="has no array 'c'"):
        load._inputs(_args(inputs=tmp_path / "x.npz", input_key="c"), None)
    with pytest.raises(ConfigError, match="pass --shape"):
        load._inputs(_args(), {"name": "x", "datatype": "FP32", "shape": [-1]})
    batches = load._requests(np.arange(10).reshape(5, 2), 2)
    assert [b.shape for b in batches] == [(2, 2), (2, 2)]
