"""Coding groups: the pure decisions of ParM, Berrut (ApproxIFER) and systematic Berrut serving.

A *group* ties together the batches one redundancy scheme codes jointly. The scheduler
(``core/scheduling``) forms batches, sends the tasks a group asks for, and reports each
task's outputs back; the group says when it can decode and rebuilds the missing outputs.
Nothing here touches a clock, a socket or a random generator: time comes in as ``now``.

Batches travel row-aligned: row i of every batch in a group codes into row i of the coded
batch. Shorter batches are padded with zero rows; a padded row's output is taken to be zero,
which is exact for a bias-free linear model and an approximation otherwise (a learned parity
model is trained on full groups, so a short group decodes a little less accurately).

* ``ParmGroup``: k data batches dispatched as they form, plus r parity batches for the parity
  models; up to r missing outputs are rebuilt from the others and the parity outputs.
* ``BerrutGroup``: K batches coded into N+1 Berrut queries, all served by the deployed model;
  every output is an interpolation from the fastest ``needed`` results, after the error
  locator (E > 0) has excluded the Byzantine workers.
* ``SystematicGroup``: the K batches themselves plus S coded ones; exact when every original
  arrives, interpolated over whatever arrived otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from parityserve.core.coding._arrays import Array, all_finite
from parityserve.core.coding.berrut import BerrutCode, SystematicBerrut
from parityserve.core.coding.parity import ConcatEncoder, LinearCode
from parityserve.errors import CodingError

__all__ = [
    "BerrutGroup",
    "Decoded",
    "ParmGroup",
    "SystematicGroup",
    "pad_rows",
    "softmax_subtraction",
    "split_even",
    "take_task",
]

ParmEncoder = Literal["addition", "concat"]


@dataclass(frozen=True, slots=True)
class Decoded:
    """Outputs a group rebuilt: data slot -> rows (one per real query of that batch)."""

    outputs: dict[int, Array]
    method: str
    suspected: tuple[int, ...] = ()  # coded slots the error locator excluded


class _Assigned(Protocol):
    """A coding group in flight, as far as pulling work goes: the workers that took a task."""

    @property
    def assigned(self) -> Collection[Hashable]: ...


class _Queued(Protocol):
    """A queued task (``core.scheduling.records.Task``)."""

    @property
    def group(self) -> _Assigned | None: ...

    def needed(self) -> bool: ...


_T = TypeVar("_T", bound=_Queued)

_Item = TypeVar("_Item")


def split_even(items: Sequence[_Item], k: int) -> list[list[_Item]]:
    """Up to k near-equal consecutive chunks (fewer when there are fewer items): how the
    Berrut modes cut the queries of one dispatch into the K batches of a group."""
    parts = min(k, len(items))
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(list(items[start:end]))
        start = end
    return chunks


def take_task(queue: deque[_T], worker: Hashable) -> _T | None:
    """Remove and return the first queued task still needed that ``worker`` may take.

    Tasks no longer needed are dropped on the way. A worker takes at most one task of a
    coding group, or a single slow (or Byzantine) worker would count as two.
    """
    for task in list(queue):
        if not task.needed():
            queue.remove(task)
        elif task.group is None or worker not in task.group.assigned:
            queue.remove(task)
            return task
    return None


def pad_rows(batches: Sequence[Array]) -> np.ndarray:
    """Stack batches ``(b_j, ...)`` into ``(n, max b_j, ...)``, zero-padding short ones."""
    arrays = [np.asarray(b) for b in batches]
    if not arrays:
        raise CodingError("a coding group needs at least one batch")
    item = arrays[0].shape[1:]
    for j, array in enumerate(arrays):
        if array.ndim == 0 or array.shape[1:] != item:
            raise CodingError(f"batch {j} has rows of shape {array.shape[1:]}, expected {item}")
        if not np.issubdtype(array.dtype, np.number):
            raise CodingError(f"batch {j} has dtype {array.dtype}; coding needs numbers")
    rows = max(len(a) for a in arrays)
    out = np.zeros((len(arrays), rows, *item), dtype=np.result_type(*arrays, np.float32))
    for j, array in enumerate(arrays):
        out[j, : len(array)] = array
    return out


def softmax_subtraction(parity: Array, present: Sequence[Array], k: int) -> np.ndarray:
    """The concat decoder (ParM §4.3): ``k * softmax(parity) - sum softmax(present)``, in
    probability space, clipped at zero and renormalised; returned as probabilities."""
    def softmax(x: Array) -> np.ndarray:
        z = np.asarray(x, dtype=np.float64)
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        return np.asarray(z / z.sum(axis=-1, keepdims=True))

    # NaN/inf logits would otherwise come back as uniform probabilities: a plausible answer.
    if not all(np.all(np.isfinite(np.asarray(x))) for x in (parity, *present)):
        raise CodingError("the concat decoder needs finite outputs; got NaN or inf")
    rebuilt = k * softmax(parity) - sum((softmax(p) for p in present), np.zeros(1))
    rebuilt = np.clip(rebuilt, 0.0, None)
    total = rebuilt.sum(axis=-1, keepdims=True)
    safe = np.where(total > 0, total, 1.0)
    return np.asarray(np.where(total > 0, rebuilt / safe, 1.0 / rebuilt.shape[-1]))


@dataclass(eq=False)
class _Slots:
    """Per data slot: how many real rows it has and the outputs that arrived."""

    sizes: list[int] = field(default_factory=list)
    outputs: dict[int, np.ndarray] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)  # arrived or rebuilt: nothing left to do

    def add(self, rows: int) -> int:
        self.sizes.append(rows)
        return len(self.sizes) - 1

    def arrive(self, slot: int, outputs: Array) -> None:
        self.outputs[slot] = np.asarray(outputs)
        self.settled.add(slot)

    def missing(self) -> list[int]:
        return [s for s in range(len(self.sizes)) if s not in self.settled]


def _k_batches(batches: Sequence[Array], k: int, what: str) -> np.ndarray:
    """1 to k batches row-padded and stacked, then zero batches up to k: ``(k, rows, ...)``."""
    if not 1 <= len(batches) <= k:
        raise CodingError(f"{what} takes 1 to {k} batches, got {len(batches)}")
    stacked = pad_rows(batches)
    if len(stacked) < k:
        fill = np.zeros((k - len(stacked), *stacked.shape[1:]), stacked.dtype)
        stacked = np.concatenate([stacked, fill])
    return stacked


def _cut(rows: Array, size: int) -> np.ndarray:
    return np.asarray(rows)[:size]


def _padded(outputs: np.ndarray, rows: int) -> np.ndarray:
    if len(outputs) == rows:
        return outputs
    out = np.zeros((rows, *outputs.shape[1:]), dtype=np.result_type(outputs, np.float32))
    out[: len(outputs)] = outputs
    return out


class _RunningParities:
    """The r parity batches of a ParM group, summed as its batches join instead of at close.

    Why not encode at close, as ParM does: ParM's encoder waits for the k-th query and then
    sums all k, so k - 1 additions of full inputs (600 KB each at ImageNet size) sit between
    the group filling and its parity leaving. Summing as batches join leaves one addition
    there whatever k is, and never stacks the inputs into a (k, rows, ...) copy. The
    arithmetic is ``pad_rows`` followed by ``LinearCode.encode``: a short batch adds into
    the first rows only (zero padding), slots the group never fills add nothing, and the sum
    is kept in the inputs' own floating dtype (``result_dtype``).

    No NaN check on the parity: a non-finite query makes the parity output non-finite, and
    the decoder checks what it rebuilds (one output row, not an input image) and refuses it.
    """

    def __init__(self, rows: list[list[float]]) -> None:
        self._rows = rows  # the code's (r, k) coefficients, as the group holds them
        self._acc: np.ndarray | None = None  # (r, rows, ...)
        self.error: CodingError | None = None  # the first bad batch: the group cannot encode

    def add(self, slot: int, batch: np.ndarray) -> None:
        if self.error is not None:
            return
        try:
            self._add(slot, batch)
        except CodingError as exc:
            self.error, self._acc = exc, None

    def parities(self) -> list[np.ndarray]:
        if self.error is not None:
            raise self.error
        if self._acc is None:
            raise CodingError("cannot encode an empty coding group")
        return list(self._acc)

    def _add(self, slot: int, batch: np.ndarray) -> None:
        if batch.ndim == 0 or batch.dtype.kind not in "fiu":
            raise CodingError(f"batch {slot} has shape {batch.shape} and dtype {batch.dtype}; "
                              "coding needs batches of rows of real numbers")
        acc = self._acc
        if acc is None:
            dtype = np.result_type(batch, np.float32)
            self._acc = np.empty((len(self._rows), *batch.shape), dtype=dtype)
            for row, target in zip(self._rows, self._acc, strict=True):
                _scaled_into(target, batch, row[slot])
            return
        if batch.shape[1:] != acc.shape[2:]:
            raise CodingError(f"batch {slot} has rows of shape {batch.shape[1:]}, expected "
                              f"{acc.shape[2:]} like batch 0")
        dtype = np.result_type(acc, batch)
        if dtype != acc.dtype:
            acc = acc.astype(dtype)
        if len(batch) > acc.shape[1]:
            grown = np.zeros((acc.shape[0], len(batch), *acc.shape[2:]), dtype=acc.dtype)
            grown[:, : acc.shape[1]] = acc
            acc = grown
        self._acc = acc
        for row, whole in zip(self._rows, acc, strict=True):
            target = whole[: len(batch)]
            c = row[slot]
            if c == 1.0:
                np.add(target, batch, out=target)
            else:
                np.add(target, np.multiply(batch, c, dtype=acc.dtype), out=target)


def _scaled_into(target: np.ndarray, batch: np.ndarray, c: float) -> None:
    if c == 1.0:
        np.copyto(target, batch, casting="unsafe")
    else:
        np.multiply(batch, c, out=target, dtype=target.dtype)


class ParmGroup:
    """ParM: up to k data batches joined as they are dispatched, then r parity batches.

    ``add`` never waits: the data batch is sent by the caller first, then joins the group.
    ``close`` (when k batches joined, or when the runtime stops waiting for more) returns
    the r parity payloads. A missing batch is rebuilt once the parity outputs that arrived
    are at least as many as the missing batches and every other batch has arrived, and
    (with ``grace_s``) once it has been outstanding that long.
    """

    def __init__(self, code: LinearCode, encoder: ParmEncoder = "addition",
                 grace_s: float | None = None) -> None:
        if encoder == "concat" and code.r != 1:
            raise CodingError("the concat encoder has one parity (r = 1)")
        self.code = code
        self.encoder = encoder
        self.grace_s = grace_s
        self._concat = ConcatEncoder(code.k) if encoder == "concat" else None
        self._slots = _Slots()
        self._inputs: list[np.ndarray] = []  # the concat encoder tiles them all at close
        self._rows: list[list[float]] = code.coefficients.tolist()
        self._running = None if self._concat else _RunningParities(self._rows)
        self._method = "parm-subtraction" if code.r == 1 else "parm-linear"
        self._sent_at: list[float] = []
        self.parity_outputs: dict[int, np.ndarray] = {}
        self.closed = False
        self.rebuilt: set[int] = set()

    @property
    def k(self) -> int:
        return self.code.k

    @property
    def size(self) -> int:
        return len(self._sent_at)

    @property
    def full(self) -> bool:
        return self.size >= self.k

    def add(self, batch: Array, sent_at: float) -> int:
        """Join a dispatched batch; returns its slot."""
        if self.closed or self.full:
            raise CodingError("this coding group is closed")
        array = np.asarray(batch)
        slot = self._slots.add(len(array) if array.ndim else 1)
        self._sent_at.append(sent_at)
        if self._running is not None:
            self._running.add(slot, array)
        else:
            self._inputs.append(array)
        return slot

    def close(self) -> list[np.ndarray]:
        """Encode the r parity batches (row i of each from row i of every data batch)."""
        if not self._sent_at:
            raise CodingError("cannot encode an empty coding group")
        self.closed = True
        if self._running is not None:
            return self._running.parities()
        stacked = pad_rows(self._inputs)  # (n, rows, ...)
        self._inputs = []  # the group no longer needs the inputs
        concat = self._concat
        assert concat is not None
        rows = [concat.encode(list(stacked[:, i])) for i in range(stacked.shape[1])]
        return [np.stack(rows)]

    def arrive(self, slot: int, outputs: Array) -> None:
        self._slots.arrive(slot, outputs)

    def arrive_parity(self, j: int, outputs: Array) -> None:
        self.parity_outputs[j] = np.asarray(outputs)

    def missing(self) -> list[int]:
        return self._slots.missing()

    def decision(self, now: float) -> list[int] | float | None:
        """Slots to rebuild now; or the time to ask again (grace not over); or None."""
        missing = self.missing()
        if not self.closed or not missing or len(missing) > len(self.parity_outputs):
            return None
        if self.grace_s is not None:
            ready_at = max(self._sent_at[s] for s in missing) + self.grace_s
            if now < ready_at:
                return ready_at
        return missing

    def decode(self, missing: Sequence[int]) -> Decoded:
        """Rebuild ``missing`` (as returned by ``decision``)."""
        lean = self._rebuild_lean(missing) if self._concat is None else None
        if lean is not None:
            return self._settle(lean, self._method)
        if not 0 < len(missing) <= len(self.parity_outputs):
            raise CodingError(f"cannot rebuild {len(missing)} outputs from "
                              f"{len(self.parity_outputs)} parity outputs")
        if self._concat is None:
            return self._settle(self._rebuild(missing), self._method)
        (slot,) = missing
        present = self._present_padded()
        rebuilt = softmax_subtraction(self.parity_outputs[0], list(present.values()), self.k)
        return self._settle({slot: rebuilt}, "parm-concat")

    def _settle(self, outputs: dict[int, Array], method: str) -> Decoded:
        """Cut the rebuilt rows to each batch's real rows and mark the slots done."""
        slots = self._slots
        for s, rows in outputs.items():
            if len(rows) != slots.sizes[s]:
                outputs[s] = _cut(rows, slots.sizes[s])
            slots.settled.add(s)
            self.rebuilt.add(s)
        return Decoded(outputs, method)

    def _present_padded(self) -> dict[int, np.ndarray]:
        rows = max(len(p) for p in self.parity_outputs.values())
        return {s: _padded(o, rows) for s, o in self._slots.outputs.items()}

    def _rebuild(self, missing: Sequence[int]) -> dict[int, Array]:
        """The validating path: ``LinearCode.decode`` with every position accounted for."""
        # Slots the group never filled (closed early) hold zero queries, zero outputs.
        unfilled = range(len(self._slots.sizes), self.k)
        zeros = np.zeros_like(next(iter(self.parity_outputs.values())))
        known = {**self._present_padded(), **{s: zeros for s in unfilled}}
        return self.code.decode(known, self.parity_outputs, list(missing))

    def _rebuild_lean(self, missing: Sequence[int]) -> dict[int, Array] | None:
        """The common case, one late batch and one parity output, without the general
        path's bookkeeping: ``(P - sum_s c_s y_s) / c_lost`` over the outputs that arrived.

        Why a second path: at ParM's sizes (1,000 classes) the subtractions take about a
        microsecond each, and the general path's position checks, padding and dictionaries
        cost ten times that. The group knows its positions are consistent, so only shapes,
        dtypes and finiteness are checked here; anything unusual (padded rows, mixed dtypes,
        an earlier rebuilt slot, a NaN) returns None and the validating path runs and names
        the problem.
        """
        outputs = self._slots.outputs
        if len(missing) != 1 or len(self.parity_outputs) != 1:
            return None
        if len(outputs) != len(self._slots.sizes) - 1:
            return None  # a slot rebuilt earlier has no output here to subtract
        ((j, parity),) = self.parity_outputs.items()
        row = self._rows[j]  # Python floats: numpy scalar arithmetic costs more than this
        lost = missing[0]
        if row[lost] == 0.0 or parity.dtype.kind != "f":
            return None
        shape, dtype = parity.shape, parity.dtype
        out = None
        for s, y in outputs.items():
            if y.shape != shape or (y.dtype is not dtype and y.dtype != dtype):
                return None
            term = y if row[s] == 1.0 else y * row[s]  # a Python float keeps y's dtype
            if out is None:  # the first subtraction allocates the result: no copy of P
                out = np.subtract(parity, term)
            else:
                np.subtract(out, term, out=out)
        if out is None:  # a group of one: the parity output alone
            out = parity.copy()
        if row[lost] != 1.0:
            np.divide(out, row[lost], out=out, casting="same_kind")
        return {lost: out} if all_finite(out) else None


class BerrutGroup:
    """ApproxIFER: K batches coded into ``n_workers`` Berrut batches, all formed at once."""

    def __init__(self, code: BerrutCode) -> None:
        self.code = code
        self._sizes: list[int] = []
        self.results: dict[int, np.ndarray] = {}
        self.decoded = False

    def encode(self, batches: Sequence[Array]) -> list[np.ndarray]:
        """The ``n_workers`` coded batches; fewer than K batches are padded with zero batches."""
        stacked = _k_batches(batches, self.code.K, "a Berrut group")
        self._sizes = [len(np.asarray(b)) for b in batches]
        coded = self.code.encode(stacked)
        return [coded[i] for i in range(len(coded))]

    def arrive(self, worker: int, outputs: Array) -> None:
        if not self.decoded:
            self.results[worker] = np.asarray(outputs)

    def ready(self) -> bool:
        return not self.decoded and len(self.results) >= self.code.decode_at

    def decode(self) -> Decoded:
        """Every batch's outputs, from the fastest ``decode_at`` results (after locating
        errors); with the minimum number of workers that is the fewest that can decode."""
        detail = self.code.decode_detailed(self.results)
        self.decoded = True  # only once it succeeded: a failed decode waits for more results
        outputs = {s: _cut(detail.outputs[s], size) for s, size in enumerate(self._sizes)}
        return Decoded(outputs, "berrut", detail.suspected)


class SystematicGroup:
    """Systematic Berrut: the K batches go out unchanged (slots 0..K-1), S coded ones after."""

    def __init__(self, code: SystematicBerrut) -> None:
        self.code = code
        self._slots = _Slots()
        self.coded: dict[int, np.ndarray] = {}
        self._rows = 0

    def encode(self, batches: Sequence[Array]) -> list[np.ndarray]:
        """The S coded batches (the originals are sent as they are)."""
        stacked = _k_batches(batches, self.code.K, "a systematic group")
        for b in batches:
            self._slots.add(len(np.asarray(b)))
        self._rows = stacked.shape[1]
        both = self.code.encode(stacked)
        return [both[self.code.K + i] for i in range(self.code.S)]

    def arrive(self, slot: int, outputs: Array) -> None:
        self._slots.arrive(slot, outputs)

    def arrive_coded(self, i: int, outputs: Array) -> None:
        self.coded[i] = np.asarray(outputs)

    def missing(self) -> list[int]:
        return self._slots.missing()

    def ready(self) -> bool:
        """Some original is missing, and K results of any kind have arrived."""
        missing = self.missing()
        unfilled = self.code.K - len(self._slots.sizes)  # zero batches: known, output zero
        have = len(self._slots.outputs) + len(self.coded) + unfilled
        return bool(missing) and have >= self.code.K

    def decode(self) -> Decoded:
        slots = self._slots
        results: dict[int, Any] = {s: _padded(o, self._rows) for s, o in slots.outputs.items()}
        if not results and not self.coded:
            raise CodingError("no outputs have arrived to decode from")
        template = next(iter([*results.values(), *self.coded.values()]))
        for s in range(len(slots.sizes), self.code.K):
            results[s] = np.zeros_like(template)
        results.update({self.code.K + i: o for i, o in self.coded.items()})
        decoded = self.code.decode(results)
        outputs = {s: _cut(decoded[s], slots.sizes[s]) for s in self.missing()}
        for s in outputs:
            slots.settled.add(s)
        return Decoded(outputs, "systematic-berrut")

