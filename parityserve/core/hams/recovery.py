"""The recovery plan after stateful primaries fail (HAMS §IV-E, decisions H8, H9).

Given the failed operators, the state each backup last applied, and what every downstream
operator has executed (its lineages), decide which backups to promote and which outputs
are speculation to throw away, so that no client and no durable downstream state ever sees
two different answers for one ``(operator, seq)``.

The rule, applied in topological order: an operator's outputs beyond its backup's applied
state are speculation once it is rolled back to that state. A downstream stateful operator
that executed anything built on speculation is rolled back too (its backup is promoted), and
its own later outputs become speculation in turn. This closes the paper's step 2 under
transitivity: the paper lists operators that saw the failed operator's speculation; an
operator that saw only a *promoted* operator's speculation must roll back as well, since
that operator recomputes those outputs, possibly differently.

Backups never apply states built on speculation (Alg. 2), so a promoted backup is always
consistent. When a listed operator's backup is dead too (Fig. 6), its primary rolls back to
the copy it retains, which is the one the backup last applied (H5): the same point.

A stateless operator needs no plan here: its request manager lives in the frontend, which
re-sends the requests it dispatched and never got answers for to the warm standby under
their original sequence numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parityserve.core.hams.lineage import FRONTEND, Lineage, speculative
from parityserve.core.hams.topology import Topology

__all__ = ["Failover", "plan_failover"]


@dataclass(frozen=True)
class Failover:
    epoch: int
    failed: tuple[str, ...]
    bounds: Mapping[str, int]  # rolled-back operator -> the seq it resumes after
    promote: tuple[str, ...]  # backups to promote, topological order
    roll_back_in_place: tuple[str, ...]  # listed operators whose backup is dead (Fig. 6)
    frontend_discards: bool  # the frontend holds replies built on speculation


def plan_failover(topology: Topology, failed: Iterable[str], applied: Mapping[str, int],
                  executed: Mapping[str, Iterable[Lineage]], epoch: int,
                  dead_backups: Iterable[str] = ()) -> Failover:
    """``failed``: stateful operators whose primary died. ``applied[op]``: the seq of the
    state op's backup last applied (or, with a dead backup, that its primary retains).
    ``executed[op]``: lineages of what op's primary executed (after op's own hop), and
    ``executed["frontend"]`` those of the replies the frontend holds."""
    failed_set = set(failed)
    _check_failed(topology, failed_set, set(dead_backups))
    bounds = {op: applied[op] for op in topology.operators if op in failed_set}
    promote = list(bounds)
    for op in topology.operators:
        if op in bounds or op not in topology.stateful:
            continue
        if any(speculative(lin, bounds) for lin in executed.get(op, ())):
            bounds[op] = applied[op]
            promote.append(op)
    dead = set(dead_backups)
    held = executed.get(FRONTEND, ())
    return Failover(epoch, tuple(sorted(failed_set, key=topology.operators.index)), bounds,
                    tuple(op for op in promote if op not in dead),
                    tuple(op for op in promote if op in dead),
                    any(speculative(lin, bounds) for lin in held))


def _check_failed(topology: Topology, failed: set[str], dead_backups: set[str]) -> None:
    if not failed <= topology.stateful:
        raise ValueError(f"not stateful, nothing to promote: {sorted(failed - topology.stateful)}")
    if both := failed & dead_backups:
        raise ValueError(f"primary and backup both lost, beyond HAMS's failure model: {both}")
