"""Failure detection for a graph's operator processes, every few milliseconds.

A member whose process exited is lost; one silent past ``heartbeat_timeout_ms`` whose
process exists is only suspected: the recovery plan fences it if another member holds its
state, else keeps it and waits until it speaks again (``RecoveryPlan.suspected``; issue 39:
under load, a promoted backup starved past the timeout was fenced, and the graph gave up
for good). bare and checkpoint-replay have no plan: a lost primary is started afresh
(``hams_baselines``). Each tick also runs the batches' watchdog (``Dispatch.expire``).

Silence alone is not a hang when the member is starved of CPU: a member with a thread that is
runnable (state R in ``/proc``: running, or waiting for a core) is given up to
``STARVED_GRACE`` times the timeout before it is suspected. Without this, three test workers
and a busy loop on two cores left healthy members 200-300 ms without a core, and they were
declared lost: a bare graph restarted a primary and lost its streams' state, and a kill was
seen as a timeout (a fresh-clone make test beside a CPU hog, 2026-11-29). A stopped member
(SIGSTOP, state T) or one blocked for good (every thread asleep) is still suspected at the
timeout; one spinning forever is suspected at the grace. A member whose process used CPU
since its silence passed half the limit counts as busy too: its threads' states are read at
one instant, and a primary starved in a garbage collection was asleep again when looked at.
A thread in uninterruptible sleep (state D: waiting on the kernel for a disk read, a page
fault, a log write) counts as busy too: under another job's heavy I/O a member waits there,
alive (a fresh-clone make test beside a Ray cluster starting up lost five healthy members at
once by the 200 ms timeout).
Each suspicion is logged with how long the member was silent and its threads' states, so the
next one says which it was. A member on another host (a Ray actor, ``hams_ray_members``)
has no ``/proc`` here to read: it gets the plain timeout.

Silence is only evidence against a member while the frontend is shown to be hearing: when no
member at all has been heard within half the timeout (healthy members speak every heartbeat
interval, 50 ms), the likelier cause is this side (the frontend's message thread starved, its
socket stalled), and every silence gets the same grace as a starved member; a member whose
process exited is still lost at once. Without this, a clean-clone make test beside a Ray node
joining heard nothing from any of four healthy members of a Ray graph for 207-214 ms, every
thread of them asleep, and failed over both operators at once (2026-11-29); with the whole
timeout as the window, a frontend deaf for just over it (as Ray declared a node dead) had
still heard someone within it. A graph with one member has no second one to vouch: it keeps
the plain timeout.

The data path (``_data_path_loss``, HAMS §IV-E) suspects sooner: a primary silent while it
holds a batch, past 4 of its operator's slowest recent round trips (at least 100 ms, two
heartbeat intervals; at most the timeout), unless it is seen working on this host. A healthy
primary answers, or beats whenever it waits (on a copy, a receipt, a seeding). It needs another
member heard within half its limit (no one to vouch: no verdict), a new primary's own round
trips (the old one's are dropped at a failover), and a plan: in ``bare`` and
``checkpoint-replay`` a wrong verdict restarts a primary from scratch, so they keep the
heartbeat alone. ``data_path_detection: false`` turns it off.

A machine takes all its members with it (``_node_loss``): once a member on a Ray node is
lost by its silence (not kept as its operator's last holder), every other
member on that node silent past the data path's floor (two heartbeat intervals) is lost with
it, while a member on another node was heard within half the floor, for as long as the
heartbeat timeout would have taken to say so. A member of that node heard more than the floor
after the lost one last spoke shows the node is up: the mark is dropped. Without this, a node
holding both operators' primaries was found through the one that held a batch; the other,
idle, waited out the heartbeat timeout, and the first recovery's protocol with it: 100-250 ms
of the 242 ms median node failover of the first full run (2026-11-30), against 20-80 ms where
both held batches. Members of the frontend's own host (the local launcher) share no node.
A member lost by its silence whose process has exited marks its node too: on a crashed node
the actor often reports its process's SIGKILL before dying itself, so the report does not
tell a crash from a node's loss (a rule that spared them never fired in a full run); a wrong
mark costs little, since any member of a live node speaks within the floor and drops it.

Neither fast rule asks ``/proc`` whether a silent member is merely asleep. Tried: leaving a
member seen alive on this host (threads, none dead or stopped) to the heartbeat, after a full
run fenced a healthy primary, every thread asleep, 104 ms silent holding a batch as a node
joined (and its node-mate primary with it; consistent, but a 6 s handover). A crashed node's
processes take 200-900 ms to be torn down on this rig and look alive meanwhile, so the next
run's node failovers waited out the heartbeat again (protocol 93-142 ms against 14-38 ms), and
it was reverted the same hour. The data path still spares a member seen working (a thread
running or waiting for a core).

Where nodes can join (Ray members), the watch also reads the cluster's nodes every
``NODES_EVERY_S``, off the loop: a node that joins gets new spares, not old roles (each
operator whose spare shares a node with another of its members, and would now go apart, has
that spare retired through the plan, which starts its replacement: ``hams_ray_members``), and
a backup left on its primary's node with the spare elsewhere is retired so that the spare,
apart, becomes the backup (``member_nodes``: the state was on one machine). Only a join
starts this: checking on every read retired 44 members in 12 minutes of node crashes (a
replacement placed where another operator's spare wanted room, and so on), and each start
costs seconds of CPU that starved the healthy members. After a join the check repeats on the
next reads while it still retires something (at most ``RENEW_PASSES``), so a chain (the spare
first, then the backup) completes; a join seen during a recovery waits for its end.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from parityserve.runtime.graphs.hams_baselines import Baselines
from parityserve.runtime.graphs.hams_context import GraphContext, log
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_membership import Membership
from parityserve.runtime.graphs.hams_protocol import OperatorSpec
from parityserve.runtime.graphs.hams_recovery import RecoveryDriver
from parityserve.runtime.graphs.hams_stall import cpu_ticks, thread_states

__all__ = ["Watch", "thread_states"]

_CHECK_EVERY_S = 0.005
STARVED_GRACE = 10  # a runnable member's silence limit, in heartbeat timeouts
DATA_LIMIT_FACTOR = 4  # a primary holding a batch: silent this many slowest round trips...
# ...but at least two of its heartbeat intervals: a primary waiting on its backup (Remus) or a
# seeding beats every interval, and one beat late must not read as a loss
DATA_LIMIT_FLOOR_S = 2 * OperatorSpec.heartbeat_s
NODES_EVERY_S = 1.0  # how often the cluster's nodes are read, where nodes can join (Ray)
RENEW_PASSES = 3  # checks for members to move after one join, while each moves something
RETIRED = "retired: a node joined where its operator has no member; a fresh spare starts there"
RETIRED_BACKUP = ("retired: it shared its primary's node (the state on one machine); the spare, "
                  "on another, becomes the backup")


class Watch:
    def __init__(self, ctx: GraphContext, members: Membership, dispatch: Dispatch,
                 recovery: RecoveryDriver, baselines: Baselines) -> None:
        self.ctx, self.members, self.dispatch = ctx, members, dispatch
        self.recovery, self.baselines = recovery, baselines
        self.losses: deque[dict[str, Any]] = deque(maxlen=100)  # members seen lost, newest last
        self._nodes_at = 0.0  # when the cluster's nodes are read next
        self._reading = False  # a read is under way (off the loop)
        self._resumed = 0.0  # when the loop last came back from a stall (``_forgive_stall``)
        self._passes = 0  # checks left for members to move (a join sets RENEW_PASSES)
        # member -> (its process's CPU ticks, when read), from when its silence passed half
        # the limit (members on this host), read again at most every heartbeat interval
        self._quiet_cpu: dict[str, tuple[int, float]] = {}
        # Ray node -> (when a member there was lost by its silence, when it last spoke)
        self._silent_nodes: dict[str, tuple[float, float]] = {}

    async def run(self) -> None:
        ctx = self.ctx
        last = ctx.clock()
        while True:
            await asyncio.sleep(_CHECK_EVERY_S)
            now = ctx.clock()
            self._forgive_stall(now - last - _CHECK_EVERY_S, now)
            last = now
            self.dispatch.expire(now)
            if self.members.launcher.watches_nodes and now >= self._nodes_at \
                    and not self._reading:
                self._nodes_at, self._reading = now + NODES_EVERY_S, True
                ctx.spawn(self._read_nodes())
            hearing = self._hearing(now, self._silence_limit_s() / 2)
            for op, member in list(self.members.by_id.values()):
                if member.lost is None:
                    self._check(op, member, now, hearing)
                elif ctx.plan is not None and member.exited() \
                        and member.worker_id in ctx.plan.suspects():
                    self._note_loss(member, "exit", now)  # a kept suspect, gone for sure
                    self.recovery.lost(member, "exit")

    async def _read_nodes(self) -> None:
        launcher = self.members.launcher
        try:
            nodes, joined = await asyncio.to_thread(launcher.read_nodes)
        except Exception as exc:  # the GCS busy or gone: the next read tries again
            log.warning("graph %s: cannot read the cluster's nodes: %s", self.ctx.graph.name,
                        exc)
            return
        finally:
            self._reading = False
        if joined:
            self._passes = RENEW_PASSES
        plan = self.ctx.plan
        if self._passes <= 0 or plan is None or plan.recovering() or plan.failed is not None:
            return  # (a join waits for the recovery's end)
        renew = launcher.members_to_renew(nodes)
        self._passes = self._passes - 1 if renew else 0
        for op, member in renew.items():
            why = RETIRED_BACKUP if plan.roles(op)[1] == member else RETIRED
            log.warning("graph %s: %s's %s %s", self.ctx.graph.name, op, member, why)
            self.recovery.act(plan.lost(member, why))

    def _hearing(self, now: float, window_s: float, but: Member | None = None) -> bool:
        """Whether the frontend is shown to hear its members: some live member (other than
        ``but``) was heard within ``window_s``, or there is no second member to vouch (see
        the module docstring). The window is half the silence limit it vouches for: healthy
        members speak every heartbeat interval, and a frontend deaf for just over a limit
        (its socket's thread without a core as Ray declared a node dead: every member,
        all asleep, past 160-200 ms at once, none quiet by its own account) had still heard
        someone within the whole limit, and suspected them all."""
        beats = [m.last_beat for _, m in self.members.by_id.values()
                 if m.lost is None and m.hello.done() and m is not but]
        if but is not None:  # the data path: another member must vouch, or no verdict
            return bool(beats) and now - max(beats) <= window_s
        return len(beats) < 2 or now - max(beats) <= window_s

    def _check(self, op: str, member: Member, now: float, hearing: bool) -> None:
        self._sample_quiet_cpu(member, now)
        how, detector, silent = self._verdict(op, member, now, hearing)
        if how is None:
            return
        self._quiet_cpu.pop(member.worker_id, None)
        member.lost = how
        log.warning("graph %s: %s %s %s (exit code %s)", self.ctx.graph.name, op,
                    member.worker_id, silent, member.popen.poll())
        if self.ctx.plan is None:
            self._note_loss(member, how, now, detector)
            self.ctx.spawn(self.baselines.recover(op, member, how, now))
            return
        self.recovery.suspect(member, how)
        if member.worker_id in self.ctx.plan.suspects():
            return  # kept, not lost: no evidence against its node
        self._note_loss(member, how, now, detector)
        node = _ray_node(member)
        if how == "exit" or node is None:
            return  # (an exit seen as such says nothing of its node)
        mark = self._silent_nodes.get(node)
        if mark is None or now - mark[0] > self._silence_limit_s():
            self._silent_nodes[node] = (now, member.last_beat)  # (an older mark has run out)
        for sibling_op, sibling in list(self.members.by_id.values()):
            if sibling.lost is None and _ray_node(sibling) == node:
                self._check(sibling_op, sibling, now, hearing)

    def _verdict(self, op: str, member: Member, now: float, hearing: bool
                 ) -> tuple[str | None, str, str]:
        """(how it is lost or None, which detector said so, what the log says of it)."""
        how = self._loss(member, now, hearing)
        beat_ms = (now - member.last_beat) * 1e3
        if how == "exit":
            return how, "exit", "exited"
        if how is not None:
            return how, "heartbeat", f"silent past the timeout ({beat_ms:.0f} ms; threads " \
                f"{_threads(member)})"
        if (data := self._data_path_loss(op, member, now, hearing)) is not None:
            return "timeout", "data path", (
                f"silent {data[0] * 1e3:.0f} ms holding a batch, past the data-path limit of "
                f"{data[1] * 1e3:.0f} ms (its last heartbeat {beat_ms:.0f} ms ago; threads "
                f"{_threads(member)})")
        if (since := self._node_loss(member, now, hearing)) is not None:
            return "timeout", "node", (
                f"silent {beat_ms:.0f} ms on node {member.node}, where another member went "
                f"silent {since * 1e3:.0f} ms ago (a lost machine takes all its members)")
        return None, "", ""

    def _node_loss(self, member: Member, now: float, hearing: bool) -> float | None:
        """How long ago another member on ``member``'s Ray node was lost by its silence, when
        ``member`` is lost with it (see the module docstring). Else None: no plan, the mark
        ran out (the heartbeat timeout after that loss), a member of the node spoke since
        (the node is up: the mark is dropped), ``member`` spoke within the data path's
        floor, or no member on another node was heard within half of it."""
        node = _ray_node(member)
        mark = self._silent_nodes.get(node) if node is not None else None
        if node is None or mark is None or self.ctx.plan is None or not member.hello.done():
            return None
        since, its_last_beat = mark
        node_heard = max((m.last_beat for _, m in self.members.by_id.values()
                          if m.lost is None and _ray_node(m) == node), default=0.0)
        if now - since > self._silence_limit_s() \
                or node_heard > its_last_beat + DATA_LIMIT_FLOOR_S:
            self._silent_nodes.pop(node, None)
            return None
        silent = now - max(member.last_beat, self._resumed)
        if silent <= DATA_LIMIT_FLOOR_S or not hearing \
                or not self._heard_off(node, now, DATA_LIMIT_FLOOR_S / 2):
            return None
        return now - since

    def _heard_off(self, node: str, now: float, window_s: float) -> bool:
        """Whether a live member on another node than ``node`` was heard within
        ``window_s``: the frontend hears, and the silence is the node's."""
        return any(now - m.last_beat <= window_s for _, m in self.members.by_id.values()
                   if m.lost is None and m.hello.done() and _ray_node(m) != node)

    def _note_loss(self, member: Member, how: str, now: float, detector: str = "exit") -> None:
        """``detector``: what noticed it, "exit", "heartbeat" (silent past the timeout),
        "data path" (silent holding a batch: ``_data_path_loss``) or "node" (silent on a node
        where another member was just lost: ``_node_loss``)."""
        self.losses.append({"member": member.worker_id, "pid": member.pid, "how": how,
                            "detector": detector, "at": round(now, 4),
                            "silent_ms": round((now - member.last_beat) * 1e3, 1)})

    def _forgive_stall(self, stall_s: float, now: float) -> None:
        """The frontend's own loop was held up (a fork, a garbage collection, a busy core):
        heartbeats that arrived meanwhile are still unread, so that time counts against no
        operator. Without this a stalled frontend declares healthy primaries dead."""
        if stall_s > 0.02:
            self._resumed = now
            for _, member in self.members.by_id.values():
                member.last_beat += stall_s

    def _loss(self, member: Member, now: float, hearing: bool) -> str | None:
        if not member.hello.done():
            return "exit" if member.exited() else None
        if (self.ctx.graph.detection == "exit" or not hearing) and member.exited():
            return "exit"
        return silence_verdict(now - member.last_beat, self._silence_limit_s(),
                               lambda: member.on_this_host and (
                                   runnable(member.pid) or self._ran_lately(member, now)),
                               hearing)

    def _sample_quiet_cpu(self, member: Member, now: float) -> None:
        """Note a member's CPU ticks once its silence passes half the limit (cleared when it
        speaks). A look at its threads at the limit is one instant: a make test saw a healthy
        primary quiet 212 ms in a full garbage collection, starved (its own watch woke 166 ms
        late, threads RRRSSS), asleep again by the time the frontend looked (SSSSSS), and
        fenced. A process that ran during its silence is working, not hung."""
        if not member.on_this_host:
            return
        if now - member.last_beat <= self._silence_limit_s() / 2:
            self._quiet_cpu.pop(member.worker_id, None)
        elif member.worker_id not in self._quiet_cpu and \
                (ticks := cpu_ticks(member.pid)) is not None:
            for gone in [m for m in self._quiet_cpu if m not in self.members.by_id]:
                del self._quiet_cpu[gone]  # (members forgotten while quiet)
            self._quiet_cpu[member.worker_id] = (ticks, now)

    def _ran_lately(self, member: Member, now: float) -> bool:
        """Whether the member's process used CPU since the last reading, which moves on every
        heartbeat interval: one that worked early in its silence and then hung gets the
        timeout one interval later, not the whole grace."""
        before = self._quiet_cpu.get(member.worker_id)
        ticks = cpu_ticks(member.pid) if before is not None else None
        if before is None or ticks is None:
            return False
        if now - before[1] >= OperatorSpec.heartbeat_s:
            self._quiet_cpu[member.worker_id] = (ticks, now)
        return ticks > before[0]

    def _data_path_loss(self, op: str, member: Member, now: float, hearing: bool
                        ) -> tuple[float, float] | None:
        """HAMS's own detector (§IV-E: a data-path RPC timeout, about 20 ms there): a primary
        holding a batch that has said nothing for ``DATA_LIMIT_FACTOR`` times the slowest of
        its operator's recent round trips (at least ``DATA_LIMIT_FLOOR_S``, at most the
        heartbeat timeout) is suspected, unless it is seen working (a thread running or
        waiting for a core: then the heartbeat's limit and grace judge it). A healthy
        primary answers a batch or beats (it beats while it waits on a backup or a seeding);
        a silent one with work is computing, starved, or gone. Under load this notices a
        lost machine in a fraction of the heartbeat timeout, where its processes' exit is
        never seen. (silent s, limit s) when suspected, else None."""
        if not self.ctx.graph.data_path_detection or self.ctx.plan is None:
            return None  # (bare and checkpoint-replay: a wrong verdict restarts a primary)
        pair = self.ctx.pairs.get(op)
        out = self.ctx.inflight.get(op)
        if pair is None or pair.primary is not member or out is None:
            return None
        sent, slowest = out.oldest_sent(), out.slowest_recent()
        if sent is None or slowest is None or not member.hello.done():
            return None
        limit = min(max(DATA_LIMIT_FACTOR * slowest, DATA_LIMIT_FLOOR_S),
                    self._silence_limit_s())
        silent = now - max(member.last_beat, sent, self._resumed)
        if silent <= limit or not hearing or not self._hearing(now, limit / 2, but=member):
            return None
        if member.on_this_host and runnable(member.pid):
            return None  # computing or starved: the heartbeat's limit and grace judge it
        return silent, limit

    def _silence_limit_s(self) -> float:
        """A hung member is a lost one, whatever the detection mode: exit detection sees a
        dead process at once, and this catches one that is alive and answers nothing (a
        stalled backup would hold every reply, a stalled primary every request). The
        frontend's own stalls are forgiven (``_forgive_stall``)."""
        return self.ctx.graph.heartbeat_timeout_ms / 1000


def _threads(member: Member) -> str:
    """Its threads' states for the log (read only when it is suspected)."""
    return thread_states(member.pid) if member.on_this_host else "on another host"


def _ray_node(member: Member) -> str | None:
    """The Ray node ``member`` runs on; None for the frontend's own host or not yet known."""
    node = member.node
    return None if node in (None, "local") else node


def silence_verdict(silent_s: float, limit_s: float, is_runnable: Callable[[], bool],
                    hearing: bool = True) -> str | None:
    """``"timeout"`` when a member silent this long is suspected (see the module docstring);
    ``is_runnable`` is asked only past the limit. ``hearing``: whether the frontend heard any
    member within the limit; when it did not, the silence may be its own, and gets the grace."""
    if silent_s <= limit_s:
        return None
    if silent_s <= limit_s * STARVED_GRACE and (not hearing or is_runnable()):
        return None  # starved of CPU, or not heard through no fault of its own: not hung
    return "timeout"


def runnable(pid: int) -> bool:
    """Whether any thread of process ``pid`` is running or waiting for a core (Linux's state
    R) or for the kernel (D: a disk read, a page fault). A Python heartbeat thread waiting for
    the GIL sleeps (S), but then the thread holding it is the busy one."""
    return busy(thread_states(pid))


def busy(states: str) -> bool:
    """Whether threads in these states (``thread_states``' letters) are doing or waiting for
    work rather than for a message: running or runnable (R), or in the kernel (D)."""
    return "R" in states or "D" in states
