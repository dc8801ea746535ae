"""Profile ``hams`` against ``bare`` on the README's stocks graph: ``python
benchmarks/results/hams-profile/profile_stocks.py MODE ROWS ROWS_PER_S [SECONDS]`` from the
project root. py-spy (``record --nonblocking -r 200 -f raw``) on the frontend, seq1's
primary and seq1's backup while an open loop offers ROWS_PER_S in requests of ROWS rows;
raw stacks go to /tmp/prof-stocks-MODE-ROWS-{frontend,primary,backup}.txt, and
``summarize.py`` turns them into the tables in README.md."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import hams  # noqa: E402
from benchmarks import hams_stocks as stocks  # noqa: E402


def main(mode: str, rows: int, rows_per_s: float, seconds: float = 12.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = hams.Server(stocks.stocks_config(mode), Path(tmp))
        try:
            hams._await_spare(server, stocks.OPS, need_backup=mode != "bare")
            seq1 = server.graph()["operators"]["seq1"]
            pids = {"frontend": server.proc.pid, "primary": seq1["primary_pid"],
                    "backup": seq1["backup_pid"]}
            spy = str(Path(sys.executable).parent / "py-spy")
            spies = [subprocess.Popen(
                [spy, "record", "-p", str(pid), "-d", str(int(seconds - 4)), "-r", "200",
                 "--nonblocking", "-f", "raw", "-o", f"/tmp/prof-stocks-{mode}-{rows}-{name}.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, pid in pids.items() if pid]
            result = stocks._open_loop(server.url, rows, rows_per_s, seconds, seed=1)
            print(mode, rows, {k: round(result[k], 3) for k in ("mean_ms", "p50_ms", "p99_ms")},
                  "n", result["n"], "errors", result["errors"], flush=True)
            for proc in spies:
                proc.wait()
        finally:
            server.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]),
         *(float(a) for a in sys.argv[4:5]))
