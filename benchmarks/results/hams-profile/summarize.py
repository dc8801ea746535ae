"""Summarize py-spy raw stacks: ``python summarize.py FILE [FILE ...]``. Per file: samples,
the top leaf frames (self time) and the top frames by inclusive share, as markdown."""

from __future__ import annotations

import sys
from collections import Counter


def frames(path: str) -> tuple[int, Counter[str], Counter[str]]:
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(path) as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            parts = [p.split(" (")[0] + " (" + p.split(" (")[-1].split(":")[0].split("/")[-1]
                     + ")" if " (" in p else p for p in stack.split(";")]
            leaf[parts[-1]] += n
            for name in set(parts):
                inclusive[name] += n
    return total, leaf, inclusive


def main(paths: list[str], top: int = 12) -> None:
    for path in paths:
        total, leaf, inclusive = frames(path)
        print(f"### {path.rsplit('/', 1)[-1]}: {total} samples\n")
        print("| self | frame | | inclusive | frame |\n|---|---|---|---|---|")
        rows_leaf = leaf.most_common(top)
        rows_inc = [(k, v) for k, v in inclusive.most_common(top * 3)
                    if not k.startswith(("<module>", "run (", "_run_once", "run_forever",
                                         "_bootstrap", "main ("))][:top]
        for (lk, lv), (ik, iv) in zip(rows_leaf, rows_inc, strict=False):
            print(f"| {lv / total:.1%} | `{lk}` | | {iv / total:.1%} | `{ik}` |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
