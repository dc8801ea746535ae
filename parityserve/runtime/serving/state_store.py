"""Where model-selection state lives: one JSON object per key, with atomic per-key updates.

The selection layer keeps a small state dict per (application, context), e.g. bandit weights
per user. ``Server.state_store`` names the store:

- ``memory``: a dict in this process (the default; lost on restart).
- ``sqlite:PATH``: a SQLite file (WAL mode), relative to the deployment's base directory. A
  restarted frontend resumes the learned state; several processes on one host may share it.
- ``redis://HOST:PORT/DB``: a Redis server, so that several frontends share one state.

Every call blocks; the asyncio runtime calls them through ``asyncio.to_thread``. ``update`` is
an atomic read-modify-write of one key: ``fn`` gets the current state (``None`` when the key is
missing) and returns the new one. ``fn`` must be quick, free of side effects and must not use
the store: Redis may call it again when another writer got there first.

States are stored as JSON (orjson; numpy arrays and scalars become lists and numbers), and
every store returns fresh copies, so all three behave alike. A stored value that is not a JSON
object is treated as missing and logged, never raised on the serving path. Problems found when
opening a store raise ``ConfigError``; a backend that fails later raises ``Unavailable``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable
from urllib.parse import urlsplit

import orjson

from parityserve.errors import ConfigError, Unavailable

__all__ = [
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "StateStore",
    "StoreStatistics",
    "open_store",
]

log = logging.getLogger(__name__)

State = dict[str, Any]
UpdateFn = Callable[[State | None], State]

_SPEC_HELP = "expected 'memory', 'sqlite:PATH' or 'redis://HOST:PORT/DB'"
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@runtime_checkable
class StateStore(Protocol):
    """Per-key JSON state with atomic read-modify-write."""

    description: str

    def get(self, key: str) -> State | None: ...

    def update(self, key: str, fn: UpdateFn) -> State: ...

    def delete_prefix(self, prefix: str) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class StoreStatistics:
    description: str
    gets: int
    updates: int
    deletes: int
    corrupt: int
    conflicts: int


def open_store(spec: str, *, base_dir: Path | None = None) -> StateStore:
    """The store that ``spec`` names; a relative SQLite path is taken from ``base_dir``."""
    spec = spec.strip()
    if spec == "memory":
        return MemoryStore()
    if spec.startswith("sqlite:"):
        return SQLiteStore(_sqlite_path(spec, base_dir))
    if spec.startswith(("redis://", "rediss://")):
        return RedisStore(spec)
    raise ConfigError(f"state_store {spec!r}: {_SPEC_HELP}")


def _sqlite_path(spec: str, base_dir: Path | None) -> Path:
    raw = spec.removeprefix("sqlite:").strip()
    if not raw:
        raise ConfigError(f"state_store {spec!r}: the SQLite store needs a path (sqlite:PATH)")
    if raw == ":memory:":
        raise ConfigError(f"state_store {spec!r}: use 'memory' for a store inside the process")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return path


# -- JSON --------------------------------------------------------------------------------------


def _encode(state: State, key: str) -> bytes:
    if not isinstance(state, dict):
        raise TypeError(f"state for {key!r} must be a dict, got {type(state).__name__}")
    return orjson.dumps(state, option=_JSON_OPTIONS)


def _loads(data: bytes) -> State:
    """A fresh copy of a state that ``_encode`` wrote."""
    state: State = orjson.loads(data)
    return state


class _Base:
    """Shared counters and the decoding that turns a corrupt value into 'missing'."""

    description: str

    def __init__(self, description: str) -> None:
        self.description = description
        self._counts = {"gets": 0, "updates": 0, "deletes": 0, "corrupt": 0, "conflicts": 0}
        self._counts_lock = threading.Lock()

    def statistics(self) -> StoreStatistics:
        with self._counts_lock:
            return StoreStatistics(description=self.description, **self._counts)

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += n

    def _decode(self, key: str, raw: bytes | str | None) -> State | None:
        if raw is None:
            return None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            self._corrupt(key, f"invalid JSON ({exc})")
            return None
        if not isinstance(value, dict):
            self._corrupt(key, f"a JSON {type(value).__name__}, not an object")
            return None
        return value

    def _corrupt(self, key: str, why: str) -> None:
        self._count("corrupt")
        log.warning("state store %s: ignoring the stored state of %r: %s",
                    self.description, key, why)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass


# -- memory ------------------------------------------------------------------------------------


class MemoryStore(_Base):
    """A dict guarded by a lock. States are kept as JSON so that callers get copies."""

    def __init__(self) -> None:
        super().__init__("memory")
        self._data: dict[str, bytes] = {}
        self._lock = threading.RLock()

    def get(self, key: str) -> State | None:
        with self._lock:
            self._count("gets")
            return self._decode(key, self._data.get(key))

    def update(self, key: str, fn: UpdateFn) -> State:
        with self._lock:
            data = _encode(fn(self._decode(key, self._data.get(key))), key)
            self._data[key] = data
            self._count("updates")
        return _loads(data)

    def delete_prefix(self, prefix: str) -> int:
        with self._lock:
            doomed = [key for key in self._data if key.startswith(prefix)]
            for key in doomed:
                del self._data[key]
            self._count("deletes", len(doomed))
        return len(doomed)


# -- SQLite ------------------------------------------------------------------------------------

_SCHEMA = ("CREATE TABLE IF NOT EXISTS state "
           "(key TEXT PRIMARY KEY, value TEXT NOT NULL, updated REAL NOT NULL)")
_UPSERT = ("INSERT INTO state (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key) "
           "DO UPDATE SET value = excluded.value, updated = excluded.updated")


class SQLiteStore(_Base):
    """One SQLite file in WAL mode. ``BEGIN IMMEDIATE`` takes the write lock before the read,
    so no update is lost between threads or processes."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        super().__init__(f"sqlite:{self.path}")
        self._lock = threading.RLock()
        self._conn = self._open(busy_timeout_s)

    def _open(self, busy_timeout_s: float) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            conn.execute("BEGIN IMMEDIATE")  # proves that we may write, now rather than later
            conn.execute("COMMIT")
        except (OSError, sqlite3.Error) as exc:
            if conn is not None:
                conn.close()
            raise ConfigError(f"state store {self.description}: cannot open a writable "
                              f"SQLite database there: {exc}") from exc
        return conn

    @contextmanager
    def _backend(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise Unavailable(f"state store {self.description}: {exc}") from exc

    def _read(self, key: str) -> State | None:
        with self._backend():
            row = self._conn.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return self._decode(key, row[0] if row else None)

    def get(self, key: str) -> State | None:
        with self._lock:
            self._count("gets")
            return self._read(key)

    def update(self, key: str, fn: UpdateFn) -> State:
        with self._lock:
            with self._backend():
                self._conn.execute("BEGIN IMMEDIATE")
            try:
                data = _encode(fn(self._read(key)), key)
                with self._backend():
                    self._conn.execute(_UPSERT, (key, data.decode(), time.time()))
                    self._conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            self._count("updates")
        return _loads(data)

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.warning("state store %s: rollback failed", self.description, exc_info=True)

    def delete_prefix(self, prefix: str) -> int:
        with self._lock, self._backend():
            cursor = self._conn.execute(
                "DELETE FROM state WHERE substr(key, 1, length(?)) = ?", (prefix, prefix))
            self._count("deletes", cursor.rowcount)
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._conn.close()


# -- Redis -------------------------------------------------------------------------------------

_MAX_ATTEMPTS = 1000


class RedisStore(_Base):
    """Keys under ``namespace`` in one Redis database. ``update`` is an optimistic
    WATCH/MULTI/EXEC transaction, retried when another writer changed the key first."""

    def __init__(self, url: str, *, namespace: str = "parityserve:state:",
                 connect_timeout_s: float = 2.0, timeout_s: float = 5.0) -> None:
        super().__init__(_redacted(url))
        _check_redis_url(url, self.description)
        self.namespace = namespace
        self._redis = _redis_module(self.description)
        self._client = self._connect(url, connect_timeout_s, timeout_s)

    def _connect(self, url: str, connect_timeout_s: float, timeout_s: float) -> Any:
        redis = self._redis
        retry = redis.retry.Retry(
            redis.backoff.ExponentialWithJitterBackoff(base=0.01, cap=0.2), retries=2)
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=connect_timeout_s,
                                          socket_timeout=timeout_s, retry=retry)
        except ValueError as exc:
            raise ConfigError(f"state store {self.description}: bad Redis URL: {exc}") from exc
        try:
            client.ping()
        except redis.RedisError as exc:
            client.close()
            raise ConfigError(f"state store {self.description}: cannot reach Redis: "
                              f"{exc}") from exc
        return client

    @contextmanager
    def _backend(self) -> Iterator[None]:
        try:
            yield
        except self._redis.RedisError as exc:
            raise Unavailable(f"state store {self.description}: {exc}") from exc

    def get(self, key: str) -> State | None:
        with self._backend():
            raw = self._client.get(self.namespace + key)
        self._count("gets")
        return self._decode(key, raw)

    def update(self, key: str, fn: UpdateFn) -> State:
        name = self.namespace + key
        with self._backend(), self._client.pipeline(transaction=True) as pipe:
            for _ in range(_MAX_ATTEMPTS):
                data = self._try_update(pipe, name, key, fn)
                if data is not None:
                    self._count("updates")
                    return _loads(data)
                self._count("conflicts")
        raise Unavailable(f"state store {self.description}: gave up on {key!r} after "
                          f"{_MAX_ATTEMPTS} conflicting writes")

    def _try_update(self, pipe: Any, name: str, key: str, fn: UpdateFn) -> bytes | None:
        """One optimistic attempt: the bytes written, or None when another writer won."""
        try:
            pipe.watch(name)
            data = _encode(fn(self._decode(key, pipe.get(name))), key)
            pipe.multi()
            pipe.set(name, data)
            pipe.execute()
        except self._redis.WatchError:
            return None
        finally:
            pipe.reset()
        return data

    def delete_prefix(self, prefix: str) -> int:
        pattern = _glob_escape(self.namespace + prefix) + "*"
        deleted = 0
        with self._backend():
            batch: list[bytes] = []
            for name in self._client.scan_iter(match=pattern, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    deleted += self._client.unlink(*batch)
                    batch.clear()
            if batch:
                deleted += self._client.unlink(*batch)
        self._count("deletes", deleted)
        return deleted

    def close(self) -> None:
        self._client.close()


def _redis_module(description: str) -> Any:
    try:
        import redis
        import redis.backoff
        import redis.retry
    except ImportError as exc:
        raise ConfigError(f"state store {description} needs redis-py: "
                          "pip install 'parityserve[redis]'") from exc
    return redis


def _check_redis_url(url: str, description: str) -> None:
    """redis-py quietly falls back to db 0 on a garbled path; a typo should be an error."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"state store {description}: bad Redis URL: {exc}") from exc
    db = parts.path.strip("/")
    problem = ("expected redis://HOST:PORT/DB" if parts.scheme not in ("redis", "rediss")
               else "no host" if not parts.hostname
               else f"port {port} is out of range" if port is not None and not 0 < port < 65536
               else f"database {db!r} is not a number" if db and not (db.isascii() and db.isdigit())
               else None)
    if problem:
        raise ConfigError(f"state store {description}: bad Redis URL: {problem}")


def _redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def _glob_escape(text: str) -> str:
    """Escape Redis glob metacharacters so that SCAN MATCH takes ``text`` literally."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
