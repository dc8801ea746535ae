"""ParM's tail benefit on a real server: a slowed replica's p99 is lower with ParM than without.

One ``parityserve start`` process serves two copies of ``zoo:echo`` (a bias-free linear model,
so its parity model is itself and ParM decodes exactly), each with two data replicas, replica 0
of each slowed by the same constant delay: ``parm`` codes pairs of batches into a parity query
(one parity replica beside them), ``plain`` has no redundancy. One open-loop Poisson schedule
sends query i to ``parm`` when i is even and to ``plain`` when odd, so both see the same
moments of the machine; latencies count from each query's intended send time. The claim is an
ordering within the run (ParM's p99 below the plain model's), never a bound in milliseconds:
a plain query that lands on the slowed replica waits its whole delay, and several percent of
them do, while ParM rebuilds those from the partner batch and the parity answer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from parityserve.bench.loadgen import (
    HttpSender,
    HttpStatusError,
    encode_bodies,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.bench.stats import percentiles

pytestmark = pytest.mark.integration

DELAY_MS = 400.0  # replica 0 of each model: a plain query there waits this long
RATE_QPS = 50.0  # both models together: well below what a loaded box serves
QUERIES = 600  # 300 per model: the p99 is the 3rd slowest, over 12 s of load


def _model(name: str, **extra: object) -> dict:
    return {"name": name, "source": "zoo:echo", "replicas": 2,
            "input": {"name": "input", "datatype": "FP32", "shape": [4]},
            "batching": {"max_batch_size": 1}, "faults": {"0": {"delay_ms": DELAY_MS}},
            **extra}


CONFIG = {
    "server": {"http_port": 0, "grpc_port": 0, "cache_bytes": 0},
    # group_wait_ms: at 25 q/s a model's batches come ~40 ms apart; the group waits for its
    # partner rather than closing alone, unprotected.
    "models": [_model("parm", parity={"k": 2, "group_wait_ms": 100}), _model("plain")],
    "applications": [{"name": n, "models": [n], "slo_ms": 10_000, "default_output": "DEFAULT"}
                     for n in ("parm", "plain")],
}


async def _interleaved(url: str, inputs: np.ndarray, schedule: np.ndarray):
    bodies = encode_bodies(list(inputs))

    async with HttpSender(url, limit=64) as http:
        async def send(i: int) -> dict:
            app = "parm" if i % 2 == 0 else "plain"
            status, raw = await http.post_json(f"/{app}/predict", bodies[i])
            if status != 200:
                raise HttpStatusError(status, raw)
            return orjson.loads(raw)

        for i in range(8):  # warm both paths (connections, first batches) before timing
            await send(i)
        return await run_open_loop(send, schedule, rate_qps=RATE_QPS, timeout_s=60.0)


def test_parm_lowers_the_p99_of_a_slowed_replica_against_no_redundancy(tmp_path: Path) -> None:
    """Guards ParM's reason to exist on a real server (the simulator alone asserted it): with
    one slowed replica, the ParM model's p99 is below the unprotected model's in the same
    interleaved run, every query is answered once with its right output, and ParM did rebuild
    answers (so the ordering comes from decoding, not from luck in where queries landed)."""
    rng = np.random.default_rng(0)
    inputs = rng.uniform(-1, 1, size=(QUERIES, 4)).astype(np.float32)
    schedule = poisson_schedule(RATE_QPS, QUERIES, rng)
    with ServerProcess(write_config(CONFIG, tmp_path / "serving.yaml")) as server:
        result = run_event_loop(_interleaved(server.url, inputs, schedule))
    assert result.ok.all(), result.summary()["errors"]
    for x, answer in zip(inputs, result.results, strict=True):
        assert answer["default"] is False, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    parm, plain = result.latencies_s[0::2], result.latencies_s[1::2]
    rebuilt = sum(bool(a.get("reconstructed")) for a in result.results[0::2])
    p_parm, p_plain = percentiles(parm), percentiles(plain)
    print(f"p99 ParM {p_parm['p99_ms']:.1f} ms vs no redundancy {p_plain['p99_ms']:.1f} ms "
          f"(p50 {p_parm['p50_ms']:.1f} vs {p_plain['p50_ms']:.1f}); {rebuilt} of "
          f"{parm.size} ParM answers rebuilt")
    assert rebuilt > 0
    assert p_parm["p99_ms"] < p_plain["p99_ms"], (p_parm, p_plain)
