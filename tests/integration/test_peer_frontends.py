"""Frontends on one Redis act as one server for admin changes (runtime/cluster/peers.py): separate
`parityserve start` processes on their own ports, as on separate hosts, one of them sharded.

The test runs a Redis of its own (redis-server from PATH, as scripts/redis.sh installs it),
because it stops and restarts it. Without redis-server it skips, except under CI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


# -- replays and forgeries through Redis, and selection state mangled in it (issue 38) --------


def _apps(url: str, headers: dict[str, str] | None = None) -> set[str]:
    state = httpx.get(url + "/admin/state", headers=headers or {}, timeout=10).json()
    return {app["name"] for app in state["applications"]}


def _stream(redis_url: str, namespace: str) -> tuple[redis.Redis, str]:
    return redis.Redis.from_url(redis_url), f"parityserve:{namespace}:admin"


def _entry(redis_url: str, namespace: str, entry_id: str) -> dict[bytes, bytes]:
    client, stream = _stream(redis_url, namespace)
    with client:
        [(_id, fields)] = client.xrange(stream, entry_id, entry_id)
    return fields


def _append(redis_url: str, namespace: str, fields: dict[bytes, bytes]) -> str:
    """What a writer to the Redis (not a frontend) appends: Redis picks the id."""
    client, stream = _stream(redis_url, namespace)
    with client:
        return client.xadd(stream, fields).decode()


def _skipped_or(err: list[Path], entry_id: str, applied: Any) -> bool:
    """Every frontend logged that it skipped ``entry_id``, or one of them applied it."""
    return applied() or all(f"skipping entry {entry_id}" in e.read_text() for e in err)


def test_a_signed_change_re_appended_to_the_stream_is_not_applied_again(
        group: dict, redis_server: RedisServer) -> None:
    a, b, app = group["a"], group["b"], {"name": "app1", "models": ["noop"]}
    assert httpx.post(a + "/admin/applications", json=app, headers=AUTH,
                      timeout=30).status_code == 201
    wait_until(lambda: "app1" in _apps(b, AUTH), timeout_s=10)
    deleted = httpx.delete(a + "/admin/applications/app1", headers=AUTH, timeout=30)
    assert deleted.status_code == 200
    wait_until(lambda: "app1" not in _apps(b, AUTH), timeout_s=10)
    old = _entry(redis_server.url, group["namespace"],
                 deleted.headers["x-parityserve-peers"].removeprefix("published:"))
    assert httpx.post(a + "/admin/applications", json=app, headers=AUTH,
                      timeout=30).status_code == 201
    wait_until(lambda: "app1" in _apps(b, AUTH), timeout_s=10)
    copy = _append(redis_server.url, group["namespace"], old)  # the old DELETE, once more
    wait_until(lambda: _skipped_or(group["err"], copy, lambda: "app1" not in _apps(b, AUTH)),
               timeout_s=10)
    assert "app1" in _apps(a, AUTH) and "app1" in _apps(b, AUTH)


@pytest.mark.parametrize("record", [
    {"log_weights": "x"},
    {"log_weights": {"noop": "heavy"}},
    {"log_weights": {"noop": None}},
    {"feedback": [1]},
    {"feedback": {"noop": "often"}},
    {"loss_sum": {"noop": [0.5]}},
    {"rounds": "many"},
    {"models": 7},
])
def test_a_type_mangled_selection_record_gets_a_normal_answer(
        group: dict, redis_server: RedisServer, record: dict) -> None:
    b, app, uid = group["b"], "sel", f"mallory-{uuid.uuid4().hex[:6]}"
    if app not in _apps(b, AUTH):
        assert httpx.post(b + "/admin/applications", headers=AUTH, timeout=30, json={
            "name": app, "models": ["noop"], "policy": "exp3"}).status_code == 201
    key = f"parityserve:state:{app}/{uid}"
    stored = {"policy": "exp3", "models": ["noop"], "feedback": {"noop": 1},
              "loss_sum": {"noop": 0.0}, "rounds": 1, "log_weights": {"noop": 0.0}, **record}
    with redis.Redis.from_url(redis_server.url) as client:
        client.set(key, json.dumps(stored))
    body = {"input": [1.0, 2.0], "uid": uid}
    answer = httpx.post(f"{b}/{app}/predict", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    feedback = httpx.post(f"{b}/{app}/update", timeout=30, json={
        **body, "label": 0, "query_id": answer.json()["query_id"]})
    assert feedback.status_code == 200, feedback.text
    with redis.Redis.from_url(redis_server.url) as client:
        repaired = json.loads(client.get(key))
    assert isinstance(repaired["log_weights"], dict) and repaired["rounds"] == 1
    assert "discarding the stored selection state" in group["err"][1].read_text()


@pytest.fixture(scope="module")
def open_group(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[dict]:
    """Two one-process frontends with the admin API open (loopback): no token anywhere but
    the token file both find in the one $PARITYSERVE_HOME, which signs their changes."""
    namespace = f"open-{uuid.uuid4().hex[:8]}"
    config = _config(redis_server.url, namespace)
    config["server"]["require_admin_token"] = False
    env = {k: v for k, v in os.environ.items() if k != "PARITYSERVE_ADMIN_TOKEN"}
    with cli_server(tmp_path_factory.mktemp("open-a"), config, env) as (a, a_err), \
            cli_server(tmp_path_factory.mktemp("open-b"), config, env) as (b, b_err):
        yield {"a": a, "b": b, "namespace": namespace, "err": [a_err, b_err]}


def test_an_unsigned_entry_is_not_applied_even_with_the_admin_api_open(
        open_group: dict, redis_server: RedisServer) -> None:
    a, b = open_group["a"], open_group["b"]
    created = httpx.post(a + "/admin/applications", json={"name": "app1", "models": ["noop"]},
                         timeout=30)  # no token: the admin API is open
    assert created.status_code == 201
    wait_until(lambda: "app1" in _apps(b), timeout_s=10)  # signed changes still flow
    forged = {b"origin": b"intruder", b"writer": b"intruder/1", b"seq": b"1",
              b"method": b"DELETE", b"target": b"/admin/applications/app1",
              b"after": b"0-0", b"body": b"", b"sig": b""}
    entry = _append(redis_server.url, open_group["namespace"], forged)
    wait_until(lambda: _skipped_or(open_group["err"], entry,
                                   lambda: "app1" not in _apps(a) | _apps(b)), timeout_s=10)
    assert "app1" in _apps(a) and "app1" in _apps(b)


def test_writers_racing_for_the_next_id_each_append_once_signed_for_their_place(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """RedisStream.append picks its entry's id before appending (the signature covers it):
    two writers that read the same last id retry, and every entry verifies where it landed."""
    import asyncio

    from parityserve.runtime.cluster import peer_log, peers
    from parityserve.runtime.cluster.peers import RedisStream

    namespace = f"race-{uuid.uuid4().hex[:8]}"
    key, tries, picked = peer_log.stream_key(namespace), [], peer_log.next_id
    # One clock reading for all: both writers read the same last id in the first round (each
    # sends its read before either reply is handled), so they pick the same id.
    monkeypatch.setattr(peers.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    monkeypatch.setattr(peer_log, "next_id", lambda last, now: tries.append(last) or picked(
        last, now))

    async def writer(stream: RedisStream, name: str) -> list[str]:
        ids = []
        for seq in range(1, 31):
            change = peer_log.Change("g", "POST", "/admin/x", b"{}", "0-0", name, seq)
            ids.append(await stream.append(
                lambda at, c=change: peer_log.encode(c, at, namespace, TOKEN), 1000))
        return ids

    async def race() -> list[list[str]]:
        streams = [RedisStream(redis_server.url, key) for _ in range(2)]
        try:
            return await asyncio.gather(*(writer(s, f"w{i}") for i, s in enumerate(streams)))
        finally:
            for s in streams:
                await s.close()

    ids = asyncio.run(race())
    with redis.Redis.from_url(redis_server.url) as client:
        entries = [(i.decode(), f) for i, f in client.xrange(key)]
    assert [i for i, _ in entries] == sorted(ids[0] + ids[1], key=peer_log.id_key)
    for entry_id, fields in entries:  # each one signed for the place it holds
        peer_log.decode(entry_id, fields, namespace, TOKEN)
    assert len(entries) == 60 and len(tries) > 60  # the race happened, and was retried
