"""CPU seconds per request of each process of the stocks graph (frontend, primaries, backups,
spares, model workers), from /proc, while an open loop offers ROWS_PER_S in ROWS-row
requests: ``python benchmarks/results/hams-profile/cpu_per_request.py ROWS ROWS_PER_S SECONDS
MODES`` from the project root (MODES: a comma list of bare, hams, remus)."""
import os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import hams, hams_stocks as stocks
rows, rate, secs = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
modes = sys.argv[4].split(",")
TCK = os.sysconf("SC_CLK_TCK")
def tree(root):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = open(f"/proc/{p}/stat").read(); ppid = int(st.rsplit(")",1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(p))
            except Exception: pass
    out, todo = [], [root]
    while todo:
        p = todo.pop(); out.append(p); todo += kids.get(p, [])
    return out
def cpu(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split()
        return (int(f[11]) + int(f[12])) / TCK
    except Exception: return 0.0
def name(pid, roles):
    if pid in roles: return roles[pid]
    try: cmd = open(f"/proc/{pid}/cmdline").read().replace("\0"," ")
    except Exception: return "?"
    for k in ("features","scorer","lstm"):
        if k in cmd: return "worker:"+k
    return cmd[:60]
for mode in modes:
    with tempfile.TemporaryDirectory() as tmp:
        server = hams.Server(stocks.stocks_config(mode), Path(tmp))
        try:
            hams._await_spare(server, stocks.OPS, need_backup=mode != "bare")
            g = server.graph()["operators"]
            roles = {server.proc.pid: "frontend"}
            for op in stocks.OPS:
                for r in ("primary","backup","spare"):
                    if g[op].get(f"{r}_pid"): roles[g[op][f"{r}_pid"]] = f"{op}:{r}"
            pids = tree(server.proc.pid)
            before = {p: cpu(p) for p in pids}
            t0 = time.time()
            res = stocks._open_loop(server.url, rows, rate, secs, seed=1)
            wall = time.time() - t0
            after = {p: cpu(p) for p in pids}
            n = res["n"]  # requests
            agg = {}
            for p in pids:
                k = name(p, roles); agg[k] = agg.get(k, 0) + after[p] - before[p]
            print(mode, rows, {k: round(res[k], 2) for k in ("mean_ms","p50_ms","p99_ms")}, "requests", int(n), "wall", round(wall,1))
            for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
                if v > 0.05: print(f"   {k:40s} cpu {v:6.2f} s  {1000*v/n:6.2f} ms/request")
            print(f"   {'TOTAL':40s} cpu {sum(agg.values()):6.2f} s  {1000*sum(agg.values())/n:6.2f} ms/request", flush=True)
        finally:
            server.stop()
