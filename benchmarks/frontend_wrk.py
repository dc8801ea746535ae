"""The frontend on the terms users compare servers on: ``wrk``, one core each (issue 17).

Each server is pinned to core 1 (``taskset -c 1``; its worker processes inherit the pin) and
``wrk`` to core 0. Closed loop: 64 connections for ``--duration`` seconds, then one connection
for the p50 of an unloaded server. In each round every system's server is up, and each point
is measured on every system back to back (the order alternating), so the ratios are pairs
measured within a minute of each other (see ``_measure_round``). Systems: ``bare`` (Starlette
calling the model in-process, with the same decoding: the ceiling), ``floor`` (the bare app
plus one CURVE round trip per batch to a parityserve worker process: what any design with
models in worker processes pays on the same core), ``litserve`` (when installed),
``parityserve`` (one replica, as it ships: no fixed batching delay, only the busy hold
while its loop is saturated) and ``parityserve-batched`` (the
same with ``batching.max_delay_ms: 2``, the setting a throughput-minded deployment makes, as
Triton users set max_queue_delay). CPU per request is read from /proc for the
server process and, separately, its workers. Two models (``--models``, see
``frontend_cases.py``):

  noop  ``zoo:noop`` on Clipper JSON, V2 JSON, V2 binary (2,000 distinct random 784-float
        bodies, and one fixed body; parityserve's cache off) and parityserve's V2 gRPC (through
        ``parityserve bench load``, closed loop, 64 in flight, since wrk speaks only HTTP);
  mlp   the zoo MNIST MLP with its published weights on 2,000 distinct MNIST test images
        (Clipper JSON, V2 binary), every system batching up to 64 queries per model call;
        the target: parityserve >= 90% of the bare app's req/s. Needs ``--data-dir``.

Results (JSON, markdown, plot, the command) go to ``--results-dir``; a stopped run resumes
(finished points are kept in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

if __package__ in (None, ""):  # run as a script: python benchmarks/frontend_wrk.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _cli  # noqa: E402
from benchmarks import frontend_wrk_report as report  # noqa: E402
from benchmarks.frontend_cases import (  # noqa: E402
    BATCHED_DELAY_MS,
    BODIES,
    LITSERVE_BATCH_TIMEOUT_S,
    MAX_BATCH,
    MODELS,
    PARITYSERVE_SYSTEMS,
    ROOT,
    Case,
    default_data_dir,
    load_case,
)
from benchmarks.frontend_wrk_report import summarise  # noqa: E402
from benchmarks.steal import StealSampler  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402

__all__ = ["build_parser", "main", "run", "run_wrk", "summarise"]

SERVER_CORE, CLIENT_CORE = "1", "0"
DEFAULT_SYSTEMS = "bare,floor,litserve,parityserve,parityserve-batched"
_TICK = os.sysconf("SC_CLK_TCK")
_LUA = r"""
local bodies = {}
local path_ = os.getenv("WRK_PATH")
local headers = {["Content-Type"] = os.getenv("WRK_CTYPE")}
local hlen = os.getenv("WRK_HLEN")
if hlen ~= nil and hlen ~= "" then headers["Inference-Header-Content-Length"] = hlen end
init = function(args)
  local f = io.open(os.getenv("WRK_BODIES"), "rb")
  while true do
    local line = f:read("*l")
    if not line then break end
    bodies[#bodies + 1] = wrk.format("POST", path_, headers, f:read(tonumber(line)))
  end
  f:close()
  counter = 0
end
request = function()
  counter = counter + 1
  return bodies[(counter % #bodies) + 1]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"socket_errors":%d,"status_errors":%d,' ..
    '"p50_us":%d,"p99_us":%d,"p999_us":%d}\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50),
    latency:percentile(99), latency:percentile(99.9)))
end
"""


DESCRIPTION = ("Throughput, latency and CPU per request under wrk, one core for the server and "
               "one for the client: bare Starlette, the worker-hop floor, LitServe and "
               "parityserve, on a no-op model and the MNIST MLP with batching (issue 17).")
EXAMPLES = (
    ("python -m benchmarks.frontend_wrk --data-dir ../shared/data",
     "both models, 2 rounds x 10 s per point (about 25 min)"),
    ("python -m benchmarks.frontend_wrk --models mlp --quick --data-dir ../shared/data",
     "check the MLP harness: 1 round x 3 s (about 2 min)"),
    ("python -m benchmarks.frontend_wrk --models noop --systems bare,parityserve",
     "the no-op rows without LitServe (no data needed)"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(MODELS), help="comma list of noop, mlp")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS,
                   help="comma list of bare, floor, litserve, parityserve, "
                        "parityserve-batched (parityserve with batching.max_delay_ms "
                        f"{BATCHED_DELAY_MS:g})")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; medians reported")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="1 round of 3 s runs")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="MNIST and weights for --models mlp (default: $PARITYSERVE_DATA, else "
                        "../shared/data)")
    p.add_argument("--bare-batch-run", choices=("inline", "thread"), default="inline",
                   help="mlp: the bare app runs each batch on its event loop or in a thread "
                        "(inline measured faster on one core)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/frontend-wrk"))
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("frontend_wrk", DESCRIPTION, _cli.examples(EXAMPLES),
                             add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.rounds, args.duration = 1, 3.0
    cases = _cases(args)  # the data is checked before anything runs
    out = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "frontend-wrk.json"
    state = _load(state_path)
    state["command"] = _command(args)
    if "mlp" in cases:
        state["mlp"] = {"bodies": BODIES, "max_batch_size": MAX_BATCH,
                        "bare_batch_run": args.bare_batch_run,
                        "litserve_batch_timeout_s": LITSERVE_BATCH_TIMEOUT_S}
    systems = _systems(args.systems)
    with wrk_workspace("wrk-") as (work, lua):
        for case in cases.values():
            where = _Where(state, state_path, lua, _write_bodies(work, case), work)
            for round_ in range(args.rounds):
                _measure_round(systems if round_ % 2 == 0 else systems[::-1], round_, case,
                               args, where)
    _write_results(state, state_path, out)
    return 0


def _cases(args: argparse.Namespace) -> dict[str, Case]:
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    data_dir = args.data_dir or default_data_dir()
    return {n: load_case(n, data_dir, args.bare_batch_run) for n in names}


KNOWN_SYSTEMS = ("bare", "floor", "litserve", *PARITYSERVE_SYSTEMS)


def _systems(given: str) -> list[str]:
    systems = [s for s in given.split(",") if s]
    unknown = [s for s in systems if s not in KNOWN_SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown --systems {unknown}; choose from {', '.join(KNOWN_SYSTEMS)}")
    if "litserve" in systems and not _has("litserve"):
        print("note: litserve is not installed, so its rows are skipped: pip install -e "
              "'.[compare]' (make bench-frontend_wrk does)", file=sys.stderr)
        systems.remove("litserve")
    return systems


def _command(args: argparse.Namespace) -> str:
    """The command, rerun from the project root: paths relative to it, the data folder named
    even when it came from the environment."""
    parts = ["python", "-m", "benchmarks.frontend_wrk", "--models", args.models]
    if args.systems != DEFAULT_SYSTEMS:
        parts += ["--systems", args.systems]
    parts += ["--quick"] if args.quick else ["--rounds", str(args.rounds),
                                              "--duration", f"{args.duration:g}"]
    if args.connections != 64:
        parts += ["--connections", str(args.connections)]
    if "mlp" in args.models:
        parts += ["--data-dir", _relative(args.data_dir or default_data_dir())]
        if args.bare_batch_run != "inline":
            parts += ["--bare-batch-run", args.bare_batch_run]
    parts += ["--results-dir", _relative(args.results_dir)]
    return " ".join(map(shlex.quote, parts))


def _relative(path: Path) -> str:
    return os.path.relpath(path.resolve(), ROOT)


def _write_results(state: dict[str, Any], state_path: Path, out: Path) -> None:
    from benchmarks.report import machine_info

    state["summary"] = summarise(state["points"])
    state["verdicts"] = report.verdicts(state["summary"])
    state_path.write_text(json.dumps(state, indent=2))
    (out / "frontend-wrk.md").write_text(report.markdown(state, machine_info()))
    report.plot(state["summary"], out / "frontend-wrk.png")
    print((out / "frontend-wrk.md").read_text())


def _load(path: Path) -> dict[str, Any]:
    if path.exists():
        saved = json.loads(path.read_text())
        if "points" in saved:
            return {**saved, "points": _with_model(saved["points"])}
    return {"points": {}}


def _with_model(points: dict[str, Any]) -> dict[str, Any]:
    """Keys from before ``--models`` (``round/system/route/bodies``) were the noop model's."""
    out = {}
    for key, point in points.items():
        parts = key.split("/")
        out["/".join([parts[0], "noop", *parts[1:]]) if len(parts) == 4 else key] = point
    return out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---- bodies ------------------------------------------------------------------------------


@contextlib.contextmanager
def wrk_workspace(prefix: str) -> Iterator[tuple[Path, Path]]:
    """A scratch folder holding wrk's body-cycling script (``bodies.lua``), for this benchmark
    and the diagnostics that drive wrk the same way; the cases' bodies go beside it
    (``_write_bodies``). Yields (folder, script)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        lua = work / "bodies.lua"
        lua.write_text(_LUA)
        yield work, lua


def _write_bodies(work: Path, case: Case) -> dict[str, dict[str, Any]]:
    """Per route and body set: the file wrk reads, the content type, the header length."""
    from parityserve.runtime.frontend.v2 import HEADER_LENGTH

    routes = dict.fromkeys(r for s in ("bare", "litserve", "parityserve") for r in case.routes(s))
    found: dict[str, dict[str, Any]] = {}
    for route in routes:
        for kind in case.kinds:
            chosen = case.rows if kind == "distinct" else case.rows[:1]
            encoded = [_encode(route, row) for row in chosen]
            path = work / f"{case.name}-{route}-{kind}.bin"
            with path.open("wb") as f:
                for body, _ in encoded:
                    f.write(b"%d\n" % len(body) + body)
            headers = encoded[0][1]
            found[f"{route}/{kind}"] = {"file": str(path), "ctype": headers["content-type"],
                                        "hlen": headers.get(HEADER_LENGTH, "")}
    return found


def _encode(route: str, row: Any) -> tuple[bytes, dict[str, str]]:
    from parityserve.runtime.frontend import v2

    if route == "clipper-json":
        return orjson.dumps({"input": row.tolist()}), {"content-type": "application/json"}
    binary = route == "v2-binary"
    return v2.encode_infer_request([("input", row[None])], binary=binary,
                                   binary_output=binary or None)


def _route_path(system: str, route: str, case: Case) -> str:
    if route == "clipper-json":
        return "/predict" if system == "litserve" else "/app/predict"
    return f"/v2/models/{case.v2_model}/infer"


# ---- one system --------------------------------------------------------------------------


@dataclass
class _Where:
    """Where a system's points go (the resumable state) and what wrk reads."""

    state: dict[str, Any]
    state_path: Path
    lua: Path
    bodies: dict[str, dict[str, Any]]  # per "route/kind", from _write_bodies
    work: Path

    def save(self, key: str, point: dict[str, Any]) -> None:
        self.state["points"][key] = point
        self.state_path.write_text(json.dumps(self.state, indent=2))


def _measure_round(order: list[str], round_: int, case: Case, args: argparse.Namespace,
                   where: _Where) -> None:
    """One round: every system's server up at once, and each point (route and bodies)
    measured for every system back to back, the order alternating from point to point. The
    VM's slow spells last tens of seconds here; measured one system after another, a spell
    could fall on one system's whole block of points and skew its ratios. Paired this way it
    falls on the systems of a point alike. The servers not being measured sit idle on the
    same core; their CPU during each run is recorded (``bystander_share``). LitServe is the
    exception (``_SOLO``): it is started for its own points only, because idle with batching
    on it polls its queue (it took 14% of the core while the others were measured)."""
    points_of = {s: _points(s, case) for s in order}
    todo = {s: [p for p in points if f"{round_}/{case.name}/{s}/{p}" not in where.state["points"]]
            for s, points in points_of.items()}
    todo = {s: points for s, points in todo.items() if points}
    if not todo:
        return  # measured before this run resumed
    servers: dict[str, tuple[subprocess.Popen[bytes], int, int]] = {}
    try:
        for system in todo:
            if system not in _SOLO:
                servers[system] = _serve(system, case, where)
        names = list(dict.fromkeys(p for points in points_of.values() for p in points))
        for i, point in enumerate(names):
            for system in (order if i % 2 == 0 else order[::-1]):
                if point not in todo.get(system, ()):
                    continue
                others = [proc.pid for s, (proc, _, _) in servers.items() if s != system]
                server = servers.get(system) or _serve(system, case, where)
                try:
                    _measure_point(system, point, round_, case, args, where, server, others)
                finally:
                    if system in _SOLO:
                        _stop(server[0])
    finally:
        for proc, _, _ in servers.values():
            _stop(proc)


_SOLO = frozenset({"litserve"})  # started for each of its points, not left idling


def _serve(system: str, case: Case, where: _Where) -> tuple[subprocess.Popen[bytes], int, int]:
    """``system``'s server, up: (process, HTTP port, gRPC port)."""
    port = free_port()
    proc, grpc_port = _start(system, port, case, where.work)
    return proc, port, grpc_port


def _points(system: str, case: Case) -> list[str]:
    """What a round measures on ``system``: ``route/bodies``, and gRPC where it speaks it."""
    points = [f"{r}/{k}" for r in case.routes(system) for k in case.kinds]
    return points + (["grpc/distinct"] if case.has_grpc(system) else [])


def _measure_point(system: str, point: str, round_: int, case: Case, args: argparse.Namespace,
                   where: _Where, server: tuple[subprocess.Popen[bytes], int, int],
                   others: list[int]) -> None:
    proc, port, grpc_port = server
    print(f"== {case.name}, round {round_ + 1}: {point} on {system}", file=sys.stderr,
          flush=True)
    key = f"{round_}/{case.name}/{system}/{point}"
    route, _, kind = point.partition("/")
    batches = _BatchCounter(system, f"http://127.0.0.1:{port}")
    if route == "grpc":
        where.save(key, _grpc_point(proc.pid, grpc_port, args, where.work, others, batches))
        return
    url = f"http://127.0.0.1:{port}{_route_path(system, route, case)}"
    where.save(key, _http_point(proc.pid, url, where.bodies[point], where.lua, args, batches,
                                others))


class _BatchCounter:
    """Queries and batches a server has run so far, where it says: parityserve's batch-size
    histogram on /metrics, the bare MLP app's /stats. LitServe does not say."""

    def __init__(self, system: str, base: str) -> None:
        self.system, self.base = system, base

    def read(self) -> tuple[float, float] | None:
        import httpx

        try:
            if self.system in PARITYSERVE_SYSTEMS:
                return _histogram(httpx.get(self.base + "/metrics", timeout=5).text,
                                  "parityserve_batch_size")
            if self.system in ("bare", "floor"):
                doc = httpx.get(self.base + "/stats", timeout=5).json()
                return (doc["queries"], doc["batches"]) if doc else None
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return None


def _histogram(text: str, name: str) -> tuple[float, float] | None:
    """(sum, count) of a Prometheus histogram, over all its label sets."""
    totals = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in totals:
            if line.startswith(name + suffix):
                totals[suffix] += float(line.rsplit(" ", 1)[1])
    return (totals["_sum"], totals["_count"]) if totals["_count"] else None


def _batching(before: tuple[float, float] | None, after: tuple[float, float] | None
              ) -> dict[str, float | None]:
    """Model calls during a run and their mean batch size (None: the server does not say;
    0 calls: every answer came from elsewhere, e.g. parityserve's cache)."""
    if before is None or after is None:
        return {"model_calls": None, "mean_batch": None}
    calls = after[1] - before[1]
    return {"model_calls": calls, "mean_batch": (after[0] - before[0]) / calls if calls else None}


def _start(system: str, port: int, case: Case, work: Path
           ) -> tuple[subprocess.Popen[bytes], int]:
    grpc_port = free_port()
    if system in PARITYSERVE_SYSTEMS:
        config = work / f"{case.name}.yaml"
        config.write_text(json.dumps(case.parityserve_config(
            port, grpc_port, max_delay_ms=PARITYSERVE_SYSTEMS[system])))
        cmd = [str(Path(sys.executable).with_name("parityserve")), "start", "-c", str(config)]
        health = f"http://127.0.0.1:{port}/v2/health/ready"
    else:
        cmd = [sys.executable, "-m", "benchmarks.frontend_apps", system, "--port", str(port),
               *case.app_args(system)]
        health = None
    proc = subprocess.Popen(["taskset", "-c", SERVER_CORE, *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
    _wait_listening(port, health, proc)
    return proc, grpc_port


def _wait_listening(port: int, health: str | None, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                if health is None or httpx.get(health, timeout=2).status_code == 200:
                    time.sleep(0.5)
                    return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"nothing listened on port {port} within 180 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _http_point(pid: int, url: str, spec: dict[str, Any], lua: Path,
                args: argparse.Namespace, batches: _BatchCounter,
                bystanders: Sequence[int] = ()) -> dict[str, Any]:
    """Warm up, then 64 connections (req/s, tail, CPU, mean batch), then one connection.
    ``bystanders``: other servers idling on the same core, whose CPU is recorded."""
    _wrk(url, spec, lua, 8, min(2.0, args.duration))
    batched = batches.read()  # first: the scrape's own CPU stays out of the figures
    with StealSampler() as stolen, _Bystanders(bystanders) as idle:
        before = _cpu_ticks(pid)
        loaded = _wrk(url, spec, lua, args.connections, args.duration)
        after = _cpu_ticks(pid)
    batching = _batching(batched, batches.read())
    single = _wrk(url, spec, lua, 1, max(2.0, args.duration / 2))
    return {**_rates(loaded), "p50_1conn_ms": single["p50_us"] / 1e3,
            **_cpu_split(before, after, loaded["requests"]), **batching,
            "steal_share": stolen.samples().share(), "bystander_share": idle.share}


class _Bystanders:
    """The share of one core the idle servers ``pids`` used while a measurement ran."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids, self.share = list(pids), 0.0

    def _ticks(self) -> int:
        stats = _proc_stats()  # one scan of /proc for all of them
        return sum(sum(_cpu_ticks(pid, stats).values()) for pid in self.pids)

    def __enter__(self) -> _Bystanders:
        self._start, self._at = self._ticks(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = max(time.monotonic() - self._at, 1e-9)
        self.share = (self._ticks() - self._start) / _TICK / elapsed


def _wrk(url: str, spec: dict[str, Any], lua: Path, connections: int,
         duration: float) -> dict[str, Any]:
    """wrk's JSON summary, wrk pinned to the client core."""
    return run_wrk(url, spec, lua, connections, duration, ["taskset", "-c", CLIENT_CORE])[0]


def run_wrk(url: str, spec: dict[str, Any], lua: Path, connections: int, duration: float,
            prefix: Sequence[str] = ()) -> tuple[dict[str, Any], float]:
    """wrk's JSON summary and the CPU seconds wrk itself used; ``prefix`` goes before the
    command (``taskset -c CORE`` to pin it)."""
    env = {**os.environ, "WRK_BODIES": spec["file"], "WRK_PATH": "/" + url.split("/", 3)[3],
           "WRK_CTYPE": spec["ctype"], "WRK_HLEN": spec["hlen"]}
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run scripts/wrk.sh ensure (Debian's package), "
                         "or use make bench-frontend_wrk / bench-frontend_shards, which do")
    cmd = [*prefix, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "-s",
           str(lua), url]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration + 60)
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"WRKJSON (\{.*\})", done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"wrk failed: {done.stdout}\n{done.stderr}")
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    return dict(json.loads(match.group(1))), cpu


def _rates(run: dict[str, Any]) -> dict[str, Any]:
    seconds = run["duration_us"] / 1e6
    ok = run["requests"] - run["status_errors"] - run["socket_errors"]
    return {"rps": ok / seconds, "requests": run["requests"],
            "errors": run["status_errors"] + run["socket_errors"],
            "p50_ms": run["p50_us"] / 1e3, "p99_ms": run["p99_us"] / 1e3,
            "p999_ms": run["p999_us"] / 1e3}


def _grpc_point(pid: int, grpc_port: int, args: argparse.Namespace, work: Path,
                bystanders: Sequence[int], batches: _BatchCounter) -> dict[str, Any]:
    out = work / "grpc.json"
    tool = str(Path(sys.executable).with_name("parityserve"))
    common = ["taskset", "-c", CLIENT_CORE, tool, "bench", "load", f"127.0.0.1:{grpc_port}",
              "--protocol", "grpc", "--model", "noop", "--shape", "784", "--no-progress"]
    subprocess.run([*common, "--concurrency", "8", "--duration", "2"], check=True,
                   capture_output=True)  # warm up
    batched = batches.read()
    with StealSampler() as stolen, _Bystanders(bystanders) as idle:
        before = _cpu_ticks(pid)
        subprocess.run([*common, "--concurrency", str(args.connections), "--duration",
                        str(args.duration), "--json", str(out)], check=True, capture_output=True)
        after = _cpu_ticks(pid)
    batching = _batching(batched, batches.read())
    loaded = json.loads(out.read_text())["run"]
    subprocess.run([*common, "--concurrency", "1", "--duration",
                    str(max(2.0, args.duration / 2)), "--json", str(out)], check=True,
                   capture_output=True)
    single = json.loads(out.read_text())["run"]
    return {"rps": loaded["throughput_rps"], "requests": loaded["n"],
            "errors": sum(loaded["errors"].values()), "p50_ms": loaded["p50_ms"],
            "p99_ms": loaded["p99_ms"], "p999_ms": loaded["p999_ms"],
            "p50_1conn_ms": single["p50_ms"], "client": "parityserve bench load",
            "client_cpu_us_per_request": loaded["tool_cpu_us_per_request"],
            **_cpu_split(before, after, loaded["n"]), **batching,
            "steal_share": stolen.samples().share(), "bystander_share": idle.share}


# ---- CPU from /proc ----------------------------------------------------------------------


def _cpu_ticks(pid: int, stats: dict[int, tuple[int, int, bytes]] | None = None
               ) -> dict[str, int]:
    """utime+stime ticks of the server process (``frontend``) and of its descendants that
    are parityserve workers (``worker``), or everything below ``pid`` for other servers.
    ``stats``: a ``_proc_stats`` snapshot to read instead of scanning /proc again."""
    stats = _proc_stats() if stats is None else stats
    below = _descendants(pid, stats)
    frontend = stats.get(pid, (0, 0, b""))[1]
    workers = sum(stats[p][1] for p in below if b"runtime.workers.worker" in stats[p][2])
    others = sum(stats[p][1] for p in below if b"runtime.workers.worker" not in stats[p][2])
    # taskset execs the server in place, so ``pid`` is the server itself.
    return {"frontend": frontend + others, "worker": workers}


def _proc_stats() -> dict[int, tuple[int, int, bytes]]:
    """Every process now: pid -> (parent pid, utime+stime ticks, command line)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            fields = text.rsplit(")", 1)[1].split()
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), cmd)
    return stats


def _descendants(pid: int, stats: dict[int, tuple[int, int, bytes]]) -> set[int]:
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (parent, _, _) in stats.items() if parent in frontier}
        found |= frontier
    return found


def _cpu_split(before: dict[str, int], after: dict[str, int], requests: int) -> dict[str, float]:
    per = 1e6 / _TICK / max(requests, 1)
    return {"frontend_cpu_us_per_request": (after["frontend"] - before["frontend"]) * per,
            "worker_cpu_us_per_request": (after["worker"] - before["worker"]) * per}


if __name__ == "__main__":
    sys.exit(main())
