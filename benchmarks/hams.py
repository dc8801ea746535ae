"""HAMS on this machine: normal-case overhead, recovery after kill -9, and global consistency.

The service is the issue's (a): an MNIST MLP fine-tuned online on every labelled request
(``zoo:online-mlp``, with injected non-determinism), between a stateless feature operator and
a stateless aggregator (``zoo:echo``, on the ordinary model path). Each mode runs in its own
``parityserve start`` process; the load generator is this process (pre-encoded requests;
an asyncio open loop or closed-loop threads), on the same 2 cores.

* **overhead** (H13): ``bare``'s saturation throughput per batch size first; then for every
  repetition and batch size, modes ``bare``, ``remus``, ``hams`` in rotating order, each in
  a server whose graph forms batches of exactly B rows (one request = one batch): latency
  (mean, p50, p99, p99.9) under open-loop Poisson arrivals at half of ``bare``'s saturation
  rate, and throughput at saturation from three closed-loop clients; ratios to ``bare`` at
  the same batch size.
* **recovery**: under a steady closed loop, SIGKILL the learner's primary, read the
  frontend's failover record, split into detection / protocol / handover (H13), once with
  exit-based and once with timeout-based detection (H7), several kills each.
* **stocks** and **chaos** (issue 39): the same overhead on the README's ``stocks`` graph
  (two per-stream LSTMs) at 1, 8 and 64 rows per request, and kill events of every kind on
  it under load, with a checker (``benchmarks.hams_stocks``).
* **consistency**: random SIGKILLs of primaries and backups under load with noise on;
  every (operator, seq -> output) a client saw is checked for a second value, and every
  request for exactly one reply (the sequence service). Then the online learner with
  ``audit`` on, under random kills too: its final state, on the primary and the backup,
  is checked against an offline replay of the durable history the replies describe
  (``benchmarks.hams_history``).

Results (JSON, markdown, plot, the command) go to ``--results-dir``; a stopped run resumes
(finished parts are kept in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/hams.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import yaml  # noqa: E402

from benchmarks import _cli  # noqa: E402
from benchmarks.frontend_cases import ROOT, default_data_dir  # noqa: E402
from benchmarks.frontend_wrk import _stop, _wait_listening  # noqa: E402
from benchmarks.hams_analysis import (  # noqa: E402
    ConsistencyOracle,
    latency_summary,
    median_and_max,
    overhead_of,
    overhead_rows,
    recovery_phases,
    render_markdown,
)
from benchmarks.hams_history import AuditedHistory, replay_check  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402

__all__ = ["build_parser", "main"]

DESCRIPTION = __doc__.split("\n\n")[0]
MODES = ("bare", "remus", "hams")
PART_NAMES = ("stocks", "chaos", "overhead", "recovery", "correlated", "consistency",
              "timeline")
# the full run (<= 60 min here): the parts; the online MLP's overhead, the
# correlated cases and the random-kill consistency run are asked for with --parts
DEFAULT_PARTS = ("stocks", "chaos", "recovery", "timeline")
Data = tuple[np.ndarray, np.ndarray]  # images, labels
OnReply = Callable[[dict[str, Any], dict[str, Any], int], None]  # answer, request body, row
EXAMPLES = (
    ("python -m benchmarks.hams --data-dir ../shared/data",
     "full run (under an hour): the stocks graph's overhead (3 reps x 1/8/64 rows x 3 "
     "modes), 200 chaos events (hams and remus), 10+10 kills, the timeline"),
    ("python -m benchmarks.hams --quick", "check the harness in under 10 minutes"),
    ("python -m benchmarks.hams --parts overhead,correlated,consistency",
     "the online MLP's overhead, the correlated cases, 1,000 random kills"),
    ("python -m benchmarks.hams --parts recovery --resume", "redo one part, keep the rest"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="short run (minutes)")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma list of {', '.join(PART_NAMES)}")
    p.add_argument("--batches", default="1,8,32,64", help="batch sizes for the overhead")
    p.add_argument("--seconds", type=float,
                   help="open-loop seconds per cell (6; quick 3); saturation runs 0.6x that")
    p.add_argument("--reps", type=int, help="repetitions of the overhead (3; quick 1)")
    p.add_argument("--kills", type=int, help="kills per detection mode (10; quick 3)")
    p.add_argument("--random-kills", type=int, help="consistency kills (1000; quick 20)")
    p.add_argument("--replay-kills", type=int,
                   help="kills before the replay check (a twentieth of --random-kills, >= 3)")
    p.add_argument("--stocks-batches", default="1,8,64",
                   help="rows per request on the stocks graph")
    p.add_argument("--stocks-seconds", type=float,
                   help="open-loop seconds per stocks cell (20; quick 3)")
    p.add_argument("--chaos-events", type=int,
                   help="kill events, half per mode (200; quick 14)")
    p.add_argument("--chaos-clients", type=int, default=3,
                   help="closed-loop clients of 4 streams each under the chaos")
    p.add_argument("--calm-seconds", type=float,
                   help="chaos load without kills first, beside CPU hogs (60; quick 10)")
    p.add_argument("--calm-hogs", type=int, default=2, help="CPU hogs in the calm window")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="shared data (MNIST test images; random images without it)")
    p.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks/results/hams")
    p.add_argument("--resume", action="store_true", help="keep parts already in the JSON")
    p.add_argument("--redo", default="", help="with --resume: measure these parts again")
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("hams", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


# ---- the service -----------------------------------------------------------------------
def service_config(mode: str, detection: str = "exit", noise: float = 1e-4,
                   max_batch: int = 64, audit: bool = False) -> dict[str, Any]:
    return {"server": {"require_admin_token": False, "grpc_port": 0},
            "models": [{"name": "features", "source": "zoo:echo", "replicas": 1},
                       {"name": "learner", "source": "zoo:online-mlp",
                        "options": {"noise": noise, "seed": 7, "audit": audit}},
                       {"name": "aggregate", "source": "zoo:echo", "replicas": 1}],
            "graphs": [{"name": "online", "fault_tolerance": mode, "detection": detection,
                        "max_batch": max_batch, "heartbeat_timeout_ms": 200,
                        "operators": [
                            {"name": "feat", "model": "features", "inputs": ["frontend"]},
                            {"name": "learner", "model": "learner", "inputs": ["feat"],
                             "stateful": True},
                            {"name": "agg", "model": "aggregate", "inputs": ["learner"]}],
                        "output": "agg"}]}


# The load generators here stand for many clients, and all of them send from 127.0.0.1:
# the per-address share of a graph (``server.limits.max_graph_requests_per_address``, 8 by
# default, and its ``_shared`` twin, 2, should anything ask from another address) would hold
# their own concurrency at the door, and a run would measure that wait (longer for the
# slower modes) instead of the graph. The soak keeps the defaults: there they are under test.
LOADGEN_SHARE = 1_000_000


def _as_many_clients(config: dict[str, Any]) -> dict[str, Any]:
    server = dict(config.get("server", {}))
    server["limits"] = {"max_graph_requests_per_address": LOADGEN_SHARE,
                        "max_graph_requests_per_address_shared": LOADGEN_SHARE,
                        **server.get("limits", {})}
    return {**config, "server": server}


class Server:
    """``parityserve start`` on one mode's config, in its own process group."""

    def __init__(self, config: dict[str, Any], folder: Path) -> None:
        config = _as_many_clients(config)
        self.port = free_port()
        self.name = config["graphs"][0]["name"]
        path = folder / f"hams-{self.port}.yaml"
        path.write_text(yaml.safe_dump(config))
        # the members' own stderr (a Ray member's would go to Ray's session folder, deleted
        # with the cluster): their stall reports say why the frontend suspected one
        cmd = [sys.executable, "-m", "parityserve.cli", "start", "-c", str(path),
               "--port", str(self.port), "--log-dir", str(folder / f"workers-{self.port}")]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=(folder / f"hams-{self.port}.log").open("wb"),
                                     start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        _wait_listening(self.port, f"{self.url}/v2/health/ready", self.proc)

    def graph(self) -> dict[str, Any]:
        import httpx

        state = httpx.get(f"{self.url}/admin/state", timeout=10).json()
        return dict(state["graphs"][self.name])

    def stop(self) -> None:
        _stop(self.proc)


def images(data_dir: Path | None, count: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """MNIST test images and their labels (the online learner's feedback), or random
    images with random labels when the shared data is not there."""
    from parityserve.errors import DataError
    from parityserve.models.datasets import load_mnist

    try:
        x, y = load_mnist("test", data_dir=data_dir)
        return x[:count], y[:count]
    except (DataError, OSError):
        rng = np.random.default_rng(0)
        return rng.random((count, 784), dtype=np.float32), rng.integers(0, 10, count)


JSON_HEADERS = {"Content-Type": "application/json"}


class Load:
    """Closed-loop clients, each sending requests of ``batch`` labelled rows."""

    def __init__(self, url: str, data: Data, batch: int, clients: int,
                 on_reply: OnReply | None = None) -> None:
        self.url, self.batch, self.clients = url, batch, clients
        self.xs, self.ys = data
        self.on_reply = on_reply
        self.latencies: list[float] = []
        self.sent_at: list[float] = []  # CLOCK_MONOTONIC, comparable with a kill's time
        self.sent = self.errors = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    route = "online"

    @functools.cached_property
    def bodies(self) -> list[tuple[dict[str, Any], bytes]]:
        raw = _encoded_bodies((self.xs, self.ys), self.batch, np.random.default_rng(self.batch))
        return [(orjson.loads(b), b) for b in raw]

    def body(self, rng: np.random.Generator, _client: int) -> tuple[dict[str, Any], bytes]:
        """The request (for ``on_reply``) and its JSON, encoded once."""
        return self.bodies[int(rng.integers(len(self.bodies)))]

    def _loop(self, seed: int) -> None:
        import httpx

        rng = np.random.default_rng(seed)
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                body, raw = self.body(rng, seed)
                start = time.perf_counter()
                self.sent += self.batch
                try:
                    reply = client.post(f"{self.url}/{self.route}/predict", content=raw,
                                        headers=JSON_HEADERS)
                    reply.raise_for_status()
                except httpx.HTTPError:
                    self.errors += self.batch
                    continue
                self.latencies.append(time.perf_counter() - start)
                self.sent_at.append(time.monotonic() - (time.perf_counter() - start))
                if self.on_reply is not None:
                    for i, answer in enumerate(reply.json()):
                        self.on_reply(answer, body, i)


class StreamLoad(Load):
    """The sequence service: each client owns ``batch`` streams and sends each one's next
    step in every request, so every stream's steps arrive in order."""

    route = "stocks"

    def body(self, rng: np.random.Generator, client: int) -> tuple[dict[str, Any], bytes]:
        steps = rng.standard_normal((self.batch, 4)).astype(np.float32)
        body = {"input_batch": steps.tolist(),
                "streams": [f"c{client}-{i}" for i in range(self.batch)]}
        return body, orjson.dumps(body)


def sequence_config(mode: str, noise: float) -> dict[str, Any]:
    """Service (b): features -> two adjacent per-stream LSTMs -> scorer."""
    lstm = {"input_size": 4, "hidden": 32, "noise": noise}
    return {"server": {"require_admin_token": False, "grpc_port": 0},
            "models": [{"name": "features", "source": "zoo:echo", "replicas": 2},
                       {"name": "lstm1", "source": "zoo:stream-lstm",
                        "options": {**lstm, "outputs": 4, "seed": 1}},
                       {"name": "lstm2", "source": "zoo:stream-lstm",
                        "options": {**lstm, "outputs": 1, "seed": 2}},
                       {"name": "scorer", "source": "zoo:echo", "replicas": 1}],
            "graphs": [{"name": "stocks", "fault_tolerance": mode, "max_batch": 64,
                        "checkpoint_every": 150, "operators": [
                            {"name": "feat", "model": "features", "inputs": ["frontend"]},
                            {"name": "seq1", "model": "lstm1", "inputs": ["feat"],
                             "stateful": True},
                            {"name": "seq2", "model": "lstm2", "inputs": ["seq1"],
                             "stateful": True},
                            {"name": "score", "model": "scorer", "inputs": ["seq2"]}],
                        "output": "score"}]}


# ---- the parts -----------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    quick = args.quick
    args.seconds = args.seconds or (3.0 if quick else 6.0)
    args.reps = args.reps or (1 if quick else 3)
    args.kills = args.kills or (3 if quick else 10)
    args.random_kills = args.random_kills or (20 if quick else 1000)
    args.stocks_seconds = args.stocks_seconds or (3.0 if quick else 20.0)
    args.chaos_events = args.chaos_events or (14 if quick else 200)
    args.calm_seconds = args.calm_seconds or (10.0 if quick else 60.0)
    out: Path = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "hams-quick" if quick else "hams"
    json_path = out / f"{stem}.json"
    state: dict[str, Any] = json.loads(json_path.read_text()) if args.resume and \
        json_path.exists() else {}
    if "command" in state and _command(args) != state["command"]:  # a resumed part
        state.setdefault("more_commands", []).append(_command(args))
    else:
        state["command"] = _command(args)
    state.update(machine=_machine(), title="quick" if quick else "full run")
    data = images(args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
            if part in state and args.resume and part not in args.redo.split(","):
                continue
            started = time.monotonic()
            args.previous = state.get(part)  # a part that resumes inside itself (chaos)
            args.save = functools.partial(_save_part, out, stem, state, part)
            state[part] = PARTS[part](args, data, Path(tmp))
            state.setdefault("elapsed_s", {})[part] = round(time.monotonic() - started, 1)
            _write(out, stem, state)
    _write(out, stem, state)
    print(render_markdown(state))
    return 0


def overhead(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    """H13: first ``bare``'s saturation throughput per batch size (three closed-loop
    clients); then, per repetition and batch size, every mode in rotating order, each in a
    server whose graph forms batches of exactly B: latency under open-loop Poisson arrivals
    at half of ``bare``'s saturation rate (the same offered load for every mode), and its
    own throughput at saturation."""
    batches = [int(b) for b in args.batches.split(",")]
    saturation = {}
    for batch in batches:
        server = _settled(Server(service_config("bare", max_batch=batch), tmp), "bare")
        try:
            saturation[batch] = _saturated(server.url, data, batch, args.seconds)["rows_per_s"]
        finally:
            server.stop()
        print(f"overhead: bare saturates at {saturation[batch]:.0f} rows/s with batch {batch}",
              flush=True)
    cells: dict[str, dict[int, list[dict[str, Any]]]] = {m: {b: [] for b in batches}
                                                         for m in MODES}
    for rep in range(args.reps):
        for i, batch in enumerate(batches):
            turn = (rep + i) % len(MODES)  # rotate: no mode always goes first
            for mode in MODES[turn:] + MODES[:turn]:
                server = _settled(Server(service_config(mode, max_batch=batch), tmp), mode)
                try:
                    cell = _cell(server.url, data, batch, LOAD_SHARE * saturation[batch],
                                 args.seconds, seed=rep * 1000 + batch)
                finally:
                    server.stop()
                cells[mode][batch].append(cell)
                print(f"overhead rep {rep + 1} batch {batch} {mode}: mean {cell['mean_ms']:.2f}"
                      f" ms, p99 {cell['p99_ms']:.2f} ms at {cell['offered_rows_per_s']:.0f} "
                      f"rows/s offered; saturates at {cell['rows_per_s']:.0f}", flush=True)
    return {"bare_saturation_rows_per_s": saturation, "load_share": LOAD_SHARE,
            "rows": overhead_rows(cells)}


def _settled(server: Server, mode: str) -> Server:
    """Measure only once the graph is whole: a backup and a spare still loading torch in
    the background would take the cores from the mode being measured."""
    try:
        _await_spare(server, need_backup=mode != "bare")
    except BaseException:
        server.stop()
        raise
    time.sleep(1.0)
    return server


LOAD_SHARE = 0.5  # H13: latency at about half of bare's saturation throughput
MIN_REQUESTS_PER_S = 30  # batch 64 offers ~30 requests/s: keep p99 above one sample


def _cell(url: str, data: Data, batch: int, rows_per_s: float, seconds: float, seed: int
          ) -> dict[str, Any]:
    summary = _open_loop(url, data, batch, rows_per_s, seconds, seed)
    saturated = _saturated(url, data, batch, seconds * 0.6)
    summary["rows_per_s"] = saturated["rows_per_s"]
    summary["saturated_p99_ms"] = saturated.get("p99_ms")
    return summary


def _open_loop(url: str, data: Data, batch: int, rows_per_s: float, seconds: float,
               seed: int) -> dict[str, Any]:
    """Poisson arrivals of requests of ``batch`` rows; latency from each request's intended
    send time, so a queue that builds up is counted (no coordinated omission)."""
    from parityserve.bench.loadgen import json_open_loop, poisson_schedule

    rate = rows_per_s / batch
    rng = np.random.default_rng(seed)
    schedule = poisson_schedule(rate, int(max(rate, MIN_REQUESTS_PER_S) * seconds), rng)
    (result,) = json_open_loop(url, "/online/predict", _encoded_bodies(data, batch, rng),
                               [schedule], warmup=20)
    ok = result.latencies_s[result.ok]
    summary = latency_summary(ok.tolist(), int(ok.size) * batch, result.duration_s)
    lag = result.send_lag_s
    return {**summary, "offered_rows_per_s": rows_per_s, "errors": int((~result.ok).sum()),
            "send_lag_p99_ms": float(np.percentile(lag, 99) * 1e3) if lag.size else None}


def _encoded_bodies(data: Data, batch: int, rng: np.random.Generator, count: int = 32
                    ) -> list[bytes]:
    """Labelled requests, serialised once: the load generator shares the 2 cores, so it
    should not spend them re-encoding JSON for every request."""
    xs, ys = data
    rows = [rng.integers(0, len(xs), batch) for _ in range(count)]
    return [orjson.dumps({"input_batch": np.ascontiguousarray(xs[r]), "labels": ys[r]},
                         option=orjson.OPT_SERIALIZE_NUMPY) for r in rows]


def _saturated(url: str, data: Data, batch: int, seconds: float) -> dict[str, Any]:
    """Throughput with three closed-loop clients (after a short warm-up)."""
    with Load(url, data, batch, clients=3):  # warm-up, discarded
        time.sleep(min(1.0, seconds / 3))
    return _timed(Load(url, data, batch, clients=3), seconds)


def _timed(load: Load, seconds: float) -> dict[str, Any]:
    start = time.perf_counter()
    with load:
        time.sleep(seconds)
    wall = time.perf_counter() - start
    return latency_summary(load.latencies, len(load.latencies) * load.batch, wall)


def recovery(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    results = {}
    for name, mode, detection in (("hams, exit-based detection", "hams", "exit"),
                                  ("hams, timeout-based detection (200 ms)", "hams", "timeout"),
                                  ("remus, exit-based detection", "remus", "exit"),
                                  ("checkpoint-replay (every 150 batches, killed 50 after "
                                   "one), exit-based detection", "checkpoint-replay", "exit")):
        server = Server(service_config(mode, detection), tmp)
        try:
            phases = [_one_kill(server, data, mode) for _ in range(args.kills)]
        finally:
            server.stop()
        results[name] = median_and_max(phases, ("detection_ms", "protocol_ms",
                                                 "handover_ms", "total_ms"))
        print(f"recovery {name}: {results[name]['median']}", flush=True)
    return results


def _one_kill(server: Server, data: Data, mode: str) -> dict[str, float | None]:
    _await_spare(server, need_backup=mode in ("hams", "remus"))
    with Load(server.url, data, batch=8, clients=2):
        time.sleep(1.0)
        if mode == "checkpoint-replay":
            _await_batches(server, "learner", 50)
        before = server.graph()
        killed_at = time.monotonic()  # CLOCK_MONOTONIC: the frontend's clock too
        os.kill(before["operators"]["learner"]["primary_pid"], signal.SIGKILL)
        time.sleep(1.5)
    failovers = server.graph()["failovers"]
    if len(failovers) <= len(before["failovers"]):
        raise SystemExit("the kill produced no failover record")
    return recovery_phases(killed_at, failovers[-1])


def _await_spare(server: Server, ops: tuple[str, ...] = ("learner",),
                 need_backup: bool = True, timeout_s: float = 60) -> None:
    """The next kill waits until every operator is whole again: a synced backup and a
    spare (HAMS's failure model: one failure per stateful operator at a time), or, with no
    backups, a primary that said hello."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        graph = server.graph()
        if graph["broken"]:
            raise SystemExit(f"the graph broke: {graph['broken']}")
        if not graph["recovering"] and all(_whole(graph["operators"][op], need_backup)
                                           for op in ops):
            time.sleep(0.3)  # the spare's model loads after its process starts
            return
        time.sleep(0.1)
    raise SystemExit("no backup and spare after a kill")


def _whole(op: dict[str, Any], need_backup: bool) -> bool:
    if not op.get("whole", True):  # the server knows of a loss it is still recovering from
        return False
    if not need_backup:
        return bool(op.get("primary_pid")) and _alive(op["primary_pid"])
    return bool(op.get("backup_synced") and op.get("spare_pid") and _alive(op["backup_pid"])
                and _alive(op["spare_pid"]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def consistency(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    """HAMS on the sequence service under random kills of primaries and backups of both
    LSTMs, noise on: every (operator, seq) a client saw is checked for a second value.
    Then checkpoint-replay on the same service under primary kills: how many replayed
    outputs differ from the ones clients already had. Last, the audited online learner
    under random kills, per mode: does its final state equal a replay of the durable
    history (``replay``)?"""
    result = _random_kills("hams", args.random_kills, ("primary", "backup"), tmp,
                           _sequence_service("hams"))
    result["checkpoint-replay"] = _random_kills(
        "checkpoint-replay", max(3, args.random_kills // 20), ("primary",), tmp,
        _sequence_service("checkpoint-replay"))
    kills = args.replay_kills or max(3, args.random_kills // 20)
    result["replay"] = {
        "hams": _random_kills("hams", kills, ("primary", "backup"), tmp,
                              _online_service("hams", data)),
        "checkpoint-replay": _random_kills("checkpoint-replay", max(3, kills // 2),
                                           ("primary",), tmp,
                                           _online_service("checkpoint-replay", data))}
    return result


@dataclass
class _Service:
    """What a random-kill run serves: its config, its stateful operators, its load, and for
    the audited learner the history its replies describe (for the replay check)."""

    config: dict[str, Any]
    ops: tuple[str, ...]
    load: Callable[[str, OnReply], Load]
    history: AuditedHistory | None = None


def _sequence_service(mode: str) -> _Service:
    return _Service(sequence_config(mode, noise=1e-3), ("seq1", "seq2"),
                    lambda url, rec: StreamLoad(url, ((), ()), batch=4, clients=2,
                                                on_reply=rec))


def _online_service(mode: str, data: Data) -> _Service:
    return _Service(service_config(mode, noise=1e-3, audit=True), ("learner",),
                    lambda url, rec: Load(url, data, batch=8, clients=2, on_reply=rec),
                    AuditedHistory("learner"))


def _random_kills(mode: str, kills: int, roles: tuple[str, ...], tmp: Path,
                  service: _Service) -> dict[str, Any]:
    oracle = ConsistencyOracle()
    lock = threading.Lock()
    by_role = {f"{op} {role}": 0 for op in service.ops for role in roles}
    server = Server(service.config, tmp)
    rng = random.Random(11)

    def record(reply: dict[str, Any], body: dict[str, Any], row: int) -> None:
        with lock:
            oracle.record(reply, service.ops)
            if service.history is not None:
                service.history.record(reply, body["input_batch"][row], body["labels"][row])

    try:
        with service.load(server.url, record) as load:
            for i in range(kills):
                op = _whole_op(server, rng, service.ops, need_backup=mode == "hams")
                role = rng.choice(roles)
                if mode != "hams":
                    _await_batches(server, op, rng.randint(5, 60))
                pid = server.graph()["operators"][op][f"{role}_pid"]
                with contextlib.suppress(ProcessLookupError):  # replaced meanwhile
                    os.kill(pid, signal.SIGKILL)
                    by_role[f"{op} {role}"] += 1
                time.sleep(rng.uniform(0.02, 0.2))
                if (i + 1) % 10 == 0:
                    print(f"consistency {mode}: {i + 1} kills, {len(oracle.conflicts)} "
                          "conflicts", flush=True)
            time.sleep(1.0)
        graph = server.graph()
        replay = _replay(server, service, mode) if service.history is not None else {}
    finally:
        server.stop()
    return {"mode": mode, "kills": sum(by_role.values()), "by_role": by_role,
            "sent": load.sent, "answered": sum(oracle.answered.values()),
            "lost": load.errors, "duplicates": oracle.duplicates(), "pairs": len(oracle.seen),
            "conflicts": len(oracle.conflicts), "conflict_examples": oracle.conflicts[:5],
            "replay_conflicts": graph["replay_conflicts"], "broken": graph["broken"],
            "failovers": len(graph["failovers"]), **replay}


def _replay(server: Server, service: _Service, mode: str) -> dict[str, Any]:
    """The replay check, once the load stopped and every operator is whole again (a new
    backup holds the primary's full state)."""
    import httpx

    assert service.history is not None
    _await_spare(server, service.ops, need_backup=mode == "hams")
    digests = httpx.get(f"{server.url}/admin/graphs/{server.name}/digests", timeout=60)
    learner = next(m for m in service.config["models"] if m["name"] == "learner")
    result = replay_check(service.history, learner["source"], learner["options"],
                          digests.raise_for_status().json())
    print(f"replay check {mode}: {result['final_state_matches_replay']} {result['why']}",
          flush=True)
    return {k: result.get(k) for k in ("final_state_matches_replay", "why",
                                       "backup_matches_primary", "batches", "requests")}


def correlated(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    """Recovery on the sequence service (two adjacent stateful LSTMs) for the paper's other
    cases: one primary; both adjacent primaries at once; a stateless replica (its warm
    standby takes over) with a stateful primary; and Fig. 6 (seq1's state delivery delayed
    by 300 ms, then seq1's primary and seq2's backup killed together). Each: the total from
    the kill to the last failover's first committed reply, and the longest reply a client
    waited for around the kill against the median before it."""
    del data
    server = Server(sequence_config("hams", noise=0.0), tmp)
    cases: dict[str, Callable[[Server], list[int]]] = {
        "one stateful primary (seq1)": lambda s: [_pid(s, "seq1", "primary")],
        "adjacent primaries (seq1 + seq2)": lambda s: [_pid(s, "seq1", "primary"),
                                                       _pid(s, "seq2", "primary")],
        "stateless replica + stateful primary (feat + seq2)":
            lambda s: [_replica_pid(s, "features"), _pid(s, "seq2", "primary")],
        "stateless replica alone (feat; its warm standby)":
            lambda s: [_replica_pid(s, "features")],
        "Fig. 6: seq1 delayed, seq1 primary + seq2 backup": _fig6,
    }
    results = {}
    try:
        for name, victims in cases.items():
            runs = [_correlated_kill(server, victims) for _ in range(args.kills)]
            results[name] = median_and_max(runs, ("total_ms", "failovers", "normal_p50_ms",
                                                  "worst_reply_ms"))
            print(f"correlated {name}: {results[name]['median']}", flush=True)
    finally:
        server.stop()
    return results


def _correlated_kill(server: Server, victims: Callable[[Server], list[int]]
                     ) -> dict[str, float | None]:
    _await_spare(server, ("seq1", "seq2"))
    _await_replicas(server, "features", 2)
    load = StreamLoad(server.url, ((), ()), batch=4, clients=2)
    with load:
        time.sleep(1.0)
        before_n, failovers = len(load.latencies), len(server.graph()["failovers"])
        pids = victims(server)
        killed_at = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(2.0)
    _clear_faults(server)
    records = server.graph()["failovers"][failovers:]
    firsts = [r["first_reply_at"] for r in records if r.get("first_reply_at")]
    return {"total_ms": (max(firsts) - killed_at) * 1e3 if firsts else None,
            "failovers": float(len(records)),
            "normal_p50_ms": float(np.median(load.latencies[:before_n])) * 1e3,
            "worst_reply_ms": max(load.latencies[before_n:]) * 1e3}


def _pid(server: Server, op: str, role: str) -> int:
    return int(server.graph()["operators"][op][f"{role}_pid"])


def _replica_pid(server: Server, model: str) -> int:
    import httpx

    models = httpx.get(f"{server.url}/admin/state", timeout=10).json()["models"]
    replicas = next(m for m in models if m["name"] == model)["replicas"]
    return int(next(r["pid"] for r in replicas if r.get("pid")))


def _await_replicas(server: Server, model: str, count: int, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = httpx.get(f"{server.url}/admin/state", timeout=10).json()["models"]
        replicas = next(m for m in models if m["name"] == model)["replicas"]
        if sum(1 for r in replicas if r.get("state") == "ready") >= count:
            return
        time.sleep(0.1)
    raise SystemExit(f"{model}: fewer than {count} live replicas after a kill")


def _fig6(server: Server) -> list[int]:
    import httpx

    httpx.post(f"{server.url}/admin/graphs/{server.name}/faults", timeout=10,
               json={"operator": "seq1", "state_delay_ms": 300}).raise_for_status()
    time.sleep(0.5)  # seq2 runs ahead on seq1's undurable outputs
    return [_pid(server, "seq1", "primary"), _pid(server, "seq2", "backup")]


def _clear_faults(server: Server) -> None:
    import httpx

    for op in ("seq1", "seq2"):
        httpx.post(f"{server.url}/admin/graphs/{server.name}/faults", timeout=10,
                   json={"operator": op, "state_delay_ms": 0}).raise_for_status()


def _whole_op(server: Server, rng: random.Random, ops: tuple[str, ...], need_backup: bool,
              timeout_s: float = 60) -> str:
    """A stateful operator that may fail now (HAMS tolerates one failure per stateful
    operator at a time): the other one may still be recovering."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        graph = server.graph()
        if graph["broken"]:
            raise SystemExit(f"the graph broke: {graph['broken']}")
        whole = [op for op in ops if _whole(graph["operators"][op], need_backup)]
        if whole and (need_backup or not graph["recovering"]):
            time.sleep(0.1)
            return rng.choice(whole)
        time.sleep(0.05)
    raise SystemExit("no operator whole again after a kill")


def timeline(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    """Every reply's latency against its send time, across one kill of the learner's
    primary, for hams and for checkpoint-replay (killed 50 batches after a checkpoint)."""
    del args
    out = {}
    for mode in ("hams", "checkpoint-replay"):
        server = Server(service_config(mode), tmp)
        try:
            _await_spare(server, need_backup=mode == "hams")
            load = Load(server.url, data, batch=8, clients=2)
            with load:
                time.sleep(1.5)
                if mode == "checkpoint-replay":
                    _await_batches(server, "learner", 50)
                killed_at = time.monotonic()
                os.kill(_pid(server, "learner", "primary"), signal.SIGKILL)
                time.sleep(3.0)
        finally:
            server.stop()
        pairs = sorted(zip(load.sent_at, load.latencies, strict=False))
        out[mode] = {"t_s": [round(t - killed_at, 4) for t, _ in pairs],
                     "latency_ms": [round(lat * 1e3, 3) for _, lat in pairs]}
    return out


def _plot_timeline(state: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, (mode, run) in zip(axes, state["timeline"].items(), strict=False):
        ax.scatter(run["t_s"], run["latency_ms"], s=4)
        ax.axvline(0, color="red", linestyle="--", label="kill -9 of the learner's primary")
        ax.set_yscale("log")
        ax.set_xlabel("send time, s from the kill")
        ax.set_title(mode)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("reply latency, ms (batch of 8)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _await_batches(server: Server, op: str, count: int, timeout_s: float = 60) -> None:
    """Checkpoint-replay: kill only once ``count`` batches ran since the last checkpoint."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.graph()["operators"][op]["since_checkpoint"] >= count:
            return
        time.sleep(0.02)


def stocks(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    from benchmarks.hams_stocks import stocks_overhead

    del data
    return stocks_overhead(args, tmp)


def chaos(args: argparse.Namespace, data: Data, tmp: Path) -> dict[str, Any]:
    from benchmarks.hams_stocks import chaos as run_chaos

    del data
    again = "chaos" in args.redo.split(",")  # --redo chaos: both modes afresh
    return run_chaos(args, tmp, args.previous if args.resume and not again else None,
                     args.save)


def _save_part(out: Path, stem: str, state: dict[str, Any], part: str,
               partial: dict[str, Any]) -> None:
    """A long part's progress so far, written as if done: a stopped run resumes from it."""
    state[part] = partial
    _write(out, stem, state)


PARTS: dict[str, Callable[[argparse.Namespace, Data, Path], Any]] = {
    "stocks": stocks, "chaos": chaos, "overhead": overhead, "recovery": recovery,
    "correlated": correlated, "consistency": consistency, "timeline": timeline}


# ---- output --------------------------------------------------------------------------
def _write(out: Path, stem: str, state: dict[str, Any]) -> None:
    (out / f"{stem}.json").write_text(json.dumps(state, separators=(",", ":"), default=float))
    (out / f"{stem}.md").write_text(render_markdown(state))
    (out / f"{stem}-command.txt").write_text(state["command"] + "\n")
    if state.get("overhead"):
        _plot(state, out / f"{stem}.png")
    if state.get("timeline"):
        _plot_timeline(state, out / f"{stem}-timeline.png")
    if state.get("stocks") or state.get("chaos"):
        _plot_stocks(state, out / f"{stem}-stocks.png")


def _plot_stocks(state: dict[str, Any], path: Path) -> None:
    """Left: mean latency per mode and request size on the stocks graph; right: each chaos
    event kind's longest reply gap (median, and max as a tick), per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    rows = (state.get("stocks") or {}).get("rows") or []
    batches = sorted({r["batch"] for r in rows})
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        means = [next((r["mean_ms"] for r in rows if r["mode"] == mode and r["batch"] == b),
                      np.nan) for b in batches]
        left.bar(np.arange(len(batches)) + i * width, means, width, label=mode)
    left.set_xticks(np.arange(len(batches)) + width, [str(b) for b in batches])
    left.set_xlabel("rows per request (stocks graph)")
    left.set_ylabel("mean latency, ms")
    left.set_title("normal case, stocks graph")
    left.legend()
    runs = {m: r for m, r in (state.get("chaos") or {}).items() if isinstance(r, dict)
            and r.get("gaps")}
    kinds = sorted({k for r in runs.values() for k in r["gaps"]})
    for i, (mode, run) in enumerate(runs.items()):
        med = [run["gaps"].get(k, {}).get("median_gap_ms", np.nan) for k in kinds]
        top = [run["gaps"].get(k, {}).get("max_gap_ms", np.nan) for k in kinds]
        at = np.arange(len(kinds)) + i * 0.4
        right.barh(at, med, 0.4, label=f"{mode} (median)")
        right.plot(top, at, "k|", markersize=10)
    right.set_yticks(np.arange(len(kinds)) + 0.2, kinds, fontsize=7)
    right.set_xscale("log")
    right.set_xlabel("longest reply gap after the event, ms (| = max)")
    right.set_title("chaos on the stocks graph")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot(state: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, _ = overhead_of(state)
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, 2 if state.get("recovery") else 1, figsize=(11, 4),
                             squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        means = [next((r["mean_ms"] for r in rows if r["mode"] == mode and r["batch"] == b),
                      np.nan) for b in batches]
        ax.bar(np.arange(len(batches)) + i * width, means, width, label=mode)
    ax.set_xticks(np.arange(len(batches)) + width, [str(b) for b in batches])
    ax.set_xlabel("batch size (rows per request)")
    ax.set_ylabel("mean latency, ms")
    ax.set_title("normal case: mean latency per mode")
    ax.legend()
    if state.get("recovery"):
        ax = axes[0][1]
        names = list(state["recovery"])
        for j, key in enumerate(("detection_ms", "protocol_ms", "handover_ms")):
            vals = [state["recovery"][n]["median"][key] or 0 for n in names]
            bottoms = [sum(state["recovery"][n]["median"][k] or 0 for k in
                           ("detection_ms", "protocol_ms", "handover_ms")[:j]) for n in names]
            ax.barh(range(len(names)), vals, left=bottoms, label=key.removesuffix("_ms"))
        ax.set_yticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=7)
        ax.set_xlabel("ms from kill -9 (median)")
        ax.set_title("recovery, split as HAMS does")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _command(args: argparse.Namespace) -> str:
    parts = ["python", "-m", "benchmarks.hams"]
    if args.quick:
        parts.append("--quick")
    if args.resume:
        parts.append("--resume")
    if args.redo:
        parts += ["--redo", args.redo]
    if args.parts != ",".join(DEFAULT_PARTS):
        parts += ["--parts", args.parts]
    if args.data_dir is not None:
        parts += ["--data-dir", os.path.relpath(Path(args.data_dir).resolve(), ROOT)]
    return shlex.join(parts)


def _machine() -> str:
    return (f"{os.cpu_count()} cores; frontend, operator processes and this load generator "
            "share them; CPU PyTorch, one thread per operator process")


if __name__ == "__main__":
    sys.exit(main())
