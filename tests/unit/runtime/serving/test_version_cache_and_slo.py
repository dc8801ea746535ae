"""Two bugs a user would meet after a rollout or on a shared model, each planted by hand once
and passed by the whole suite (issue 44): the prediction cache answering a new model version
with the old version's prediction, and admission judging a model by the loosest SLO of the
applications sharing it instead of the tightest.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from parityserve.config import Application, BatchingConfig, Deployment
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.admin_ops import AppAdmin, slo_for
from parityserve.runtime.serving.applications import AppRuntime
from parityserve.runtime.workers import wire
from tests.unit.runtime.modelpath.dispatch_fakes import T0, FakeClock, FakeLink

Cache = ClockCache[tuple[str, int, bytes], Any]


def _path(version: int, cache: Cache, clock: FakeClock, link: FakeLink) -> ModelPath:
    deployment = Deployment(name="m", source="zoo:echo", version=version,
                            batching=BatchingConfig(max_batch_size=4))
    path = ModelPath(deployment, link=link, metrics=Metrics(), cache=cache, clock=clock,
                     slo_s=1.0, max_queue=100)
    path.replicas[f"v{version}"] = Replica(f"v{version}", 0, AIMDController(4, 1.0), clock(),
                                           state="ready")
    return path


def _answer(path: ModelPath, link: FakeLink, scale: float) -> None:
    """The last batch sent, answered as its replica would: the input times ``scale``."""
    rid, header, frames = link.sent[-1]
    outputs = np.asarray(wire.unpack_payload(header["in"], frames)) * scale
    desc, out_frames = wire.pack_payload(outputs)
    path.on_result(path.replicas[rid], {"t": wire.RESULT, "bid": header["bid"], "ok": True,
                                        "out": desc}, [bytes(f) for f in out_frames])


def test_cache_keys_of_two_versions_of_a_model_differ() -> None:
    """Guards ModelPath._key: a key without the version lets version 2 read version 1's
    predictions out of the server's one shared cache."""
    cache: Cache = ClockCache(1 << 20)
    clock, link = FakeClock(), FakeLink()
    item = np.array([1.0, 2.0], dtype=np.float32)
    old, new = _path(1, cache, clock, link), _path(2, cache, clock, link)
    assert old._key(item) != new._key(item)  # noqa: SLF001
    assert old._key(item) == _path(1, cache, clock, link)._key(item)  # noqa: SLF001


def test_a_repeated_input_after_a_rollout_is_computed_by_the_new_version() -> None:
    """Guards the cache across a rollout: version 1 answered an input and cached it; version 2
    (here a model that triples where version 1 doubled) must compute the same input again, and
    only then answer it from the cache."""
    async def body() -> None:
        cache: Cache = ClockCache(1 << 20)
        clock, link = FakeClock(), FakeLink()
        x = np.array([1.0, 2.0], dtype=np.float32)
        old = _path(1, cache, clock, link)
        first, _ = old.submit(x, T0 + 10)
        await asyncio.sleep(0)  # the pass's pump sends it
        _answer(old, link, 2.0)
        await asyncio.sleep(0)  # the done-callback stores the answer
        assert first.result().tolist() == [2.0, 4.0]
        new = _path(2, cache, clock, link)
        again, cached = new.submit(x, T0 + 10)
        assert not cached, "version 2 was answered from version 1's cache entry"
        await asyncio.sleep(0)
        assert len(link.sent) == 2 and link.sent[-1][0] == "v2"
        _answer(new, link, 3.0)
        await asyncio.sleep(0)
        assert again.result().tolist() == [3.0, 6.0]
        hit, cached = new.submit(x, T0 + 10)
        assert cached and hit.result().tolist() == [3.0, 6.0]

    asyncio.run(body())


def _apps(*slos: tuple[str, float, tuple[str, ...]]) -> dict[str, AppRuntime]:
    return {name: AppRuntime.build(Application(name=name, models=models, slo_ms=slo,
                                               default_output=None))
            for name, slo, models in slos}


def test_a_shared_model_is_admitted_against_its_tightest_slo() -> None:
    """Guards slo_for: a model shared by a 20 ms and a 1 s application must be queued, shed
    and batched for 20 ms; the loosest SLO would let it queue work the 20 ms one cannot use."""
    deployment = Deployment(name="m", source="zoo:echo", timeout_ms=5000)
    apps = _apps(("fast", 20, ("m",)), ("slow", 1000, ("m",)), ("other", 5, ("n",)))
    assert slo_for(apps, "m", deployment) == 0.020
    assert slo_for({}, "m", deployment) == 5.0  # no application: the model's own timeout


def test_adding_a_looser_application_keeps_the_tighter_slo_in_force() -> None:
    """Guards the admin path: linking a 1 s application to a model a 20 ms one uses leaves
    the path's admission horizon and its replicas' AIMD target at 20 ms."""
    async def body() -> None:
        cache: Cache = ClockCache(0)
        path = _path(1, cache, FakeClock(), FakeLink())
        apps = _apps(("fast", 20, ("m",)))
        admin = AppAdmin(apps, {"m": path}, store=lambda: None)  # type: ignore[arg-type,return-value]
        admin.refresh_slos()
        assert path.slo_s == 0.020
        await admin.add_application(Application(name="slow", models=("m",), slo_ms=1000,
                                                default_output=None))
        assert path.slo_s == 0.020
        assert path.replicas["v1"].aimd._slo_s == 0.020  # noqa: SLF001

    asyncio.run(body())
