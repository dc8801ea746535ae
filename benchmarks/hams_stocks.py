"""``benchmarks.hams`` on the README's ``stocks`` graph (issue 39): the normal-case overhead
of ``hams`` and ``remus`` against ``bare`` at 1, 8 and 64 rows per request, and the chaos
part (kill events of every kind under load, with a checker). The rules are pure, in
``benchmarks.hams_chaos``; this module moves requests and signals.

**Overhead** (``stocks``). One server per mode, the three side by side for the whole part
(idle ones cost only heartbeats), the graph exactly the README's. ``bare``'s saturation
per request size first (three closed-loop clients); then per repetition and request size,
the three modes in rotating order, each under the same open-loop Poisson load at half of
that saturation (requests of B rows on B streams of a pool of 256). Latency from each
request's intended send time; ratios to ``bare`` per repetition (paired).

**Chaos** (``chaos``). Per mode (``hams``, ``remus``): the graph, noise off, under
closed-loop clients each owning a few streams (a stream's next step leaves after its last
one's answer); a calm window first (no kills, two CPU hogs beside it: heartbeats that
stall there are false failovers); then events in a fixed random order, each once the
graph is whole again: a stateful primary; both primaries at once; a chain (a primary,
then the backup promoted in its place 20-300 ms later); a primary and its spare; a
backup; a stateless replica; a 1 s SIGSTOP of a primary or backup. Then every stream is
replayed (``hams_chaos.replay_streams``), every (operator, sequence) a client saw is
checked for a second output, and each event's longest reply gap is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import hams as h
from benchmarks.hams_analysis import ConsistencyOracle, latency_summary, overhead_rows
from benchmarks.hams_chaos import KINDS, Outcome, event_gaps, gap_table, replay_streams

__all__ = ["chaos", "stocks_config", "stocks_overhead"]

OPS = ("seq1", "seq2")
LSTM1 = {"input_size": 4, "outputs": 4, "seed": 1}
LSTM2 = {"input_size": 4, "outputs": 1, "seed": 2}
STREAM_POOL = 256
JSON = {"Content-Type": "application/json"}


def stocks_config(mode: str) -> dict[str, Any]:
    """The README's graph (docs/hams.md), as its YAML has it, in ``mode``."""
    return {"server": {"require_admin_token": False, "grpc_port": 0},
            "models": [{"name": "features", "source": "zoo:echo"},
                       {"name": "lstm1", "source": "zoo:stream-lstm", "options": LSTM1},
                       {"name": "lstm2", "source": "zoo:stream-lstm", "options": LSTM2},
                       {"name": "scorer", "source": "zoo:echo"}],
            "graphs": [{"name": "stocks", "stream_key": "ticker", "fault_tolerance": mode,
                        "input_shape": [4], "operators": [
                            {"name": "feat", "model": "features", "inputs": ["frontend"]},
                            {"name": "seq1", "model": "lstm1", "inputs": ["feat"],
                             "stateful": True},
                            {"name": "seq2", "model": "lstm2", "inputs": ["seq1"],
                             "stateful": True},
                            {"name": "score", "model": "scorer", "inputs": ["seq2"]}],
                        "output": "score"}]}


# ---- overhead ----------------------------------------------------------------------------
def _bodies(batch: int, rng: np.random.Generator, count: int = 32) -> list[bytes]:
    out = []
    for _ in range(count):
        streams = rng.choice(STREAM_POOL, batch, replace=False)
        out.append(orjson.dumps({"input_batch": rng.standard_normal((batch, 4)).astype(
            np.float32), "streams": [f"t{s}" for s in streams]},
            option=orjson.OPT_SERIALIZE_NUMPY))
    return out


def _open_loop(url: str, batch: int, rows_per_s: float, seconds: float, seed: int
               ) -> dict[str, Any]:
    from parityserve.bench.loadgen import json_open_loop, poisson_schedule

    rate = rows_per_s / batch
    rng = np.random.default_rng(seed)
    schedule = poisson_schedule(rate, max(int(rate * seconds), 50), rng)
    (result,) = json_open_loop(url, "/stocks/predict", _bodies(batch, rng), [schedule],
                               warmup=20)
    ok = result.latencies_s[result.ok]
    return {**latency_summary(ok.tolist(), int(ok.size) * batch, result.duration_s),
            "offered_rows_per_s": rows_per_s, "errors": int((~result.ok).sum())}


class _Closed:
    """Closed-loop clients posting pre-encoded stocks requests (for saturation)."""

    def __init__(self, url: str, batch: int, clients: int = 3) -> None:
        self.url, self.batch = url, batch
        self.bodies = _bodies(batch, np.random.default_rng(batch))
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(clients)]

    def _loop(self, seed: int) -> None:
        import httpx

        with httpx.Client(timeout=60) as client:
            i = seed
            while not self.stop.is_set():
                start = time.perf_counter()
                reply = client.post(f"{self.url}/stocks/predict",
                                    content=self.bodies[i % len(self.bodies)], headers=JSON)
                i += 1
                if reply.status_code == 200:
                    self.latencies.append(time.perf_counter() - start)

    def run(self, seconds: float) -> dict[str, Any]:
        for t in self.threads:
            t.start()
        time.sleep(min(1.0, seconds / 3))  # warm-up, discarded
        self.latencies.clear()
        start = time.perf_counter()
        time.sleep(seconds)
        wall, done = time.perf_counter() - start, list(self.latencies)
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return latency_summary(done, len(done) * self.batch, wall)


def stocks_overhead(args: argparse.Namespace, tmp: Path,
                    configs: Mapping[str, dict[str, Any]] | None = None, base: str = "bare",
                    label: str = "stocks") -> dict[str, Any]:
    """``configs`` (mode -> server config; the stocks graph in ``bare``, ``remus`` and
    ``hams`` unless given) side by side; ratios and the offered load are ``base``'s."""
    batches = [int(b) for b in args.stocks_batches.split(",")]
    seconds = args.stocks_seconds
    configs = configs or {mode: stocks_config(mode) for mode in h.MODES}
    modes = tuple(configs)
    servers = {mode: h.Server(config, tmp) for mode, config in configs.items()}
    try:
        for mode, server in servers.items():
            backed = configs[mode]["graphs"][0]["fault_tolerance"] != "bare"
            h._await_spare(server, OPS, need_backup=backed)
        saturation = {b: _Closed(servers[base].url, b).run(max(3.0, seconds / 2))["rows_per_s"]
                      for b in batches}
        print(f"{label}: {base} saturates at {saturation} rows/s", flush=True)
        cells: dict[str, dict[int, list[dict[str, Any]]]] = {
            m: {b: [] for b in batches} for m in modes}
        for rep in range(args.reps):
            for i, batch in enumerate(batches):
                turn = (rep + i) % len(modes)
                for mode in modes[turn:] + modes[:turn]:
                    cell = _open_loop(servers[mode].url, batch,
                                      h.LOAD_SHARE * saturation[batch], seconds,
                                      seed=rep * 1000 + batch)
                    cells[mode][batch].append(cell)
                    print(f"{label} rep {rep + 1} batch {batch} {mode}: mean "
                          f"{cell['mean_ms']:.2f} ms p99 {cell['p99_ms']:.2f} ms n {cell['n']}"
                          f" errors {cell['errors']}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    rows = overhead_rows(cells, base)
    for row in rows:
        row["errors"] = sum(c["errors"] for c in cells[row["mode"]][row["batch"]])
    return {f"{base}_saturation_rows_per_s": saturation, "load_share": h.LOAD_SHARE,
            "seconds": seconds, "rows": rows,
            "targets": _targets(rows, batches) if base == "bare" else {}}


def _targets(rows: list[dict[str, Any]], batches: list[int]) -> dict[str, bool]:
    """The issue's: hams <= 1.15x bare at 64 rows, and below remus at every size (paired)."""
    def paired(mode: str, batch: int) -> float:
        row = next(r for r in rows if r["mode"] == mode and r["batch"] == batch)
        return float(row.get("mean_vs_bare_paired", row.get("mean_vs_bare", np.nan)))

    out = {}
    if 64 in batches:
        out["hams <= 1.15x bare at 64 rows"] = paired("hams", 64) <= 1.15
    for b in batches:
        out[f"hams below remus at {b} rows"] = paired("hams", b) < paired("remus", b)
    return out


# ---- chaos -------------------------------------------------------------------------------
class _StreamClients:
    """Closed-loop clients, each owning ``per_client`` streams and sending each one's next
    step in every request (a request of ``per_client`` rows); every outcome is kept per
    stream, in order, and every success's time."""

    def __init__(self, url: str, clients: int, per_client: int, tag: str) -> None:
        self.url, self.per_client = url, per_client
        self.names = [[f"{tag}c{c}s{i}" for i in range(per_client)] for c in range(clients)]
        self.history: dict[str, list[Outcome]] = {s: [] for n in self.names for s in n}
        self.replied_at: list[float] = []
        self.oracle = ConsistencyOracle()
        self.lock = threading.Lock()
        self.sent = self.lost = 0
        self.error_kinds: Counter[str] = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(c,), daemon=True)
                        for c in range(clients)]

    def __enter__(self) -> _StreamClients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def _loop(self, c: int) -> None:
        import httpx

        rng = np.random.default_rng(c)
        names = self.names[c]
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                x = rng.standard_normal((len(names), 4)).astype(np.float32)
                body = orjson.dumps({"input_batch": x, "streams": names},
                                    option=orjson.OPT_SERIALIZE_NUMPY)
                self._record(names, x, self._post(client, body))

    def _post(self, client: Any, body: bytes) -> Any:
        import httpx

        try:
            reply = client.post(f"{self.url}/stocks/predict", content=body, headers=JSON)
        except httpx.HTTPError as exc:
            return f"no answer ({type(exc).__name__})"
        if reply.status_code != 200:
            return f"HTTP {reply.status_code}"
        return reply.json()

    def _record(self, names: list[str], x: np.ndarray, answer: Any) -> None:
        now = time.monotonic()
        with self.lock:
            self.sent += len(names)
            if isinstance(answer, str):
                self.error_kinds[answer] += len(names)
                lost = answer.startswith("no answer") or answer == "HTTP 504"
                self.lost += len(names) if lost else 0
                for name, row in zip(names, x, strict=True):
                    self.history[name].append(Outcome(tuple(map(float, row)), None, answer))
                return
            self.replied_at.append(now)
            for name, row, reply in zip(names, x, answer, strict=True):
                self.oracle.record(reply, OPS)
                self.history[name].append(Outcome(tuple(map(float, row)),
                                                  tuple(np.ravel(reply["output"]).tolist())))


def _lstm_step() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """One step of a stream through both LSTMs, from their (h, c), as the operators run."""
    import torch

    from parityserve.models.stateful import StreamLSTM

    first, second = StreamLSTM(**LSTM1), StreamLSTM(**LSTM2)  # type: ignore[arg-type]

    def step(state: tuple[Any, ...], x: Any) -> tuple[tuple[float, ...], tuple[Any, ...]]:
        h1, c1, h2, c2 = state
        with torch.no_grad():
            h1, c1 = first.cell(torch.tensor([x], dtype=torch.float32), (h1, c1))
            h2, c2 = second.cell(h1 @ first.w_out, (h2, c2))
            out = (h2 @ second.w_out).reshape(-1)
        return tuple(out.tolist()), (h1, c1, h2, c2)

    zeros = (torch.zeros(1, first.hidden), torch.zeros(1, first.hidden),
             torch.zeros(1, second.hidden), torch.zeros(1, second.hidden))
    return step, zeros


def _hog(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


@contextlib.contextmanager
def _hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU (what the rest of a test suite does to a
    2-core box)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_hog, args=(stop,), daemon=True) for _ in range(count)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(10)


class _Losses:
    """Every member loss the server recorded (its list keeps the last 100: read often)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], dict[str, Any]] = {}

    def read(self, graph: dict[str, Any]) -> None:
        for loss in graph.get("losses", []):
            self.seen.setdefault((loss["member"], loss["pid"]), loss)

    def timeouts(self, frozen: set[int]) -> list[dict[str, Any]]:
        """Members lost by silence that the benchmark did not freeze: false failovers."""
        return [loss for (_, pid), loss in self.seen.items()
                if loss["how"] == "timeout" and pid not in frozen]


def chaos(args: argparse.Namespace, tmp: Path, previous: dict[str, Any] | None,
          save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Per mode, resumable: a mode already in ``previous`` is kept."""
    result = dict(previous or {})
    per_mode = max(1, args.chaos_events // 2)
    for mode in ("hams", "remus"):
        if mode in result:  # finished before the run was stopped
            continue
        result[mode] = _chaos_mode(mode, per_mode, args, tmp)
        save(result)
    return result


def _schedule(count: int, seed: int) -> list[str]:
    """Event kinds in a fixed random order, each kind as often as the others (+-1)."""
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    random.Random(seed).shuffle(kinds)
    return kinds


def _chaos_mode(mode: str, count: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    started = time.monotonic()
    server = h.Server(stocks_config(mode), tmp)
    losses, frozen = _Losses(), set()
    events: list[dict[str, Any]] = []
    rng = random.Random(7)
    outages = 0
    clients = _StreamClients(server.url, args.chaos_clients, 4, tag=mode[0])
    try:
        _await_whole(server)
        with clients:
            calm = _calm(server, losses, args.calm_seconds, args.calm_hogs)
            for i, kind in enumerate(_schedule(count, seed=11)):
                try:
                    _await_whole(server)
                except SystemExit as exc:  # broken, or never whole again: an outage
                    outages += 1
                    if events:
                        events[-1]["outage"] = str(exc)
                    break
                losses.read(server.graph())
                time.sleep(rng.uniform(0.2, 0.8))
                event = _fire(server, kind, rng, frozen)
                events.append(event)
                try:  # seen, before "whole" means anything
                    _await_gone(server, event["pids"])
                except SystemExit as exc:  # a member that hangs and is never replaced
                    event["not_seen"] = str(exc)
                if (i + 1) % 10 == 0 or i + 1 == count:
                    print(f"chaos {mode}: {i + 1}/{count} events, {clients.sent} rows sent, "
                          f"{clients.lost} lost", flush=True)
            with contextlib.suppress(SystemExit):
                _await_whole(server)
            time.sleep(1.0)
        end = time.monotonic()
        graph = server.graph()
        losses.read(graph)
    finally:
        server.stop()
    for event, gap in zip(events, event_gaps(clients.replied_at, events, end), strict=True):
        event["gap_ms"] = gap
    step, start = _lstm_step()
    verdict = replay_streams(clients.history, step, start)
    print(f"chaos {mode}: replay {verdict.as_dict()}", flush=True)
    return {"events_done": len(events), "events": events, "gaps": gap_table(events),
            "clients": args.chaos_clients, "streams": len(clients.history),
            "sent": clients.sent, "lost": clients.lost,
            "error_kinds": dict(clients.error_kinds), "replay": verdict.as_dict(),
            "pairs": len(clients.oracle.seen), "conflicts": len(clients.oracle.conflicts),
            "conflict_examples": clients.oracle.conflicts[:5],
            "duplicates": clients.oracle.duplicates(),
            "outages": outages + (1 if graph.get("broken") else 0),
            "broken": graph.get("broken"), "failovers": len(graph["failovers"]),
            "losses": len(losses.seen), "false_timeouts": len(losses.timeouts(frozen)),
            "false_timeout_records": losses.timeouts(frozen),
            "calm": calm, "elapsed_s": time.monotonic() - started}


def _calm(server: h.Server, losses: _Losses, seconds: float, hogs: int) -> dict[str, Any]:
    """Load, no kills, ``hogs`` CPU spinners beside it: every member lost here is a false
    failover (a heartbeat that came late on a loaded box)."""
    before = set(losses.seen)
    failovers = len(server.graph()["failovers"])
    with _hogs(hogs):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            losses.read(server.graph())
            time.sleep(0.5)
    graph = server.graph()
    losses.read(graph)
    new = [loss for key, loss in losses.seen.items() if key not in before]
    return {"seconds": seconds, "hogs": hogs, "losses": len(new),
            "timeouts": sum(1 for loss in new if loss["how"] == "timeout"),
            "failovers": len(graph["failovers"]) - failovers, "records": new}


def _await_gone(server: h.Server, pids: list[int], timeout_s: float = 60) -> None:
    """Until no member or replica the server lists has one of ``pids``: right after a
    kill the graph still reads whole (the loss not seen yet), and the next event would
    then land inside this one's recovery."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = httpx.get(f"{server.url}/admin/state", timeout=10).json()
        listed = {r.get("pid") for m in state["models"] for r in m["replicas"]}
        for op in state["graphs"]["stocks"]["operators"].values():
            listed |= {op.get(f"{role}_pid") for role in ("primary", "backup", "spare")}
        if not listed & set(pids):
            return
        time.sleep(0.02)
    raise SystemExit(f"pids {pids} still listed {timeout_s:g} s after the event")


def _await_whole(server: h.Server, timeout_s: float = 60) -> None:
    h._await_spare(server, OPS, timeout_s=timeout_s)
    for model in ("features", "scorer"):
        h._await_replicas(server, model, 1, timeout_s)


def _fire(server: h.Server, kind: str, rng: random.Random, frozen: set[int]
          ) -> dict[str, Any]:
    """Send the event's signals; returns its record (``at``: the first signal)."""
    ops = server.graph()["operators"]
    op = rng.choice(OPS)
    pids = {role: ops[op][f"{role}_pid"] for role in ("primary", "backup", "spare")}
    event: dict[str, Any] = {"kind": kind, "op": op}
    if kind == "stateless replica":
        event["op"] = rng.choice(("features", "scorer"))
        pids["replica"] = h._replica_pid(server, event["op"])
    event["pids"] = {"primary": [pids["primary"]], "chain": [pids["primary"], pids["backup"]],
                     "both primaries": [ops["seq1"]["primary_pid"], ops["seq2"]["primary_pid"]],
                     "primary + spare": [pids["primary"], pids["spare"]],
                     "backup": [pids["backup"]], "stateless replica": [pids.get("replica")],
                     "SIGSTOP 1 s": []}[kind]
    event["at"] = time.monotonic()
    if kind == "primary":
        _kill(pids["primary"])
    elif kind == "both primaries":
        _kill(ops["seq1"]["primary_pid"], ops["seq2"]["primary_pid"])
        event["op"] = "seq1+seq2"
    elif kind == "chain":
        _kill(pids["primary"])
        event["delay_ms"] = delay = rng.uniform(20, 300)
        time.sleep(max(0.0, event["at"] + delay / 1e3 - time.monotonic()))
        _kill(pids["backup"])  # promoted by now, or being promoted
    elif kind == "primary + spare":
        _kill(pids["primary"], pids["spare"])
    elif kind == "backup":
        _kill(pids["backup"])
    elif kind == "stateless replica":
        _kill(pids["replica"])
    elif kind == "SIGSTOP 1 s":
        role = rng.choice(("primary", "backup"))
        event["op"] = f"{op} {role}"
        frozen.add(pids[role])
        event["pids"] = [pids[role]]  # fenced (killed) once declared lost
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[role], signal.SIGSTOP)
            time.sleep(1.0)
            os.kill(pids[role], signal.SIGCONT)
    return event


def _kill(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
