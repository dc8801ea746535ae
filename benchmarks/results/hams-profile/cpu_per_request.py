"""CPU seconds per request of each process of the stocks graph (frontend, primaries, backups,
spares, model workers), from /proc, while an open loop offers ROWS_PER_S in ROWS-row
requests: ``python benchmarks/results/hams-profile/cpu_per_request.py ROWS ROWS_PER_S SECONDS
MODES`` from the project root (MODES: a comma list of bare, hams, remus)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import hams  # noqa: E402
from benchmarks import hams_stocks as stocks  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _parent(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if (parent := _parent(pid)) is not None:
            children.setdefault(parent, []).append(int(pid))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def cpu_s(pid: int) -> float:
    """User + system time of every thread of ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def name_of(pid: int, roles: dict[int, str]) -> str:
    if pid in roles:
        return roles[pid]
    try:
        command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "?"
    model = next((m for m in ("features", "scorer", "lstm") if m in command), None)
    return f"worker:{model}" if model else command[:60]


def measure(mode: str, rows: int, rows_per_s: float, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = hams.Server(stocks.stocks_config(mode), Path(tmp))
        try:
            hams._await_spare(server, stocks.OPS, need_backup=mode != "bare")
            operators = server.graph()["operators"]
            roles = {server.proc.pid: "frontend"}
            for op in stocks.OPS:
                for role in ("primary", "backup", "spare"):
                    if operators[op].get(f"{role}_pid"):
                        roles[operators[op][f"{role}_pid"]] = f"{op}:{role}"
            pids = process_tree(server.proc.pid)
            before = {pid: cpu_s(pid) for pid in pids}
            result = stocks._open_loop(server.url, rows, rows_per_s, seconds, seed=1)
            used: dict[str, float] = {}
            for pid in pids:
                name = name_of(pid, roles)
                used[name] = used.get(name, 0.0) + cpu_s(pid) - before[pid]
            requests = result["n"]
            print(mode, rows, {k: round(result[k], 2) for k in ("mean_ms", "p50_ms", "p99_ms")},
                  "requests", requests)
            for name, seconds_used in sorted(used.items(), key=lambda kv: -kv[1]):
                if seconds_used > 0.05:
                    print(f"   {name:40s} cpu {seconds_used:6.2f} s "
                          f"{1000 * seconds_used / requests:6.2f} ms/request")
            total = sum(used.values())
            print(f"   {'TOTAL':40s} cpu {total:6.2f} s {1000 * total / requests:6.2f} ms/request",
                  flush=True)
        finally:
            server.stop()


def main(argv: list[str]) -> None:
    rows, rows_per_s, seconds = int(argv[0]), float(argv[1]), float(argv[2])
    for mode in argv[3].split(","):
        measure(mode, rows, rows_per_s, seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
