"""Where parityserve's frontend spends its CPU under wrk: py-spy on the server process.

The same setup as ``benchmarks/frontend_wrk.py`` (server pinned to core 1, wrk to core 0,
64 connections, the case's distinct bodies), one system and route at a time, while py-spy
samples the frontend process. Writes the collapsed stacks (``--format raw``: render them with
flamegraph.pl or speedscope) and prints the self time per line, the top ``--top``.

    python benchmarks/diagnostics/frontend_profile.py --model mlp --route clipper-json \\
        --data-dir ../shared/data --out benchmarks/results/frontend-profile/mlp-clipper-json.raw

Needs ``wrk`` and ``py-spy`` (``pip install py-spy``; sampling another process needs
ptrace rights: root, or ``kernel.yama.ptrace_scope=0``).

``--profiler cprofile`` counts instead of sampling: cProfile runs on the frontend's main
thread for the loaded run (started and stopped by signals, through a ``sitecustomize`` this
script puts on the server's ``PYTHONPATH``), and the report gives every function's calls,
self time and cumulative time *per request*. cProfile's own cost per call about doubles the
times, so read them as shares and counts; and its times are wall clock, so a call that
blocks or is preempted (a ZeroMQ send, whose I/O thread and worker share the core) reads
long. Writes OUT (pstats) and OUT.txt.
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import frontend_wrk as fw  # noqa: E402
from benchmarks.frontend_cases import default_data_dir, load_case  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp", choices=("noop", "mlp"))
    p.add_argument("--route", default="clipper-json",
                   choices=("clipper-json", "v2-json", "v2-binary"))
    p.add_argument("--profiler", default="py-spy", choices=("py-spy", "perf", "cprofile"),
                   help="py-spy: Python stacks (collapsed, --format raw); perf: native "
                        "samples, reported by shared object (interpreter, kernel, numpy, "
                        "ZeroMQ...), to see how much of the core is Python at all; cprofile: "
                        "every function's calls and time per request, on the main thread")
    p.add_argument("--seconds", type=float, default=10.0, help="sampling time")
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--worker-core", choices=(fw.CLIENT_CORE,),
                   help="move the server's worker processes to this core (wrk's) once it is "
                        "up: the samples then show the frontend's own work, without the "
                        "worker preempting it on the shared core (a diagnostic setup; the "
                        "benchmarks keep both on the server core)")
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument("--out", type=Path, required=True,
                   help="py-spy: collapsed stacks (.raw); perf: perf.data (its report by "
                        "shared object goes beside it, OUT.dso.txt)")
    args = p.parse_args()
    for tool in ("wrk", args.profiler):
        if tool != "cprofile" and shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH")
    case = load_case(args.model, args.data_dir)
    with fw.wrk_workspace("fprof-") as (work, lua):
        spec = fw._write_bodies(work, case)[f"{args.route}/distinct"]
        port = free_port()
        if args.profiler == "cprofile":
            _install_cprofile_hook(work, args.out)
        proc, _ = fw._start("parityserve", port, case, work)
        try:
            url = f"http://127.0.0.1:{port}{fw._route_path('parityserve', args.route, case)}"
            if args.worker_core is not None:
                _pin_children(proc.pid, args.worker_core)
            fw._wrk(url, spec, lua, 8, 2.0)  # warm up
            if args.profiler == "cprofile":
                requests = _cprofile_run(proc.pid, url, spec, lua, args)
                _print_per_request(args.out, requests, args.top)
                return 0
            load = threading.Thread(target=fw._wrk,
                                    args=(url, spec, lua, 64, args.seconds + 4.0))
            load.start()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            _record(args, proc.pid)
            load.join()
        finally:
            fw._stop(proc)
    if args.profiler == "perf":
        _print_shared_objects(args.out, args.top)
    else:
        _print_self_time(args.out, args.top)
    return 0


# In the frontend only (its argv[0] is the ``parityserve`` script), SIGUSR1 starts cProfile
# on the main thread, where Python runs signal handlers, and SIGUSR2 stops it and writes it.
_CPROFILE_HOOK = """
import os, sys
if os.environ.get("PARITYSERVE_CPROFILE_OUT") and sys.argv[0].endswith("parityserve"):
    import cProfile, signal
    _profile = cProfile.Profile()
    def _stop(*_):
        _profile.disable()
        out = os.environ["PARITYSERVE_CPROFILE_OUT"]
        _profile.dump_stats(out + ".part")
        os.replace(out + ".part", out)  # the file appears whole
    signal.signal(signal.SIGUSR1, lambda *_: _profile.enable())
    signal.signal(signal.SIGUSR2, _stop)
"""


def _install_cprofile_hook(work: Path, out: Path) -> None:
    """The server started next imports ``work/sitecustomize.py`` (it inherits this
    environment); a ``sitecustomize`` of the environment's own is shadowed meanwhile."""
    (work / "sitecustomize.py").write_text(_CPROFILE_HOOK)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(work), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PARITYSERVE_CPROFILE_OUT"] = str(out.resolve())


def _cprofile_run(pid: int, url: str, spec: dict[str, object], lua: Path,
                  args: argparse.Namespace) -> int:
    """Profile one 64-connection run; the requests it answered."""
    os.kill(pid, signal.SIGUSR1)
    loaded = fw._wrk(url, spec, lua, 64, args.seconds)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not args.out.exists():  # renamed into place whole by the hook
        if time.monotonic() > deadline:
            raise SystemExit(f"the server wrote no profile to {args.out}")
        time.sleep(0.1)
    return int(loaded["requests"])


def _print_per_request(stats_file: Path, requests: int, top: int) -> None:
    """Calls and times per request, by function and by module; written beside the stats."""
    stats = pstats.Stats(str(stats_file)).stats  # type: ignore[attr-defined]
    per = 1e6 / max(requests, 1)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])
    calls = sum(v[1] for v in stats.values()) / max(requests, 1)
    lines = [f"cProfile of the frontend's main thread: {requests:,} requests, "
             f"{calls:.0f} calls per request (times per request, us, cProfile's included)",
             "", "calls/req   self us   cum us  function"]
    for (file, line, name), (_, ncalls, self_s, cum_s, _) in rows[:top]:
        lines.append(f"{ncalls / requests:9.2f} {self_s * per:9.1f} {cum_s * per:8.1f}  "
                     f"{_short(file)}:{line} {name}")
    modules: collections.Counter[str] = collections.Counter()
    for (file, _, _), (_, _, self_s, _, _) in stats.items():
        modules[_short(file).split(":")[0]] += self_s
    lines += ["", "self us per request, by file", *(
        f"{t * per:9.1f}  {m}" for m, t in modules.most_common(top))]
    text = "\n".join(lines) + "\n"
    stats_file.with_suffix(stats_file.suffix + ".txt").write_text(text)
    print(text)


def _record(args: argparse.Namespace, pid: int) -> None:
    if args.profiler == "perf":
        cmd = ["perf", "record", "-F", str(args.rate), "-p", str(pid), "-o", str(args.out),
               "--", "sleep", str(int(args.seconds))]
    else:
        cmd = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(args.seconds)),
               "--rate", str(args.rate), "--format", "raw", "--nonblocking", "-o", str(args.out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _print_shared_objects(data: Path, top: int) -> None:
    """perf's samples by shared object, written beside ``data`` and printed."""
    report = subprocess.run(["perf", "report", "-i", str(data), "--sort", "dso", "--stdio"],
                            capture_output=True, text=True, check=True).stdout
    rows = [line.strip() for line in report.splitlines()
            if line.strip() and not line.startswith("#")][:top]
    text = "\n".join(["share of samples by shared object (perf report --sort dso)", *rows, ""])
    data.with_suffix(".dso.txt").write_text(text)
    print(text)


def _pin_children(pid: int, core: str) -> None:
    """Every process ``pid`` started (its model workers) onto ``core``."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    if not children:
        raise SystemExit(f"the server (pid {pid}) has no worker processes to move")
    for child in children:
        subprocess.run(["taskset", "-pc", core, child], check=True, stdout=subprocess.DEVNULL)


def _print_self_time(raw: Path, top: int) -> None:
    """Self time: the innermost frame of each sampled stack, by function and line."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or "select" in frames[-1] or "epoll" in frames[-1]:
            continue  # idle: waiting in the event loop's poll
        counts[_short(frames[-1])] += int(n)
        total += int(n)
    print(f"{total} busy samples ({raw})")
    for where, count in counts.most_common(top):
        print(f"{100 * count / total:5.1f}%  {where}")


def _short(frame: str) -> str:
    """Paths relative to the project, the environment and the interpreter's library."""
    for base in (sys.prefix, ROOT, sys.base_prefix):
        frame = frame.replace(str(base) + os.sep, "")
    return frame


if __name__ == "__main__":
    sys.exit(main())
