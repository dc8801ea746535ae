"""hams against hams, interleaved: ``python benchmarks/results/hams-profile/ab_shipping_window.py
ROWS ROWS_PER_S SECONDS REPS`` from the project root, with the worker's ``_window`` made to
read ``EXP_WINDOW`` from the environment for the run (it was, for the run recorded in
README.md; the committed worker uses 2). One fresh server per cell, cells in rotating order,
the paired ratio per repetition."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import hams  # noqa: E402
from benchmarks import hams_stocks as stocks  # noqa: E402

CELLS = [("hams", "1"), ("hams", "2")]  # (mode, EXP_WINDOW)


def main(argv: list[str]) -> None:
    rows, rows_per_s, seconds, reps = int(argv[0]), float(argv[1]), float(argv[2]), int(argv[3])
    means: dict[tuple[str, str], list[float]] = {cell: [] for cell in CELLS}
    for rep in range(reps):
        for mode, window in CELLS[rep % 2:] + CELLS[:rep % 2]:
            os.environ["EXP_WINDOW"] = window
            with tempfile.TemporaryDirectory() as tmp:
                server = hams.Server(stocks.stocks_config(mode), Path(tmp))
                try:
                    hams._await_spare(server, stocks.OPS, need_backup=mode != "bare")
                    result = stocks._open_loop(server.url, rows, rows_per_s, seconds, seed=rep)
                    means[(mode, window)].append(result["mean_ms"])
                    print(rep, mode, "window", window, round(result["mean_ms"], 2),
                          round(result["p99_ms"], 2), flush=True)
                finally:
                    server.stop()
    for cell, values in means.items():
        print(cell, [round(v, 1) for v in values], "median", round(statistics.median(values), 2))
    ratios = [b / a for a, b in zip(means[CELLS[0]], means[CELLS[1]], strict=True)]
    print("window 2 / window 1, paired median", round(statistics.median(ratios), 3))


if __name__ == "__main__":
    main(sys.argv[1:])
