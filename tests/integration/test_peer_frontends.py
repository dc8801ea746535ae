"""Frontends on one Redis act as one server for admin changes (runtime/peers.py): separate
`parityserve start` processes on their own ports, as on separate hosts, one of them sharded.

The test runs a Redis of its own (redis-server from PATH, as scripts/redis.sh installs it),
because it stops and restarts it. Without redis-server it skips, except under CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import cli_server, wait_until

from parityserve.bench.ports import free_port

pytestmark = pytest.mark.integration

TOKEN = "peers-test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}


class RedisServer:
    """A private redis-server that the test may stop and start again (empty: --save "")."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--bind", "127.0.0.1", "--port",
                                      str(self.port), "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _answers(client), timeout_s=10)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        why = "redis-server is not on PATH (scripts/redis.sh ensure installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI needs Redis for these tests: {why}")
        pytest.skip(why)
    server = RedisServer(binary)
    server.start()
    yield server
    server.stop()


def _config(redis_url: str, namespace: str, frontends: int = 1) -> dict:
    return {"server": {"http_port": 0, "grpc_port": 0, "frontends": frontends,
                       "state_store": redis_url, "peers": {"namespace": namespace}},
            "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}]}


@pytest.fixture(scope="module")
def group(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict]:
    """Frontend A (2 shards) and frontend B (one process), on one Redis and namespace."""
    namespace = f"peers-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PARITYSERVE_ADMIN_TOKEN": TOKEN}
    with cli_server(tmp_path_factory.mktemp("a"), _config(redis_server.url, namespace, 2),
                    env) as (a, a_err), \
            cli_server(tmp_path_factory.mktemp("b"), _config(redis_server.url, namespace),
                       env) as (b, b_err):
        yield {"a": a, "b": b, "namespace": namespace, "env": env, "err": [a_err, b_err]}


def _parallelism(url: str) -> object:
    state = httpx.get(url + "/admin/state", headers=AUTH, timeout=10).json()
    return next(m for m in state["models"] if m["name"] == "noop")["parallelism"]


def _shard_parallelisms(url: str) -> set[object]:
    state = httpx.get(url + "/admin/state", headers=AUTH, timeout=10).json()
    return {next(m for m in shard["models"] if m["name"] == "noop")["parallelism"]
            for shard in state["shards"].values()}


def _set(url: str, parallelism: int) -> httpx.Response:
    return httpx.post(url + "/admin/models/noop/parallelism", json={"parallelism": parallelism},
                      headers=AUTH, timeout=30)


def test_a_change_through_one_frontend_reaches_the_other(group: dict) -> None:
    resp = _set(group["b"], 1)
    assert resp.status_code == 200
    assert resp.headers["x-parityserve-peers"].startswith("published:")
    wait_until(lambda: _shard_parallelisms(group["a"]) == {1}, timeout_s=10)  # both shards
    resp = _set(group["a"], 2)  # through whichever shard of A takes it
    assert resp.status_code == 200 and resp.headers["x-parityserve-fanout"] == "all"
    assert resp.headers["x-parityserve-peers"].startswith("published:")
    wait_until(lambda: _parallelism(group["b"]) == 2, timeout_s=10)
    time.sleep(0.5)  # and it stays: no later entry, replayed or reapplied, undoes it
    assert _shard_parallelisms(group["a"]) == {2} and _parallelism(group["b"]) == 2
    for err in group["err"]:  # no change was refused or skipped on the way
        assert "admin stream" not in err.read_text()


def test_a_frontend_started_later_replays_the_changes_before_it_serves(
        group: dict, redis_server: RedisServer, tmp_path: Path) -> None:
    assert _set(group["a"], 3).status_code == 200
    late, apart = tmp_path / "late", tmp_path / "apart"
    late.mkdir()
    apart.mkdir()
    with cli_server(late, _config(redis_server.url, group["namespace"]), group["env"]) as (
            url, _err):
        assert _parallelism(url) == 3  # at its first answer: replayed before it served
    with cli_server(apart, _config(redis_server.url, "another-deployment"), group["env"]) as (
            url, _err):
        assert _parallelism(url) is None  # another namespace shares nothing


def test_with_redis_down_a_change_is_refused_and_applied_nowhere(
        group: dict, redis_server: RedisServer) -> None:
    assert _set(group["b"], 4).status_code == 200
    wait_until(lambda: _shard_parallelisms(group["a"]) == {4}, timeout_s=10)
    redis_server.stop()
    try:
        resp = _set(group["a"], 1)
        assert resp.status_code == 503 and resp.json()["code"] == "peers_unavailable"
        assert _shard_parallelisms(group["a"]) == {4} and _parallelism(group["b"]) == 4
        # inference does not wait for the stream
        infer = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                             "data": [1, 2]}]}
        assert httpx.post(group["b"] + "/v2/models/noop/infer", json=infer,
                          timeout=10).status_code == 200
    finally:
        redis_server.start()  # empty: what it held is gone, the followers go on after it
    wait_until(lambda: _set(group["a"], 5).status_code == 200, timeout_s=10)
    wait_until(lambda: _parallelism(group["b"]) == 5, timeout_s=10)
    said = group["err"][1].read_text()  # B's log: the outage, and what it lost in it
    assert "cannot read the admin stream" in said and "made anew" in said
