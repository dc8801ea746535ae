"""What each of the soak's attacks costs the frontend: CPU per round, net of an idle server.

    python benchmarks/diagnostics/attack_cost.py [--rounds 12] [--name attack-cost]

Method: a ``parityserve start`` subprocess serves the soak's configuration (the README's
``stocks`` graph and ``vec``), with the soak's attack streams opened. Each attack of
``benchmarks/soak_attacks.py`` then runs alone, ``--rounds`` times with a 0.3 s pause after
each round; the frontend process's CPU time (user + system, from /proc) over those rounds,
less what the idle server used over the same wall time (measured before, between and after
the attacks, median), divided by the rounds, is the attack's cost per round. The idle
connection hog is left out (its round is a 9 s hold). CPU time, not wall time: the machine
is shared and a busy neighbour stretches wall time, not the frontend's own CPU.

Why: the soak's well-behaved client's p99 under attack is set by what the attacks make the
frontend's one event loop do; this says which attack to make cheaper first. Writes
``benchmarks/results/attack-cost/NAME.{json,md,png}`` and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import soak  # noqa: E402
from benchmarks import soak_attacks as sa  # noqa: E402
from benchmarks.figures import save_figure  # noqa: E402
from parityserve.bench.serverproc import ServerProcess, write_config  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "attack-cost"
_LEFT_OUT = {sa.MATES, "1,030 idle connections from one address"}
_PAUSE_S = 0.3
_IDLE_S = 3.0


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _idle_rate(pid: int) -> float:
    """The idle server's CPU per second of wall time (its watchdogs and heartbeats)."""
    c0, t0 = _cpu_s(pid), time.monotonic()
    await asyncio.sleep(_IDLE_S)
    return (_cpu_s(pid) - c0) / (time.monotonic() - t0)


async def _measure(url: str, grpc: str, pid: int, rounds: int) -> dict[str, Any]:
    target = sa.Target(url, grpc, soak.GRAPH, soak.STREAM_KEY, soak.MODEL, soak.WIDTH)
    await sa.prepare_attacks(target)
    ctx = sa._Ctx(target, 0)
    idle = [await _idle_rate(pid)]
    rows: dict[str, dict[str, Any]] = {}
    try:
        for attack in sa.ATTACKS:
            if attack.name in _LEFT_OUT:
                continue
            c0, t0, m0 = _cpu_s(pid), time.monotonic(), _rss_mb(pid)
            answers: dict[str, int] = {}
            for _ in range(rounds):
                for _name, answer in await attack.run(ctx):
                    answers[answer] = answers.get(answer, 0) + 1
                await asyncio.sleep(_PAUSE_S)
            rows[attack.name] = {"cpu_s": _cpu_s(pid) - c0, "wall_s": time.monotonic() - t0,
                                 "answers": answers, "rss_before_mb": round(m0, 1),
                                 "rss_after_mb": round(_rss_mb(pid), 1)}
            print(f"  {attack.name}: {rows[attack.name]['cpu_s'] / rounds * 1e3:.1f} ms "
                  f"CPU a round (gross), RSS {m0:.1f} -> {_rss_mb(pid):.1f} MB", flush=True)
            idle.append(await _idle_rate(pid))
    finally:
        await ctx.close()
    rate = statistics.median(idle)
    for row in rows.values():
        row["net_ms_per_round"] = round(max(0.0, row["cpu_s"] - rate * row["wall_s"])
                                        / rounds * 1e3, 1)
    return {"idle_cores": round(rate, 4), "idle_samples": idle, "attacks": rows}


def _markdown(result: dict[str, Any], command: str) -> str:
    lines = [
        "# What each attack costs the frontend (CPU per round, net of idle)", "",
        f"{result['rounds']} rounds per attack, {_PAUSE_S} s apart, against the soak's server "
        f"(the README's `stocks` graph and `vec`). Idle frontend: "
        f"{result['idle_cores']:.3f} cores (median of {len(result['idle_samples'])} "
        f"readings of {_IDLE_S:g} s). Load average at the start: {result['loadavg']}.", "",
        "RSS: the frontend's resident memory before and after the attack's rounds (a "
        "steady climb over a longer run, `--rounds 200`, would be a leak).", "",
        "| attack | net frontend CPU per round (ms) | answers | RSS before -> after (MB) |",
        "|---|---|---|---|"]
    for name, row in sorted(result["attacks"].items(),
                            key=lambda kv: -kv[1]["net_ms_per_round"]):
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(row["answers"].items()))
        lines.append(f"| {name} | {row['net_ms_per_round']} | {answers} | "
                     f"{row['rss_before_mb']} -> {row['rss_after_mb']} |")
    lines += ["", "![cost](" + result["name"] + ".png)", "", "Command:", "",
              f"    {command}", ""]
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = sorted(result["attacks"].items(), key=lambda kv: kv[1]["net_ms_per_round"])
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(items) + 1.2))
    ax.barh([n for n, _ in items], [r["net_ms_per_round"] for _, r in items])
    ax.set_xlabel("frontend CPU per round, net of idle (ms)")
    ax.set_title("What each attack costs the frontend")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples, from the project root:\n"
                                "  python benchmarks/diagnostics/attack_cost.py\n"
                                "  python benchmarks/diagnostics/attack_cost.py --rounds 30 "
                                "--name attack-cost-30")
    p.add_argument("--rounds", type=int, default=12, help="rounds per attack (default 12)")
    p.add_argument("--name", default="attack-cost", help="results file name")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    from parityserve.bench.ports import free_port

    grpc_port = free_port()
    config = {**soak.CONFIG, "server": {**soak.CONFIG["server"], "grpc_port": grpc_port}}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(config, Path(tmp) / "soak.yaml")
        with ServerProcess(path, log_dir=Path(tmp) / "logs") as server:
            assert server.proc is not None
            soak._wait_ready(server.url)
            result = asyncio.run(_measure(server.url, f"127.0.0.1:{grpc_port}",
                                          server.proc.pid, args.rounds))
    result.update(rounds=args.rounds, name=args.name,
                  loadavg=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    command = "python benchmarks/diagnostics/attack_cost.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    (RESULTS / f"{args.name}.md").write_text(_markdown(result, command.strip()))
    (RESULTS / f"{args.name}.command.txt").write_text(command.strip() + "\n")
    _plot(result, RESULTS / f"{args.name}.png")
    print(_markdown(result, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
