"""Who is who in a graph: its operator processes by id, launched and waited for until they
say hello (each operator's roles are in ``GraphContext.pairs``, as the recovery plan says).
"""

from __future__ import annotations

import asyncio
import itertools

from parityserve.core.hams import FRONTEND
from parityserve.core.hams.placement import ROLES
from parityserve.errors import ModelLoadError
from parityserve.runtime.graphs.hams_context import GraphContext, log
from parityserve.runtime.graphs.hams_members import Member, MemberLauncher
from parityserve.runtime.graphs.hams_messages import Hello
from parityserve.runtime.graphs.hams_protocol import OperatorSpec

__all__ = ["KilledLoading", "Membership"]

_START_TRIES = 3  # a member killed while loading at start is launched again this often


class Membership:
    """A graph's operator processes: launched, said hello, and known by id until forgotten
    (its late messages are then ignored, and the monitor no longer looks at it)."""

    def __init__(self, ctx: GraphContext, launcher: MemberLauncher, host: str,
                 ipc_dir: str) -> None:
        self.ctx, self.launcher = ctx, launcher
        self._host = host
        self._ipc_dir = ipc_dir  # primary -> backup on this host: Unix sockets in it
        self.by_id: dict[str, tuple[str, Member]] = {}  # worker id -> (operator, member)

    def launch(self, op: str, role: str) -> Member:
        ctx = self.ctx
        model = ctx.deployments[ctx.ops[op].model]
        spec = OperatorSpec(
            worker_id=self.launcher.next_id(ctx.graph.name, op, role), op=op,
            source=model.source, role=role, mode=ctx.mode, options=dict(model.options),
            pfm=tuple(m for m in ctx.topology.prev_stateful(op) if m != FRONTEND),
            bind_host=self._host, ipc_dir=self._ipc_dir,
            checkpoint_every=ctx.graph.checkpoint_every,
            full_state_every=ctx.graph.full_state_every,
            checkpoint_path=ctx.checkpoint_path(op),
            restore_seq=ctx.replay[op].checkpoint if op in ctx.replay else 0)
        member = self.launcher.start(spec, ctx.clock())
        self.by_id[member.worker_id] = (op, member)
        return member

    def launch_all(self) -> None:
        for pair in self.ctx.pairs.values():
            pair.primary = self.launch(pair.op, "primary")
            if self.ctx.held:
                pair.backup = self.launch(pair.op, "backup")
                pair.spare = self.launch(pair.op, "backup")

    def member(self, worker_id: str | None) -> Member | None:
        found = self.by_id.get(worker_id or "")
        return found[1] if found is not None else None

    def forget(self, member: Member) -> None:
        """Kill and unregister a member: its late messages are ignored, and the monitor,
        which checks every member every few ms, no longer looks at it."""
        self.launcher.forget(member)
        self.by_id.pop(member.worker_id, None)

    async def all_hellos(self) -> None:
        """Every member loaded. One killed while loading (no state yet to lose) is launched
        again; one whose model cannot load stops the start with the reason."""
        for pair in self.ctx.pairs.values():
            for role in ROLES:
                for attempt in itertools.count(1):
                    member = getattr(pair, role)
                    if member is None:
                        break
                    try:
                        await self.hello(member)
                        break
                    except KilledLoading:
                        if attempt >= _START_TRIES:
                            raise
                        log.warning("graph %s: %s was killed while loading; starting it "
                                    "again", self.ctx.graph.name, member.worker_id)
                        self.forget(member)
                        setattr(pair, role, self.launch(
                            pair.op, "primary" if role == "primary" else "backup"))

    async def hello(self, member: Member) -> Hello:
        while not member.hello.done():
            if member.exited():
                code = member.popen.returncode
                error = KilledLoading if code < 0 else ModelLoadError  # a signal, not a
                raise error(f"operator process {member.worker_id} exited with "  # reason
                            f"{code} before it said hello")
            await asyncio.sleep(0.02)
        return member.hello.result()


class KilledLoading(ModelLoadError):
    """A member died of a signal before it said hello: no fault of its model's."""
