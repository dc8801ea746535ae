"""The worker's emulated-accelerator hold: the drawn service time minus the real compute."""

from __future__ import annotations

import time

import pytest

from parityserve.core.emulation import PROFILES, draw_service_s
from parityserve.runtime.workers.worker import WorkerSpec, _Emulator

SPEC = {"name": "t", "base_ms": 20.0, "per_query_ms": 5.0, "source": "a test",
        "distribution": "constant", "cv": 0.0}


def _spec(emulation: dict, rid: str = "m/v1/r0#1-ab") -> WorkerSpec:
    return WorkerSpec(replica_id=rid, model="m", version=1, source="zoo:echo",
                      emulation=emulation)


def test_a_worker_without_emulation_holds_nothing() -> None:
    assert _Emulator.from_spec(_spec({})) is None


def test_the_hold_is_the_service_time_left_after_the_real_compute() -> None:
    emulator = _Emulator.from_spec(_spec({**SPEC, "seed": 1}))
    assert emulator is not None
    now = time.perf_counter()
    # A batch of 2 takes 30 ms on the emulated device; it started 10 ms ago (real compute).
    assert emulator.hold_s(2, now - 0.010) == pytest.approx(0.020, abs=0.002)
    assert emulator.overruns == 0


def test_a_compute_longer_than_the_service_time_is_counted_and_reported(capsys) -> None:
    emulator = _Emulator.from_spec(_spec({**SPEC, "seed": 1}))
    assert emulator is not None
    assert emulator.hold_s(1, time.perf_counter() - 1.0) == 0.0
    assert emulator.overruns == 1
    assert "1 batch(es) computed for longer than the drawn service time (25.00 ms)" in \
        capsys.readouterr().err


def test_replica_slots_draw_their_own_streams_that_survive_a_restart() -> None:
    parm = {**{k: getattr(PROFILES["parm-gpu-resnet18"], k) for k in SPEC}, "seed": 3}
    draws = {}
    for rid in ("m/v1/r0#1-aa", "m/v1/r0#2-bb", "m/v1/r1#1-cc"):
        emulator = _Emulator.from_spec(_spec(parm, rid))
        assert emulator is not None
        draws[rid] = draw_service_s(emulator.profile, 1, emulator.rng)
    assert draws["m/v1/r0#1-aa"] == draws["m/v1/r0#2-bb"]  # the same slot, restarted
    assert draws["m/v1/r0#1-aa"] != draws["m/v1/r1#1-cc"]
