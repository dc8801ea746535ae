"""The admin token: where it comes from, where it is kept, and how a request proves it.

Resolution order: ``server.admin_token`` > ``$PARITYSERVE_ADMIN_TOKEN`` > the token file
(``server.admin_token_file``, else ``$PARITYSERVE_HOME/admin-token``, the home defaulting to
``~/.parityserve``). When none exists the server writes a fresh one, race-safely (O_EXCL,
mode 0600), so a client on the same host finds it with no configuration.

Before serving, ``vetted`` refuses a token shorter than ``MIN_TOKEN_CHARS`` (a guessable
token is an open admin API) and warns when the token file, or any other secret file
(``secret_files.warn_if_exposed``: the CURVE secret keys), may be read or written by others than its
owner: the token in it is still strong, and secrets mounted into a container (Kubernetes'
default mode 0644, Docker's 0444) are readable only by that container's one user, where a
refusal would stop a safe deployment.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from parityserve.config import Server
from parityserve.errors import ConfigError
from parityserve.runtime.workers.secret_files import warn_if_exposed

__all__ = ["ENV_HOME", "ENV_TOKEN", "MIN_TOKEN_CHARS", "AuthPolicy", "ResolvedToken",
           "authorized", "default_token_file", "read_token", "resolve_token", "token_file",
           "vetted", "write_new_token"]


ENV_TOKEN = "PARITYSERVE_ADMIN_TOKEN"
ENV_HOME = "PARITYSERVE_HOME"
MIN_TOKEN_CHARS = 32  # the generated token has 43 (32 random bytes)
_BEARER = "bearer "


@dataclass(frozen=True)
class ResolvedToken:
    """The token and where it came from; repr and str never show the token."""

    token: str = field(repr=False)
    source: str  # "config", "env", "file" or "generated"
    path: Path | None = None

    def where(self) -> str:
        """A sentence for the operator: where the token lives (never the token)."""
        if self.source == "config":
            return "admin token: from the config (server.admin_token)"
        if self.source == "env":
            return f"admin token: from ${ENV_TOKEN}"
        verb = "generated and stored in" if self.source == "generated" else "read from"
        return f"admin token: {verb} {self.path} (show it with `parityserve token --show`)"

    def __str__(self) -> str:
        return self.where()


@dataclass(frozen=True)
class AuthPolicy:
    """What the frontend asks of a request. ``token=None`` means admin is open (loopback only).

    There is no default instance: a library user must say which policy they want.
    """

    token: str | None = field(repr=False)
    protect_metrics: bool = False
    protect_inference: bool = False
    serve_admin: bool = True  # False when admin routes live on their own listener

    @classmethod
    def open(cls) -> AuthPolicy:
        """No token anywhere (``require_admin_token: false``; only on loopback)."""
        return cls(token=None)


def default_token_file(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    home = env.get(ENV_HOME) or str(Path("~/.parityserve").expanduser())
    return Path(home) / "admin-token"


def token_file(server: Server, base_dir: Path | None = None,
               env: Mapping[str, str] | None = None) -> Path:
    """The token file for ``server``; a relative path is resolved against the config folder."""
    if server.admin_token_file is None:
        return default_token_file(env)
    path = Path(server.admin_token_file).expanduser()
    return path if path.is_absolute() else (base_dir or Path.cwd()) / path


def read_token(path: Path) -> str | None:
    """The token stored at ``path``, or None when there is no (non-empty) file."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def write_new_token(path: Path, *, replace: bool = False) -> str:
    """Create ``path`` holding a new token (0600, folder 0700). Another writer's file wins."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    if replace:  # rotate: write beside it, then rename over (atomic for readers)
        tmp = path.with_name(path.name + f".{secrets.token_hex(4)}.tmp")
        _write_exclusive(tmp, token)
        os.replace(tmp, path)
        return token
    try:
        _write_exclusive(path, token)
    except FileExistsError:  # someone else created it first: use theirs
        theirs = read_token(path)
        if theirs is None:
            raise
        return theirs
    return token


def _write_exclusive(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")


def resolve_token(server: Server, base_dir: Path | None = None, *, create: bool = True,
                  env: Mapping[str, str] | None = None) -> ResolvedToken | None:
    """The admin token by the order above; generates the file if ``create`` and none exists."""
    env = os.environ if env is None else env
    if server.admin_token is not None:
        return ResolvedToken(server.admin_token.get_secret_value(), "config")
    if env.get(ENV_TOKEN):
        return ResolvedToken(env[ENV_TOKEN], "env")
    path = token_file(server, base_dir, env)
    found = read_token(path)
    if found is not None:
        return ResolvedToken(found, "file", path)
    if not create:
        return None
    return ResolvedToken(write_new_token(path), "generated", path)


@overload
def vetted(resolved: ResolvedToken) -> ResolvedToken: ...


@overload
def vetted(resolved: ResolvedToken | None) -> ResolvedToken | None: ...


def vetted(resolved: ResolvedToken | None) -> ResolvedToken | None:
    """``resolved``, fit to serve with: ``ConfigError`` when the token is too short, a
    warning when its file is open to others (see the module docstring for why each)."""
    if resolved is None:
        return None
    if len(resolved.token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{resolved.where()}: the token has {len(resolved.token)} characters, and a token "
            f"shorter than {MIN_TOKEN_CHARS} is refused (it could be guessed). Make one with "
            "`parityserve token --rotate` (the token file) or `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`")
    if resolved.path is not None:
        warn_if_exposed(resolved.path, "the admin token file")
    return resolved


def authorized(header: str | None, token: str) -> bool:
    """True when ``header`` is ``Bearer <token>``; compared in constant time."""
    if header is None or header[:len(_BEARER)].lower() != _BEARER:
        return False
    given = header[len(_BEARER):].strip()
    return hmac.compare_digest(given.encode(), token.encode())
