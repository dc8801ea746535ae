"""Two cProfile dumps of the frontend (``frontend_profile.py --profiler cprofile``) side by
side, per request: which functions are called more or less often, and by how much.

Calls per request are counts, not times: they do not move with the load on the machine, so
two trees profiled at different moments of a busy VM still compare. The self times beside
them are wall clock with cProfile's cost included (read them as rough shares). Functions are
named by file basename and function name, so a module that moved between the trees still
matches.

    python benchmarks/diagnostics/profile_diff.py before.prof after.prof --top 25
"""

from __future__ import annotations

import argparse
import collections
import pstats
import re
from pathlib import Path

_HEAD = re.compile(r"^cProfile of the frontend's main thread: ([\d,]+) requests")


def requests_of(dump: Path) -> int:
    """The request count ``frontend_profile.py`` wrote in the first line of DUMP.txt."""
    first = Path(f"{dump}.txt").read_text().splitlines()[0]
    match = _HEAD.match(first)
    if match is None:
        raise SystemExit(f"{dump}.txt: no request count in its first line: {first!r}")
    return int(match.group(1).replace(",", ""))


def per_request(dump: Path) -> dict[str, tuple[float, float]]:
    """function -> (calls per request, self microseconds per request)."""
    requests = requests_of(dump)
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = (
        pstats.Stats(str(dump)).stats)  # type: ignore[attr-defined]
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for (filename, _line, name), (_cc, calls, self_s, _cum, _callers) in stats.items():
        key = f"{Path(filename).name}:{name}" if filename != "~" else name
        key = re.sub(r" at 0x[0-9a-f]+", "", key)  # builtins named with an address
        out[key][0] += calls / requests
        out[key][1] += self_s / requests * 1e6
    return {k: (v[0], v[1]) for k, v in out.items()}


def report(before: Path, after: Path, top: int) -> str:
    b, a = per_request(before), per_request(after)
    calls_b, calls_a = (sum(c for c, _ in d.values()) for d in (b, a))
    lines = [f"calls per request: {calls_b:.1f} -> {calls_a:.1f} ({calls_a - calls_b:+.1f}, "
             f"{(calls_a / calls_b - 1) * 100:+.1f}%)", "",
             "| calls/req before | after | change | self us/req before | after | function |",
             "|---|---|---|---|---|---|"]
    changed = sorted(set(a) | set(b), key=lambda k: -abs(a.get(k, (0, 0))[0]
                                                       - b.get(k, (0, 0))[0]))
    for key in changed[:top]:
        (cb, sb), (ca, sa) = b.get(key, (0.0, 0.0)), a.get(key, (0.0, 0.0))
        if abs(ca - cb) < 0.05:
            break
        lines.append(f"| {cb:.2f} | {ca:.2f} | {ca - cb:+.2f} | {sb:.1f} | {sa:.1f} | "
                     f"`{key}` |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path, help="a pstats dump (with its .txt beside it)")
    p.add_argument("after", type=Path)
    p.add_argument("--top", type=int, default=25, help="at most this many changed functions")
    args = p.parse_args()
    print(report(args.before, args.after, args.top))


if __name__ == "__main__":
    main()
