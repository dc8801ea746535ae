"""``parityserve top``: a live terminal view of one or more running frontends.

Every ``--interval`` seconds each frontend's ``/metrics`` and ``/admin/state`` are read (all
frontends at once, through ``parityserve.Client``, so the admin token is found exactly where
``Client`` finds it) and drawn with rich: per model the rate, p50/p99 of the last interval
against its SLO, replicas ready, defaults and rebuilt answers per second and the parallelism
the controller runs; per graph its rate, p50/p99, durable lag, backups synced and failovers in
the last minute. The numbers come from parityserve/top_view.py (pure); this module only reads,
waits and draws.

A frontend that cannot be read is one line in the view (unreachable, token refused, not a
parityserve frontend), never a traceback; the others go on. ``q`` quits when stdin is a
terminal (read without blocking, in cbreak mode, and the terminal's settings are put back on
any exit); otherwise Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from parityserve.client import Client
from parityserve.errors import ParityServeError, Unauthorized, Unavailable
from parityserve.top_view import (
    GraphRow,
    ModelRow,
    Scrape,
    graph_rows,
    model_rows,
    parse,
    window_base,
)

__all__ = ["Frontend", "describe_error", "frame", "run"]

WINDOW_S = 60.0  # "failovers in the last minute"


def describe_error(exc: Exception) -> str:
    """One line for a frontend that could not be read."""
    text = " ".join(str(exc).split())
    if isinstance(exc, Unauthorized):
        return f"admin token refused: {text}"
    if isinstance(exc, Unavailable):
        return f"unreachable: {text}"
    if isinstance(exc, ValueError):  # a 200 that is not /metrics text or state JSON
        return f"not a parityserve frontend? {type(exc).__name__}: {text}"
    return f"{type(exc).__name__}: {text}"


def _split_url(url: str) -> tuple[str, str | None]:
    """``SERVE_URL`` or ``SERVE_URL,ADMIN_URL`` (a server with a separate admin listener); a
    bare host:port means http."""
    serve, _, admin = url.partition(",")
    fixed = [u if "://" in u else f"http://{u}" for u in (serve.strip(), admin.strip()) if u]
    return fixed[0], (fixed[1] if len(fixed) > 1 else None)


@dataclass
class Frontend:
    """One frontend's scrapes on top's own clock, oldest first, kept for about a minute."""

    url: str
    client: Client
    clock: Callable[[], float] = time.monotonic
    history: deque[tuple[float, Scrape]] = field(default_factory=deque)
    state: dict[str, Any] | None = None
    error: str | None = None

    @classmethod
    def open(cls, url: str, timeout_s: float) -> Frontend:
        serve, admin = _split_url(url)
        return cls(serve, Client(serve, timeout=timeout_s, admin_url=admin))

    def poll(self) -> None:
        try:
            text = self.client.metrics_text()
            state = self.client.state()
            scrape = parse(text)
        except (ParityServeError, ValueError) as exc:
            self.error = describe_error(exc)
            return
        now = self.clock()
        self.history.append((now, scrape))
        # keep the newest scrape at least a minute old, as the base for "last minute"
        while len(self.history) > 2 and now - self.history[1][0] >= WINDOW_S:
            self.history.popleft()
        self.state, self.error = state, None

    def rows(self) -> tuple[list[ModelRow], list[GraphRow], float]:
        """The rows over the last interval, and its length in seconds (0 with one scrape)."""
        assert self.state is not None and self.history
        now, after = self.history[-1]
        before, seconds = None, 0.0
        if len(self.history) >= 2:
            t, before = self.history[-2]
            seconds = now - t
        return (model_rows(before, after, seconds, self.state),
                graph_rows(before, after, seconds, self.state,
                           window_base(list(self.history), now, WINDOW_S)), seconds)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _p99_style(p99: float | None, slo: float) -> str:
    return "bold red" if p99 is not None and not math.isnan(p99) and p99 > slo else ""


def _models_table(rows: Sequence[ModelRow]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("model", "req/s", "p50 ms", "p99 ms", "SLO ms", "replicas", "defaults/s",
                 "rebuilt/s", "parallelism"):
        table.add_column(name, justify="left" if name in ("model", "parallelism") else "right",
                         no_wrap=True)
    for r in rows:
        table.add_row(r.model, _rate(r.rate), _ms(r.p50_s),
                      Text(_ms(r.p99_s), style=_p99_style(r.p99_s, r.slo_s)), _ms(r.slo_s),
                      _replicas(r),
                      _rate(r.defaults_per_s), _rate(r.rebuilt_per_s), r.parallelism)
    return table


def _replicas(r: ModelRow) -> Text:
    """Ready of the model's own replicas, then its parity replicas (ParM) as ``+ready/n p``:
    a ParM model configured with 2 replicas reads 2/2, not 3/3."""
    text = f"{r.replicas_up}/{r.replicas}"
    if r.parity:
        text += f" +{r.parity_up}/{r.parity}p"
    short = r.replicas_up < r.replicas or r.parity_up < r.parity
    return Text(text, style="bold red" if short else "")


def _graphs_table(rows: Sequence[GraphRow]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("graph", "req/s", "p50 ms", "p99 ms", "durable lag", "backups synced",
                 "failovers 1m"):
        table.add_column(name, justify="left" if name == "graph" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.graph, _rate(r.rate), _ms(r.p50_s), _ms(r.p99_s), f"{r.lag:.0f}",
                      r.synced, "n/a" if r.failovers is None else str(r.failovers))
    return table


def frame(frontends: Sequence[Frontend], footer: str = "", *,
          terminal: bool = True) -> RenderableType:
    """One picture of every frontend: a header line, then its tables or its error (one line:
    cut with an ellipsis on a ``terminal``, else whole, for a script to read)."""
    parts: list[RenderableType] = []
    for f in frontends:
        if f.error is not None or f.state is None:
            parts.append(Text.assemble((f.url, "bold"), "  ",
                                       (f.error or "not read yet", "bold red"),
                                       no_wrap=terminal, overflow="ellipsis"))
            continue
        models, graphs, seconds = f.rows()
        window = f"rates over the last {seconds:.1f} s" if seconds else \
            "one scrape so far: rates n/a"
        parts += [Text.assemble((f.url, "bold"), f"  {window}"), _models_table(models)]
        if graphs:
            parts.append(_graphs_table(graphs))
        parts.append(Text(""))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


class _Keys:
    """``q`` quits. On a terminal, stdin goes to cbreak mode (keys arrive one by one, unechoed;
    Ctrl-C is still a signal) and is read without blocking; its settings are restored on exit.
    Not a terminal: only Ctrl-C stops top, and waiting is plain sleeping."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream is not None and stream.isatty():
                self._fd = stream.fileno()
        self._saved: list[Any] | None = None

    @property
    def interactive(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> _Keys:
        if self._fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)

    def quit_within(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as ``q`` is pressed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._fd is None:
                time.sleep(left)
                return False
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and b"q" in os.read(self._fd, 64).lower():
                return True
        return False


def _poll_all(pool: ThreadPoolExecutor, frontends: Sequence[Frontend]) -> None:
    list(pool.map(Frontend.poll, frontends))


def _console(stream: IO[str]) -> Console:
    # A pipe gets whole lines (rich would fold at 80 columns) unless $COLUMNS says otherwise.
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(file=stream, width=100_000 if wide else None)


def run(urls: Sequence[str], *, interval_s: float = 2.0, once: bool = False,
        out: IO[str] | None = None, keys: IO[str] | None = None) -> int:
    """``parityserve top``. With ``once``: two scrapes ``interval_s`` apart (so rates exist),
    one frame printed, and exit 1 if any frontend could not be read."""
    _ctrl_c_quits()
    frontends = [Frontend.open(u, timeout_s=max(1.0, min(interval_s, 10.0))) for u in urls]
    console = _console(out or sys.stdout)
    try:
        with ThreadPoolExecutor(len(frontends)) as pool:
            if once:
                return _once(pool, frontends, interval_s, console)
            return _live(pool, frontends, interval_s, console,
                         _Keys(sys.stdin if keys is None else keys))
    finally:
        for f in frontends:
            f.client.close()


def _ctrl_c_quits() -> None:
    """Ctrl-C raises KeyboardInterrupt, whatever top inherited: a process started in the
    background by a non-interactive shell (``cmd &`` in a script, a CI job) inherits SIGINT
    ignored, and Python then never installs its handler, so Ctrl-C (or the tests' SIGINT) did
    nothing and top ran on."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _once(pool: ThreadPoolExecutor, frontends: Sequence[Frontend], interval_s: float,
          console: Console) -> int:
    _poll_all(pool, frontends)
    if any(f.error is None for f in frontends):  # nothing to wait for if none answered
        time.sleep(interval_s)
        _poll_all(pool, frontends)
    console.print(frame(frontends, terminal=console.is_terminal), soft_wrap=True)
    return 1 if any(f.error for f in frontends) else 0


def _live(pool: ThreadPoolExecutor, frontends: Sequence[Frontend], interval_s: float,
          console: Console, keys: _Keys) -> int:
    footer = f"every {interval_s:g} s; " + ("q quits" if keys.interactive else "Ctrl-C quits")

    def draw_each(show: Callable[[RenderableType], None], terminal: bool = True) -> None:
        while True:
            _poll_all(pool, frontends)
            show(frame(frontends, footer, terminal=terminal))
            if keys.quit_within(interval_s):
                return

    with contextlib.suppress(KeyboardInterrupt), keys:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                draw_each(lambda picture: live.update(picture, refresh=True))
        else:  # a pipe or a file: one frame after another, as top -b does
            draw_each(lambda picture: _print(console, picture), terminal=False)
    return 0


def _print(console: Console, picture: RenderableType) -> None:
    console.print(picture, "", soft_wrap=True)
    console.file.flush()
