"""What every ``python -m benchmarks.<name>`` shares: its parser, logging, errors and Ctrl-C.

An experiment behaves as ``parityserve bench overhead`` does: a ``ParityServeError`` is one
line on stderr and exit status 2, and SIGTERM unwinds like Ctrl-C, so that the servers an
experiment started are stopped too.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from parityserve.bench.extra import require_bench_extra
from parityserve.errors import ParityServeError

__all__ = ["build_parser", "examples", "main"]

# (command, what it does), shown under "examples" in --help
Example = tuple[str, str]


def build_parser(name: str, description: str, examples_text: str,
                 add_arguments: Callable[[argparse.ArgumentParser], None]
                 ) -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks.<name>``: its flags, and an epilog that teaches."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}", description=description,
        epilog=f"examples, from the project root (or: make bench-{name} ARGS='...'):\n"
               f"{examples_text}\n\n"
               "Datasets and weights are read from --data-dir or $PARITYSERVE_DATA; nothing is "
               "downloaded.\nResults (JSON, markdown, plots and the command) go to "
               "benchmarks/results/.\nNeeds the bench extra: pip install -e '.[bench]'.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_arguments(parser)
    return parser


def examples(pairs: Sequence[Example]) -> str:
    """Each command on its line, what it does indented under it."""
    return "\n".join(f"  {command}\n      {what}" for command, what in pairs)


def main(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the experiment; its exit status."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        require_bench_extra(parser.prog)  # now, not after an hour of measuring
        return int(args.func(args))
    except ParityServeError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
