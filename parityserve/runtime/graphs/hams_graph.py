"""Serving one stateful service graph (HAMS): the asyncio driver around ``core.hams``.

The frontend's graph router is every operator's request manager (decision H10, see
``core/hams/requests.py``): each client request enters the router, which numbers it at
every operator in execution order, carries its lineage, joins fan-ins and holds the reply
until every state in its lineage is durable. This module only moves data:

* a **stateless** operator's batch goes to its deployed model through the ordinary model
  path (replicas, restarts and re-queueing of a crashed replica's batch included);
* a **stateful** operator has a primary, a hot backup and a warm spare process
  (``hams_worker``). The primary answers batches; its backup tells us what is durable;
  we forward that to the next stateful operators' backups and release replies;
* a lost primary is replaced by its backup (``plan_failover`` says which other operators
  must roll back with it), the spare becomes the new backup, and a new spare is started.
  A member silent past ``heartbeat_timeout_ms`` whose process exists is only suspected:
  it is fenced if another member holds its state, else kept and waited for until it
  speaks again (``RecoveryPlan.suspected``; issue 39: under load, a promoted backup
  starved past the timeout was fenced, and the graph gave up for good).

One client never hurts another (issue 38): rows of two shapes never share an operator batch,
and rows that do not fit the shape the graph declares (``Graph.door``; never one learned from
traffic, which a client could choose) are refused at the door; an operator's refusal fails
the refused rows alone (a stateless operator's batch is searched for them, ``RowBisection``;
a stateful primary searches its own and says which it refused);
no exception on the send or answer path leaves a batch in flight; and a watchdog fails, and
counts, any batch in flight past the graph's ``timeout_ms``, so a graph heals instead of
wedging, while ``ready()`` says no for as long as an operator finishes nothing.

``GraphRuntime`` is the face; each job is a piece of its own (``hams_context`` lists them).
Everything that decides is in ``core/hams``; what is here is sockets, processes and timers.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.config import Deployment, Graph, LauncherConfig
from parityserve.core.hams import Failover, GraphRouter, InFlight, OutputCommit, RecoveryPlan
from parityserve.core.hams.placement import StatefulGraph
from parityserve.errors import ConfigError, UnknownModel
from parityserve.runtime.fleet.placement_plan import demand as placement_demand
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs.hams_baselines import Baselines
from parityserve.runtime.graphs.hams_context import (
    Batch,
    FailoverRecord,
    GraphAnswer,
    GraphContext,
    Infer,
    Pair,
)
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_inbox import Inbox
from parityserve.runtime.graphs.hams_inspect import Inspection
from parityserve.runtime.graphs.hams_members import MemberLauncher
from parityserve.runtime.graphs.hams_membership import Membership
from parityserve.runtime.graphs.hams_recovery import RecoveryDriver
from parityserve.runtime.graphs.hams_requests import Requests
from parityserve.runtime.graphs.hams_watch import Watch
from parityserve.runtime.workers.keys import ServerKeys
from parityserve.runtime.workers.rpc import RejectLog, WorkerLink

__all__ = ["FailoverRecord", "GraphAnswer", "GraphRuntime", "Infer"]


class GraphRuntime:
    def __init__(self, graph: Graph, deployments: dict[str, Deployment], infer: Infer, *,
                 keys: ServerKeys | None, clock: Callable[[], float],
                 log_dir: Path | None = None, host: str = "127.0.0.1",
                 launcher: LauncherConfig | None = None) -> None:
        router: GraphRouter[np.ndarray] = GraphRouter(graph.topology(), _combine)
        link = WorkerLink(host, 0, keys=keys, on_reject=RejectLog())
        # checkpoint-replay's "global storage": a private folder; its log is in ``replay``
        store = tempfile.mkdtemp(prefix="parityserve-ckpt-") \
            if graph.fault_tolerance == "checkpoint-replay" else ""
        self.ctx = ctx = GraphContext(graph, deployments, clock, router, link, store)
        if not ctx.held:  # nothing waits for a backup, so nothing is held
            router.commit = OutputCommit(())
        # primary -> backup on this host: Unix sockets in a folder only this user can enter
        self._ipc_dir = tempfile.mkdtemp(prefix="parityserve-hams-") \
            if graph.state_link == "unix" else ""
        self.launcher = member_launcher(ctx, keys, log_dir, launcher)
        self.members = members = Membership(ctx, self.launcher, host, self._ipc_dir)
        self.requests = Requests(ctx, graph.door(deployments.values()))
        self.dispatch = Dispatch(ctx, self.requests, infer)
        self.requests.pump = self.dispatch.pump_all
        self.recovery = RecoveryDriver(ctx, members, self.requests, self.dispatch)
        self.baselines = Baselines(ctx, members, self.requests, self.dispatch)
        self.watch = Watch(ctx, members, self.dispatch, self.recovery, self.baselines)
        self.inbox = Inbox(ctx, members, self.requests, self.dispatch, self.recovery,
                           self.baselines)
        self.inspection = Inspection(ctx, self.requests, self.dispatch, self.recovery,
                                     self.baselines, self.watch)
        self._monitor: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, timeout_s: float = 120.0) -> None:
        self.link.start(self.inbox.on_message)
        self.members.launch_all()
        await asyncio.wait_for(self.members.all_hellos(), timeout_s)
        if self.ctx.held:
            self.recovery.begin()
        self._monitor = asyncio.get_running_loop().create_task(self.watch.run())

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        for task in list(self.ctx.tasks):
            task.cancel()
        for _, member in list(self.members.by_id.values()):
            self.launcher.forget(member)
        self.requests.break_all("the graph is shutting down")
        await self.link.close()
        for folder in (self._ipc_dir, self.ctx.store):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    def ready(self) -> bool:
        return self.inspection.ready()

    def stalled(self) -> list[str]:
        return self.dispatch.stalled()

    # ---- queries, fault injection, inspection ----------------------------------------------
    async def predict(self, rows: Sequence[np.ndarray], streams: Sequence[str],
                      labels: Sequence[int], timeout_s: float) -> list[GraphAnswer]:
        return await self.requests.predict(rows, streams, labels, timeout_s)

    def slow_state(self, op: str, delay_s: float) -> None:
        """Fault injection: ``op``'s primary waits this long before each state leaves, so
        downstream runs ahead on speculation (the paper's Fig. 6 set-up)."""
        pair = self.pairs.get(op)
        if pair is None:
            raise UnknownModel(f"graph {self.graph.name!r} has no stateful operator {op!r}; "
                               f"stateful: {sorted(self.pairs)}")
        self.inspection.slow[op] = delay_s
        if pair.primary is not None:  # else a recovery is under way: nothing to slow
            self.ctx.tell(pair.primary, hm.Slow(delay_s))

    async def state_digests(self) -> dict[str, dict[str, Any]]:
        return await self.inspection.state_digests()

    def statistics(self) -> dict[str, Any]:
        """The inspection's record, and why members of an operator share a node, if any do."""
        return {**self.inspection.statistics(), "placement_notes": dict(self.launcher.notes)}

    # ---- what the server, the benchmarks and the tests read ---------------------------------
    @property
    def graph(self) -> Graph:
        return self.ctx.graph

    @property
    def mode(self) -> str:
        return self.ctx.mode

    @property
    def topology(self) -> Any:
        return self.ctx.topology

    @property
    def router(self) -> GraphRouter[np.ndarray]:
        return self.ctx.router

    @property
    def link(self) -> WorkerLink:
        return self.ctx.link

    @property
    def pairs(self) -> dict[str, Pair]:
        return self.ctx.pairs

    @property
    def plan(self) -> RecoveryPlan | None:
        return self.ctx.plan

    @property
    def inflight(self) -> dict[str, InFlight[Batch]]:
        return self.ctx.inflight

    @property
    def failovers(self) -> list[FailoverRecord]:
        return self.ctx.failovers

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        return self.requests.input_shape

    @property
    def on_expired(self) -> Callable[[str, int], None] | None:
        """(operator, batches) the watchdog failed: the server counts them (a metric)."""
        return self.dispatch.on_expired

    @on_expired.setter
    def on_expired(self, count: Callable[[str, int], None] | None) -> None:
        self.dispatch.on_expired = count

    @property
    def on_protocol_error(self) -> Callable[[str], None] | None:
        """(kind) of a malformed operator message dropped: the server counts them."""
        return self.inbox.on_protocol_error

    @on_protocol_error.setter
    def on_protocol_error(self, count: Callable[[str], None] | None) -> None:
        self.inbox.on_protocol_error = count

    def _planner(self, resumed: Mapping[str, int], epoch: int) -> Failover:
        """The failover the plan would make now (``test_hams_sequences`` asks it)."""
        return self.ctx.failover_plan(resumed, epoch)


def member_launcher(ctx: GraphContext, keys: ServerKeys | None, log_dir: Path | None,
                    launcher: LauncherConfig | None) -> MemberLauncher:
    """Members as local processes, or as Ray actors on distinct nodes (``kind: ray``; Ray is
    imported only then)."""
    if launcher is None or launcher.kind != "ray":
        return MemberLauncher(ctx.link, keys, log_dir)
    try:
        from parityserve.runtime.graphs.hams_ray_members import RayMemberLauncher
    except ImportError as exc:
        raise ConfigError("launcher kind ray needs Ray installed: "
                          f"pip install 'parityserve[ray]' ({exc})") from exc
    demand = {op: placement_demand(ctx.deployments[ctx.ops[op].model]) for op in ctx.pairs}
    # the demand goes to the rule too: without it every member counted as needing nothing,
    # and a node any CPU-holding members or replicas had filled still looked like room
    return RayMemberLauncher(ctx.link, keys, log_dir,
                             graph=StatefulGraph.of(ctx.topology, demand), demand=demand,
                             roles=ctx.member_roles, address=launcher.address)


def _combine(parts: Sequence[np.ndarray]) -> np.ndarray:
    """A join's input: its predecessors' outputs side by side, flattened (H4)."""
    return np.concatenate([np.ravel(p) for p in parts])
