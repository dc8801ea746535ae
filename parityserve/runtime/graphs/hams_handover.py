"""The messages that hand an operator's state from one member to another during a recovery:
let a backup (or a spare) in for its primary, attach it, tell it the upstream watermarks,
and the order a member taking over is sent. ``hams_recovery`` decides when (as the plan
says); this piece only knows what each member is told.
"""

from __future__ import annotations

from parityserve.core.hams.recovery_plan import Allow, Attach, Inform, Promote, RollBack
from parityserve.errors import ProtocolError
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_context import GraphContext
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_membership import Membership

__all__ = ["Handover"]


class Handover:
    def __init__(self, ctx: GraphContext, members: Membership) -> None:
        self.ctx, self.members = ctx, members

    async def allow(self, action: Allow) -> Member | None:
        """The backup admits only the primary's key and learns how far upstream is durable
        (earlier notices will not come again). Raises ``Unavailable`` if the backup does
        not answer; returns the backup, or None when a member is already gone."""
        backup, primary = self.members.member(action.backup), self.members.member(action.primary)
        if backup is None or primary is None:
            return None
        durable = self._durable_upstream(backup)
        durable[action.op] = self.ctx.heard[action.op].upto  # its own outputs held here
        await self.ctx.ask(backup, hp.ALLOW, hm.Allow(_key(primary), durable))
        return backup

    def attach(self, action: Attach) -> None:
        """The primary sends the backup its retained copy as a base, then every state."""
        backup = self.members.member(action.backup)
        primary = self.members.member(action.primary)
        if backup is None or primary is None:
            return
        hello = backup.hello.result()
        if hello.address is None:
            raise ProtocolError(f"{backup.worker_id} said hello without its address")
        self.ctx.tell(primary, hm.Attach(hello.address, hello.key))

    def inform(self, action: Inform) -> None:
        """A recovery resumed: the backup hears every upstream watermark the frontend holds
        (``Inbox._on_durable`` relayed notices to the backup of the moment only, and
        ignored a taker's; ``_resume`` reset the points). One it has already changes
        nothing: a watermark never moves back."""
        backup = self.members.member(action.backup)
        if backup is None:
            return
        for upstream in backup.spec.pfm:
            self.ctx.tell(backup, hm.Notify(upstream, self.ctx.router.commit.durable[upstream]))

    def order(self, action: Promote | RollBack, member: Member) -> tuple[hm.Order, Member | None]:
        """What ``member`` is told to take over, and the spare it seeds (promotions only)."""
        if isinstance(action, RollBack):
            return hm.Rollback(), None
        spare = self.members.member(action.attach)
        return self._seed_spare(member, spare), spare

    def _seed_spare(self, member: Member, spare: Member | None) -> hm.Promote:
        """Let the spare in for the member being promoted (not waited for: it answers the
        promotion only once the spare applied its state), and say where it listens."""
        if spare is None or not spare.hello.done():
            return hm.Promote()
        durable = self._durable_upstream(spare)
        op = spare.spec.op  # outputs beyond the durable point may be renumbered: not those
        durable[op] = self.ctx.router.commit.durable[op]
        self.ctx.tell(spare, hm.Allow(_key(member), durable))
        hello = spare.hello.result()
        return hm.Promote(hello.address, hello.key)

    def _durable_upstream(self, member: Member) -> dict[str, int]:
        return {m: self.ctx.router.commit.durable[m] for m in member.spec.pfm}


def _key(member: Member) -> str:
    return member.keys.public.decode() if member.keys is not None else ""
