"""A graph's members as Ray actors on distinct nodes (``launcher: {kind: ray}``, issue 41).

Everything else about a member is as in ``hams_members``: its keys, its hello, its loss. Only
where it runs changes. Each new member is placed by ``core.hams.member_nodes.place_member``
with every running member fixed: an operator's primary, backup and spare on three distinct
nodes when the cluster has them, else as apart as it allows (the note goes to the log and to
``/admin/state``). A node counts with what Ray says is free on it plus what the graph's own
members hold there (``usable_nodes``): model replicas' CPUs are not room for a member. A node
where one of the graph's members was just lost is the last choice for a replacement for a
minute: Ray reports a crashed machine alive until its health checks give up, and a member
pinned there would never start.

The state link follows the nodes (``member_nodes.state_link``): a backup whose operator's other
members all share its node listens on a Unix socket; otherwise on TCP at its node's address,
with CURVE when workers authenticate.

A node that joins gets new spares, not old roles: the graph's watch calls ``read_nodes``
every ``hams_watch.NODES_EVERY_S`` (Ray's node table, read off the loop), and once a node id
it has not seen before is alive, ``members_to_renew`` (``member_nodes``) names the spares
that share a node with their operator and would now go apart; the recovery plan retires them
and the replacement it starts is placed on the new node.

Importing this module imports Ray: ``hams_graph`` loads it only for the Ray launcher.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path

from parityserve.core.hams.member_nodes import (
    RunningMember,
    members_to_renew,
    place_member,
    state_link,
    usable_nodes,
)
from parityserve.core.hams.placement import StatefulGraph
from parityserve.core.placement import Node, Resources
from parityserve.runtime.fleet.launcher import ProcessHandle
from parityserve.runtime.fleet.ray_launcher import SUSPECT_NODES, connect_ray, reachable
from parityserve.runtime.fleet.ray_operators import (
    RayOperatorProcess,
    free_resources,
    live_nodes,
    start_operator,
)
from parityserve.runtime.graphs.hams_context import log
from parityserve.runtime.graphs.hams_members import Member, MemberLauncher
from parityserve.runtime.graphs.hams_protocol import OperatorSpec
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys
from parityserve.runtime.workers.rpc import WorkerLink

__all__ = ["RayMemberLauncher"]


class RayMemberLauncher(MemberLauncher):
    def __init__(self, link: WorkerLink, keys: ServerKeys | None, log_dir: Path | None, *,
                 graph: StatefulGraph, demand: Mapping[str, Resources],
                 roles: Callable[[], Mapping[str, str]], address: str | None) -> None:
        super().__init__(link, keys, log_dir)
        connect_ray(address)
        self.graph, self.demand = graph, demand
        self.roles = roles  # worker id -> its role now (failovers change them)
        self.handles: dict[str, tuple[str, RayOperatorProcess]] = {}  # worker id -> (op, h)
        self.watches_nodes = True
        self.suspects = SUSPECT_NODES  # where a member was just lost: the last choice
        # (shared with the replicas' launcher, which then avoids those nodes too)
        self._pin: tuple[str | None, str] = (None, "")  # the next actor's node and address
        self._tag = secrets.token_hex(3)  # actor names unique across frontends on a cluster
        self.seen: set[str] | None = None  # node ids ever seen alive (None: not read yet)

    def start(self, spec: OperatorSpec, now: float) -> Member:
        nodes, addresses = live_nodes()
        node, note = self._node_for(spec, self._usable(nodes))
        ip = addresses.get(node or "", "")
        others = [self._node(wid) for wid, (op, _) in self._running().items() if op == spec.op]
        if state_link(node, others) == "tcp":  # primary and backup may be on two nodes
            spec = dataclasses.replace(spec, ipc_dir="", bind_host=ip or spec.bind_host)
        self._pin = (node, reachable(self.link.address, ip) if ip else self.link.address)
        member = super().start(spec, now)
        self._note(spec.op, note)
        return member

    def _process(self, spec: OperatorSpec, keys: ClientKeys | None) -> ProcessHandle:
        node, connect = self._pin
        handle = start_operator(
            ["--connect", connect, "--spec", spec.to_json()],
            keys_env=keys.to_env() if keys is not None else None, ipc_dir=spec.ipc_dir,
            log_dir=self.log_dir, name=f"{spec.worker_id}#{self._tag}", node_id=node,
            demand=self.demand.get(spec.op, Resources(cpu=1.0)))
        self.handles[spec.worker_id] = (spec.op, handle)
        return handle

    def forget(self, member: Member) -> None:
        _, handle = self.handles.pop(member.worker_id, (None, None))
        # Lost by its silence, or its actor died: its machine may be gone. A process that
        # exited under a live actor (a crash, a chaos kill) says its node is alive, and a
        # member fenced by a failover (a demoted primary) or retired is no sign either.
        if handle is not None and (member.lost == "timeout" or handle.death is not None) \
                and handle.node_id is not None:
            self.suspects.mark(handle.node_id)
        super().forget(member)
        if handle is not None:
            self._note(member.spec.op, None)  # (a retired spare: its operator may be apart now)

    def read_nodes(self) -> tuple[tuple[list[Node], dict[str, Resources]], bool]:
        """The live nodes and, when one joined since the last call (the first call only
        learns them), what is free on each; and whether one did. GCS calls only: the watch
        makes them off the frontend's loop (``members_to_renew`` then runs on it, pure)."""
        nodes, _ = live_nodes()
        ids = {n.node_id for n in nodes}
        new = ids - self.seen if self.seen is not None else set()
        self.seen = (self.seen or set()) | ids
        if new:
            log.warning("graph placement: node%s %s joined", "s" if len(new) > 1 else "",
                        ", ".join(sorted(new)))
        return (nodes, free_resources() if new else {}), bool(new)

    def members_to_renew(self, nodes: tuple[list[Node], dict[str, Resources]]
                         ) -> dict[str, str]:
        """Operator -> its member to retire: a spare, so that its replacement goes to a
        joined node, or a backup on its primary's node (``nodes``: what ``read_nodes``
        read; the rule is ``member_nodes.members_to_renew``)."""
        alive, free = nodes
        running = self._running_members()
        return members_to_renew(self.graph, running,
                               usable_nodes(self.graph, alive, free, running),
                               self._suspect_nodes())

    def _usable(self, nodes: list[Node]) -> list[Node]:
        """The live nodes with what replicas (and other graphs) hold on them left out."""
        return usable_nodes(self.graph, nodes, free_resources(), self._running_members())

    def _running_members(self) -> dict[str, RunningMember]:
        roles = self.roles()
        return {wid: RunningMember(op, roles.get(wid, "backup"), node)
                for wid, (op, _) in self._running().items()
                if (node := self._node(wid)) is not None}

    def _node_for(self, spec: OperatorSpec, nodes: list[Node]) -> tuple[str | None, str | None]:
        spot = place_member(self.graph, spec.op, spec.worker_id, spec.role,
                            self._running_members(),
                            nodes, self._suspect_nodes())
        if spot.note:
            log.warning("graph placement: %s", spot.note)
        return spot.node, spot.note

    def _note(self, op: str, note: str | None) -> None:
        """The operator's note: the newest placement's, kept while any of its running members
        share a node, dropped once none do."""
        nodes = [self._node(wid) for wid, (o, _) in self._running().items() if o == op]
        if len(set(nodes)) == len(nodes):
            self.notes.pop(op, None)
        elif note:
            self.notes[op] = note

    def _running(self) -> dict[str, tuple[str, RayOperatorProcess]]:
        return {wid: (op, h) for wid, (op, h) in self.handles.items() if h.poll() is None}

    def _node(self, worker_id: str) -> str | None:
        found = self.handles.get(worker_id)
        return found[1].node_id if found is not None else None

    def _suspect_nodes(self) -> set[str]:
        """Nodes where a member was lost in the last minute, or whose actor Ray says died."""
        for _, handle in self.handles.values():
            if handle.death is not None and handle.node_id is not None:
                self.suspects.mark(handle.node_id, renew=False)
        return self.suspects.current()
