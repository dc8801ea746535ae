"""Pool names: the one place that spells them.

A model's replicas serve in pools: ``DATA_POOL`` runs the deployed model; ``parity<j>`` runs
ParM's parity model j. Admin calls and replica ids name one replica of a pool as a *slot*:
``"2"`` (data replica 2) or ``"parity0-1"`` (replica 1 of parity pool 0).
"""

from __future__ import annotations

__all__ = ["DATA_POOL", "is_parity_slot", "parity_index", "parity_pool", "parity_pools",
           "slot_name"]

DATA_POOL = "data"
_PARITY = "parity"


def parity_pool(j: int) -> str:
    """The pool of parity model ``j``."""
    return f"{_PARITY}{j}"


def parity_pools(r: int) -> list[str]:
    """The pools of a ParM deployment with ``r`` parity models."""
    return [parity_pool(j) for j in range(r)]


def _ascii_int(text: str) -> int | None:
    # ASCII digits only: "²".isdigit() is True, and int() would refuse it.
    return int(text) if text.isascii() and text.isdigit() else None


def parity_index(pool: str) -> int | None:
    """j for ``parity<j>``; None for the data pool or anything else."""
    return _ascii_int(pool[len(_PARITY):]) if pool.startswith(_PARITY) else None


def slot_name(index: int, pool: str) -> str:
    """How admin calls and replica ids name a replica: "2", or "parity0-1"."""
    return str(index) if pool == DATA_POOL else f"{pool}-{index}"


def is_parity_slot(name: str) -> bool:
    """Whether ``name`` names a parity replica's slot, like ``parity0-1``."""
    pool, sep, index = name.rpartition("-")
    return bool(sep) and parity_index(pool) is not None and _ascii_int(index) is not None
