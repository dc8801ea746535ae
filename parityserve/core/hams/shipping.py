"""The primary side of non-stop primary-backup (HAMS §III-B, §IV-B/C, decision H2, H5).

A stateful operator runs each batch as a compute stage (reads the state) then an update
stage (writes it). After batch n its outputs leave at once; while batch n+1 computes, the
state manager copies s^n and sends it to the backup. ``update(n+1)`` waits for that copy,
because the copy must not see half-written state (H2).

At most ``window`` undelivered states are in flight (the paper: one): while the backup has
not acknowledged receipt of them, no new copy starts. The batches that finish meanwhile are
not lost: their lineages are folded into the next state shipped (coalescing). The model
never waits on the network, only on a local copy: that is the "non-stop". The link keeps
order, so a delta whose base is still in flight reaches the backup after its base.

Why a window of two in the worker: with one, a batch's state waits for the receipt of the
one before it, a round trip through the backup process, and on two shared cores that wait
is on every reply's path. Measured interleaved, 64-row requests on the stocks graph: hams
with two in flight took 0.947x the mean latency of hams with one (6 repetitions;
benchmarks/results/hams-profile/README.md).

The primary keeps the last copy its backup *applied* (H5) to roll back to if the backup
dies before applying a newer one (the Fig. 6 case); ``retained_seq`` names it.

The Remus baseline differs only in its driver: it takes the copy before the next batch
starts (stop) and holds outputs until the backup has the state.
"""

from __future__ import annotations

from dataclasses import dataclass

from parityserve.core.hams.lineage import Lineage

__all__ = ["CopyOrder", "PrimaryShipper", "ShipperStats"]


@dataclass(frozen=True)
class CopyOrder:
    """Copy the current state, the one after request ``seq``, to ship with these lineages;
    or, with ``existing``, send the copy already taken after ``seq`` (just finished, or
    again for a new backup's catch-up), which holds no update back."""
    seq: int
    lineages: tuple[Lineage, ...]
    existing: bool = False


@dataclass(frozen=True)
class ShipperStats:
    last_executed: int
    copying: int | None
    in_flight: int | None  # the newest state in flight
    applied: int
    unshipped: int


class PrimaryShipper:
    def __init__(self, op: str, start_seq: int = 0, window: int = 1) -> None:
        if window < 1:
            raise ValueError(f"{op}: a shipping window is at least 1 state, got {window}")
        self.op, self.window = op, window
        self._executed = start_seq
        self._unshipped: list[Lineage] = []
        self._copying: int | None = None
        self._in_flight: list[int] = []  # shipped, receipt not heard, in shipping order
        self._applied = start_seq
        self._unapplied: list[tuple[int, tuple[Lineage, ...]]] = []  # shipped, not applied
        self._copy_lineages: tuple[Lineage, ...] = ()
        self._resend: list[tuple[int, tuple[Lineage, ...]]] = []

    @property
    def update_allowed(self) -> bool:
        """The update stage may write the state: no copy of it is being taken."""
        return self._copying is None

    @property
    def retained_seq(self) -> int:
        return self._applied

    def batch_finished(self, lineages: tuple[Lineage, ...], last_seq: int) -> CopyOrder | None:
        """The update stage of a batch ended. Returns a new copy to take now (it overlaps
        the next batch's compute stage) unless the window is full or copies wait to be
        sent again: never an ``existing`` one."""
        if last_seq <= self._executed:
            raise ValueError(f"{self.op}: batch ending at {last_seq} after {self._executed}")
        self._executed = last_seq
        self._unshipped.extend(lineages)
        if self._resend:  # a new backup catches up: the resends go first, each on a
            return None  # receipt (the caller takes what this returns for a new copy)
        return self._maybe_copy()

    def copy_finished(self, seq: int) -> CopyOrder | None:
        """The copy is in a private buffer. Returns what to send with it now (it is then in
        flight). During a new backup's catch-up the copy waits its turn behind the resends
        (it comes back later as an ``existing`` order) and the next resend may be returned."""
        if seq != self._copying:
            raise ValueError(f"{self.op}: finished copying {seq}, was copying {self._copying}")
        self._copying = None
        if len(self._in_flight) >= self.window or self._resend:
            self._resend.append((seq, self._copy_lineages))
            return self._maybe_copy()
        self._in_flight.append(seq)
        self._unapplied.append((seq, self._copy_lineages))
        return CopyOrder(seq, self._copy_lineages, existing=True)

    def received(self, seq: int) -> CopyOrder | None:
        """The backup acknowledged receipt of state ``seq``. If batches finished since, their
        state may be copied now; the caller takes it at the next point the state is at rest
        (right away if the operator is idle, else during the next compute stage)."""
        self._in_flight = [s for s in self._in_flight if s > seq]  # the link keeps order
        return self._maybe_copy()

    def applied(self, seq: int) -> None:
        """The backup applied state ``seq``: it is durable, and the older copy can go."""
        self._applied = max(self._applied, seq)
        self._unapplied = [(s, lins) for s, lins in self._unapplied if s > self._applied]

    def _maybe_copy(self) -> CopyOrder | None:
        if len(self._in_flight) >= self.window or self._copying is not None:
            return None
        if self._resend:
            seq, lineages = self._resend.pop(0)
            self._in_flight.append(seq)
            self._unapplied.append((seq, lineages))
            return CopyOrder(seq, lineages, existing=True)
        if not self._unshipped:
            return None
        order = CopyOrder(self._executed, tuple(self._unshipped))
        self._unshipped, self._copying, self._copy_lineages = [], order.seq, order.lineages
        return order

    def lost_backup(self) -> CopyOrder | None:
        """The backup died; a new one starts from the copy the old one last acknowledged as
        applied (``retained_seq``, H5/H6). Every state shipped after it is sent again, the
        same bytes in the same order: the dead backup may have applied some and announced
        them durable, so the new one must reproduce them, not jump to a newer state."""
        self._resend = sorted([*self._unapplied, *self._resend], key=lambda entry: entry[0])
        self._unapplied = []
        self._in_flight = []
        return self._maybe_copy()

    def statistics(self) -> ShipperStats:
        return ShipperStats(self._executed, self._copying,
                            self._in_flight[-1] if self._in_flight else None, self._applied,
                            len(self._unshipped))
