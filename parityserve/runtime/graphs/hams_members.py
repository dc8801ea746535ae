"""The processes behind a stateful graph operator: launch, hello, liveness.

A member is one operator process (a primary or a backup). Each gets a fresh CURVE keypair,
bound to its id on the graph's link, so a process can speak only as itself. Loss is seen
two ways, reported separately because they differ by an order of magnitude (H7): the
process exits (``exit``: the kernel tells its parent at once, the frontend or the zygote
that forked it, ``runtime/fleet/zygote.py``), or its
heartbeats stop (``timeout``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parityserve.runtime.fleet.launcher import ProcessHandle, kill_and_reap
from parityserve.runtime.fleet.zygote import OPERATOR, ForkServer, start_process
from parityserve.runtime.graphs.hams_messages import Hello
from parityserve.runtime.graphs.hams_protocol import OperatorSpec
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys
from parityserve.runtime.workers.rpc import WorkerLink

__all__ = ["Member", "MemberLauncher"]


@dataclass
class Member:
    spec: OperatorSpec
    popen: ProcessHandle  # a subprocess.Popen, or a zygote's ForkedProcess
    keys: ClientKeys | None
    started_at: float
    hello: asyncio.Future[Hello]  # its first message, or why its model did not load
    last_beat: float = 0.0
    lost: str | None = None  # how its loss was seen: "exit" or "timeout"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def node(self) -> str | None:
        """The Ray node it runs on (None until Ray says), or "local": the frontend's host."""
        node: str | None = getattr(self.popen, "node_id", "local")
        return node

    @property
    def on_this_host(self) -> bool:
        """Whether ``/proc`` here shows its process (a Ray member may run on another host)."""
        return bool(getattr(self.popen, "local", True))

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def kill(self) -> None:
        """SIGKILL: a demoted or lost process gets no chance to send anything more."""
        kill_and_reap(self.popen, reap_s=2)  # reaped: no zombie, no warning at exit


class MemberLauncher:
    def __init__(self, link: WorkerLink, keys: ServerKeys | None, log_dir: Path | None) -> None:
        self.link, self.keys, self.log_dir = link, keys, log_dir
        self._count = 0
        # the server's zygote (runtime/graphs/registry.py sets it): members are forked, not spawned
        self.forks: ForkServer | None = None
        self.notes: dict[str, str] = {}  # operator -> why its members share a node (Ray)
        self.watches_nodes = False  # Ray: nodes join (``read_nodes``, ``members_to_renew``)

    def read_nodes(self) -> tuple[Any, bool]:
        """What the cluster says of its nodes (for ``members_to_renew``), and whether one
        joined since the last call (local: one, never). It may block: called off the loop."""
        return None, False

    def members_to_renew(self, nodes: Any) -> dict[str, str]:
        """Operator -> its member to retire (a spare or a backup sharing a node with its
        operator's other members): local members share one host, so none."""
        return {}

    def start(self, spec: OperatorSpec, now: float) -> Member:
        keys = self.keys.client() if self.keys is not None else None
        if keys is not None:
            self.link.expect(spec.worker_id, keys.public)
        popen = self._process(spec, keys)
        hello: asyncio.Future[Hello] = asyncio.get_running_loop().create_future()
        return Member(spec, popen, keys, now, hello, last_beat=now)

    def _process(self, spec: OperatorSpec, keys: ClientKeys | None) -> ProcessHandle:
        args = ["--connect", self.link.address, "--spec", spec.to_json()]
        return start_process(OPERATOR, args, threads=1, keys=keys, log_dir=self.log_dir,
                             name=spec.worker_id, forks=self.forks)

    def forget(self, member: Member) -> None:
        """The member is gone: its id and key stop being accepted."""
        member.kill()
        if member.keys is not None and self.keys is not None:
            self.keys.revoke(member.keys.public)
        self.link.forget(member.worker_id)

    def next_id(self, graph: str, op: str, role: str) -> str:
        self._count += 1
        return f"{graph}/{op}/{role}-{self._count}"
