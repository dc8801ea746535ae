"""The in-process and SQLite selection-state stores: semantics, atomicity, restarts, bad specs."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parityserve.errors import ConfigError, Unavailable
from parityserve.runtime.serving.state_store import (
    MemoryStore,
    SQLiteStore,
    StateStore,
    open_store,
)

StoreFactory = Callable[[], StateStore]


def bump(state: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": (state or {}).get("n", 0) + 1}


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores of one kind; with SQLite every store opens the same file."""
    opened: list[StateStore] = []

    def make() -> StateStore:
        spec = "memory" if request.param == "memory" else "sqlite:state/selection.db"
        store = open_store(spec, base_dir=tmp_path)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_missing_key_reads_as_none(make_store: StoreFactory) -> None:
    assert make_store().get("app/user-1") is None


def test_update_sees_the_previous_state_and_returns_the_new_one(
        make_store: StoreFactory) -> None:
    store = make_store()
    seen: list[dict[str, Any] | None] = []

    def fn(state: dict[str, Any] | None) -> dict[str, Any]:
        seen.append(state)
        return {"weights": [0.5, 0.5], "rounds": (state or {}).get("rounds", 0) + 1}

    assert store.update("app/u", fn) == {"weights": [0.5, 0.5], "rounds": 1}
    assert store.update("app/u", fn) == {"weights": [0.5, 0.5], "rounds": 2}
    assert seen == [None, {"weights": [0.5, 0.5], "rounds": 1}]
    assert store.get("app/u") == {"weights": [0.5, 0.5], "rounds": 2}


def test_states_are_copies(make_store: StoreFactory) -> None:
    store = make_store()
    returned = store.update("k", lambda _: {"w": [1.0]})
    returned["w"].append(2.0)
    store.get("k")["w"].append(3.0)
    assert store.get("k") == {"w": [1.0]}


def test_numpy_values_are_stored_as_json(make_store: StoreFactory) -> None:
    store = make_store()
    state = store.update("k", lambda _: {"w": np.array([0.25, 0.75]), "t": np.int64(3)})
    assert state == {"w": [0.25, 0.75], "t": 3}


def test_a_failing_update_changes_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    store.update("k", bump)

    def boom(state: dict[str, Any] | None) -> dict[str, Any]:
        raise RuntimeError("policy bug")

    with pytest.raises(RuntimeError, match="policy bug"):
        store.update("k", boom)
    with pytest.raises(TypeError, match="must be a dict"):
        store.update("k", lambda _: [1, 2])
    with pytest.raises(TypeError):
        store.update("k", lambda _: {"x": object()})
    assert store.get("k") == {"n": 1}
    assert store.update("k", bump) == {"n": 2}  # the store still works


def test_delete_prefix_removes_one_application(make_store: StoreFactory) -> None:
    store = make_store()
    for key in ("app1/u1", "app1/u2", "app1x/u1", "app2/u1", "app_%/u1"):
        store.update(key, bump)
    assert store.delete_prefix("app1/") == 2
    assert store.get("app1/u1") is None and store.get("app1/u2") is None
    assert store.get("app1x/u1") == {"n": 1}
    assert store.delete_prefix("app_%/") == 1  # LIKE/glob characters are literal
    assert store.get("app2/u1") == {"n": 1}
    assert store.delete_prefix("nothing/") == 0


def test_update_is_atomic_across_threads(make_store: StoreFactory) -> None:
    store = make_store()
    threads, rounds = 8, 200

    def work() -> None:
        for _ in range(rounds):
            store.update("counter", bump)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert store.get("counter") == {"n": threads * rounds}


def test_statistics_count_the_calls(make_store: StoreFactory) -> None:
    store = make_store()
    store.update("a", bump)
    store.get("a")
    store.delete_prefix("a")
    stats = store.statistics()
    assert (stats.updates, stats.gets, stats.deletes, stats.corrupt) == (1, 1, 1, 0)


def test_the_protocol_is_satisfied() -> None:
    assert isinstance(MemoryStore(), StateStore)


# -- SQLite only -------------------------------------------------------------------------------


def test_sqlite_state_survives_a_restart(tmp_path: Path) -> None:
    with open_store("sqlite:s.db", base_dir=tmp_path) as store:
        store.update("app/u", lambda _: {"weights": [0.1, 0.9]})
    with open_store("sqlite:s.db", base_dir=tmp_path) as again:
        assert again.get("app/u") == {"weights": [0.1, 0.9]}
        assert again.description == f"sqlite:{tmp_path / 's.db'}"


def test_two_sqlite_stores_on_one_file_see_each_other(tmp_path: Path) -> None:
    one, two = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    one.update("k", bump)
    assert two.update("k", bump) == {"n": 2}
    assert one.get("k") == {"n": 2}
    one.close()
    two.close()


_INCREMENT_SCRIPT = textwrap.dedent("""
    import sys
    from parityserve.runtime.serving.state_store import SQLiteStore
    store = SQLiteStore(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        store.update("counter", lambda s: {"n": (s or {}).get("n", 0) + 1})
    store.close()
""")


def test_sqlite_update_is_atomic_across_processes(tmp_path: Path) -> None:
    path, rounds = tmp_path / "shared.db", 200
    SQLiteStore(path).close()  # create the schema before the race
    procs = [subprocess.Popen([sys.executable, "-c", _INCREMENT_SCRIPT, str(path), str(rounds)],
                              stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    with SQLiteStore(path) as store:
        assert store.get("counter") == {"n": 2 * rounds}


def _write_raw(path: Path, key: str, value: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?, 0)", (key, value))
    conn.close()


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", "42", ""])
def test_corrupt_sqlite_state_reads_as_missing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    _write_raw(path, "app/u", raw)
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.serving.state_store"):
        assert store.get("app/u") is None
        assert store.update("app/u", bump) == {"n": 1}  # overwritten with a good state
    assert "ignoring the stored state of 'app/u'" in caplog.text
    assert store.get("app/u") == {"n": 1}
    assert store.statistics().corrupt == 2
    store.close()


def test_corrupt_memory_state_reads_as_missing(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    store._data["k"] = b"\xff garbage"
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.serving.state_store"):
        assert store.get("k") is None
    assert "ignoring the stored state of 'k'" in caplog.text


def test_relative_sqlite_paths_follow_base_dir(tmp_path: Path) -> None:
    with open_store("sqlite:deep/er/s.db", base_dir=tmp_path):
        pass
    assert (tmp_path / "deep" / "er" / "s.db").is_file()


# -- specs -------------------------------------------------------------------------------------


def test_memory_is_the_plain_spec() -> None:
    store = open_store(" memory ")
    assert isinstance(store, MemoryStore) and store.description == "memory"


@pytest.mark.parametrize(("spec", "message"), [
    ("", "expected 'memory', 'sqlite:PATH' or 'redis://HOST:PORT/DB'"),
    ("Memory", "expected 'memory'"),
    ("postgres://db/x", "expected 'memory'"),
    ("sqlite:", "needs a path"),
    ("sqlite::memory:", "use 'memory'"),
    ("redis://localhost:port/0", "bad Redis URL"),
    ("redis://localhost:6379/zero", "database 'zero' is not a number"),
    ("redis://:6379/0", "no host"),
    ("redis://localhost:99999/0", "bad Redis URL"),
])
def test_bad_specs_are_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(spec)


def test_unwritable_sqlite_paths_are_config_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="sqlite:.*cannot open a writable SQLite"):
        open_store("sqlite:a-file/s.db", base_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot open a writable SQLite"):
        open_store(f"sqlite:{tmp_path}")  # a directory, not a file
    with pytest.raises(ConfigError, match="cannot open a writable SQLite"):
        open_store("sqlite:s.db", base_dir=blocker)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes")
def test_a_readonly_sqlite_file_is_a_config_error(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    SQLiteStore(folder / "s.db").close()
    (folder / "s.db").chmod(0o444)
    folder.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot open a writable SQLite"):
            open_store("sqlite:ro/s.db", base_dir=tmp_path)
    finally:
        folder.chmod(0o755)


def test_redis_urls_hide_their_password() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("redis://user:hunter2@localhost:6379/db")
    assert "hunter2" not in str(info.value) and "user:***@localhost" in str(info.value)


def test_a_failing_sqlite_backend_is_unavailable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store._conn.close()  # as if the database had gone away under a running frontend
    with pytest.raises(Unavailable, match="state store sqlite:"):
        store.get("k")
    with pytest.raises(Unavailable):
        store.update("k", bump)
