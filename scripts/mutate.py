"""``make mutate``: plant known bugs one at a time in a scratch copy and see which the tests catch.

A mutant is one exact text replacement in one file of the package, chosen by hand to be a bug
a user would meet (not a random operator swap): the two that the whole suite passed when issue
44 planted them, and others of the same kind in core/scheduling, core/cache, core/admission,
core/coding and core/hams. Each runs in a scratch copy of the package and the tests (never in
the working tree), with only the unit tests nearest the module, so a run takes minutes and is
deterministic. A mutant is *killed* when those tests fail, *survived* when they pass; a
survivor the tests cannot see by design says why in its ``note``.

    python scripts/mutate.py              # every mutant; report in benchmarks/results/mutate
    python scripts/mutate.py --only cache-key-ignores-version --tests tests/unit/core/test_cache.py
    python scripts/mutate.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "mutate"
COPIED = ("parityserve", "tests", "benchmarks", "pyproject.toml")
PER_MUTANT_TIMEOUT_S = 300

_U = "tests/unit/"
SCHEDULING_TESTS = tuple(_U + f for f in (
    "core/scheduling/test_scheduler.py",
    "core/scheduling/test_scheduler_parallelism.py",
    "core/scheduling/test_scheduler_batch_isolation.py",
    "runtime/modelpath/test_dispatch.py",
    "runtime/modelpath/test_redundancy_dispatch.py",
    "core/scheduling/test_busy_hold.py",
))
CACHE_TESTS = tuple(_U + f for f in (
    "core/test_cache.py",
    "runtime/modelpath/test_dispatch.py",
    "runtime/serving/test_json_inputs.py",
    "runtime/serving/test_version_cache_and_slo.py",
))
ADMISSION_TESTS = tuple(_U + f for f in (
    "core/test_admission.py",
    "runtime/serving/test_system_overload.py",
    "runtime/serving/test_version_cache_and_slo.py",
))
CODING_TESTS = tuple(_U + f for f in (
    "core/coding/test_coding_berrut.py",
    "core/coding/test_coding_parity.py",
    "core/coding/test_coding_locator.py",
    "core/test_redundancy.py",
))
HAMS_TESTS = tuple(_U + f for f in (
    "core/hams/test_hams_core.py",
    "core/hams/test_hams_isolation.py",
    "runtime/graphs/test_hams_runtime_pieces.py",
    "core/hams/test_hams_history.py",
    "core/hams/test_hams_door.py",
))


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # the area reported (core/cache, ...)
    path: str  # the file changed, from the project root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]
    note: str = ""  # where the bug comes from, or why it is expected to survive


def _m(name: str, module: str, path: str, old: str, new: str, tests: tuple[str, ...],
       note: str = "") -> Mutant:
    return Mutant(name, module, "parityserve/" + path, old, new, tests, note)


_SCHED = "core/scheduling/machine.py"
_BERRUT = "core/coding/berrut.py"
_ADM = "core/admission.py"
_CACHE = "core/cache.py"
_DUR = "core/hams/durability.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- core/scheduling ---------------------------------------------------------------------
    _m("shared-work-never-requeued", "core/scheduling", _SCHED,
       "if later > entry.deadline:", "if later < entry.deadline:", SCHEDULING_TESTS),
    _m("aimd-never-learns", "core/scheduling", _SCHED,
       "replica.aimd.observe(rows, round_trip)", "replica.aimd.observe(rows, 0.0)",
       SCHEDULING_TESTS),
    _m("busy-hold-not-capped-by-slo", "core/scheduling", _SCHED,
       "hold = min(hold, self.slo_s * _BUSY_HOLD_SLO_SHARE)", "hold = hold", SCHEDULING_TESTS),
    _m("busy-replicas-pull", "core/scheduling", _SCHED,
       "            if not replica.idle:\n                continue",
       "            if not replica.idle and False:\n                continue", SCHEDULING_TESTS),
    _m("parallelism-limit-off-by-one", "core/scheduling", _SCHED,
       "if data and room is not None and room <= 0:",
       "if data and room is not None and room < 0:", SCHEDULING_TESTS),
    _m("one-estimate-for-every-replica", "core/scheduling", _SCHED,
       "replica.service = replica.service.observe(round_trip, rows)\n"
       "            self.service = admission.pooled(",
       "self.service = self.service.observe(round_trip, rows)\n"
       "            _ = (", SCHEDULING_TESTS),
    _m("doomed-queries-computed", "core/scheduling", _SCHED,
       "fits = admission.can_finish(self.service, now, entry.deadline)", "fits = True",
       SCHEDULING_TESTS),
    _m("timers-fire-late", "core/scheduling", _SCHED,
       "while timers and timers[0][0] <= now:", "while timers and timers[0][0] < now:",
       SCHEDULING_TESTS),
    _m("served-never-counted", "core/scheduling", _SCHED,
       "replica.served += 1", "replica.served += 0", SCHEDULING_TESTS),
    # ---- core/cache (and the model path's cache key) ----------------------------------------
    _m("cache-key-ignores-version", "core/cache", "runtime/modelpath/dispatch.py",
       "return cache_key(self.name, self.version, input_digest(item))",
       "return cache_key(self.name, 1, input_digest(item))", CACHE_TESTS,
       note="issue 44: the whole suite passed it (ModelPath._key); test_version_cache_and_slo "
       "and test_rollout_cache were added for it"),
    _m("clock-no-second-chance", "core/cache", _CACHE,
       "            if slot.referenced:\n                slot.referenced = False",
       "            if False:\n                slot.referenced = False", CACHE_TESTS),
    _m("hit-sets-no-reference-bit", "core/cache", _CACHE,
       "        slot.referenced = True\n        return slot.value",
       "        return slot.value", CACHE_TESTS),
    _m("put-keeps-the-old-entrys-bytes", "core/cache", _CACHE,
       "old = self._pop(key)", "old = self._ring.get(key)", CACHE_TESTS),
    _m("bytes-never-counted", "core/cache", _CACHE,
       "self._bytes += nbytes", "self._bytes += 0", CACHE_TESTS),
    _m("true-and-false-share-a-digest", "core/cache", _CACHE,
       '_feed_header(h, b"T" if x else b"F", 0)', '_feed_header(h, b"T", 0)', CACHE_TESTS,
       note="survived this script's first run; test_true_and_false_have_different_digests "
       "was added for it"),
    _m("array-digest-ignores-shape", "core/cache", _CACHE,
       'h.update(descr + struct.pack("<Q", a.ndim) + struct.pack(f"<{a.ndim}q", *a.shape))',
       "h.update(descr)", CACHE_TESTS),
    _m("dict-digest-depends-on-order", "core/cache", _CACHE,
       "key=lambda kv: kv[0])", "key=lambda kv: 0)", CACHE_TESTS),
    _m("evictions-never-counted", "core/cache", _CACHE,
       "                self._evictions += 1", "                pass", CACHE_TESTS),
    # ---- core/admission (and the SLO it is given) -------------------------------------------
    _m("admission-uses-loosest-slo", "core/admission", "runtime/serving/admin_ops.py",
       "return (min(slos) if slos else deployment.timeout_ms) / 1000",
       "return (max(slos) if slos else deployment.timeout_ms) / 1000", ADMISSION_TESTS,
       note="issue 44: the whole suite passed it (slo_for); test_version_cache_and_slo was "
       "added for it"),
    _m("bound-admits-one-too-few", "core/admission", _ADM,
       "if depth + count > bound:", "if depth + count >= bound:", ADMISSION_TESTS),
    _m("bound-ignores-batch-time", "core/admission", _ADM,
       "servable = (slo_s - estimate.batch_s) * c / estimate.per_query_s",
       "servable = slo_s * c / estimate.per_query_s", ADMISSION_TESTS),
    _m("unmeasured-bound-ignores-replicas", "core/admission", _ADM,
       "unmeasured = UNMEASURED_BATCHES * max_batch_size * c",
       "unmeasured = UNMEASURED_BATCHES * max_batch_size", ADMISSION_TESTS),
    _m("deadline-check-lenient", "core/admission", _ADM,
       "        if finish > deadline:", "        if finish > deadline + 1.0:", ADMISSION_TESTS),
    _m("retry-after-rounds-down", "core/admission", _ADM,
       "return float(max(1, math.ceil(_drain_s(estimate, depth, replicas))))",
       "return float(max(1, math.floor(_drain_s(estimate, depth, replicas))))", ADMISSION_TESTS),
    _m("can-finish-ignores-batch-time", "core/admission", _ADM,
       "return not estimate.measured or now + estimate.batch_s <= deadline",
       "return not estimate.measured or now <= deadline", ADMISSION_TESTS),
    _m("service-estimate-not-smoothed", "core/admission", _ADM,
       "return ServiceEstimate(self.batch_s + alpha * (batch_s - self.batch_s),",
       "return ServiceEstimate(batch_s,", ADMISSION_TESTS),
    _m("pooled-batch-time-is-the-stragglers", "core/admission", _ADM,
       "batch_s = sorted(e.batch_s for e in measured)[(len(measured) - 1) // 2]",
       "batch_s = max(e.batch_s for e in measured)", ADMISSION_TESTS),
    # ---- core/coding -------------------------------------------------------------------------
    _m("berrut-decodes-zeros", "core/coding", _BERRUT,
       "outputs=outputs.astype(result_dtype(results[w] for w in workers)),",
       "outputs=(0 * outputs).astype(result_dtype(results[w] for w in workers)),",
       CODING_TESTS, note="issue 44: passed 57% of the old accuracy cases"),
    _m("berrut-nodes-misindexed", "core/coding", _BERRUT,
       "self._beta[[workers[m] for m in keep]], values[keep], self._alpha",
       "self._beta[keep], values[keep], self._alpha", CODING_TESTS,
       note="issue 44: passed 99.5% of the old accuracy cases"),
    _m("berrut-weights-not-alternating", "core/coding", _BERRUT,
       "signs[np.argsort(nodes, kind=\"stable\")] = (-1.0) ** np.arange(len(nodes))",
       "signs[np.argsort(nodes, kind=\"stable\")] = 1.0", CODING_TESTS),
    _m("chebyshev-data-nodes-shifted", "core/coding", _BERRUT,
       "return np.cos((2.0 * j + 1.0) * np.pi / (2.0 * count))",
       "return np.cos((2.0 * j + 0.5) * np.pi / (2.0 * count))", CODING_TESTS),
    _m("systematic-originals-interpolated", "core/coding", _BERRUT,
       "                outputs[worker] = values[m]  # originals are exact, not interpolated",
       "                pass", CODING_TESTS),
    _m("systematic-rebuilds-zeros", "core/coding", _BERRUT,
       "            outputs = berrut_interpolate(self._nodes[workers], values, self._alpha)",
       "            outputs = 0 * berrut_interpolate(self._nodes[workers], values, self._alpha)",
       CODING_TESTS),
    _m("berrut-decodes-with-too-few", "core/coding", _BERRUT,
       "        if len(finite) < self.needed:", "        if len(finite) < self.needed - 1:",
       CODING_TESTS),
    _m("parity-subtracts-with-wrong-sign", "core/coding", "core/coding/parity.py",
       "fast = _combine([[1.0] + [-1.0] * len(keys)], arrays, len(arrays))",
       "fast = _combine([[1.0] + [1.0] * len(keys)], arrays, len(arrays))", CODING_TESTS),
    _m("parity-ignores-its-coefficient", "core/coding", "core/coding/parity.py",
       "            np.divide(out, c[lost], out=out, dtype=out.dtype)", "            pass",
       CODING_TESTS),
    _m("locator-excludes-the-best-fit", "core/coding", "core/coding/locator.py",
       'np.argsort(-votes, kind="stable")[:errors]', 'np.argsort(votes, kind="stable")[:errors]',
       CODING_TESTS),
    # ---- core/hams ---------------------------------------------------------------------------
    _m("reply-released-one-early", "core/hams", _DUR,
       "return all(self._durable[h.op] >= h.seq for h in lineage if h.op in self._durable)",
       "return all(self._durable[h.op] >= h.seq - 1 for h in lineage if h.op in self._durable)",
       HAMS_TESTS),
    _m("reply-held-one-too-long", "core/hams", _DUR,
       "return all(self._durable[h.op] >= h.seq for h in lineage if h.op in self._durable)",
       "return all(self._durable[h.op] > h.seq for h in lineage if h.op in self._durable)",
       HAMS_TESTS),
    _m("backup-applies-a-state-twice", "core/hams", _DUR,
       "return state.op == self.op and state.seq > newest",
       "return state.op == self.op and state.seq >= newest", HAMS_TESTS,
       note="rewritten when BackupApplier.fits replaced the test in receive (its old text was "
       "gone: tests/unit/test_mutate_script.py now fails on such a mutant)"),
    _m("watermark-moves-backwards", "core/hams", _DUR,
       "if op not in self._durable or seq <= self._durable[op]:",
       "if op not in self._durable:", HAMS_TESTS),
    _m("speculative-includes-the-bound", "core/hams", "core/hams/lineage.py",
       "return any(hop.op in bounds and hop.seq > bounds[hop.op] for hop in lineage)",
       "return any(hop.op in bounds and hop.seq >= bounds[hop.op] for hop in lineage)",
       HAMS_TESTS),
    _m("join-accepts-disagreeing-inputs", "core/hams", "core/hams/lineage.py",
       "if seen.setdefault(hop.op, hop.seq) != hop.seq:", "if False:", HAMS_TESTS),
    _m("failover-rolls-back-no-downstream", "core/hams", "core/hams/recovery.py",
       "if any(speculative(lin, bounds) for lin in executed.get(op, ())):", "if False:",
       HAMS_TESTS),
    _m("history-gap-unseen", "core/hams", "core/hams/history.py",
       "        if batch.first != expected:", "        if batch.first < expected:", HAMS_TESTS),
    _m("busy-streams-evicted", "core/hams", "core/hams/streams.py",
       "used[slot] + idle_s <= at", "used[slot] <= at", HAMS_TESTS),
)


@dataclass
class Outcome:
    name: str
    module: str
    path: str
    status: str  # killed | survived | timeout | baseline-failed
    seconds: float
    failed_test: str
    note: str


def _scratch() -> Path:
    """A copy of the package and its tests, outside the working tree."""
    scratch = Path(tempfile.mkdtemp(prefix="parityserve-mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, scratch / name, ignore=ignore)
        else:
            shutil.copy2(source, scratch / name)
    return scratch


def _pytest(scratch: Path, tests: tuple[str, ...]) -> tuple[int, str, float]:
    """Run ``tests`` against the scratch copy: (exit code, first failing test, seconds)."""
    # The copy comes first on the path (pytest's pythonpath=["."] is the copy too), before
    # the editable install's finder that points at the working tree.
    env = {**os.environ, "PYTHONPATH": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", *tests]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=PER_MUTANT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return -1, "", time.monotonic() - started
    failed = next((line.split(" ", 1)[1].split(" - ")[0] for line in done.stdout.splitlines()
                   if line.startswith(("FAILED ", "ERROR "))), "")
    return done.returncode, failed, time.monotonic() - started


def _plant(scratch: Path, mutant: Mutant) -> str:
    """Write the mutant into the copy; returns the original text to put back."""
    target = scratch / mutant.path
    text = target.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: {mutant.old!r} occurs {count} times in {mutant.path}")
    target.write_text(text.replace(mutant.old, mutant.new))
    return text


def run(mutants: list[Mutant], tests: tuple[str, ...] | None) -> list[Outcome]:
    scratch = _scratch()
    try:
        every = tuple(dict.fromkeys(t for m in mutants for t in (tests or m.tests)))
        code, failed, seconds = _pytest(scratch, every)
        if code != 0:
            raise SystemExit(f"the tests fail without any mutant ({failed}); fix that first")
        print(f"baseline: {len(every)} test files pass ({seconds:.0f} s)", flush=True)
        outcomes = []
        for mutant in mutants:
            original = _plant(scratch, mutant)
            try:
                code, failed, seconds = _pytest(scratch, tests or mutant.tests)
            finally:
                (scratch / mutant.path).write_text(original)
            status = "timeout" if code == -1 else "survived" if code == 0 else "killed"
            outcomes.append(Outcome(mutant.name, mutant.module, mutant.path, status, seconds,
                                    failed, mutant.note))
            print(f"{status:9} {mutant.module:16} {mutant.name:36} {seconds:5.1f} s  {failed}",
                  flush=True)
        return outcomes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _markdown(outcomes: list[Outcome], command: str, seconds: float) -> str:
    modules = list(dict.fromkeys(o.module for o in outcomes))
    lines = ["# Planted bugs (make mutate)", "",
             f"Command: `{command}`, {seconds:.0f} s on {platform.node() or 'this machine'} "
             f"({os.cpu_count()} cores, shared with other jobs; nothing here is timed).", "",
             "Each mutant is one bug planted in a scratch copy of the package; the unit tests "
             "nearest its module run against it. Killed: they fail.", "",
             "| module | killed | survived |", "|---|---|---|"]
    for module in modules:
        mine = [o for o in outcomes if o.module == module]
        killed = sum(o.status == "killed" for o in mine)
        lines.append(f"| {module} | {killed} | {len(mine) - killed} |")
    lines += ["", "Issue 44's four planted bugs that the suite caught are not recorded anywhere in "
              "the repository; the two it did not catch are here by name, with the two Berrut "
              "decoders its accuracy tolerances passed.",
              "", "| mutant | module | file | status | first failing test | note |",
              "|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.module} | {o.path} | {o.status} | "
                     f"{o.failed_test or '-'} | {o.note or ''} |")
    return "\n".join(lines) + "\n"


def _interpreter() -> str:
    """The Python that ran, relative to the project root when it lives there (the venv), so
    the committed report names no one's checkout."""
    executable = Path(sys.executable)
    return str(executable.relative_to(ROOT)) if executable.is_relative_to(ROOT) \
        else executable.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", help="run only this mutant (repeatable)")
    parser.add_argument("--tests", nargs="+", help="test files to run instead of each "
                        "mutant's own")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--out", type=Path, default=OUT, help="where the report goes (a full "
                        "run only)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.module:16} {m.name:36} {m.path}")
        return 0
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        parser.error(f"unknown mutant in {args.only}; see --list")
    started = time.monotonic()
    outcomes = run(chosen, tuple(args.tests) if args.tests else None)
    if args.only or args.tests:
        return 0 if all(o.status == "killed" for o in outcomes) else 1
    seconds = time.monotonic() - started
    command = "make mutate (python scripts/mutate.py)"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutate.json").write_text(json.dumps(
        {"command": command, "seconds": round(seconds, 1),
         "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    (args.out / "mutate.md").write_text(_markdown(outcomes, command, seconds))
    (args.out / "command.txt").write_text(
        f"{command}\n# run from the project root; {_interpreter()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
