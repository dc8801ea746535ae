"""Cold start: ``parityserve start`` to ready, for a plain install and for the full one.

Each system is a Python interpreter and a deployment file: the plain install (a venv where
only ``pip install .`` ran; built under .cache/ when missing) serving plain models, the full
development install (.venv: torch, onnx, redis, dev) serving the same plain models, and the
full install serving the README's stateful graph. With ``--before REF``, the same plain models
served by the code at git commit REF in the full install (a worktree under .cache/), to show
what a change did. Rounds interleave the systems (the order alternates), each start is timed
from the spawn to the first 200 from /v2/health/ready, and the frontend process of one extra
start per system runs with ``-X importtime``: its top 10 imports by cumulative time.

Stop it and run it again: finished starts are kept in the JSON and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from benchmarks._cli import build_parser, examples, main

ROOT = Path(__file__).resolve().parents[1]
_EXAMPLES = examples([
    ("python -m benchmarks.cold_start", "5 rounds of every system (about 3 minutes)"),
    ("python -m benchmarks.cold_start --quick", "2 rounds"),
    ("python -m benchmarks.cold_start --before 0985673", "and the code at that commit"),
])
_URL = re.compile(r"serving on (https?://\S+)")
_IMPORT = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")

PLAIN_MODEL = '''
import numpy as np

class Doubler:
    def predict(self, batch):
        return [2.0 * np.asarray(x, dtype=np.float32) for x in batch]
'''
PLAIN = {"models": [{"name": "double", "source": "python:plainmodel:Doubler"},
                    {"name": "echo", "source": "zoo:echo"}],
         "applications": [{"name": "double", "models": ["double"], "slo_ms": 5000},
                          {"name": "echo", "models": ["echo"], "slo_ms": 5000}]}
GRAPH = {
    "models": [
        {"name": "features", "source": "zoo:echo"},
        {"name": "lstm1", "source": "zoo:stream-lstm",
         "options": {"input_size": 4, "outputs": 4, "seed": 1}},
        {"name": "lstm2", "source": "zoo:stream-lstm",
         "options": {"input_size": 4, "outputs": 1, "seed": 2}},
        {"name": "scorer", "source": "zoo:echo"}],
    "graphs": [{"name": "stocks", "stream_key": "ticker", "output": "score", "operators": [
        {"name": "feat", "model": "features", "inputs": ["frontend"]},
        {"name": "seq1", "model": "lstm1", "inputs": ["feat"], "stateful": True},
        {"name": "seq2", "model": "lstm2", "inputs": ["seq1"], "stateful": True},
        {"name": "score", "model": "scorer", "inputs": ["seq2"]}]}]}


@dataclass(frozen=True)
class System:
    name: str
    python: Path
    config: str  # "plain" | "graph"
    pythonpath: str = ""  # a source tree that wins over the installed package


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="starts per system (default 5)")
    p.add_argument("--quick", action="store_true", help="2 rounds")
    p.add_argument("--plain-venv", type=Path, default=Path(".cache/cold-start-plain-venv"),
                   help="a venv with only `pip install .` (built when missing)")
    p.add_argument("--full-python", type=Path, default=Path(".venv/bin/python"))
    p.add_argument("--before", metavar="REF", help="also the code at git commit REF")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/cold-start"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rounds = 2 if args.quick else args.rounds
    systems = _systems(args)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    store = args.results_dir / "cold-start.json"
    out = _load(store, systems, rounds, _command(args))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "plainmodel.py").write_text(PLAIN_MODEL)
        for name, mapping in (("plain", PLAIN), ("graph", GRAPH)):
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(
                {"server": {"http_port": 0}, **mapping}, sort_keys=False))
        for r in range(rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in order:
                done = out["starts"].setdefault(system.name, [])
                if len(done) <= r:
                    seconds, _ = _start(system, folder)
                    done.append(seconds)
                    print(f"round {r + 1}/{rounds} {system.name}: {seconds:.2f} s", flush=True)
                    _save(store, out)
        for system in systems:
            if system.name not in out["imports"]:
                _, stderr = _start(system, folder, importtime=True)
                out["imports"][system.name] = top_imports(stderr)
                _save(store, out)
    _write(args.results_dir, out)
    return 0


def _systems(args: argparse.Namespace) -> list[System]:
    # absolute, not resolved: a venv's python is a symlink that must keep its venv
    plain = (_plain_venv(args.plain_venv) / "bin" / "python").absolute()
    full = args.full_python.absolute()
    systems = [System("plain install, plain models", plain, "plain"),
               System("full install, plain models", full, "plain"),
               System("full install, README graph", full, "graph")]
    if args.before:
        tree = _worktree(args.before)
        systems.append(System(f"full install, plain models, at {args.before}", full, "plain",
                              str(tree)))
    return systems


def _plain_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        return venv
    print(f"building the plain install in {venv} (pip install ., about 30 s)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", str(ROOT)], check=True)
    return venv


def _worktree(ref: str) -> Path:
    tree = ROOT / ".cache" / f"cold-start-{ref}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
                       check=True, capture_output=True)
    return tree


def _start(system: System, folder: Path, *, importtime: bool = False) -> tuple[float, str]:
    """Seconds from spawn to the first ready answer, and the frontend's stderr."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PARITYSERVE_HOME": str(folder / "home")}
    env.pop("PYTHONPATH", None)
    if system.pythonpath:
        env["PYTHONPATH"] = system.pythonpath
    flags = ["-X", "importtime"] if importtime else []
    cmd = [str(system.python), *flags, "-m", "parityserve.cli", "start", "-c",
           str(folder / f"{system.config}.yaml")]
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                cwd=folder)
        try:
            seconds = _await_ready(proc, start)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        err.seek(0)
        return seconds, err.read()


def _await_ready(proc: subprocess.Popen[str], start: float) -> float:
    assert proc.stdout is not None
    for line in proc.stdout:
        if match := _URL.search(line):
            url = match.group(1)
            break
    else:
        raise RuntimeError(f"the server exited ({proc.wait()}) before serving")
    deadline = start + 180
    with httpx.Client(timeout=5) as http:
        while time.perf_counter() < deadline:
            try:
                if http.get(f"{url}/v2/health/ready").status_code == 200:
                    return time.perf_counter() - start
            except httpx.TransportError:
                pass
            time.sleep(0.01)
    raise RuntimeError("not ready within 180 s")


def top_imports(stderr: str, n: int = 10) -> dict[str, Any]:
    """The frontend's total import time (the sum of every module's own time, ms) and the
    ``n`` packages whose root import took longest, with what each pulled in that was not
    loaded before it (cumulative ms). parityserve itself is left out: its cumulative time is
    everything."""
    total_us, rows = 0, []
    for self_us, cumulative_us, _, name in _IMPORT.findall(stderr):
        total_us += int(self_us)
        if "." not in name and name not in ("parityserve", "site", "encodings"):
            rows.append({"module": name, "cumulative_ms": int(cumulative_us) / 1000})
    rows.sort(key=lambda row: -row["cumulative_ms"])
    return {"total_ms": total_us / 1000, "top": rows[:n]}


def _load(store: Path, systems: list[System], rounds: int, command: str) -> dict[str, Any]:
    if store.exists():
        out: dict[str, Any] = json.loads(store.read_text())
    else:
        out = {"name": "cold-start", "starts": {}, "imports": {}}
    out.update(rounds=rounds, systems=[s.name for s in systems], command=command,
               machine=f"{os.cpu_count()} cores")
    return out


def _save(store: Path, out: dict[str, Any]) -> None:
    tmp = store.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(store)


def markdown(out: dict[str, Any]) -> str:
    lines = ["# Cold start: `parityserve start` to ready", "",
             f"Spawn to the first 200 from `/v2/health/ready`, {out['rounds']} interleaved "
             f"rounds on this machine ({out['machine']}). Plain models: a `python:` class and "
             "`zoo:echo`, one replica each. The README graph: `stocks` (two stateful LSTM "
             "operators, each a primary, a backup and a warm spare).", "",
             "| system | median s | min s | max s | starts |", "|---|---|---|---|---|"]
    for name in out["systems"]:
        starts = out["starts"].get(name, [])
        if starts:
            lines.append(f"| {name} | {np.median(starts):.2f} | {min(starts):.2f} | "
                         f"{max(starts):.2f} | {len(starts)} |")
    for name in out["systems"]:
        found = out["imports"].get(name)
        if not found:
            continue
        lines += ["", f"Frontend imports, {name} (`-X importtime`, one start): "
                      f"{found['total_ms']:.0f} ms in all; the 10 packages whose import took "
                      "longest, with what each pulled in first:", "",
                  "| package | cumulative ms |", "|---|---|"]
        lines += [f"| {r['module']} | {r['cumulative_ms']:.0f} |" for r in found["top"]]
    lines += ["", "Command:", "", f"    {out['command']}", ""]
    return "\n".join(lines)


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in out["systems"] if out["starts"].get(n)]
    fig, ax = plt.subplots(figsize=(8, 0.7 * len(names) + 1.2))
    for i, name in enumerate(names):
        starts = out["starts"][name]
        ax.plot(starts, [i] * len(starts), "o", alpha=0.6, color="tab:blue")
        ax.plot([np.median(starts)], [i], "|", markersize=20, color="black")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("seconds from spawn to ready (dots: starts; bar: median)")
    ax.set_xlim(left=0)
    ax.set_title("parityserve start to ready")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write(folder: Path, out: dict[str, Any]) -> None:
    (folder / "cold-start.md").write_text(markdown(out))
    (folder / "command.txt").write_text(out["command"] + "\n")
    _plot(out, folder / "cold-start.png")
    print(markdown(out))


def _command(args: argparse.Namespace) -> str:
    parts = ["python", "-m", "benchmarks.cold_start"]
    if args.quick:
        parts.append("--quick")
    elif args.rounds != 5:
        parts += ["--rounds", str(args.rounds)]
    if args.before:
        parts += ["--before", args.before]
    return " ".join(map(shlex.quote, parts))


if __name__ == "__main__":
    sys.exit(main(build_parser("cold_start", __doc__.split("\n")[0], _EXAMPLES,
                               _add_arguments)))
