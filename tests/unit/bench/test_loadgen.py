"""The open-loop load generator and its statistics, driven by in-process async fakes."""

from __future__ import annotations

import asyncio
import gc
import math
import time

import numpy as np
import orjson
import pytest

from parityserve.bench import loadgen, stats
from parityserve.bench.loadgen import (
    HttpStatusError,
    LoadResult,
    encode_bodies,
    error_kind,
    poisson_schedule,
    run_at_rates,
    run_event_loop,
    run_open_loop,
)
from parityserve.errors import ConfigError


def test_public_names() -> None:
    assert sorted(loadgen.__all__) == [
        "HttpSender", "HttpStatusError", "LoadResult", "Send", "collector_paused",
        "encode_bodies", "error_kind",
        "json_open_loop", "json_sender", "poisson_schedule", "run_at_rates", "run_event_loop",
        "run_open_loop", "warm_open_loops", "warm_up", "warmed_json_sender",
    ]
    assert sorted(stats.__all__) == [
        "PERCENTILES", "enough_samples", "median_and_spread", "min_samples", "percentiles",
    ]


# --- schedule -----------------------------------------------------------------------------


def test_poisson_schedule_has_the_asked_rate() -> None:
    sched = poisson_schedule(500.0, 20_000, np.random.default_rng(7))
    assert sched.shape == (20_000,)
    assert np.all(np.diff(sched) > 0)
    assert 20_000 / sched[-1] == pytest.approx(500.0, rel=0.03)
    gaps = np.diff(sched)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1


def test_poisson_schedule_is_reproducible() -> None:
    a = poisson_schedule(100.0, 50, np.random.default_rng(3))
    b = poisson_schedule(100.0, 50, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
def test_poisson_schedule_rejects_bad_rates(rate: float) -> None:
    with pytest.raises(ConfigError):
        poisson_schedule(rate, 10, np.random.default_rng(0))


# --- run_open_loop ------------------------------------------------------------------------


def _sleeper(seconds: float):
    async def send(i: int) -> int:
        await asyncio.sleep(seconds)
        return i * 2

    return send


def test_open_loop_does_not_wait_for_answers() -> None:
    schedule = np.arange(20) * 0.002  # 20 queries over 38 ms, each taking 20 ms
    result = asyncio.run(run_open_loop(_sleeper(0.02), schedule))
    assert result.ok.all() and result.errors == {}
    assert result.results == [i * 2 for i in range(20)]
    assert np.all(result.latencies_s >= 0.02)
    # Closed loop would need 20 x 20 ms = 400 ms.
    assert result.duration_s < 0.25


def test_latency_runs_from_the_intended_time_when_the_generator_is_late() -> None:
    async def send(i: int) -> int:
        if i == 0:
            time.sleep(0.06)  # blocks the event loop: queries 1..4 are launched ~60 ms late
        await asyncio.sleep(0.005)
        return i

    schedule = np.array([0.0, 0.001, 0.002, 0.003, 0.004])
    result = asyncio.run(run_open_loop(send, schedule))
    assert result.ok.all()
    for i in range(1, 5):
        # launched >= 60 ms after t=0, done 5 ms later; intended at i ms
        assert result.latencies_s[i] >= 0.065 - schedule[i] - 0.002


def test_the_garbage_collector_is_off_while_a_run_is_timed_and_restored_after() -> None:
    seen = []

    async def send(i: int) -> int:
        seen.append(gc.isenabled())
        return i

    assert gc.isenabled()
    result = asyncio.run(run_open_loop(send, np.arange(3) * 0.001))
    assert result.ok.all() and seen == [False, False, False] and gc.isenabled()
    from parityserve.bench.load import run_closed_loop

    seen.clear()
    closed = asyncio.run(run_closed_loop(send, 2, requests=4))
    assert closed.ok.all() and seen == [False] * 4 and gc.isenabled()


def test_overlapping_pauses_restore_the_collector_once_the_last_ends() -> None:
    with loadgen.collector_paused():
        with loadgen.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer run is still timed
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with loadgen.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_run_still_restores_the_collector() -> None:
    async def boom(i: int) -> int:
        raise RuntimeError("refused")

    result = asyncio.run(run_open_loop(boom, np.arange(2) * 0.001))
    assert result.errors == {"RuntimeError": 2} and gc.isenabled()
    with pytest.raises(KeyError), loadgen.collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_send_lag_is_recorded_and_spinning_sends_on_time() -> None:
    schedule = 0.003 + np.arange(5) * 0.002
    result = run_event_loop(run_open_loop(_sleeper(0.0), schedule, spin_s=0.002))
    assert result.ok.all()
    assert np.all(result.send_lag_s >= 0) and np.all(np.isfinite(result.send_lag_s))
    # Some send was on time. Not every send: one stall of a shared CI machine (120 ms seen)
    # makes every send after it late together, and that is the machine, not the spin.
    assert np.min(result.send_lag_s) < 0.05
    assert result.summary()["send_lag_p99_ms"] >= result.summary()["send_lag_p50_ms"]
    assert np.all(result.latencies_s >= result.send_lag_s)


def test_errors_are_counted_never_lost() -> None:
    async def send(i: int) -> int:
        if i % 3 == 0:
            raise ValueError("bad")
        if i % 5 == 0:
            raise HttpStatusError(503, b"busy")
        return i

    result = asyncio.run(run_open_loop(send, np.zeros(30)))
    assert result.errors == {"ValueError": 10, "HTTP 503": 4}
    assert int(result.ok.sum()) == 16
    assert int(result.ok.sum()) + sum(result.errors.values()) == result.n == 30
    assert np.all(np.isfinite(result.latencies_s))
    assert [r for r in result.results if r is not None] == [
        i for i in range(30) if i % 3 and i % 5
    ]


def test_timeout_marks_stragglers() -> None:
    async def send(i: int) -> int:
        await asyncio.sleep(30.0 if i == 2 else 0.001)
        return i

    t0 = time.perf_counter()
    result = asyncio.run(run_open_loop(send, np.zeros(4), timeout_s=0.05))
    assert time.perf_counter() - t0 < 1.0
    assert result.errors == {"timeout": 1}
    assert list(result.ok) == [True, True, False, True]
    assert result.results[2] is None
    assert result.latencies_s[2] >= 0.05  # a lower bound: the time it was waited for


def test_max_in_flight_wait_counts_in_latency() -> None:
    result = asyncio.run(run_open_loop(_sleeper(0.005), np.zeros(6), max_in_flight=1))
    assert result.ok.all()
    # All six were due at t=0; one at a time, the last finishes after ~6 x 5 ms.
    assert result.latencies_s.max() >= 0.029


def test_summary_fields_and_reliability() -> None:
    result = asyncio.run(run_open_loop(_sleeper(0.0), np.zeros(10), rate_qps=123.0))
    summary = result.summary()
    assert {"n", "ok", "errors", "throughput_qps", "offered_qps", "p50_ms", "p99_ms",
            "p999_ms", "mean_ms", "max_ms", "p999_reliable", "send_lag_p50_ms",
            "send_lag_p99_ms"} <= set(summary)
    assert summary["n"] == summary["ok"] == 10
    assert summary["offered_qps"] == 123.0
    assert summary["p999_reliable"] is False
    assert summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert result.throughput > 0


def test_empty_schedule() -> None:
    result = asyncio.run(run_open_loop(_sleeper(0.0), np.zeros(0)))
    assert result.n == 0 and result.throughput == 0.0
    assert math.isnan(result.summary()["p50_ms"])


def test_progress_bar_is_optional(capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(run_open_loop(_sleeper(0.0), np.zeros(5), progress="fake"))
    assert "fake" in capsys.readouterr().err


def test_run_at_rates_seeds_each_rate() -> None:
    runs = asyncio.run(run_at_rates(_sleeper(0.0), [2000.0, 4000.0], queries=40, seed=1))
    assert [rate for rate, _ in runs] == [2000.0, 4000.0]
    assert all(isinstance(r, LoadResult) and r.ok.all() and r.n == 40 for _, r in runs)
    by_duration = asyncio.run(run_at_rates(_sleeper(0.0), [1000.0], duration_s=0.02))
    assert by_duration[0][1].n == 20
    with pytest.raises(ConfigError):
        asyncio.run(run_at_rates(_sleeper(0.0), [1.0]))


def test_error_kind_and_bodies() -> None:
    assert error_kind(KeyError("x")) == "KeyError"
    assert error_kind(HttpStatusError(404, b"")) == "HTTP 404"
    bodies = encode_bodies([np.arange(3, dtype=np.float32), [1, 2]])
    assert bodies == [b'{"input":[0.0,1.0,2.0]}', b'{"input":[1,2]}']


# --- HTTP clients -------------------------------------------------------------------------


async def _http_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal keep-alive HTTP/1.1 server: 200 with the body back, 503 for /busy."""
    try:
        while True:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
            length = next(int(v) for k, _, v in (h.partition(": ") for h in lines)
                          if k.lower() == "content-length")
            body = await reader.readexactly(length)
            status = "503 Service Unavailable" if " /busy " in lines[0] else "200 OK"
            writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n"
                         "content-type: application/json\r\n\r\n".encode() + body)
            await writer.drain()
    except asyncio.IncompleteReadError:  # the client closed its connection
        pass
    finally:
        writer.close()
        await writer.wait_closed()


async def _post_through(client: str) -> tuple[str, list[object], dict[str, int]]:
    server = await asyncio.start_server(_http_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with loadgen.HttpSender(f"http://127.0.0.1:{port}/", client=client) as http:
            ok = await run_open_loop(loadgen.json_sender(http, "/a/predict",
                                                         encode_bodies([1, 2, 3])), np.zeros(3))
            busy = await run_open_loop(loadgen.json_sender(http, "/busy", [b"{}"]),
                                       np.zeros(2))
        return http.client, [r["input"] for r in ok.results], busy.errors
    finally:
        server.close()
        await server.wait_closed()


async def _warmed_then_measured() -> tuple[list[int], list[object]]:
    """What the echo server saw, in order, and what the measured run got back."""
    seen: list[int] = []

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        original_read = reader.readexactly

        async def read(n: int) -> bytes:
            body = await original_read(n)
            seen.append(orjson.loads(body)["input"])
            return body
        reader.readexactly = read  # type: ignore[method-assign]
        await _http_echo(reader, writer)

    server = await asyncio.start_server(counting, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with loadgen.warmed_json_sender(f"http://127.0.0.1:{port}", "/a/predict",
                                              encode_bodies([10, 11, 12]), warmup=4) as send:
            assert seen == [10, 11, 12, 10]  # the warm-up ran, one after another, before
            result = await run_open_loop(send, np.zeros(2))
        return seen, [r["input"] for r in result.results]
    finally:
        server.close()
        await server.wait_closed()


def test_a_warmed_sender_is_handed_over_after_its_warm_up_queries() -> None:
    seen, answers = asyncio.run(_warmed_then_measured())
    assert seen[:4] == [10, 11, 12, 10]
    assert sorted(answers) == [10, 11]  # the measured run starts again at query 0


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_both_http_clients_send_and_count_statuses(client: str) -> None:
    used, answers, errors = asyncio.run(_post_through(client))
    assert used == client
    assert answers == [1, 2, 3]
    assert errors == {"HTTP 503": 2}


def test_http_client_defaults_to_aiohttp_and_falls_back_to_httpx(monkeypatch) -> None:
    assert loadgen.HttpSender("http://x").client == "aiohttp"  # the bench extra is installed
    monkeypatch.setattr(loadgen, "_has_aiohttp", lambda: False)
    assert loadgen.HttpSender("http://x").client == "httpx"  # a plain install
    with pytest.raises(ConfigError, match="client must be one of"):
        loadgen.HttpSender("http://x", client="requests")


# --- stats --------------------------------------------------------------------------------


def test_percentiles_are_observed_values_in_ms() -> None:
    lat = np.arange(1, 1001) / 1000.0  # 1 ms .. 1000 ms
    p = stats.percentiles(lat)
    expected = {"p50_ms": 501.0, "p90_ms": 901.0, "p99_ms": 991.0, "p999_ms": 1000.0}
    assert p == pytest.approx(expected)
    assert stats.percentiles([0.001, math.nan])["p50_ms"] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in stats.percentiles([]).values())


def test_sample_rules_and_spread() -> None:
    assert stats.min_samples(99.9) == 1000 and stats.min_samples(99.0) == 100
    assert stats.enough_samples(1000, 99.9) and not stats.enough_samples(999, 99.9)
    assert stats.median_and_spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert stats.median_and_spread(v for v in (5.0,)) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError):
        stats.median_and_spread([])


@pytest.mark.parametrize("token", ["-starts-with-a-dash", "plain", "--looks-like-a-flag"])
def test_v2_target_takes_any_token_and_shape(token: str) -> None:
    """A urlsafe admin token begins with "-" one time in 64; argparse must not read it as an
    option (it did, and the profiler failed with 'expected one argument')."""
    from parityserve.bench.load import v2_target

    target = v2_target("http://127.0.0.1:9", "-model", token=token, shape="-1,4")
    assert (target.args.token, target.args.model, target.args.shape) == (token, "-model", "-1,4")
