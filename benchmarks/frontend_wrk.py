"""The frontend on the terms users compare servers on: ``wrk``, one core each (issue 17).

Each server is pinned to core 1 (``taskset -c 1``; its worker processes inherit the pin) and
``wrk`` to core 0. Bodies are 784-float JSON (or V2 binary) queries: 2,000 distinct ones, and
one fixed one (which a cache can answer). Closed loop: 64 connections for ``--duration``
seconds, then one connection for the p50 of an unloaded server. Systems, interleaved in every
round: ``bare`` (Starlette calling a no-op in-process, with the same decoding: the ceiling),
``litserve`` (when installed) and ``parityserve`` (``zoo:noop``, one replica), on the Clipper
route, V2 JSON and V2 binary; parityserve's V2 gRPC runs through ``parityserve bench load``
(closed loop, 64 in flight) since wrk speaks only HTTP. CPU per request is read from /proc
for the server process and, separately, its workers.

    python benchmarks/frontend_wrk.py                 # 2 rounds x 10 s per point (~15 min)
    python benchmarks/frontend_wrk.py --quick         # 1 round x 3 s (~3 min)

Results (JSON, markdown, plot, the command) go to ``benchmarks/results/frontend-wrk/``; a
stopped run resumes (finished points are kept in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
SERVER_CORE, CLIENT_CORE = "1", "0"
ROUTES = ("clipper-json", "v2-json", "v2-binary")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.rounds, args.duration = 1, 3.0
    out = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "frontend-wrk.json"
    state = _load(state_path)
    given = sys.argv[1:] if argv is None else argv
    state["command"] = " ".join(["python", "benchmarks/frontend_wrk.py",
                                 *map(shlex.quote, given)])
    systems = [s for s in args.systems.split(",") if s]
    if "litserve" in systems and not _has("litserve"):
        print("note: litserve is not installed (pip install litserve); skipped", file=sys.stderr)
        systems.remove("litserve")
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        work = Path(tmp)
        lua = work / "bodies.lua"
        lua.write_text(_LUA)
        bodies = _write_bodies(work)
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else systems[::-1]
            for system in order:
                _measure_system(system, round_, args, state, state_path, lua, bodies, work)
    state["summary"] = summarise(state["points"])
    state_path.write_text(json.dumps(state, indent=2))
    (out / "frontend-wrk.md").write_text(_markdown(state))
    _plot(state["summary"], out / "frontend-wrk.png")
    print((out / "frontend-wrk.md").read_text())
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--systems", default="bare,litserve,parityserve")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="1 round of 3 s runs")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/frontend-wrk"))
    return p


def _load(path: Path) -> dict[str, Any]:
    if path.exists():
        saved = json.loads(path.read_text())
        if "points" in saved:
            return dict(saved)
    return {"points": {}}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---- bodies ------------------------------------------------------------------------------


def _write_bodies(work: Path) -> dict[str, dict[str, Any]]:
    """Per route and body set: the file wrk reads, the path, content type, header length."""
    from parityserve.runtime import v2

    rows = np.random.default_rng(0).random((2000, 784), dtype=np.float32)
    found: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        for kind, chosen in (("distinct", rows), ("fixed", rows[:1])):
            encoded: list[tuple[bytes, dict[str, str]]] = []
            for row in chosen:
                if route == "clipper-json":
                    encoded.append((orjson.dumps({"input": row.tolist()}),
                                    {"content-type": "application/json"}))
                else:
                    encoded.append(v2.encode_infer_request(
                        [("input", row[None])], binary=route == "v2-binary",
                        binary_output=route == "v2-binary" or None))
            path = work / f"{route}-{kind}.bin"
            with path.open("wb") as f:
                for body, _ in encoded:
                    f.write(b"%d\n" % len(body) + body)
            headers = encoded[0][1]
            found[f"{route}/{kind}"] = {
                "file": str(path), "ctype": headers["content-type"],
                "hlen": headers.get(v2.HEADER_LENGTH, "")}
    return found


def _route_path(system: str, route: str) -> str:
    if route == "clipper-json":
        return "/predict" if system == "litserve" else "/app/predict"
    return "/v2/models/noop/infer"


# ---- one system --------------------------------------------------------------------------


def _measure_system(system: str, round_: int, args: argparse.Namespace, state: dict[str, Any],
                    state_path: Path, lua: Path, bodies: dict[str, dict[str, Any]],
                    work: Path) -> None:
    routes = ["clipper-json"] if system == "litserve" else list(ROUTES)
    wanted = [(r, k) for r in routes for k in ("distinct", "fixed")]
    keys = [f"{round_}/{system}/{r}/{k}" for r, k in wanted]
    if system == "parityserve":
        keys.append(f"{round_}/{system}/grpc/distinct")
    if all(k in state["points"] for k in keys):
        return
    port = _free_port()
    proc, grpc_port = _start(system, port, work)
    try:
        base = f"http://127.0.0.1:{port}"
        for (route, kind), key in zip(wanted, keys, strict=False):
            if key in state["points"]:
                continue
            print(f"round {round_ + 1}: {system} {route} {kind}", file=sys.stderr, flush=True)
            spec = bodies[f"{route}/{kind}"]
            url = base + _route_path(system, route)
            _wrk(url, spec, lua, 8, min(2.0, args.duration))  # warm up
            state["points"][key] = _point(proc.pid, url, spec, lua, args)
            state_path.write_text(json.dumps(state, indent=2))
        grpc_key = f"{round_}/{system}/grpc/distinct"
        if system == "parityserve" and grpc_key not in state["points"]:
            state["points"][grpc_key] = _grpc_point(proc.pid, grpc_port, args, work)
            state_path.write_text(json.dumps(state, indent=2))
    finally:
        _stop(proc)


def _start(system: str, port: int, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    grpc_port = _free_port()
    if system == "parityserve":
        config = work / "noop.yaml"
        config.write_text(json.dumps({
            "server": {"http_port": port, "grpc_port": grpc_port},
            "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}],
            "applications": [{"name": "app", "models": ["noop"], "slo_ms": 1000}]}))
        cmd = [str(Path(sys.executable).with_name("parityserve")), "start", "-c", str(config)]
        health = f"http://127.0.0.1:{port}/v2/health/ready"
    else:
        cmd = [sys.executable, str(HERE / "frontend_apps.py"), system, "--port", str(port)]
        health = None
    proc = subprocess.Popen(["taskset", "-c", SERVER_CORE, *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
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


def _point(pid: int, url: str, spec: dict[str, Any], lua: Path,
           args: argparse.Namespace) -> dict[str, Any]:
    before = _cpu_ticks(pid)
    loaded = _wrk(url, spec, lua, args.connections, args.duration)
    after = _cpu_ticks(pid)
    single = _wrk(url, spec, lua, 1, max(2.0, args.duration / 2))
    return {**_rates(loaded), "p50_1conn_ms": single["p50_us"] / 1e3,
            **_cpu_split(before, after, loaded["requests"])}


def _wrk(url: str, spec: dict[str, Any], lua: Path, connections: int,
         duration: float) -> dict[str, Any]:
    env = {**os.environ, "WRK_BODIES": spec["file"], "WRK_PATH": "/" + url.split("/", 3)[3],
           "WRK_CTYPE": spec["ctype"], "WRK_HLEN": spec["hlen"]}
    cmd = ["taskset", "-c", CLIENT_CORE, "wrk", "-t1", f"-c{connections}",
           f"-d{max(1, round(duration))}s", "-s", str(lua), url]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration + 60)
    match = re.search(r"WRKJSON (\{.*\})", done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"wrk failed: {done.stdout}\n{done.stderr}")
    return dict(json.loads(match.group(1)))


def _rates(run: dict[str, Any]) -> dict[str, Any]:
    seconds = run["duration_us"] / 1e6
    ok = run["requests"] - run["status_errors"] - run["socket_errors"]
    return {"rps": ok / seconds, "requests": run["requests"],
            "errors": run["status_errors"] + run["socket_errors"],
            "p50_ms": run["p50_us"] / 1e3, "p99_ms": run["p99_us"] / 1e3,
            "p999_ms": run["p999_us"] / 1e3}


def _grpc_point(pid: int, grpc_port: int, args: argparse.Namespace, work: Path
                ) -> dict[str, Any]:
    out = work / "grpc.json"
    tool = str(Path(sys.executable).with_name("parityserve"))
    common = ["taskset", "-c", CLIENT_CORE, tool, "bench", "load", f"127.0.0.1:{grpc_port}",
              "--protocol", "grpc", "--model", "noop", "--shape", "784", "--no-progress"]
    subprocess.run([*common, "--concurrency", "8", "--duration", "2"], check=True,
                   capture_output=True)  # warm up
    before = _cpu_ticks(pid)
    subprocess.run([*common, "--concurrency", str(args.connections), "--duration",
                    str(args.duration), "--json", str(out)], check=True, capture_output=True)
    after = _cpu_ticks(pid)
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
            **_cpu_split(before, after, loaded["n"])}


# ---- CPU from /proc ----------------------------------------------------------------------


def _cpu_ticks(pid: int) -> dict[str, int]:
    """utime+stime ticks of the server process (``frontend``) and of its descendants that
    are parityserve workers (``worker``), or everything below ``pid`` for other servers."""
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
    below = _descendants(pid, stats)
    frontend = stats.get(pid, (0, 0, b""))[1]
    workers = sum(stats[p][1] for p in below if b"runtime.worker" in stats[p][2])
    others = sum(stats[p][1] for p in below if b"runtime.worker" not in stats[p][2])
    # taskset execs the server in place, so ``pid`` is the server itself.
    return {"frontend": frontend + others, "worker": workers}


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


# ---- summary -----------------------------------------------------------------------------


def summarise(points: dict[str, Any]) -> list[dict[str, Any]]:
    """Medians over rounds per (system, route, bodies), with ratios to bare and LitServe."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for key, point in points.items():
        _, system, route, kind = key.split("/")
        groups.setdefault((system, route, kind), []).append(point)
    rows = []
    for (system, route, kind), runs in sorted(groups.items()):
        row: dict[str, Any] = {"system": system, "route": route, "bodies": kind,
                               "rounds": len(runs), "requests": runs[0]["requests"]}
        for metric in ("rps", "p50_ms", "p99_ms", "p999_ms", "p50_1conn_ms",
                       "frontend_cpu_us_per_request", "worker_cpu_us_per_request"):
            row[metric] = statistics.median(r[metric] for r in runs)
        row["rps_rounds"] = [round(r["rps"]) for r in runs]
        rows.append(row)
    by = {(r["system"], r["route"], r["bodies"]): r for r in rows}
    for row in rows:
        bare = by.get(("bare", row["route"] if row["route"] != "grpc" else "v2-binary",
                       row["bodies"]))
        lit = by.get(("litserve", "clipper-json", row["bodies"]))
        row["vs_bare"] = row["rps"] / bare["rps"] if bare else None
        row["vs_litserve"] = row["rps"] / lit["rps"] if lit else None
        row["p50_over_bare_ms"] = row["p50_1conn_ms"] - bare["p50_1conn_ms"] if bare else None
    return rows


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _markdown(state: dict[str, Any]) -> str:
    from parityserve.bench.report import machine_info

    lines = ["# The frontend under wrk: one core for the server, one for the client", "",
             f"Command: `{state['command']}`", "",
             "Medians over rounds (each round's req/s listed). 64 connections closed loop "
             "for req/s and p50/p99/p99.9 (n requests); p50 at 1 connection; CPU per request "
             "from /proc for the server process (frontend) and its workers. gRPC is measured "
             "with `parityserve bench load` (wrk speaks only HTTP) and compared with the bare "
             "app's V2 binary route.", "",
             "| system | route | bodies | req/s | rounds | vs bare | vs LitServe | p50 1-conn ms"
             " | over bare ms | p50 / p99 / p99.9 ms @64 | n | frontend us/req | worker us/req |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in state["summary"]:
        lines.append(
            f"| {r['system']} | {r['route']} | {r['bodies']} | {r['rps']:.0f} | "
            f"{r['rps_rounds']} | {_fmt(r['vs_bare'], '.2f')} | {_fmt(r['vs_litserve'], '.2f')}"
            f" | {r['p50_1conn_ms']:.3f} | {_fmt(r['p50_over_bare_ms'], '+.3f')} | "
            f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['p999_ms']:.2f} | {r['requests']} | "
            f"{r['frontend_cpu_us_per_request']:.0f} | {r['worker_cpu_us_per_request']:.0f} |")
    machine = machine_info()
    lines += ["", "Machine: " + ", ".join(f"{k} {machine[k]}" for k in
                                          ("cpu_model", "cpu_count", "python", "date"))]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    distinct = [r for r in rows if r["bodies"] == "distinct"]
    labels = [f"{r['system']}\n{r['route']}" for r in distinct]
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 1.1), 4))
    ax.bar(range(len(distinct)), [r["rps"] for r in distinct],
           color=["grey" if r["system"] == "bare" else "tab:orange"
                  if r["system"] == "litserve" else "tab:blue" for r in distinct])
    ax.set_xticks(range(len(distinct)), labels, fontsize=7)
    ax.set_ylabel("requests/s, 64 connections, one server core")
    ax.set_title("no-op model, 2,000 distinct 784-float bodies")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
