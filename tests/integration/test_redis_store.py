"""The Redis selection-state store against a real Redis (``make test`` starts one with
``scripts/redis.sh`` and sets PARITYSERVE_REDIS_URL). Without one these tests skip, except
under CI (CI=true), where a missing Redis is a failure rather than a quiet green."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from parityserve.bench.ports import free_port
from parityserve.errors import ConfigError, Unavailable
from parityserve.runtime.serving.state_store import RedisStore, open_store

pytestmark = pytest.mark.integration


def bump(state: dict[str, Any] | None) -> dict[str, Any]:
    return {"n": (state or {}).get("n", 0) + 1}


@pytest.fixture(scope="module")
def redis_url() -> str:
    url = os.environ.get("PARITYSERVE_REDIS_URL")
    if url:
        return url
    why = ("PARITYSERVE_REDIS_URL is not set: run `make test`, or `scripts/redis.sh ensure && "
           "scripts/redis.sh start` and export PARITYSERVE_REDIS_URL=redis://127.0.0.1:6390/0")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs Redis for these tests; {why}")
    pytest.skip(why)


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A namespace of its own per test, emptied afterwards."""
    ns = f"parityserve-test:{uuid.uuid4().hex}:"
    yield ns
    with RedisStore(redis_url, namespace=ns) as store:
        store.delete_prefix("")


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[RedisStore]:
    with RedisStore(redis_url, namespace=namespace) as opened:
        yield opened


def test_open_store_reads_a_redis_url(redis_url: str) -> None:
    key = f"test-open/{uuid.uuid4().hex}"
    with open_store(redis_url) as store:
        assert isinstance(store, RedisStore)
        assert store.description == redis_url
        assert store.update(key, bump) == {"n": 1}
        assert store._client.exists(f"parityserve:state:{key}") == 1  # the default namespace
        assert store.delete_prefix(key) == 1


def test_get_update_and_copies(store: RedisStore) -> None:
    assert store.get("app/u") is None
    assert store.update("app/u", lambda s: {"w": [0.5, 0.5], "t": 1}) == {"w": [0.5, 0.5], "t": 1}
    seen = []

    def fn(state: dict[str, Any] | None) -> dict[str, Any]:
        seen.append(state)
        return {**(state or {}), "t": (state or {})["t"] + 1}

    assert store.update("app/u", fn)["t"] == 2
    assert seen == [{"w": [0.5, 0.5], "t": 1}]
    store.get("app/u")["w"].append(9)
    assert store.get("app/u") == {"w": [0.5, 0.5], "t": 2}


def test_a_failing_update_changes_nothing(store: RedisStore) -> None:
    store.update("k", bump)

    def boom(state: dict[str, Any] | None) -> dict[str, Any]:
        raise RuntimeError("policy bug")

    with pytest.raises(RuntimeError, match="policy bug"):
        store.update("k", boom)
    with pytest.raises(TypeError, match="must be a dict"):
        store.update("k", lambda _: "nope")
    assert store.update("k", bump) == {"n": 2}


def test_update_is_atomic_across_threads(store: RedisStore) -> None:
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
    stats = store.statistics()
    assert stats.updates == threads * rounds  # conflicts were retried, not lost


def test_two_frontends_share_state(redis_url: str, namespace: str) -> None:
    with RedisStore(redis_url, namespace=namespace) as one, \
            RedisStore(redis_url, namespace=namespace) as two:
        errors: list[BaseException] = []

        def work(store: RedisStore) -> None:
            try:
                for _ in range(150):
                    store.update("app/user-7", bump)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(s,)) for s in (one, two, one, two)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        assert one.get("app/user-7") == two.get("app/user-7") == {"n": 600}


def test_a_restarted_frontend_resumes(redis_url: str, namespace: str) -> None:
    with RedisStore(redis_url, namespace=namespace) as first:
        first.update("app/u", lambda _: {"weights": [0.2, 0.8]})
    with RedisStore(redis_url, namespace=namespace) as second:
        assert second.get("app/u") == {"weights": [0.2, 0.8]}


def test_namespaces_keep_stores_apart(redis_url: str, namespace: str) -> None:
    with RedisStore(redis_url, namespace=namespace + "a:") as a, \
            RedisStore(redis_url, namespace=namespace + "b:") as b:
        a.update("k", bump)
        assert b.get("k") is None


def test_delete_prefix(store: RedisStore) -> None:
    for key in ("app1/u1", "app1/u2", "app1x/u1", "app2/u1", "app*/u1", "app[1]/u1"):
        store.update(key, bump)
    assert store.delete_prefix("app1/") == 2
    assert store.get("app1/u1") is None and store.get("app1x/u1") == {"n": 1}
    assert store.delete_prefix("app*/") == 1  # glob characters are literal
    assert store.delete_prefix("app[1]/") == 1
    assert store.get("app2/u1") == {"n": 1}
    assert store.delete_prefix("none/") == 0


def test_delete_prefix_handles_many_keys(store: RedisStore) -> None:
    for i in range(1200):
        store._client.set(f"{store.namespace}big/{i}", b'{"n": 1}')
    assert store.delete_prefix("big/") == 1200
    assert store.get("big/7") is None


@pytest.mark.parametrize("raw", [b"{not json", b"[1]", b"\xff"])
def test_corrupt_state_reads_as_missing(
        store: RedisStore, caplog: pytest.LogCaptureFixture, raw: bytes) -> None:
    store._client.set(store.namespace + "app/u", raw)
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.serving.state_store"):
        assert store.get("app/u") is None
        assert store.update("app/u", bump) == {"n": 1}
    assert "ignoring the stored state of 'app/u'" in caplog.text
    assert store.get("app/u") == {"n": 1}


def test_unreachable_redis_is_a_quick_config_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=f"state store {url}: cannot reach Redis"):
        open_store(url)
    assert time.monotonic() - started < 3.0


def test_redis_going_away_later_is_unavailable(redis_url: str, namespace: str) -> None:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not on PATH (scripts/redis.sh ensure installs it)")
    port = free_port()
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        store = _open_when_up(f"redis://127.0.0.1:{port}/0", namespace)
        store.update("k", bump)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    started = time.monotonic()
    with pytest.raises(Unavailable, match=f"state store redis://127.0.0.1:{port}/0"):
        store.get("k")
    with pytest.raises(Unavailable):
        store.update("k", bump)
    assert time.monotonic() - started < 3.0
    store.close()


def _open_when_up(url: str, namespace: str) -> RedisStore:
    deadline = time.monotonic() + 10
    while True:
        try:
            return RedisStore(url, namespace=namespace)
        except ConfigError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
