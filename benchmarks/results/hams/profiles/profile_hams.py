"""Profile one HAMS cell: ``python benchmarks/results/hams/profiles/profile_hams.py MODE BATCH
ROWS_PER_S`` from the project root (py-spy on the frontend, the learner's primary and backup
while an open loop offers ROWS_PER_S in requests of BATCH rows; raw stacks in /tmp)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from benchmarks import hams  # noqa: E402


def main(mode: str, batch: int, rows_per_s: float) -> None:
    data = hams.images(Path("../shared/data"))
    with tempfile.TemporaryDirectory() as tmp:
        config = hams.service_config(mode, max_batch=batch)
        server = hams._settled(hams.Server(config, Path(tmp)), mode)
        learner = server.graph()["operators"]["learner"]
        pids = {"frontend": server.proc.pid, "primary": learner["primary_pid"],
                "backup": learner["backup_pid"]}
        spies = [subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                   str(pid), "-d", "8", "-r", "200", "--nonblocking", "-f", "raw",
                                   "-o", f"/tmp/prof-{mode}-{name}.txt"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for name, pid in pids.items() if pid]
        result = hams._open_loop(server.url, data, batch, rows_per_s, 12, seed=1)
        print({k: result[k] for k in ("mean_ms", "p50_ms", "p99_ms", "n")})
        for spy in spies:
            spy.wait()
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
