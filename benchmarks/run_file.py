"""A benchmark's finished measurements, one JSON line each, so that ``--resume`` skips them.

Why: a full benchmark takes up to an hour on this machine (the tail experiment far longer on
a small one), and a crash, a reboot or the end of a working session must not throw away the
runs already measured. A line is reused only under the same settings (``fingerprint``), so a
changed run never mixes with an old one. Without ``resume`` an earlier file is kept aside as
``*.old``, not deleted. Hand-written because the format is ours: one self-describing JSON
object per line, appended and flushed as each measurement finishes.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from benchmarks.report import command_line

__all__ = ["RunFile"]


class RunFile:
    """The saved rows of one benchmark, by a key each subclass reads off its lines."""

    def __init__(self, path: Path, fingerprint: dict[str, Any], *, resume: bool) -> None:
        self.path, self.fingerprint = path, json.loads(json.dumps(fingerprint))
        self.rows: dict[Hashable, dict[str, Any]] = {}
        # The commands that measured the saved rows, in order (a report written later with
        # --report-only or --resume names them, not only itself); lines from before commands
        # were kept have none.
        self.commands: dict[str, None] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists():
            for line in path.read_text().splitlines():
                saved = json.loads(line) if line.strip() else {}
                if saved.get("fingerprint") == self.fingerprint:
                    self.rows[self.key_of(saved)] = saved["row"]
                    if saved.get("command"):
                        self.commands[str(saved["command"])] = None
        elif path.exists():
            path.replace(path.with_name(path.name + ".old"))

    def key_of(self, saved: dict[str, Any]) -> Hashable:
        """The key of one saved line (``{"fingerprint", ..., "row"}``)."""
        raise NotImplementedError

    def append(self, key: Hashable, label: dict[str, Any], row: dict[str, Any]) -> None:
        """Save ``row`` under ``key``; ``label`` is what ``key_of`` reads back from the line."""
        command = command_line()
        with self.path.open("a") as f:
            f.write(json.dumps({"fingerprint": self.fingerprint, **label, "command": command,
                                "row": row}, default=float) + "\n")
        self.rows[key] = row
        self.commands[command] = None
