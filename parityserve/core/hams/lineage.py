"""Causal lineage (HAMS Alg. 1): the sequence number a request got at every operator it passed.

A hop ``(pred, pred_seq, op, seq)`` says: operator ``op`` executed, as its ``seq``-th request,
what ``pred`` emitted as its ``pred_seq``-th output. The frontend is the first ``pred`` and its
``pred_seq`` is the client request's id, so every lineage names its client request.

A lineage is a plain tuple of hops; a join merges its inputs' lineages (decision H4), so one
operator may appear in several hops, always with one ``seq``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FRONTEND", "Hop", "Lineage", "client_of", "extend", "frontier", "merge", "seq_at",
           "speculative"]

FRONTEND = "frontend"


@dataclass(frozen=True, order=True)
class Hop:
    pred: str
    pred_seq: int
    op: str
    seq: int


Lineage = tuple[Hop, ...]


def seq_at(lineage: Lineage, op: str) -> int | None:
    """The sequence number ``op`` gave this request, or None if it never passed ``op``."""
    for hop in lineage:
        if hop.op == op:
            return hop.seq
    return None


def client_of(lineage: Lineage) -> int:
    """The client request a lineage descends from (the frontend's hop)."""
    for hop in lineage:
        if hop.pred == FRONTEND:
            return hop.pred_seq
    raise ValueError("a lineage without a frontend hop has no client request")


def extend(lineage: Lineage, sources: Iterable[tuple[str, int]], op: str, seq: int) -> Lineage:
    """Alg. 1 line 3: one hop per input that ``op`` combined into its ``seq``-th request."""
    return lineage + tuple(Hop(pred, pred_seq, op, seq) for pred, pred_seq in sources)


def merge(lineages: Iterable[Lineage]) -> Lineage:
    """The union of a join's input lineages, first occurrence order (H4).

    Fan-out then join brings the same upstream hop twice; it is kept once. One operator
    with two different sequence numbers would mean two different requests were joined.
    """
    merged: dict[Hop, None] = {}
    seen: dict[str, int] = {}
    for lineage in lineages:
        for hop in lineage:
            if seen.setdefault(hop.op, hop.seq) != hop.seq:
                raise ValueError(f"joined inputs disagree on {hop.op}'s sequence number")
            merged[hop] = None
    return tuple(merged)


def speculative(lineage: Lineage, bounds: Mapping[str, int]) -> bool:
    """Whether a lineage depends on an output beyond a rolled-back operator's bound (H8)."""
    return any(hop.op in bounds and hop.seq > bounds[hop.op] for hop in lineage)


def frontier(lineages: Iterable[Lineage], ops: Collection[str]) -> Lineage:
    """What a batch's state depends on, in one lineage: per operator of ``ops`` that any
    of ``lineages`` passed, one hop with the highest sequence number it carries there.
    Alg. 2's test (``Watermarks.covers``) holds for it exactly when it holds for every one
    of the lineages, so a primary ships this instead of a lineage per request."""
    top: dict[str, int] = {}
    for lineage in lineages:
        for hop in lineage:
            if hop.op in ops and hop.seq > top.get(hop.op, 0):
                top[hop.op] = hop.seq
    return tuple(Hop("", 0, op, seq) for op, seq in sorted(top.items()))
