"""``python -m benchmarks.ray_cluster``: what Ray costs, and a node failure's timeline.

On a 3-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, dashboard off, head with
no CPUs), a ParM k=2 deployment (2 data + 1 parity replica) and a plain 2-replica model, both
``zoo:echo``, run as Ray actors placed by ``core/placement.py``:

* **startup**: seconds from nothing to 3 live nodes, and to every replica ready;
* **control-plane cost**: CPU (% of one core) and RSS of Ray's own processes (GCS, raylets,
  agents, idle workers), of the replica actors Ray runs, and of the parityserve workers, over
  an idle window and a loaded one;
* **node failure**: closed-loop load (``--clients`` threads, each one query at a time) while
  the node that holds ParM data replica 0 crashes (its raylet and its processes killed): per
  ``--bin-s`` bin, queries answered per second, p50/p99 latency and answers rebuilt by
  decoding; the time until every replica is ready again on the survivors.

Closed-loop load: the clients slow down when the server does, so the p99 here shows the gap
but understates what open-loop arrivals would see. Results: ``ray-cluster.json``/``.md``/``.png``
in ``--results-dir``; a finished run is reused unless ``--force``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import _cli
from benchmarks.report import markdown_table, write_results
from parityserve.errors import ConfigError

__all__ = ["build_parser", "classify", "main", "run", "timeline"]

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}
_TICK = os.sysconf("SC_CLK_TCK")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="short windows (about 1 minute)")
    p.add_argument("--clients", type=int, default=6, help="closed-loop client threads")
    p.add_argument("--window-s", type=float, default=20.0, help="idle and loaded windows")
    p.add_argument("--after-kill-s", type=float, default=20.0, help="load kept after the kill")
    p.add_argument("--bin-s", type=float, default=0.5, help="timeline bin width")
    p.add_argument("--force", action="store_true", help="measure again over a finished run")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.set_defaults(func=run)


# ---- processes ---------------------------------------------------------------------------
def _proc(pid: int) -> tuple[int, str, float, float] | None:
    """(ppid, cmdline, cpu seconds, rss MiB) of one process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    rss = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")), 0)
    comm = stat.split("(", 1)[1].rsplit(")", 1)[0]
    return int(fields[1]), cmd or comm, (int(fields[11]) + int(fields[12])) / _TICK, rss / 1024


def classify(cmd: str) -> str:
    """Which bill a process is on: ray (its control plane), actor (a replica's Ray worker),
    worker (a parityserve model worker)."""
    if "parityserve.runtime.workers.worker" in cmd:
        return "worker"
    if "ReplicaActor" in cmd:
        return "actor"
    return "ray"


def _descendants(root: int) -> dict[int, tuple[str, float, float]]:
    procs = {int(p): _proc(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    children: dict[int, list[int]] = {}
    for pid, info in procs.items():
        if info is not None:
            children.setdefault(info[0], []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        info = procs.get(pid)
        if info is not None:
            out[pid] = info[1:]
            todo += children.get(pid, [])
    return out


def _sample() -> dict[int, tuple[str, float, float]]:
    return _descendants(os.getpid())


def cost(before: dict[int, tuple[str, float, float]], after: dict[int, tuple[str, float, float]],
         seconds: float) -> dict[str, dict[str, float]]:
    """CPU % of one core and RSS MiB per bill, over the window between two samples."""
    bills: dict[str, dict[str, float]] = {}
    for pid, (cmd, cpu, rss) in after.items():
        bill = bills.setdefault(classify(cmd), {"processes": 0, "cpu_pct": 0.0, "rss_mib": 0.0})
        bill["processes"] += 1
        bill["cpu_pct"] += 100 * (cpu - before.get(pid, (cmd, cpu, rss))[1]) / seconds
        bill["rss_mib"] += rss
    return bills


# ---- the cluster and the server ----------------------------------------------------------
@contextmanager
def _cluster() -> Iterator[tuple[Any, list[Any], float]]:
    """The 3-node cluster, started as the integration test starts it (benchmarks/_ray_local)."""
    from benchmarks._ray_local import ClusterUnavailable, local_cluster

    try:
        stack = contextlib.ExitStack()
        local = stack.enter_context(local_cluster(nodes=3, cpus=3))
    except ClusterUnavailable as exc:
        raise ConfigError(f"Ray could not start a 3-node cluster here: {exc}") from exc
    with stack:
        yield local.cluster, local.nodes, local.startup_s


def _config(address: str) -> dict[str, Any]:
    models = [{"name": n, "source": "zoo:echo", "replicas": 2, "input": VECTOR,
               "batching": {"max_batch_size": 4}, **extra}
              for n, extra in (("parm", {"parity": {"k": 2}}), ("plain", {}))]
    return {"server": {"http_port": 0, "grpc_port": 0, "cache_bytes": 0,
                       "heartbeat_timeout_ms": 3000},
            "launcher": {"kind": "ray", "address": address}, "models": models,
            "applications": [{"name": m["name"], "models": [m["name"]], "slo_ms": 20_000,
                              "default_output": "DEFAULT"} for m in models]}


def _load(url: str, app: str, stop: threading.Event, seed: int) -> list[tuple[float, float, int]]:
    """(sent at, seconds, rebuilt 0/1) per query, one at a time until ``stop``."""
    from parityserve.client import Client

    rng, out = np.random.default_rng(seed), []
    with Client(url, timeout=60) as client:
        while not stop.is_set():
            x = rng.uniform(-1, 1, size=4).astype(np.float32).tolist()
            sent = time.monotonic()
            answer = client.predict(app, x)
            out.append((sent, time.monotonic() - sent, int(bool(answer.get("reconstructed")))))
    return out


def _all_ready(server: Any, survivors: set[str]) -> bool:
    """Every replica ready and pinned to a surviving node (the frontend's view)."""
    replicas = [r for p in server.system.models.values() for r in p.replicas.values()]
    return (len(replicas) == 5 and all(r.state == "ready" for r in replicas)
            and {r.process.node_id for r in replicas} <= survivors)


def timeline(samples: Sequence[tuple[float, float, int]], start: float, bin_s: float
             ) -> list[dict[str, float]]:
    """Per bin of answer time: answers/s, p50/p99 ms, rebuilt answers/s."""
    if not samples:
        return []
    arr = np.array(samples, dtype=float)
    done = arr[:, 0] + arr[:, 1] - start
    rows = []
    for b in range(int(done.max() // bin_s) + 1):
        sel = (done >= b * bin_s) & (done < (b + 1) * bin_s)
        lat = arr[sel, 1] * 1000
        rows.append({"t_s": b * bin_s, "qps": sel.sum() / bin_s, "n": int(sel.sum()),
                     "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
                     "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
                     "rebuilt_per_s": float(arr[sel, 2].sum() / bin_s)})
    return rows


def run(args: argparse.Namespace) -> int:
    path = args.results_dir / "ray-cluster.json"
    if path.exists() and not args.force:
        report = orjson.loads(path.read_bytes())
        print(f"reusing {path} (--force measures again)")
    else:
        report = measure(args)
    _write(report, args)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError("this benchmark needs Ray: pip install -e '.[ray]'") from exc
    from parityserve.config import parse_config
    from parityserve.runtime.server import RunningServer

    window = 5.0 if args.quick else args.window_s
    after_kill = 8.0 if args.quick else args.after_kill_s
    with _cluster() as (c, nodes, cluster_s):
        t0 = time.monotonic()
        server = RunningServer(parse_config(_config(c.address))).start()
        ready_s = time.monotonic() - t0
        try:
            time.sleep(1.0)
            before, t_idle = _sample(), time.monotonic()
            time.sleep(window)
            idle = cost(before, _sample(), time.monotonic() - t_idle)
            return _under_load(args, server, c, nodes, window, after_kill) | {
                "cluster_up_s": cluster_s, "replicas_ready_s": ready_s, "idle": idle,
                "settings": {"clients": args.clients, "window_s": window,
                             "after_kill_s": after_kill, "bin_s": args.bin_s,
                             "quick": args.quick}}
        finally:
            server.stop()


def _under_load(args: argparse.Namespace, server: Any, c: Any, nodes: list[Any],
                window: float, after_kill: float) -> dict[str, Any]:
    import ray

    from benchmarks._ray_local import crash_node

    where = {a["Name"].split("#")[0]: a["Address"]["NodeID"]
             for a in ray._private.state.actors().values()
             if a["State"] == "ALIVE" and a["ActorClassName"] == "ReplicaActor"}
    victim = next(n for n in nodes if n.node_id == where["parm/v1/0"])
    survivors = {n.node_id for n in nodes if n is not victim}
    stop, start = threading.Event(), time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:
        futures = [pool.submit(_load, server.url, ["parm", "plain"][i % 2], stop, i)
                   for i in range(args.clients)]
        time.sleep(1.0)
        before, t_load = _sample(), time.monotonic()
        time.sleep(window)
        loaded = cost(before, _sample(), time.monotonic() - t_load)
        killed_at = time.monotonic()
        crash_node(c, victim)
        recovered_at = None
        while time.monotonic() < killed_at + after_kill or recovered_at is None:
            if recovered_at is None and _all_ready(server, survivors):
                recovered_at = time.monotonic()
            if time.monotonic() > killed_at + 120:
                break
            time.sleep(0.05)
        stop.set()
        samples = [s for f in futures for s in f.result()]
    gap = [s for s in samples if killed_at <= s[0] + s[1] <= (recovered_at or killed_at)]
    return {"loaded": loaded, "kill_at_s": killed_at - start,
            "recover_s": None if recovered_at is None else recovered_at - killed_at,
            "queries": len(samples), "rebuilt_in_gap": sum(s[2] for s in gap),
            "answered_in_gap": len(gap),
            "timeline": timeline(samples, start, args.bin_s)}


# ---- report --------------------------------------------------------------------------------
def _write(report: dict[str, Any], args: argparse.Namespace) -> None:
    rows = [{"window": w, "bill": b, **v} for w in ("idle", "loaded")
            for b, v in sorted(report[w].items())]
    md = "\n\n".join([
        f"3 logical nodes on one machine, Ray dashboard off. Cluster up in "
        f"{report['cluster_up_s']:.1f} s; 5 replicas (ParM k=2 + plain x2) ready "
        f"{report['replicas_ready_s']:.1f} s later.",
        markdown_table(rows, [("window", "window", "s"), ("bill", "processes of", "s"),
                              ("processes", "count", ".0f"), ("cpu_pct", "CPU % of a core", ".1f"),
                              ("rss_mib", "RSS MiB", ".0f")]),
        f"Node kill at t = {report['kill_at_s']:.1f} s under closed-loop load "
        f"({report['settings']['clients']} clients): replicas ready again on the survivors "
        f"after {_fmt(report['recover_s'])} s; {report['answered_in_gap']} queries answered "
        f"in the gap, {report['rebuilt_in_gap']} of them rebuilt by ParM decoding; "
        f"{report['queries']} queries in all, every one answered.",
        markdown_table(report["timeline"], [
            ("t_s", "t (s)", ".1f"), ("n", "answers", ".0f"), ("qps", "per s", ".0f"),
            ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"),
            ("rebuilt_per_s", "rebuilt per s", ".0f")]),
    ])
    write_results("ray-cluster", report, results_dir=args.results_dir, markdown=md)
    _plot(report, args.results_dir / "ray-cluster.png")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["timeline"]
    t = [r["t_s"] for r in rows]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(7, 6))
    for ax, key, label in zip(axes, ("qps", "p99_ms", "rebuilt_per_s"),
                              ("answers per s", "p99 ms", "rebuilt per s"), strict=True):
        ax.plot(t, [r[key] if r[key] is not None else np.nan for r in rows])
        ax.set_ylabel(label)
        ax.axvline(report["kill_at_s"], color="red", linestyle="--")
        if report["recover_s"] is not None:
            ax.axvline(report["kill_at_s"] + report["recover_s"], color="green", linestyle=":")
    axes[-1].set_xlabel("seconds (red: node killed, green: replicas ready again)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


DESCRIPTION = ("Ray's cost (startup, CPU and memory of its own processes idle and under load) "
               "and a node failure's timeline (answers/s, p99, rebuilt answers/s) for ParM on a "
               "3-node local Ray cluster.")
EXAMPLES = (("python -m benchmarks.ray_cluster --quick", "short windows (about 1 minute)"),
            ("python -m benchmarks.ray_cluster --force", "20 s windows, measured again"))


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("ray_cluster", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
