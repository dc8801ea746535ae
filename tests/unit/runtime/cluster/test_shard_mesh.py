"""``/admin/state`` across frontend shards: the pure merge, and the wrapper with fake peers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.responses import JSONResponse
from starlette.testclient import TestClient

from parityserve.runtime.cluster.shard_mesh import ShardMesh, merge_states

OWN = {"models": [{"name": "noop", "parallelism": 1}], "applications": []}
PEER = {"models": [{"name": "noop", "parallelism": 2}], "applications": []}


def test_merge_keeps_the_answering_shards_fields_and_adds_every_shard() -> None:
    merged = merge_states(1, OWN, {0: (200, orjson.dumps(PEER).decode())})
    assert merged["models"] == OWN["models"] and merged["applications"] == []
    assert merged["shards"] == {"0": PEER, "1": OWN}
    assert list(merged["shards"]) == ["0", "1"]  # in shard order, whoever answered


@pytest.mark.parametrize(("status", "text", "error"), [
    (0, "", "did not answer"),
    (401, '{"error": "unauthorized"}', "answered 401"),
    (500, "Internal Server Error", "answered 500"),
    (200, "not json", "not a JSON object"),
    (200, "[1, 2]", "not a JSON object"),
])
def test_a_peer_without_a_state_is_an_error_entry(status: int, text: str, error: str) -> None:
    merged = merge_states(0, OWN, {1: (status, text)})
    assert error in merged["shards"]["1"]["error"]
    assert merged["shards"]["1"]["status"] == status
    assert merged["shards"]["0"] == OWN and merged["models"] == OWN["models"]


def _mesh(tmp_path: Path, peers: dict[int, tuple[int, str]], asked: list[Any]) -> ShardMesh:
    """Shard 0 of three, whose control-port calls go to ``peers`` (a fake) instead."""
    mesh = ShardMesh(0, (1, 2, 3), "token", tmp_path / "journal.jsonl", (0, 0, 0))

    async def fake(peer: int, method: str, target: str, body: bytes,
                   timeout_s: float) -> tuple[int, str]:
        asked.append((peer, method, target))
        return peers[peer]
    mesh._request = fake  # type: ignore[method-assign]
    return mesh


def _app(status: int = 200) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await JSONResponse(OWN if status == 200 else {"error": "no"}, status)(scope, receive,
                                                                               send)
    return app


def test_state_asks_every_peer_and_a_silent_one_is_not_a_500(tmp_path: Path) -> None:
    asked: list[Any] = []
    mesh = _mesh(tmp_path, {1: (200, orjson.dumps(PEER).decode()), 2: (0, "")}, asked)
    resp = TestClient(mesh.wrap(_app())).get("/admin/state")
    assert resp.status_code == 200 and resp.headers["x-parityserve-shard"].startswith("0:")
    state = resp.json()
    assert sorted(asked) == [(1, "GET", "/admin/state"), (2, "GET", "/admin/state")]
    assert state["models"] == OWN["models"]
    assert state["shards"]["0"] == OWN and state["shards"]["1"] == PEER
    assert "did not answer" in state["shards"]["2"]["error"]
    assert int(resp.headers["content-length"]) == len(resp.content)


def test_state_refused_on_the_answering_shard_asks_no_peer(tmp_path: Path) -> None:
    asked: list[Any] = []
    mesh = _mesh(tmp_path, {}, asked)
    resp = TestClient(mesh.wrap(_app(401))).get("/admin/state")
    assert resp.status_code == 401 and resp.json() == {"error": "no"} and asked == []


def test_the_control_port_answers_its_state_alone(tmp_path: Path) -> None:
    asked: list[Any] = []
    resp = TestClient(_mesh(tmp_path, {}, asked).local(_app(), None)).get("/admin/state")
    assert resp.json() == OWN and asked == []


def test_shard_zero_waits_until_every_sibling_listens(tmp_path: Path) -> None:
    asked: list[Any] = []
    answers = {1: (0, ""), 2: (200, "")}  # shard 1 still starting
    mesh = _mesh(tmp_path, answers, asked)

    async def scenario() -> int:
        waiting = asyncio.create_task(mesh.siblings_listening())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        answers[1] = (200, "")
        await asyncio.wait_for(waiting, 2.0)
        return sum(1 for peer, _m, _t in asked if peer == 2)

    assert asyncio.run(scenario()) == 1  # a sibling that answered is not asked again
    assert {(peer, target) for peer, _m, target in asked} == {(1, "/v2/health/live"),
                                                             (2, "/v2/health/live")}
