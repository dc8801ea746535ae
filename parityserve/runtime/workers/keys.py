"""CURVE keys for the worker channel: who the frontend is, and which workers it lets in.

ZeroMQ CURVE encrypts the channel and authenticates both ends: a worker must know the frontend's
public key (so nobody can pose as the frontend), and the frontend admits only workers whose
public key it allows (so nobody can pose as a worker). Keys are z85 text, as
``zmq.curve_keypair`` and ``zmq.auth.create_certificates`` make them.

Layout of ``server.worker_keys_dir`` (``parityserve keys generate`` writes it):

- ``server.key_secret``: the frontend's keypair (stays on the frontend host, mode 0600);
- ``server.key``: its public half, copied to every worker host (``--server-key``);
- ``<name>.key`` / ``<name>.key_secret``: one keypair per remote worker; the worker host gets
  the ``.key_secret`` file (``--client-key``), the frontend admits every ``*.key`` in the folder.

Local workers need none of this: the frontend makes one keypair per replica in memory and hands
it over in an environment variable (never on argv, which any user can read with ``ps``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import zmq
import zmq.auth

from parityserve.errors import ConfigError
from parityserve.runtime.workers.secret_files import warn_if_exposed

__all__ = [
    "ENV_VAR",
    "SERVER_NAME",
    "ClientKeys",
    "ServerKeys",
    "generate",
    "new_client_keys",
]

ENV_VAR = "PARITYSERVE_WORKER_KEYS"  # how a launched worker receives its keys
SERVER_NAME = "server"


@dataclass
class ServerKeys:
    """The frontend's keypair and the worker public keys it admits (z85 bytes).

    ``allowed`` grows at run time: each locally launched replica gets a fresh keypair.
    """

    public: bytes
    secret: bytes
    allowed: set[bytes] = field(default_factory=set)

    @classmethod
    def in_memory(cls) -> ServerKeys:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def from_dir(cls, folder: str | Path) -> ServerKeys:
        """The server keypair in ``folder`` and every other ``*.key`` there as an allowed worker."""
        root = Path(folder)
        server = root / f"{SERVER_NAME}.key_secret"
        if not server.is_file():
            raise ConfigError(f"server.worker_keys_dir {root} has no {server.name}; make one "
                              f"with `parityserve keys generate --dir {root}`")
        public, secret = _load(server, need_secret=True)
        assert secret is not None
        allowed = {_load(p, need_secret=False)[0] for p in sorted(root.glob("*.key"))
                   if p.stem != SERVER_NAME}
        return cls(public, secret, allowed)

    def client(self) -> ClientKeys:
        """A fresh worker keypair, admitted from now on."""
        keys = new_client_keys(self.public)
        self.allowed.add(keys.public)
        return keys

    def revoke(self, public: bytes) -> None:
        self.allowed.discard(public)


@dataclass(frozen=True)
class ClientKeys:
    """What a worker needs: the frontend's public key and its own keypair (z85 bytes)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, server_key: str | Path, client_key: str | Path) -> ClientKeys:
        server_public, _ = _load(Path(server_key), need_secret=False)
        public, secret = _load(Path(client_key), need_secret=True)
        assert secret is not None
        return cls(server_public, public, secret)

    def to_env(self) -> str:
        return orjson.dumps({"server": self.server_public.decode(), "public": self.public.decode(),
                             "secret": self.secret.decode()}).decode()

    @classmethod
    def from_env(cls, text: str) -> ClientKeys:
        try:
            raw = orjson.loads(text)
            return cls(raw["server"].encode(), raw["public"].encode(), raw["secret"].encode())
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"${ENV_VAR} does not hold worker keys: {exc}") from exc


def new_client_keys(server_public: bytes) -> ClientKeys:
    public, secret = zmq.curve_keypair()
    return ClientKeys(server_public, public, secret)


def generate(folder: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``name.key`` (public) and ``name.key_secret`` (0600) into ``folder``."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    public, secret = (Path(p) for p in zmq.auth.create_certificates(root, name))
    os.chmod(secret, 0o600)
    return public, secret


def _load(path: Path, *, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CURVE key file {path}: {exc}") from exc
    if need_secret and not secret:
        raise ConfigError(f"{path} holds no secret key; pass the .key_secret file")
    if need_secret:  # auth's module docstring says why a warning, not a refusal
        warn_if_exposed(path, "the CURVE secret key file")
    return public, secret
