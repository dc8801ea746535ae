"""hams against hams, interleaved: ``python benchmarks/results/hams-profile/ab_shipping_window.py
ROWS ROWS_PER_S SECONDS REPS`` from the project root, with the worker's ``_window`` made to
read ``EXP_WINDOW`` from the environment for the run (it was, for the run recorded in
README.md; the committed worker uses 2). One fresh server per cell, cells in rotating order,
the paired ratio per repetition."""
import os, sys, tempfile, statistics as st
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import hams, hams_stocks as stocks
rows, rate, secs, reps = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
cells = [("hams", "1"), ("hams", "2")]
res = {c: [] for c in cells}
for rep in range(reps):
    order = cells[rep % 2:] + cells[:rep % 2]
    for mode, rec in order:
        os.environ["EXP_WINDOW"] = rec
        with tempfile.TemporaryDirectory() as tmp:
            server = hams.Server(stocks.stocks_config(mode), Path(tmp))
            try:
                hams._await_spare(server, stocks.OPS, need_backup=mode != "bare")
                r = stocks._open_loop(server.url, rows, rate, secs, seed=rep)
                res[(mode, rec)].append(r["mean_ms"])
                print(rep, mode, "window", rec, round(r["mean_ms"], 2), round(r["p99_ms"], 2), flush=True)
            finally:
                server.stop()
for c, v in res.items(): print(c, [round(x, 1) for x in v], "median", round(st.median(v), 2))
b = res[("hams", "1")]
for c in cells[1:]:
    print(c, "paired ratio median", round(st.median([x / y for x, y in zip(res[c], b)]), 3))
