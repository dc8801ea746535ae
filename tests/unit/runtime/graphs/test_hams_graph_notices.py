"""Durability notices through a recovery, in the graph runtime itself (no processes).

``seq1 -> seq2``, both stateful, driven by the real ``RecoveryPlan`` with fake members that
answer ALLOW, ATTACH and PROMOTE the way ``hams_worker`` does. The case is the CI hang of
``test_hams_sequences`` (both primaries killed): seq2's backup is being promoted and seeds
the spare, and meanwhile seq1's backup says a state is durable. The frontend relays that
notice to seq2's backup of the moment, which is nobody; the spare then becomes seq2's
backup, and unless it is told the watermark after all, it never applies a state that needs
it: with every client waiting for such a reply, no later notice ever comes.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import numpy as np
import pytest

from parityserve.config import Deployment, Graph, GraphOperator
from parityserve.core.hams import Failover
from parityserve.runtime.graphs import hams_graph, hams_recovery
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_graph import GraphRuntime
from parityserve.runtime.graphs.hams_members import Member
from tests.unit.runtime.graphs.test_hams_graph_isolation import Clock, FakeLink


class FakePopen:
    pids = itertools.count(5000)

    def __init__(self) -> None:
        self.pid = next(FakePopen.pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class Workers:
    """Each member's side of the protocol, answered on the next loop turn: a backup
    admits its primary; an attached backup applies its base and says it is durable; a
    promoted backup seeds the spare it is given only when ``promote_now`` is called."""

    def __init__(self, runtime: GraphRuntime) -> None:
        self.rt = runtime
        self.link = cast(FakeLink, runtime.link)
        self.link.on_send = self._heard
        self.promotions: list[str] = []
        self.address: dict[str, str] = {}  # backup address -> worker id

    def launch(self, op: str, role: str) -> Member:
        """``Membership.launch`` without a process: a member that said hello."""
        wid = self.rt.launcher.next_id("g", op, role)
        spec = hp.OperatorSpec(worker_id=wid, op=op, source="zoo:stream-lstm", role=role,
                               pfm=self.rt.topology.prev_stateful(op))
        hello: asyncio.Future[hm.Hello] = asyncio.get_running_loop().create_future()
        hello.set_result(hm.Hello(role, 0, address=f"ipc://{wid}"))
        self.address[f"ipc://{wid}"] = wid
        member = Member(spec, cast(Any, FakePopen()), None, 0.0, hello)
        self.rt.members.by_id[wid] = (op, member)
        return member

    def _heard(self, header: dict[str, Any], _: list[Any]) -> None:
        wid = self.link.sent[-1][0]
        if header["t"] == hp.ALLOW:
            self._answer(wid, {"t": hp.ALLOW})
        elif header["t"] == hp.ATTACH:  # the backup applies its base
            self._answer(self.address[header["address"]], {"t": hp.DURABLE, "seq": 0})
        elif header["t"] == hp.PROMOTE:
            self.promotions.append(wid)

    def promote_now(self, seq: int) -> None:
        """The promoted backup sends the spare its state, the spare applies it, and the
        promoted member answers (``Backup.promote``)."""
        wid = self.promotions[-1]
        header = next(h for w, h, _ in reversed(self.link.sent) if w == wid)
        spare = self.address[header["attach"]]
        self._answer(spare, {"t": hp.DURABLE, "seq": seq})
        self._answer(wid, {"t": hp.PROMOTED, "seq": seq, "seeded": True})

    def _answer(self, wid: str, header: dict[str, Any]) -> None:
        asyncio.get_running_loop().call_soon(self.rt.inbox.on_message, wid, header, [])


def runtime() -> GraphRuntime:
    graph = Graph(name="g", fault_tolerance="hams", max_batch=8,
                  operators=[GraphOperator(name="seq1", model="lstm", inputs=["frontend"],
                                           stateful=True),
                             GraphOperator(name="seq2", model="lstm", inputs=["seq1"],
                                           stateful=True)],
                  output="seq2")
    models = {"lstm": Deployment(name="lstm", source="zoo:stream-lstm")}

    async def infer(model: str, rows: np.ndarray) -> np.ndarray:
        raise AssertionError("no stateless operator here")

    return GraphRuntime(graph, models, infer, keys=None, clock=Clock())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def whole_graph() -> tuple[GraphRuntime, Workers]:
    """Both operators with a primary, a seeded backup and a loaded spare (as ``start``)."""
    rt = runtime()
    workers = Workers(rt)
    rt.members.launch = workers.launch  # type: ignore[method-assign]
    rt.launcher.forget = lambda member: member.popen.kill()  # type: ignore[method-assign]
    for pair in rt.pairs.values():
        pair.primary = workers.launch(pair.op, "primary")
        pair.backup, pair.spare = (workers.launch(pair.op, "backup") for _ in range(2))
    rt.recovery.begin()  # every member is loaded (as ``start``)
    await settle()
    assert all(p.backup is not None and p.backup.extra.get("synced")
               for p in rt.pairs.values())
    return rt, workers


def test_a_spare_seeded_by_a_promotion_hears_the_upstream_notices_relayed_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hams_graph, "WorkerLink", FakeLink)

    async def test() -> None:
        rt, workers = await whole_graph()
        seq1, seq2 = rt.pairs["seq1"], rt.pairs["seq2"]
        assert seq1.backup is not None and seq2.primary is not None
        spare = seq2.spare
        assert spare is not None
        rt.recovery.lost(seq2.primary, "exit")  # killed: its backup is promoted, seeding the spare
        await settle()
        assert workers.promotions and seq2.backup is None
        rt.inbox.on_message(seq1.backup.worker_id, {"t": hp.DURABLE, "seq": 5}, [])  # relayed
        assert rt.router.commit.durable["seq1"] == 5  # to seq2's backup of the moment: none
        workers.promote_now(3)
        await settle()
        assert rt.plan is not None and not rt.plan.recovering()
        assert seq2.backup is spare  # the spare the promoted member seeded
        to_spare = [h for w, h, _ in workers.link.sent if w == spare.worker_id]
        told = [h["durable"]["seq1"] for h in to_spare if h["t"] == hp.ALLOW] + \
            [h["seq"] for h in to_spare if h["t"] == hp.NOTIFY and h["op"] == "seq1"]
        assert max(told) == 5, f"seq1's watermarks the new backup heard: {told}"
        await rt.close()

    asyncio.run(test())


def test_work_re_run_after_a_demotion_goes_to_the_new_primary_not_the_fenced_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """seq1's primary is lost and seq2 ran on its discarded speculation, so seq2's backup
    is promoted too and seq2's old primary fenced, in the same round of actions as
    ``Resume``. Resume dispatches what rolled back; the pair still named the fenced
    primary then (the roles were synced only after the round), so the re-run batch went
    to a dead process and stayed in flight until the watchdog failed it, timeout_ms later:
    the 30 s seq2 stalls seen after failovers under load."""
    monkeypatch.setattr(hams_graph, "WorkerLink", FakeLink)

    async def test() -> None:
        rt, workers = await whole_graph()
        seq1, seq2 = rt.pairs["seq1"], rt.pairs["seq2"]
        assert seq1.primary is not None and seq2.primary is not None
        old_seq2, new_seq2 = seq2.primary, seq2.backup
        assert rt.plan is not None

        def planner(resumed: Any, epoch: int) -> Failover:  # seq2 ran ahead of seq1
            return Failover(epoch, ("seq1",), {"seq2": 0, **resumed}, (), (), False)
        rt.plan._planner = planner  # type: ignore[assignment]
        dispatched_to: list[tuple[str, str | None]] = []
        to_the_dead: list[str] = []  # (pump_all logs what raises: collected instead)
        pump = rt.dispatch._pump_stateful

        def spy(pair: Any) -> None:
            primary = pair.primary
            dispatched_to.append((pair.op, None if primary is None else primary.worker_id))
            if primary is not None and not primary.lost and primary.popen.returncode:
                to_the_dead.append(primary.worker_id)
            pump(pair)
        rt.dispatch._pump_stateful = spy  # type: ignore[method-assign]
        rt.recovery.lost(seq1.primary, "exit")
        await settle()
        workers.promote_now(0)  # seq1's backup took over; seq2 must roll back: promoted
        await settle()
        workers.promote_now(0)
        await settle()
        assert not rt.plan.recovering() and old_seq2.popen.returncode == -9  # fenced
        assert to_the_dead == [], f"work was dispatched to dead processes: {to_the_dead}"
        assert old_seq2.lost is not None  # marked: nothing is sent to it any more
        assert new_seq2 is not None and ("seq2", new_seq2.worker_id) in dispatched_to
        await rt.close()

    asyncio.run(test())


def test_a_taker_that_speaks_but_never_answers_its_promotion_is_lost_after_a_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """seq1's backup is promoted and keeps sending heartbeats, but never answers PROMOTE
    (a wedged process, not a starved one). Before, it was suspected, kept as the last
    holder, heard, and suspected again every 8 s, for ever: clients waited out their
    timeouts with nothing said. Now it is lost after WEDGED_AFTER windows and the plan
    says why (here it held seq1's only copy: the graph fails, naming it)."""
    monkeypatch.setattr(hams_graph, "WorkerLink", FakeLink)

    async def test() -> None:
        rt, workers = await whole_graph()
        seq1 = rt.pairs["seq1"]
        assert seq1.primary is not None and seq1.backup is not None and rt.plan is not None
        rt.plan.durable("seq1", 3)  # a state past the initial one is durable: the spare
        # holds nothing recovery could use
        taker = seq1.backup
        rt.recovery.lost(seq1.primary, "exit")
        await settle()
        assert workers.promotions == [taker.worker_id]
        clock = cast(Clock, rt.ctx.clock)
        for window in range(hams_recovery.WEDGED_AFTER):
            assert rt.plan.failed is None, f"gave up after {window} windows"
            clock.now += hams_recovery.TAKE_OVER_S / 2
            rt.inbox.on_message(taker.worker_id, {"t": hp.BEAT}, [])  # it speaks
            clock.now += hams_recovery.TAKE_OVER_S / 2 + 0.1
            await asyncio.sleep(0.02)  # the wait notices its deadline
            await settle()
        assert rt.plan.failed is not None and "wedged" in rt.plan.failed
        assert taker.popen.returncode == -9  # fenced
        await rt.close()

    asyncio.run(test())
