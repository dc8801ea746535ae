"""The supervisor with a fake launcher and a fake clock: no processes, no sleeps.

In the manner of Ray Serve's ``test_deployment_state.py``: the launcher hands out fake process
handles whose exit code a test sets, workers "speak" by handing wire headers to the inbox, and
the clock moves only when told. Each test then calls ``tick()`` and checks which replicas run,
in which state, and what was launched, killed or told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from parityserve.config import Deployment
from parityserve.core.cache import ClockCache
from parityserve.core.restarts import RestartPolicy, restart_delay
from parityserve.errors import InvalidInput, LimitExceeded, Unavailable
from parityserve.runtime.fleet.inbox import Inbox
from parityserve.runtime.fleet.supervisor import Settings, Supervisor
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.admin_ops import ModelAdmin
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.commands import Command, SetFaults, SetThreads, Stop
from parityserve.runtime.workers.keys import ClientKeys
from parityserve.runtime.workers.worker import WorkerSpec
from tests.unit.runtime.modelpath.dispatch_fakes import FakeClock, FakeLink

HEARTBEAT_S = 1.0
STARTUP_S = 10.0
POLICY = RestartPolicy()


class FakeProcess:
    """A worker process handle: alive until a test sets its exit code."""

    pids = iter(range(1000, 100_000))

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.pid = next(self.pids)
        self.code: int | None = None
        self.killed = self.terminated = False

    def exit_code(self) -> int | None:
        return self.code

    def kill(self) -> None:
        self.killed = True
        self.code = -9 if self.code is None else self.code

    def terminate(self) -> None:
        self.terminated = True


class FakeLauncher:
    def __init__(self) -> None:
        self.started: list[FakeProcess] = []

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> FakeProcess:
        self.started.append(FakeProcess(spec))
        return self.started[-1]


class FakeKeyring:
    def __init__(self) -> None:
        self.issued: list[str] = []
        self.revoked: list[str] = []

    def issue(self, rid: str) -> ClientKeys | None:
        self.issued.append(rid)
        return None

    def revoke(self, rid: str) -> None:
        self.revoked.append(rid)


class Rig:
    def __init__(self, *, max_workers: int = 64) -> None:
        self.clock = FakeClock()
        self.launcher = FakeLauncher()
        self.keyring = FakeKeyring()
        self.sent: list[tuple[str, Command]] = []
        self.rejected: list[tuple[str, str]] = []
        self.metrics = Metrics()
        self.sup = Supervisor(
            Settings(heartbeat_timeout_s=HEARTBEAT_S, max_local_workers=max_workers,
                     startup_timeout_s=STARTUP_S, restarts=POLICY),
            models={}, launcher=self.launcher, keyring=self.keyring,
            send=lambda rid, command: self.sent.append((rid, command)), clock=self.clock,
            metrics=self.metrics, make_path=self._make_path,
            stop_process=lambda process: process.terminate())
        self.inbox = Inbox(self.sup, lambda rid, reason, detail: self.rejected.append(
            (rid, reason)))

    def _make_path(self, deployment: Deployment) -> ModelPath:
        return ModelPath(deployment, link=FakeLink(), metrics=self.metrics,
                         cache=ClockCache(0), clock=self.clock, slo_s=1.0, max_queue=None)

    def deploy(self, replicas: int = 1, version: int = 1, **fields: Any) -> ModelPath:
        dep = Deployment(name="m", source="zoo:noop", replicas=replicas, version=version,
                         **fields)
        path = self.sup.launch_path(dep)
        self.sup.models["m"] = path
        return path

    def say(self, rid: str, kind: str, **fields: Any) -> None:
        self.inbox(rid, {"t": kind, **fields}, [])

    def hello(self, rid: str, model: str = "m", version: int = 1) -> None:
        self.say(rid, wire.HELLO, replica=rid, model=model, version=version, pid=1)

    def hello_all(self, path: ModelPath) -> None:
        for rid in list(path.replicas):
            self.hello(rid)

    def tick_after(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.sup.tick()

    def stops(self) -> list[str]:
        return [rid for rid, command in self.sent if isinstance(command, Stop)]


def slots(path: ModelPath) -> list[tuple[str, int, str]]:
    """(pool, index, state) of every replica, sorted: what a test compares."""
    return sorted((r.pool, r.index, r.state) for r in path.replicas.values())


def only(path: ModelPath) -> Replica:
    (replica,) = path.replicas.values()
    return replica


# ---- starting ----------------------------------------------------------------------------
def test_a_replica_is_launched_starting_and_serves_after_its_hello() -> None:
    rig = Rig()
    path = rig.deploy(replicas=2)
    assert slots(path) == [("data", 0, "starting"), ("data", 1, "starting")]
    assert rig.sup.starting() == list(path.replicas)
    assert [p.spec.replica_id for p in rig.launcher.started] == list(path.replicas)
    assert rig.keyring.issued == list(path.replicas)  # each launched with its own key
    rig.hello_all(path)
    rig.tick_after(HEARTBEAT_S / 2)
    assert slots(path) == [("data", 0, "ready"), ("data", 1, "ready")]
    assert rig.sup.starting() == []
    assert len(rig.launcher.started) == 2  # nothing restarted


def test_replica_ids_are_unique_and_unguessable() -> None:
    rig = Rig()
    path = rig.deploy(replicas=2)
    first, second = path.replicas
    assert first.startswith("m/v1/0#1-") and second.startswith("m/v1/1#2-")
    assert len(first.split("-")[-1]) == 16


def test_a_replica_that_never_says_hello_is_replaced_after_the_startup_timeout() -> None:
    rig = Rig()
    path = rig.deploy()
    old = only(path)
    rig.tick_after(STARTUP_S)
    assert only(path) is old  # not yet: the timeout is strict
    rig.tick_after(0.01)
    new = only(path)
    assert new is not old and new.index == 0 and new.state == "starting"
    assert old.process.killed
    assert rig.keyring.revoked == [old.rid]
    assert rig.sup.load_error(path) is None  # slow is not broken: no load error


# ---- failures and restarts ---------------------------------------------------------------
@pytest.mark.parametrize(("reason", "fail"), [
    ("exit code", lambda rig, r: setattr(r.process, "code", 1)),
    ("hung: heartbeats stopped", lambda rig, r: rig.clock.advance(HEARTBEAT_S + 0.01)),
    ("unreachable", lambda rig, r: setattr(r, "state", "dead")),
])
def test_a_failed_ready_replica_is_replaced_at_once(reason, fail) -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    old = only(path)
    fail(rig, old)
    rig.sup.tick()
    new = only(path)
    assert new is not old and (new.index, new.state) == (0, "starting"), reason
    assert old.process.killed
    assert old.rid not in rig.sup.replicas


def test_heartbeats_keep_a_ready_replica_alive() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    replica = only(path)
    for _ in range(5):
        rig.clock.advance(HEARTBEAT_S * 0.9)
        rig.say(replica.rid, wire.HEARTBEAT, served=0)
        rig.sup.tick()
    assert only(path) is replica and replica.state == "ready"
    rig.tick_after(HEARTBEAT_S * 1.1)  # the heartbeats stop: hung
    assert only(path) is not replica


def crash_starting(rig: Rig, path: ModelPath) -> Replica:
    """The slot's current replica exits before it was ever ready; the round notices."""
    replica = only(path)
    replica.process.code = 1
    rig.sup.tick()
    return replica


def test_a_slot_that_keeps_crashing_restarts_with_growing_back_off_then_is_given_up() -> None:
    rig = Rig()
    path = rig.deploy()
    for failures in range(1, POLICY.give_up_after):
        crash_starting(rig, path)
        delay = restart_delay(failures, POLICY)
        assert delay is not None
        if delay > 0:
            assert not path.replicas, f"relaunched before its {delay}s back-off"
            rig.tick_after(delay - 0.01)
            assert not path.replicas
            rig.tick_after(0.01)
        assert slots(path) == [("data", 0, "starting")], f"not relaunched after {failures}"
    launched = len(rig.launcher.started)
    crash_starting(rig, path)  # one failure too many
    rig.tick_after(POLICY.max_delay_s * 10)
    assert not path.replicas and len(rig.launcher.started) == launched
    assert rig.sup.gave_up_on(path)
    assert "exited with code 1 before it was ready" in (rig.sup.load_error(path) or "")


def test_a_model_that_fails_to_load_says_why_and_is_given_up() -> None:
    rig = Rig()
    path = rig.deploy()
    for _ in range(POLICY.give_up_after):
        replica = only(path)
        rig.say(replica.rid, wire.FAILED, error="ImportError: no module named nope")
        crash_starting(rig, path)
        rig.tick_after(POLICY.max_delay_s)
    assert not path.replicas and rig.sup.gave_up_on(path)
    assert rig.sup.load_error(path) == "ImportError: no module named nope"  # its own words


def test_an_operator_asking_again_gives_a_given_up_slot_its_tries_back() -> None:
    rig = Rig()
    path = rig.deploy()
    for _ in range(POLICY.give_up_after):
        crash_starting(rig, path)
        rig.tick_after(POLICY.max_delay_s)
    assert rig.sup.gave_up_on(path)
    rig.sup.forgive(path)
    rig.sup.reconcile(path, path.deployment)
    assert not rig.sup.gave_up_on(path)
    assert slots(path) == [("data", 0, "starting")]
    crash_starting(rig, path)
    assert slots(path) == [("data", 0, "starting")]  # a first failure again: at once


def test_a_hello_resets_the_failure_count() -> None:
    rig = Rig()
    path = rig.deploy()
    crash_starting(rig, path)
    crash_starting(rig, path)
    rig.tick_after(restart_delay(2, POLICY) or 0)
    rig.hello_all(path)
    assert rig.sup.restarts.failures == {}
    only(path).process.code = 1
    rig.sup.tick()
    assert slots(path) == [("data", 0, "starting")]  # relaunched at once, not backed off


def test_a_restart_drops_one_shot_faults_and_keeps_the_others() -> None:
    rig = Rig()
    faults = {"0": {"crash_after_batches": 2, "delay_ms": 5.0}}
    path = rig.deploy(faults=faults)
    rig.hello_all(path)
    only(path).process.code = 1
    rig.sup.tick()
    assert "crash_after_batches" not in only(path).faults  # it fired once: not again
    assert only(path).faults["delay_ms"] == 5.0
    assert "crash_after_batches" not in rig.launcher.started[-1].spec.faults
    assert rig.launcher.started[0].spec.faults["crash_after_batches"] == 2


def test_faults_set_while_starting_are_sent_with_the_hello() -> None:
    rig = Rig()
    path = rig.deploy()
    replica = only(path)
    replica.faults = {"delay_ms": 7.0}
    rig.hello(replica.rid)
    assert rig.sent == [(replica.rid, SetFaults({"delay_ms": 7.0}))]


def test_a_delayed_restart_is_dropped_when_the_slot_is_no_longer_wanted() -> None:
    rig = Rig()
    path = rig.deploy(replicas=2)
    crash_starting_slot0 = next(r for r in path.replicas.values() if r.index == 0)
    crash_starting_slot0.process.code = 1
    rig.sup.tick()  # a first failure: relaunched at once
    next(r for r in path.replicas.values() if r.index == 0).process.code = 1
    rig.sup.tick()  # a second: backed off
    rig.sup.reconcile(path, path.deployment.model_copy(update={"replicas": 0}))
    rig.tick_after(POLICY.max_delay_s)
    assert not path.replicas and len(rig.launcher.started) == 3


# ---- scaling -----------------------------------------------------------------------------
@pytest.mark.parametrize(("before", "after", "stopped"), [
    (1, 3, []),
    (3, 1, [1, 2]),       # the highest slots go first
    (2, 0, [0, 1]),
    (2, 2, []),
])
def test_reconcile_scales_to_the_desired_count(before, after, stopped) -> None:
    rig = Rig()
    path = rig.deploy(replicas=before)
    rig.hello_all(path)
    by_index = {r.index: r for r in path.replicas.values()}
    rig.sup.reconcile(path, path.deployment.model_copy(update={"replicas": after}))
    assert sorted(r.index for r in path.replicas.values()) == list(range(after))
    assert sorted(r.index for r in by_index.values() if r.state == "retiring") == stopped
    assert rig.stops() == [by_index[i].rid for i in stopped]
    assert all(by_index[i].process.terminated for i in stopped)
    assert len(rig.launcher.started) == max(before, after)
    assert path.deployment.replicas == after


def test_a_replica_that_says_goodbye_is_forgotten_not_restarted() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    replica = only(path)
    rig.say(replica.rid, wire.BYE)
    rig.tick_after(HEARTBEAT_S * 5)
    assert not path.replicas and len(rig.launcher.started) == 1
    assert rig.keyring.revoked == [replica.rid]


# ---- workers that join by themselves -----------------------------------------------------
def test_a_worker_joins_a_served_model_and_is_not_restarted_when_it_goes() -> None:
    rig = Rig()
    path = rig.deploy(replicas=0)
    rig.hello("remote-1")
    assert slots(path) == [("data", -1, "ready")]
    rig.tick_after(HEARTBEAT_S + 0.01)
    assert not path.replicas and rig.launcher.started == []


@pytest.mark.parametrize(("model", "version"), [("nope", 1), ("m", 2)])
def test_a_worker_naming_no_served_model_is_told_to_stop(model, version) -> None:
    rig = Rig()
    path = rig.deploy(replicas=0)
    rig.hello("stranger", model=model, version=version)
    assert not path.replicas
    assert rig.sent == [("stranger", Stop(f"no model {model!r} version {version} here"))]
    assert rig.rejected == [("stranger", "unknown_model")]


@pytest.mark.parametrize(("kind", "fields", "reason"), [
    (wire.HEARTBEAT, {"served": 1}, "unknown_replica"),
    ("nonsense", {}, "malformed"),
])
def test_messages_from_no_replica_are_dropped(kind, fields, reason) -> None:
    rig = Rig()
    rig.deploy()
    rig.say("nobody", kind, **fields)
    assert rig.rejected == [("nobody", reason)]


def test_only_a_starting_launched_replica_may_say_its_model_failed() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    rig.say(only(path).rid, wire.FAILED, error="late")
    assert rig.rejected == [(only(path).rid, "unexpected_failed")]
    assert rig.sup.load_error(path) is None


# ---- rolling deploys and retirement ------------------------------------------------------
def test_a_retired_version_is_stopped_once_its_work_is_done() -> None:
    rig = Rig()
    old = rig.deploy(version=1)
    rig.hello_all(old)
    old_rid = only(old).rid
    new = rig.sup.launch_path(Deployment(name="m", source="zoo:noop", version=2))
    rig.sup.models["m"] = new
    rig.sup.retire(old)
    rig.sup.tick()  # nothing queued or in flight: stopped now
    assert old not in rig.sup.retired and not old.replicas
    assert rig.stops() == [old_rid]


def test_a_rolling_deploy_serves_the_old_version_until_the_new_one_is_ready() -> None:
    async def body() -> None:
        rig = Rig()
        old = rig.deploy(version=1)
        rig.hello_all(old)
        rolling = asyncio.create_task(ModelAdmin(rig.sup, rig.clock).deploy(
            Deployment(name="m", source="zoo:noop", version=2)))
        await asyncio.sleep(0)
        new_rid = next(rid for rid in rig.sup.replicas if rid.startswith("m/v2/"))
        assert rig.sup.models["m"] is old and not rolling.done()
        rig.hello(new_rid, version=2)
        await rolling
        assert rig.sup.models["m"].version == 2 and rig.sup.retired == [old]
        assert only(old).state == "ready"  # still finishing its work
        rig.sup.tick()
        assert not old.replicas and rig.sup.retired == []

    asyncio.run(body())


def test_a_rolling_deploy_that_cannot_load_keeps_the_old_version() -> None:
    async def body() -> None:
        rig = Rig()
        old = rig.deploy(version=1)
        rig.hello_all(old)
        rolling = asyncio.create_task(ModelAdmin(rig.sup, rig.clock).deploy(
            Deployment(name="m", source="zoo:noop", version=2)))
        await asyncio.sleep(0)
        new_rid = next(rid for rid in rig.sup.replicas if rid.startswith("m/v2/"))
        rig.say(new_rid, wire.FAILED, error="bad weights")
        with pytest.raises(Unavailable, match="version 2 of 'm' not deployed: bad weights"):
            await rolling
        assert rig.sup.models["m"] is old and rig.stops() == [new_rid]
        assert new_rid not in rig.sup.replicas

    asyncio.run(body())


# ---- the worker budget -------------------------------------------------------------------
@pytest.mark.parametrize(("limit", "running", "joined", "wanted", "replacing", "ok"), [
    (4, 2, 0, 2, False, True),
    (4, 2, 0, 3, False, False),
    (4, 2, 5, 2, False, True),    # workers that joined from elsewhere do not count
    (4, 3, 0, 4, True, True),     # scaling a model counts its own replicas once
    (4, 3, 0, 5, True, False),
    (0, 0, 0, 0, False, True),
])
def test_the_worker_budget(limit, running, joined, wanted, replacing, ok) -> None:
    rig = Rig(max_workers=limit)
    path = rig.deploy(replicas=0)
    rig.sup.reconcile(path, path.deployment.model_copy(update={"replicas": running}))
    for i in range(joined):
        rig.hello(f"remote-{i}")
    change = Deployment(name="m" if replacing else "other", source="zoo:noop",
                        replicas=wanted)
    refused = pytest.raises(LimitExceeded, match="max_local_workers")
    with contextlib.nullcontext() if ok else refused:
        rig.sup.check_worker_budget(change, replacing=path if replacing else None)


def test_the_worker_budget_counts_a_retiring_version_still_running() -> None:
    rig = Rig(max_workers=3)
    old = rig.deploy(replicas=2)  # retired below: it runs until its work is done
    rig.sup.models["m"] = rig.sup.launch_path(
        Deployment(name="m", source="zoo:noop", version=2, replicas=1))
    rig.sup.check_worker_budget(Deployment(name="x", source="zoo:noop"), replacing=None)
    rig.sup.retire(old)
    with pytest.raises(LimitExceeded):
        rig.sup.check_worker_budget(Deployment(name="x", source="zoo:noop"), replacing=None)


# ---- shutting down -----------------------------------------------------------------------
def test_shut_down_stops_ready_workers_and_restarts_nothing_after() -> None:
    rig = Rig()
    path = rig.deploy(replicas=2)
    ready = next(iter(path.replicas))
    rig.hello(ready)
    processes = rig.sup.shut_down()
    assert sorted(p.pid for p in processes) == sorted(p.pid for p in rig.launcher.started)
    assert rig.stops() == [ready]  # a starting worker is not listening: it gets SIGTERM
    for replica in path.replicas.values():
        replica.process.code = 0
    rig.tick_after(POLICY.max_delay_s)
    assert len(rig.launcher.started) == 2


def test_shut_down_still_waits_for_workers_scaled_away_that_have_not_exited() -> None:
    # Their SIGTERM grace runs in a thread; a server closing meanwhile must still reap them
    # (found by the API fuzz run: "subprocess ... is still running" at interpreter exit).
    rig = Rig()
    path = rig.deploy(replicas=2)
    rig.hello_all(path)
    rig.sup.reconcile(path, path.deployment.model_copy(update={"replicas": 1}))
    (gone,) = [p for p in rig.launcher.started if p.terminated]
    (kept,) = [r.process for r in path.replicas.values()]
    assert sorted(p.pid for p in rig.sup.shut_down()) == sorted([gone.pid, kept.pid])
    gone.code = 0  # once it has exited, there is nothing left to wait for
    assert [p.pid for p in rig.sup.shut_down()] == [kept.pid]


# ---- intra-op threads (issue 18) -------------------------------------------------------------
def test_set_threads_tells_every_ready_replica_and_restarts_nothing() -> None:
    rig = Rig()
    path = rig.deploy(replicas=2)
    rig.hello_all(path)
    launched = len(rig.launcher.started)
    asyncio.run(ModelAdmin(rig.sup, rig.clock, cores=4).set_threads("m", 2))
    assert sorted(rig.sent, key=lambda s: s[0]) == sorted(
        ((rid, SetThreads(2)) for rid in path.replicas), key=lambda s: s[0])
    assert len(rig.launcher.started) == launched and path.deployment.threads_per_replica == 2
    assert not any(p.killed or p.terminated for p in rig.launcher.started)


def test_the_heartbeat_is_the_acknowledgement_recorded_per_replica() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    replica = only(path)
    assert replica.threads is None
    rig.say(replica.rid, wire.HEARTBEAT, served=0, threads=3)
    assert replica.threads == 3 and path.replica_stats()[0].threads == 3
    rig.say(replica.rid, wire.HEARTBEAT, served=0)  # an older worker says nothing: kept
    assert replica.threads == 3


def test_a_malformed_thread_count_is_rejected_and_not_recorded() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    replica = only(path)
    rig.say(replica.rid, wire.HEARTBEAT, served=0, threads=0)
    assert replica.threads is None and rig.rejected == [(replica.rid, "malformed")]


def test_threads_set_while_starting_are_sent_with_the_hello() -> None:
    rig = Rig()
    path = rig.deploy()
    replica = only(path)
    asyncio.run(ModelAdmin(rig.sup, rig.clock, cores=4).set_threads("m", 4))
    assert rig.sent == []  # not listening yet
    rig.hello(replica.rid)
    assert rig.sent == [(replica.rid, SetThreads(4))]


def test_a_replica_launched_after_the_change_starts_with_the_new_threads() -> None:
    rig = Rig()
    path = rig.deploy()
    rig.hello_all(path)
    asyncio.run(ModelAdmin(rig.sup, rig.clock, cores=2).set_threads("m", 2))
    only(path).process.code = 1  # crashes: its replacement is launched with 2 threads
    rig.sup.tick()
    assert rig.launcher.started[-1].spec.threads == 2


@pytest.mark.parametrize(("fields", "cores", "threads"), [
    ({"replicas": 2}, 2, 2),                                   # c = every replica = 2
    ({"replicas": 3, "parallelism": 1}, 2, 3),                 # 1 x 3 > 2
    ({"replicas": 4, "parallelism": 4, "oversubscribe": True}, 2, 2),  # 8 > 2 x 2
])
def test_threads_that_do_not_fit_the_cores_are_refused_changing_nothing(
        fields, cores, threads) -> None:
    rig = Rig()
    path = rig.deploy(**fields)
    rig.hello_all(path)
    before = path.deployment
    with pytest.raises(InvalidInput, match="threads"):
        asyncio.run(ModelAdmin(rig.sup, rig.clock, cores=cores).set_threads("m", threads))
    assert path.deployment is before and rig.sent == []


def test_oversubscription_is_an_opt_in() -> None:
    faithful = Rig()
    faithful.hello_all(faithful.deploy(replicas=4, parallelism=4))
    with pytest.raises(InvalidInput, match="oversubscribe: true"):
        asyncio.run(ModelAdmin(faithful.sup, faithful.clock, cores=2).set_threads("m", 1))
    rig = Rig()
    path = rig.deploy(replicas=4, parallelism=4, oversubscribe=True)
    rig.hello_all(path)
    asyncio.run(ModelAdmin(rig.sup, rig.clock, cores=2).set_threads("m", 1))
    assert path.deployment.threads_per_replica == 1 and len(rig.sent) == 4
