"""What the Grafana dashboard and ``parityserve top`` show during trouble, without Grafana.

A real parityserve (``parityserve start``) serves a ParM model (2 replicas, k=2), a slow model
behind a 50 ms SLO with a queue of two (defaults and shed queries), a model under the SERF
controller and a stateful graph (HAMS), under a small steady load. A real Prometheus
(Debian's, through scripts/prometheus.sh) scrapes it every second and evaluates
deploy/prometheus/rules.yml as written (every ``for:`` as in the file). On a timeline scaled
to ``--duration``: at 15 % replica 0 of the ParM model is slowed by 400 ms (rebuilt answers),
at 55 % the graph's stateful primary is SIGKILLed (a failover), at 80 % the slow replica is
healed; at 30 % the frontend gets a malformed body and a connection that is not HTTP, and at
40 % the slow model's replica is SIGKILLed (a restart). ``parityserve top`` runs in a tmux
window meanwhile and is captured at 60 %.

Afterwards every query of deploy/grafana/parityserve.json is run over the whole run through
Prometheus' query_range (step 5 s) and drawn, one small plot per panel, with the firing
alerts (Prometheus' ALERTS series) in the last plot.

Writes to --results-dir: observability-run.png (the panels), top.txt and top.png (the tmux
capture), series.json (every panel's data), README.md (machine, command, timeline, alerts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks._cli import build_parser, examples, main
from benchmarks.figures import save_figure
from benchmarks.observability_setup import observed_config, provoke_frontend_refusals
from parityserve.bench.ports import free_port
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.client import Client
from parityserve.errors import ParityServeError

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "parityserve.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
PROMETHEUS = ROOT / "scripts" / "prometheus.sh"
STEP_S = 5
# fractions of the run
SLOW_AT, KILL_AT, CAPTURE_AT, HEAL_AT = 0.15, 0.55, 0.60, 0.80


def _load(url: str, stop: threading.Event) -> None:
    """About 10 rounds a second: each application once, the graph once, and every 20th round
    a burst of 4 on the slow model that its queue of two cannot hold (shed)."""
    rng = np.random.default_rng(0)
    n = 0
    with Client(url, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        while not stop.is_set():
            x = rng.random(4).tolist()
            calls = [(client.predict, ("sick", x), {}), (client.predict, ("ctl", x), {}),
                     (client.predict_graph, ("stocks", x),
                      {"stream": f"s{n % 3}", "stream_key": "ticker"})]
            calls += [(client.predict, ("slow", x), {})] * (4 if n % 20 == 0 else 1)
            for future in [pool.submit(f, *args, **kw) for f, args, kw in calls]:
                with contextlib.suppress(ParityServeError):  # shed and paused are the point
                    future.result()
            n += 1
            stop.wait(0.1)


@contextlib.contextmanager
def _prometheus(target: str) -> Iterator[str]:
    env = {**os.environ, "PARITYSERVE_PROMETHEUS_PORT": str(free_port())}
    subprocess.run([str(PROMETHEUS), "ensure"], check=True, env=env)
    subprocess.run([str(PROMETHEUS), "start", target, str(RULES)], check=True, env=env,
                   timeout=60)
    try:
        yield subprocess.run([str(PROMETHEUS), "url"], check=True, env=env,
                             capture_output=True, text=True).stdout.strip()
    finally:
        subprocess.run([str(PROMETHEUS), "stop"], check=True, env=env, timeout=60)


@contextlib.contextmanager
def _tmux_top(url: str, token: str) -> Iterator[str]:
    """``parityserve top`` in a detached tmux window of 150 x 40; yields the session name."""
    session = f"parityserve-top-{os.getpid()}"
    top = str(Path(sys.executable).with_name("parityserve"))
    command = (f"env PARITYSERVE_ADMIN_TOKEN={shlex.quote(token)} {shlex.quote(top)} top "
               f"--url {shlex.quote(url)} --interval 2")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40",
                    command], check=True)
    try:
        yield session
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=False)
        time.sleep(1)  # q has been read: the session ends with top
        subprocess.run(["tmux", "kill-session", "-t", session], check=False,
                       stderr=subprocess.DEVNULL)


def _kill_primary(client: Client) -> float:
    pid = client.state()["graphs"]["stocks"]["operators"]["mean"]["primary_pid"]
    os.kill(int(pid), signal.SIGKILL)
    return time.time()


def _timeline(url: str, token: str, duration_s: float, out: Path) -> dict[str, float]:
    """Run the load and the events; the wall-clock time of each event."""
    events = {"start": time.time()}
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(url, stop), daemon=True)
    loader.start()
    plan = [(SLOW_AT, "slow replica 0 of sick (+400 ms)"),
            (0.3, "a bad request and a non-HTTP connection"), (0.4, "replica of slow killed"),
            (0.5, "top started"),
            (KILL_AT, "stateful primary killed"), (CAPTURE_AT, "top captured"),
            (HEAL_AT, "slow replica healed")]
    try:
        with Client(url, token=token) as client, contextlib.ExitStack() as stack:
            for at, what in plan:
                _sleep_until(events["start"] + at * duration_s)
                events[what] = time.time()
                if what.startswith("slow replica 0"):
                    client.set_faults("sick", "0", delay_ms=400)
                elif what.startswith("a bad request"):
                    provoke_frontend_refusals(url)
                elif what == "replica of slow killed":
                    _kill_replica(client, "slow")
                elif what == "top started":
                    session = stack.enter_context(_tmux_top(url, token))
                elif what.endswith("killed"):
                    events[what] = _kill_primary(client)
                elif what == "top captured":
                    _capture(session, out)
                elif what.endswith("healed"):
                    client.set_faults("sick", "0")
            _sleep_until(events["start"] + duration_s)
    finally:
        stop.set()
        loader.join(60)
    events["end"] = time.time()
    return events


def _kill_replica(client: Client, model: str) -> None:
    """SIGKILL replica 0 of ``model``; the supervisor starts another."""
    entry = next(m for m in client.state()["models"] if m["name"] == model)
    os.kill(int(entry["replicas"][0]["pid"]), signal.SIGKILL)


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _capture(session: str, out: Path) -> None:
    text = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], check=True,
                          capture_output=True, text=True).stdout.rstrip() + "\n"
    (out / "top.txt").write_text(text)


def _panels() -> list[tuple[str, list[str]]]:
    """(title, expressions) per dashboard panel, Grafana's $__rate_interval as 1m."""
    doc = json.loads(DASHBOARD.read_text())
    flat = [p for top in doc["panels"] for p in (top, *top.get("panels", []))]
    return [(p["title"], [t["expr"].replace("$__rate_interval", "1m") for t in p["targets"]])
            for p in flat if p.get("targets")]


def _range(prometheus: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    body = httpx.get(f"{prometheus}/api/v1/query_range", timeout=30,
                     params={"query": expr, "start": start, "end": end, "step": STEP_S}).json()
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return list(body["data"]["result"])


def _series(prometheus: str, events: dict[str, float]) -> dict[str, Any]:
    start, end = events["start"], events["end"]
    panels = {title: [{"expr": e, "result": _range(prometheus, e, start, end)} for e in exprs]
              for title, exprs in _panels()}
    panels["Alerts firing (ALERTS)"] = [{"expr": 'ALERTS{alertstate="firing"}', "result":
                                         _range(prometheus, 'ALERTS{alertstate="firing"}',
                                                start, end)}]
    return panels


STORED_STEP_S = 30  # the series kept in series.json; the plot is drawn from every STEP_S


def _compact(panels: dict[str, Any]) -> dict[str, Any]:
    """The series in a fraction of the bytes (benchmarks/results/ has a 5 MB budget): one
    point per STORED_STEP_S, times to 0.1 s, values to 4 significant digits, as numbers."""
    every = max(1, round(STORED_STEP_S / STEP_S))
    return {title: [{**q, "result": [{**r, "values": [[round(t, 1), float(f"{float(v):.4g}")]
                                                       for t, v in r.get("values", [])[::every]]}
                                     for r in q["result"]]} for q in queries]
            for title, queries in panels.items()}


def _label(metric: dict[str, str]) -> str:
    shown = {k: v for k, v in metric.items() if k not in ("__name__", "job", "instance")}
    return ",".join(f"{v}" for v in shown.values()) or metric.get("__name__", "value")


def _plot(panels: dict[str, Any], events: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(22, 3.1 * rows), squeeze=False)
    t0 = events["start"]
    marks = [(events[k] - t0, c) for k, c in (("slow replica 0 of sick (+400 ms)", "tab:orange"),
                                              ("stateful primary killed", "tab:red"),
                                              ("slow replica healed", "tab:green"))]
    for ax, (title, queries) in zip(axes.flat, panels.items(), strict=False):
        _draw(ax, title, queries, t0)
        for x, colour in marks:
            ax.axvline(x, color=colour, linestyle="--", linewidth=0.8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle("parityserve dashboard queries over a run (orange: replica 0 of 'sick' slowed "
                 "by 400 ms; red: stateful primary SIGKILLed; green: healed); x: seconds",
                 fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    save_figure(fig, path, dpi=80)
    plt.close(fig)


def _draw(ax: Any, title: str, queries: list[dict[str, Any]], t0: float) -> None:
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    lines = 0
    for query in queries:
        for series in query["result"]:
            if lines >= 8:  # a legend past eight names reads as noise
                break
            xs = [float(t) - t0 for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            if "ALERTS" in query["expr"]:
                name = series["metric"].get("alertname", "?")
                ys = [lines + 1.0] * len(ys)
                ax.plot(xs, ys, ".", markersize=3, label=name)
            else:
                ax.plot(xs, ys, linewidth=1, label=_label(series["metric"])[:40])
            lines += 1
    if lines:
        ax.legend(fontsize=6, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes, fontsize=8)


def _top_png(text: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = text.splitlines() or [""]
    fig = plt.figure(figsize=(0.085 * max(len(x) for x in lines) + 0.5, 0.17 * len(lines) + 0.4))
    fig.patch.set_facecolor("black")
    fig.text(0.01, 0.99, text, family="monospace", fontsize=9, color="#d0d0d0", va="top")
    save_figure(fig, path, dpi=100, facecolor="black")
    plt.close(fig)


def _report(args: argparse.Namespace, events: dict[str, float], panels: dict[str, Any],
            out: Path) -> None:
    t0 = events["start"]
    empty = [title for title, queries in panels.items()
             if not any(q["result"] for q in queries)]
    fired: dict[str, float] = {}
    for series in panels["Alerts firing (ALERTS)"][0]["result"]:
        name = series["metric"].get("alertname", "?")
        first = min(float(t) for t, _ in series["values"]) - t0
        fired[name] = min(fired.get(name, first), first)
    lines = [
        "# Dashboard queries and `parityserve top` over a run",
        "",
        "Command: `" + " ".join(["python -m benchmarks.observability_run", *sys.argv[1:]]) + "`",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}; shared with other work (load average "
        f"{os.getloadavg()[0]:.1f} at the end).",
        f"Run: {args.duration:.0f} s; Prometheus scrapes every 1 s and evaluates "
        "deploy/prometheus/rules.yml as written; queries plotted at a 5 s step.",
        "", "| event | at (s) |", "|---|---|",
        *(f"| {k} | {v - t0:.0f} |" for k, v in events.items()),
        "", "Alerts that fired (first seen, s):", "",
        *(f"- {name}: {at:.0f}" for name, at in sorted(fired.items(), key=lambda kv: kv[1])),
        "", f"Panels with no data ({len(empty)}): " + (", ".join(empty) or "none"),
        "", "![panels](observability-run.png)", "",
        f"`parityserve top` in tmux (150 x 40) at {events['top captured'] - t0:.0f} s:",
        "", "```", (out / "top.txt").read_text().rstrip(), "```", ""]
    (out / "README.md").write_text("\n".join(lines))


def run(args: argparse.Namespace) -> int:
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed (apt-get install tmux)")
    out = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    token = secrets.token_hex(24)
    config = write_config(observed_config(
        work.resolve(), {"admin_token": token},
        source="benchmarks/observability_run.py (stated)"), work / "serving.yaml")
    with ServerProcess(config, log_dir=work / "logs") as server:
        host_port = httpx.URL(server.url)
        with _prometheus(f"{host_port.host}:{host_port.port}") as prometheus:
            events = _timeline(server.url, token, args.duration, out)
            panels = _series(prometheus, events)
    shutil.rmtree(work, ignore_errors=True)
    (out / "series.json").write_text(json.dumps(
        {"events": events, "step_s": STORED_STEP_S, "panels": _compact(panels)},
        separators=(",", ":")))
    _plot(panels, events, out / "observability-run.png")
    _top_png((out / "top.txt").read_text(), out / "top.png")
    _report(args, events, panels, out)
    print(f"wrote {out}/README.md, observability-run.png, top.txt, top.png, series.json")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=600.0, metavar="SECONDS",
                        help="length of the run (default 600; events at 15/55/60/80 %%)")
    parser.add_argument("--quick", action="store_const", const=120.0, dest="duration",
                        help="a 2-minute run (too short for the 5-minute alerts' for:)")
    parser.add_argument("--results-dir", type=Path,
                        default=ROOT / "benchmarks" / "results" / "observability",
                        help="where the picture, the capture and the report go")
    parser.set_defaults(func=run)


PARSER = build_parser(
    "observability_run", __doc__.split("\n\n")[0], examples([
        ("python -m benchmarks.observability_run", "the 10-minute run"),
        ("python -m benchmarks.observability_run --quick --results-dir /tmp/obs",
         "a 2-minute check that everything runs")]), add_arguments)

if __name__ == "__main__":
    sys.exit(main(PARSER))
