"""HAMS members on Ray nodes (issue 41): node kills under load, and the TCP state link's cost.

The README's ``stocks`` graph (``feat`` -> ``seq1`` -> ``seq2`` -> ``score``, two per-stream
LSTMs, noise off), ``fault_tolerance: hams``.

* **kills**: first the reference, on the local launcher: ``kill -9`` of a stateful primary
  (seq1's and seq2's in turn), a few times. Then the same graph with ``launcher: {kind:
  ray}`` on a 4-node Ray cluster on this machine (``benchmarks._ray_local``; each stateful
  operator's primary, backup and spare on three distinct nodes), and node kills: each
  event crashes the node holding a chosen member, in turn seq1's primary, seq2's primary, a
  backup, the Fig. 6 node (seq1's primary beside seq2's backup; skipped while placement
  keeps them apart) and a spare; adds a node back (the cluster is 4 nodes again) and waits
  until every operator is whole (backup synced, spare up). Every event runs under fresh
  closed-loop stream clients and is checked on its own: every request answered exactly
  once, no (operator, sequence) pair with two outputs, every stream equal to its replay
  through fresh LSTMs, primary and backup digests equal once the load stopped
  (``GET /admin/graphs/stocks/digests``). Its failover, as the server's records and the
  kill's time give it: detection, protocol, handover (first reply), median and max.
  Goals: every node kill consistent; failover median <= 2x the process kill's, from this
  same run.
* **link**: the normal-case cost of the CURVE TCP state link against the Unix socket, at 1,
  8 and 64 rows per request: the graph on the local launcher twice, ``state_link: unix``
  and ``state_link: tcp`` (the launcher's own choice of link, no Ray: this measures the
  link, not Ray), side by side, interleaved repetitions of open-loop Poisson load at half
  of the Unix server's saturation (``benchmarks.hams_stocks.stocks_overhead``). Goal: TCP
  <= 1.10x Unix at 64 rows (paired mean).

Everything (cluster nodes, servers, operator processes, the load) shares this machine's
cores, so a node crash is a killed raylet and its processes, never a partition or a slow
network. Results (JSON, markdown, a plot, the command) go to ``--results-dir``; a stopped
run resumes with ``--resume`` (finished parts and events are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/hams_nodes.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _cli  # noqa: E402
from benchmarks import hams as h  # noqa: E402
from benchmarks.frontend_cases import ROOT, default_data_dir  # noqa: E402
from benchmarks.hams_chaos import event_gaps, replay_streams  # noqa: E402
from benchmarks.hams_nodes_analysis import (  # noqa: E402
    digests_equal,
    event_failover,
    goals,
    render_markdown,
    summarise,
)
from benchmarks.hams_stocks import (  # noqa: E402
    OPS,
    _await_whole,
    _lstm_step,
    _StreamClients,
    stocks_config,
    stocks_overhead,
)

__all__ = ["build_parser", "main"]

DESCRIPTION = __doc__.split("\n\n")[0]
PART_NAMES = ("kills", "link")
# node kill kinds, in turn: the member whose node crashes
KINDS = ("seq1 primary", "seq2 primary", "backup", "fig6", "spare")
NODES, NODE_CPUS = 4, 6  # as tests/integration/test_hams_ray_nodes.py
START_S = 180  # a cold graph on Ray: six member actors import torch on two cores
WHOLE_S = 120  # after a crash: a new spare's actor and a new backup seeded
EXAMPLES = (
    ("python -m benchmarks.hams_nodes --data-dir ../shared/data",
     "full run (<= 30 min): 6 process kills, 50 node kills on a 4-node Ray cluster, the "
     "TCP/Unix link at 1/8/64 rows (3 reps x 10 s)"),
    ("python -m benchmarks.hams_nodes --quick --data-dir ../shared/data",
     "check the harness in under 5 minutes: 3 process kills, 8 node kills, 1 rep x 3 s"),
    ("python -m benchmarks.hams_nodes --parts link",
     "only the state link's overhead (no Ray)"),
    ("python -m benchmarks.hams_nodes --resume",
     "go on after a stop: finished parts and kill events are kept"),
    ("python -m benchmarks.hams_nodes --resume --redo kills",
     "measure the kills again (process reference and node kills), keep the link"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="short run (under 5 minutes)")
    p.add_argument("--parts", default=",".join(PART_NAMES),
                   help=f"comma list of {', '.join(PART_NAMES)}")
    p.add_argument("--node-kills", type=int, help="node kill events (50; quick 8)")
    p.add_argument("--process-kills", type=int,
                   help="kill -9 events of a primary, the reference (6; quick 3)")
    p.add_argument("--clients", type=int, default=2,
                   help="closed-loop clients of 4 streams each during a kill event")
    p.add_argument("--link-batches", dest="stocks_batches", default="1,8,64", metavar="B,B",
                   help="rows per request for the link's overhead")
    p.add_argument("--link-seconds", dest="stocks_seconds", type=float, metavar="S",
                   help="open-loop seconds per link cell (10; quick 3)")
    p.add_argument("--reps", type=int, help="interleaved repetitions of the link (3; quick 1)")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="shared data (unused: the stocks graph's rows are random; kept so "
                        "that every benchmark takes the same flags)")
    p.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks/results/hams-nodes")
    p.add_argument("--logs-dir", type=Path, metavar="DIR",
                   help="keep the servers' logs and configs in DIR (default: a temporary "
                        "folder, removed at the end); what to read when an event goes wrong")
    p.add_argument("--resume", action="store_true",
                   help="keep parts and kill events already in the JSON")
    p.add_argument("--redo", default="", help="with --resume: measure these parts again")
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("hams_nodes", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


def run(args: argparse.Namespace) -> int:
    quick = args.quick
    command = _command(args)  # before the defaults fill in what was not given
    args.node_kills = args.node_kills or (8 if quick else 50)
    args.process_kills = args.process_kills or (3 if quick else 6)
    args.stocks_seconds = args.stocks_seconds or (3.0 if quick else 10.0)
    args.reps = args.reps or (1 if quick else 3)
    out: Path = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "hams-nodes-quick" if quick else "hams-nodes"
    json_path = out / f"{stem}.json"
    state: dict[str, Any] = json.loads(json_path.read_text()) \
        if args.resume and json_path.exists() else {}
    for part in (p.strip() for p in args.redo.split(",") if p.strip()):
        state.pop(part, None)
        state.get("elapsed_s", {}).pop(part, None)
    if "command" in state and command != state["command"]:
        more = state.setdefault("more_commands", [])
        if command not in more:  # a resume stopped and resumed again says it once
            more.append(command)
    else:
        state["command"] = command
    state.update(machine=_machine(), title="quick" if quick else "full run",
                 planned={"node_kills": args.node_kills, "process_kills": args.process_kills})
    save = functools.partial(_write, out, stem, state)
    with contextlib.ExitStack() as stack:
        tmp = args.logs_dir or stack.enter_context(tempfile.TemporaryDirectory())
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
            if part not in PART_NAMES:
                raise SystemExit(f"unknown part {part!r}; parts: {', '.join(PART_NAMES)}")
            if part == "link" and "link" in state:
                continue
            started = time.monotonic()
            if part == "kills":  # resumes inside: events already measured are kept
                state["kills"] = kills(args, Path(tmp), state.get("kills") or {}, save)
            else:
                state["link"] = link(args, Path(tmp))
            elapsed = state.setdefault("elapsed_s", {})
            elapsed[part] = round(elapsed.get(part, 0) + time.monotonic() - started, 1)
            save()
    save()
    print(render_markdown(state))
    return 0


# ---- kills -------------------------------------------------------------------------------
Save = Callable[[], None]


def kills(args: argparse.Namespace, tmp: Path, part: dict[str, Any], save: Save
          ) -> dict[str, Any]:
    """The process-kill reference, then the node kills; events already in ``part`` kept."""
    for name, count, measure in (("process", args.process_kills, _process_kills),
                                 ("node", args.node_kills, _node_kills)):
        runs = part.setdefault(name, {"events": []})
        if len(runs["events"]) < count:
            measure(args, tmp, runs, count, save)
        runs["summary"] = summarise(runs["events"])
        save()
    return part


def _process_kills(args: argparse.Namespace, tmp: Path, runs: dict[str, Any], count: int,
                   save: Save) -> None:
    """``kill -9`` of seq1's, then seq2's primary, ... on the local launcher."""
    server = h.Server(stocks_config("hams"), tmp)
    try:
        while len(runs["events"]) < count:
            i = len(runs["events"])
            op = OPS[i % len(OPS)]

            def kill(op: str = op) -> dict[str, Any]:
                pid = server.graph()["operators"][op]["primary_pid"]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return {"kind": f"{op} primary", "held": [f"{op} primary"], "primaries": 1}

            _event(server, args, i, kill, runs, tag=f"p{i}")
            save()
    finally:
        server.stop()


def ray_config(address: str) -> dict[str, Any]:
    """The stocks graph on the Ray launcher. The stateless operators' models get two
    replicas each (one replica on the crashed node would be a single point of failure
    outside what is measured), as tests/integration/test_hams_ray_nodes.py does."""
    config = stocks_config("hams")
    for model in config["models"]:
        if model["name"] in ("features", "scorer"):
            model["replicas"] = 2
    return {**config, "launcher": {"kind": "ray", "address": address}}


def _node_kills(args: argparse.Namespace, tmp: Path, runs: dict[str, Any], count: int,
                save: Save) -> None:
    from benchmarks._ray_local import crash_node, local_cluster

    with local_cluster(nodes=NODES, cpus=NODE_CPUS) as local:
        runs.setdefault("cluster_startup_s", []).append(round(local.startup_s, 1))
        started = time.monotonic()
        server = h.Server(ray_config(local.cluster.address), tmp)
        runs.setdefault("server_startup_s", []).append(round(time.monotonic() - started, 1))
        try:
            _await_whole(server, START_S)
            while len(runs["events"]) < count:
                i, turn = len(runs["events"]), runs.get("turn", 0)
                kind, node_id, held = _victim(server.graph()["operators"], turn)
                runs["turn"] = turn + 1 + KINDS[turn % len(KINDS):].index(kind)  # a skipped
                # fig6 counts as its turn

                def crash(kind: str = kind, node_id: str = node_id,
                          held: list[str] = held) -> dict[str, Any]:
                    node = next(n for n in local.nodes if n.node_id == node_id)
                    crashed_at = crash_node(local.cluster, node)
                    local.nodes.remove(node)
                    return {"kind": kind, "node": node_id[:8], "held": held,
                            "primaries": sum(1 for m in held if m.endswith("primary")),
                            "at": crashed_at}

                _event(server, args, i, crash, runs, tag=f"n{i}", after=local.add_node)
                save()
        finally:
            server.stop()


def _victim(ops: dict[str, Any], turn: int) -> tuple[str, str, list[str]]:
    """The event's kind, the node to crash and the members it holds. The kinds go in
    turn; ``fig6`` (seq1's primary and seq2's backup on one node) only when placement put
    them together (it keeps them apart when it can), else the next kind."""
    for k in range(len(KINDS)):
        kind = KINDS[(turn + k) % len(KINDS)]
        if kind.endswith("primary"):
            node = ops[kind.split()[0]]["primary_node"]
        elif kind == "fig6":
            node = ops["seq1"]["primary_node"]
            if node != ops["seq2"]["backup_node"]:
                continue
        else:  # a backup's or a spare's node, of seq1 and seq2 in turn
            node = ops[OPS[(turn // len(KINDS)) % len(OPS)]][f"{kind}_node"]
        held = [f"{op} {role}" for op in OPS for role in ("primary", "backup", "spare")
                if ops[op][f"{role}_node"] == node]
        return kind, node, held
    raise AssertionError("unreachable: the primaries' kinds always apply")


def _event(server: h.Server, args: argparse.Namespace, index: int,
           strike: Callable[[], dict[str, Any]], runs: dict[str, Any], tag: str,
           after: Callable[[], Any] | None = None) -> None:
    """One kill under fresh stream clients: wait whole, load, ``strike``, wait for the
    failovers' first replies, ``after`` (a node added back), wait whole again, stop the
    load; then the checks. The event is appended to ``runs['events']``."""
    _await_whole(server, WHOLE_S)
    clients = _StreamClients(server.url, args.clients, 4, tag=tag)
    not_whole = None
    with clients:
        time.sleep(1.0)
        killed_at = time.monotonic()  # CLOCK_MONOTONIC: the frontend's clock too
        event = {"index": index, "at": killed_at, **strike()}  # a crash says its instant
        killed_at = event["at"]
        event["strike_ms"] = round((time.monotonic() - killed_at) * 1e3, 1)
        _await_failovers(server, killed_at, event["primaries"])
        if after is not None:
            added = time.monotonic()
            after()
            event["node_added_s"] = round(time.monotonic() - added, 1)
        try:
            _await_whole(server, WHOLE_S)
        except SystemExit as exc:
            not_whole = str(exc)
        event["whole_s"] = round(time.monotonic() - killed_at, 1)
        time.sleep(0.5)
    end = time.monotonic()
    graph = server.graph()
    records = [f for f in graph["failovers"] if f["detected_at"] >= killed_at]
    step, start = _lstm_step()
    verdict = replay_streams(clients.history, step, start)
    digests, equal = _digests(server)
    event.update(
        failover=event_failover(killed_at, records), detections=sorted(
            {f["detection"] for f in records}), failovers=len(records),
        detectors=sorted({loss["detector"] for loss in graph.get("losses", [])
                          if loss.get("at", 0) >= killed_at and "detector" in loss}),
        gap_ms=event_gaps(clients.replied_at, [event], end)[0], sent=clients.sent,
        answered=verdict.answered, lost=clients.lost,
        errors=sum(clients.error_kinds.values()) - clients.lost,
        error_kinds=dict(clients.error_kinds), duplicates=clients.oracle.duplicates(),
        pairs=len(clients.oracle.seen), conflicts=len(clients.oracle.conflicts),
        conflict_examples=clients.oracle.conflicts[:3],
        diverged_streams=verdict.diverged_streams, replay_examples=verdict.examples[:3],
        digests_equal=equal, digests={op: {side: (d or {}).get("seq") for side, d in
                                           sides.items()} for op, sides in digests.items()},
        broken=graph.get("broken"), not_whole=not_whole)
    runs["events"].append(event)
    f = event["failover"]
    print(f"{tag}: {event['kind']} (held {', '.join(event['held']) or 'nothing'}): "
          f"failover {_fmt(f['total_ms'])} ms (detection {_fmt(f['detection_ms'])}, protocol "
          f"{_fmt(f['protocol_ms'])}, handover {_fmt(f['handover_ms'])}), gap "
          f"{event['gap_ms']:.0f} ms; {event['sent']} rows, {event['answered']} answered, "
          f"lost {event['lost']}, errors {event['errors']}, twice {event['duplicates']}, "
          f"pairs with two outputs {event['conflicts']}, diverged "
          f"{event['diverged_streams']}, digests equal {equal}; whole again after "
          f"{event['whole_s']} s", flush=True)


def _await_failovers(server: h.Server, killed_at: float, primaries: int,
                     timeout_s: float = 60) -> None:
    """Until ``primaries`` failovers since the kill have their first reply (or the time
    is up: the event's record then says what was missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = [f for f in server.graph()["failovers"] if f["detected_at"] >= killed_at]
        if len(records) >= primaries and all(f.get("first_reply_at") for f in records):
            return
        time.sleep(0.05)


def _digests(server: h.Server, timeout_s: float = 15) -> tuple[dict[str, Any], bool]:
    """Each operator's primary and backup state digests, asked until they agree (a backup
    applies the last state shortly after its primary's batch) or the time is up."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        found = httpx.get(f"{server.url}/admin/graphs/{server.name}/digests", timeout=60)
        digests = found.raise_for_status().json()
        if digests_equal(digests) or time.monotonic() > deadline:
            return digests, digests_equal(digests)
        time.sleep(0.2)


# ---- link --------------------------------------------------------------------------------
def link(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The stocks graph with each state link, side by side, on the local launcher."""
    configs = {}
    for form in ("unix", "tcp"):
        config = stocks_config("hams")
        config["graphs"][0]["state_link"] = form
        configs[form] = config
    return stocks_overhead(args, tmp, configs, base="unix", label="link")


# ---- output ------------------------------------------------------------------------------
def _write(out: Path, stem: str, state: dict[str, Any]) -> None:
    node = ((state.get("kills") or {}).get("node") or {}).get("summary") or {}
    process = ((state.get("kills") or {}).get("process") or {}).get("summary") or {}
    state["goals"] = goals(node, process, state["planned"]["node_kills"],
                           (state.get("link") or {}).get("rows") or [])
    (out / f"{stem}.json").write_text(json.dumps(state, separators=(",", ":"), default=float))
    (out / f"{stem}.md").write_text(render_markdown(state) + "\n")
    (out / f"{stem}-command.txt").write_text(
        "\n".join([state["command"], *state.get("more_commands", [])]) + "\n")
    if state.get("kills") or state.get("link"):
        _plot(state, out / f"{stem}.png")


def _plot(state: dict[str, Any], path: Path) -> None:
    """Left: each kill event's failover split (process kills, then node kills); right: the
    mean latency per request size over each state link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from benchmarks.figures import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    kills = state.get("kills") or {}
    groups = {"process kill -9": (kills.get("process") or {}).get("events", [])}
    for e in (kills.get("node") or {}).get("events", []):
        groups.setdefault(f"node: {e['kind']}", []).append(e)
    groups = {name: [e for e in events if e["failover"]["total_ms"] is not None]
              for name, events in groups.items()}
    groups = {name: events for name, events in groups.items() if events}
    bottoms = np.zeros(len(groups))
    for key, colour in (("detection_ms", "tab:red"), ("protocol_ms", "tab:orange"),
                        ("handover_ms", "tab:green")):
        medians = np.array([np.median([e["failover"][key] for e in events])
                            for events in groups.values()])
        left.barh(range(len(groups)), medians, left=bottoms, color=colour, height=0.6,
                  label=f"{key.removesuffix('_ms')} (median)")
        bottoms += medians
    for i, events in enumerate(groups.values()):
        totals = [e["failover"]["total_ms"] for e in events]
        left.plot(totals, [i] * len(totals), "k|", markersize=9)
    left.set_yticks(range(len(groups)),
                    [f"{name} ({len(events)})" for name, events in groups.items()], fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("ms from the kill to the first reply via the promoted primary (| = each)")
    left.set_title("failover as a client sees it")
    left.legend(fontsize=7)
    rows = (state.get("link") or {}).get("rows") or []
    batches = sorted({r["batch"] for r in rows})
    for i, form in enumerate(("unix", "tcp")):
        means = [next((r["mean_ms"] for r in rows if r["mode"] == form and r["batch"] == b),
                      np.nan) for b in batches]
        right.bar(np.arange(len(batches)) + i * 0.4, means, 0.4, label=form)
    right.set_xticks(np.arange(len(batches)) + 0.2, [str(b) for b in batches])
    right.set_xlabel("rows per request (stocks graph, local launcher)")
    right.set_ylabel("mean latency, ms")
    right.set_title("state link, normal case")
    right.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _command(args: argparse.Namespace) -> str:
    """The command as run from the project root, every flag that was given."""
    parts = ["python", "-m", "benchmarks.hams_nodes"]
    for flag, value in (("--quick", args.quick), ("--resume", args.resume)):
        if value:
            parts.append(flag)
    for flag, value in (("--redo", args.redo), ("--node-kills", args.node_kills),
                        ("--process-kills", args.process_kills),
                        ("--link-seconds", args.stocks_seconds), ("--reps", args.reps)):
        if value:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if args.parts != ",".join(PART_NAMES):
        parts += ["--parts", args.parts]
    if args.clients != 2:
        parts += ["--clients", str(args.clients)]
    if args.stocks_batches != "1,8,64":
        parts += ["--link-batches", args.stocks_batches]
    if args.data_dir is not None:
        parts += ["--data-dir", os.path.relpath(Path(args.data_dir).resolve(), ROOT)]
    return shlex.join(parts)


def _machine() -> str:
    return (f"{os.cpu_count()} cores; the Ray cluster's nodes, the frontend, the operator "
            "processes and this load generator share them; CPU PyTorch")


if __name__ == "__main__":
    sys.exit(main())
