"""A service graph's shape: operators, edges, which are stateful; validated, then queried.

The frontend is an implicit node: the graph's entry operators receive from it and its exit
operators send to it. An operator with several inputs is a join: it waits for one output
of each predecessor for the same client request and combines them (H4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from graphlib import CycleError, TopologicalSorter

from parityserve.core.hams.lineage import FRONTEND

__all__ = ["GraphError", "Topology"]


class GraphError(ValueError):
    """A graph description that cannot be served, with the reason."""


@dataclass(frozen=True)
class Topology:
    operators: tuple[str, ...]  # topological order
    preds: Mapping[str, tuple[str, ...]]  # FRONTEND for entry operators
    stateful: frozenset[str]
    exits: tuple[str, ...]  # operators whose output goes to the frontend

    @classmethod
    def build(cls, operators: Iterable[str], edges: Iterable[tuple[str, str]],
              stateful: Iterable[str] = ()) -> Topology:
        """Validate and order a graph. ``edges`` name operators, or ``frontend`` as the
        source of an entry or the sink of an exit."""
        ops = list(operators)
        _check_names(ops)
        edge_list = list(edges)
        preds = {op: tuple(a for a, b in edge_list if b == op) for op in ops}
        _check_edges(ops, edge_list, set(stateful))
        order = _order(preds)
        exits = tuple(op for op in order if (op, FRONTEND) in edge_list)
        if len(exits) != 1:
            raise GraphError(f"exactly one operator answers the client; {list(exits)} do")
        return cls(order, preds, frozenset(stateful), exits)

    # Both are asked once per row at every hop (5% of the frontend's time under a flood of
    # 1,024-row requests): worked out once, the graph never changes.
    @cached_property
    def entries(self) -> tuple[str, ...]:
        return tuple(op for op in self.operators if FRONTEND in self.preds[op])

    @cached_property
    def _succs(self) -> dict[str, tuple[str, ...]]:
        return {op: tuple(o for o in self.operators if op in self.preds[o])
                for op in (*self.operators, FRONTEND)}

    def succs(self, op: str) -> tuple[str, ...]:
        return self._succs.get(op, ())

    def next_stateful(self, op: str) -> tuple[str, ...]:
        """NFM: the nearest stateful operators downstream, through stateless ones only.
        The frontend stands in when a path reaches the exit without one."""
        return self._nearest(op, self.succs, lambda o: o in self.exits)

    def prev_stateful(self, op: str) -> tuple[str, ...]:
        """PFM: the nearest stateful operators upstream, through stateless ones only."""
        return self._nearest(op, lambda o: tuple(p for p in self.preds[o] if p != FRONTEND),
                             lambda o: False)

    def _nearest(self, op: str, step: Callable[[str], tuple[str, ...]],
                 reaches_frontend: Callable[[str], bool]) -> tuple[str, ...]:
        found: set[str] = set()
        stack: list[str] = list(step(op))
        frontend = reaches_frontend(op)
        while stack:
            nxt = stack.pop()
            if nxt in self.stateful:
                found.add(nxt)
                continue
            frontend |= reaches_frontend(nxt)
            stack.extend(step(nxt))
        ordered = tuple(o for o in self.operators if o in found)
        return (*ordered, FRONTEND) if frontend else ordered


def _check_names(ops: list[str]) -> None:
    if not ops:
        raise GraphError("a graph needs at least one operator")
    dupes = sorted({o for o in ops if ops.count(o) > 1})
    if dupes:
        raise GraphError(f"operator names repeat: {dupes}")
    if FRONTEND in ops:
        raise GraphError(f"'{FRONTEND}' is reserved for the graph's entry and exit")


def _check_edges(ops: list[str], edges: list[tuple[str, str]], stateful: set[str]) -> None:
    known = {*ops, FRONTEND}
    for a, b in edges:
        for name in (a, b):
            if name not in known:
                raise GraphError(f"edge {a} -> {b} names an unknown operator '{name}'")
    if (FRONTEND, FRONTEND) in edges or len(set(edges)) != len(edges):
        raise GraphError("an edge repeats, or goes from the frontend straight to it")
    if unknown := sorted(stateful - set(ops)):
        raise GraphError(f"stateful names unknown operators: {unknown}")
    for op in ops:
        if not any(b == op for _, b in edges):
            raise GraphError(f"operator '{op}' has no input: add an edge into it")
        if not any(a == op for a, _ in edges):
            raise GraphError(f"operator '{op}' has no output: add an edge out of it")
    if not any(a == FRONTEND for a, _ in edges) or not any(b == FRONTEND for _, b in edges):
        raise GraphError("the graph needs an edge from 'frontend' and an edge to 'frontend'")


def _order(preds: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    graph = {op: {p for p in ps if p != FRONTEND} for op, ps in preds.items()}
    try:
        return tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise GraphError(f"the graph has a cycle: {cycle}") from exc
