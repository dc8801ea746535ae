"""Secret files open to others than their owner: the admin token file and the CURVE secret keys.

A warning, not a refusal (``runtime/frontend/auth.py``'s docstring says why). The frontend's
admin token (``auth``) and the worker channel's keys (``keys``) both check their files here,
in the lowest wing, so that the worker side never imports the frontend.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

__all__ = ["exposed", "warn_if_exposed"]

log = logging.getLogger(__name__)


def exposed(path: Path) -> str | None:
    """Why the secret file ``path`` is open to others than its owner, or None."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o066:
        return None
    who = " and ".join(w for w, bits in (("its group", 0o060), ("every user", 0o006))
                       if mode & bits)
    return f"{path} has mode {mode:04o}: {who} may read or change it"


def warn_if_exposed(path: Path, what: str) -> None:
    """Log a warning, with the fix, when ``exposed(path)`` says why."""
    why = exposed(path)
    if why is not None:
        log.warning("%s %s; make it private: chmod 600 %s", what, why, path)
