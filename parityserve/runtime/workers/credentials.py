"""Which CURVE keys the worker channel accepts, and one keypair per launched replica.

A replica's key is bound to its id when it is launched and revoked when it leaves, so a worker
that is gone cannot come back under its old id, nor under another replica's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from parityserve.config import Server
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys

__all__ = ["ReplicaCredentials", "server_keys"]


class Binder(Protocol):
    """What of the worker link binds replica ids to keys (``WorkerLink``)."""

    def expect(self, replica_id: str, public_key: bytes) -> None: ...

    def forget(self, replica_id: str) -> None: ...


def server_keys(server: Server, base_dir: Path | None) -> ServerKeys | None:
    """The CURVE keys workers must present: from ``worker_keys_dir`` (for workers started
    elsewhere), else made now in memory (local workers get theirs at launch). None: worker
    authentication is off."""
    if not server.worker_auth:
        return None
    if server.worker_keys_dir is None:
        return ServerKeys.in_memory()
    folder = Path(server.worker_keys_dir)
    if not folder.is_absolute() and base_dir is not None:
        folder = base_dir / folder
    return ServerKeys.from_dir(folder)


class ReplicaCredentials:
    """Issues and revokes the keys of the replicas this frontend launches."""

    def __init__(self, keys: ServerKeys | None, link: Binder) -> None:
        self.keys = keys
        self.link = link
        self.issued: dict[str, bytes] = {}  # launched replica id -> its public key

    def issue(self, rid: str) -> ClientKeys | None:
        """A fresh keypair for one launched replica, admitted and bound to its id."""
        if self.keys is None:
            return None
        keys = self.keys.client()
        self.issued[rid] = keys.public
        self.link.expect(rid, keys.public)
        return keys

    def revoke(self, rid: str) -> None:
        """A replica left: its id and its key stop being accepted."""
        public = self.issued.pop(rid, None)
        if public is not None and self.keys is not None:
            self.keys.revoke(public)
        self.link.forget(rid)
