"""runtime/cluster/peers.py on an in-memory stream: what is published, what is refused when Redis is
down, what a group replays before serving, and what it applies while following."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from parityserve.errors import ConfigError
from parityserve.runtime.cluster import peer_log
from parityserve.runtime.cluster.peer_log import ZERO, Change
from parityserve.runtime.cluster.peers import PeerPlan, Peers
from parityserve.runtime.frontend.asgi_calls import call

TOKEN = "peers-unit-token"
ROUTE = "/admin/models/m/parallelism"


class FakeStream:
    """The RedisStream interface on a list; ``down`` makes every call fail as Redis would."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, dict[bytes, bytes]]] = []
        self.down = False
        self.fail_append = False
        self.added = 0  # XINFO STREAM's entries-added

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("Connection refused")

    async def ping(self) -> None:
        self._check()

    async def append(self, fields: Any, max_changes: int) -> str:
        """As RedisStream: ``fields`` makes the entry's fields for the id it gets."""
        self._check()
        if self.fail_append:
            raise ConnectionError("Connection reset")
        self.added += 1
        self.entries.append((f"{self.added}-0", fields(f"{self.added}-0")))
        return self.entries[-1][0]

    def copy(self, entry_id: str) -> str:
        """What a writer to the Redis does: an old entry's fields appended again."""
        [fields] = [f for i, f in self.entries if i == entry_id]
        return self.raw(dict(fields))

    def raw(self, fields: dict[bytes, bytes]) -> str:
        self.added += 1
        self.entries.append((f"{self.added}-0", fields))
        return self.entries[-1][0]

    async def read(self, after: str, block_ms: int, count: int) -> list:
        self._check()
        newer = [e for e in self.entries if peer_log.id_key(e[0]) > peer_log.id_key(after)]
        if not newer:
            await asyncio.sleep(0.005)  # XREAD BLOCK, shortened
        return newer[:count]

    async def range(self, start: str, until: str, count: int) -> list:
        after = peer_log.id_key(ZERO if start == "-" else start.lstrip("("))
        return [e for e in self.entries
                if after < peer_log.id_key(e[0]) <= peer_log.id_key(until)][:count]

    async def counts(self) -> tuple[int | None, int]:
        self._check()
        return self.added, len(self.entries)

    def trim(self, n: int) -> None:
        del self.entries[:n]

    async def close(self) -> None:
        pass


def admin_app(settings: dict[str, int]) -> Starlette:
    """One admin route, behind the token, that sets ``settings['m']``."""
    async def set_parallelism(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "unauthorized"}, 401)
        value = orjson.loads(await request.body()).get("parallelism")
        if not isinstance(value, int):
            return JSONResponse({"error": "parallelism must be an integer"}, 422)
        settings["m"] = value
        return JSONResponse({"parallelism": value})
    return Starlette(routes=[Route(ROUTE, set_parallelism, methods=["POST"]),
                             Route("/admin/state", lambda r: JSONResponse(settings))])


def group(stream: FakeStream, origin: str, until: str = ZERO) -> tuple[Peers, dict[str, int]]:
    """A group that starts now, ``until`` being the stream's last entry, as plan_group reads."""
    settings: dict[str, int] = {}
    held = sum(peer_log.id_key(e[0]) <= peer_log.id_key(until) for e in stream.entries)
    plan = PeerPlan("redis://unused:6379/0", "test", 1000, origin, until,
                    peer_log.id_key(until)[0], held)
    return Peers(plan, TOKEN, stream), settings


async def change(peers: Peers, settings: dict[str, int], value: Any,
                 token: str = TOKEN) -> tuple[int, dict[str, str]]:
    """A client's admin change through the publishing wrapper: (status, headers)."""
    headers: dict[str, str] = {}
    app = peers.wrap(admin_app(settings))
    status, _ = await call(_keeping_headers(app, headers), "POST", ROUTE,
                           orjson.dumps({"parallelism": value}), token)
    return status, headers


def _keeping_headers(app: Any, into: dict[str, str]) -> Any:
    async def keep(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                into.update({k.decode(): v.decode() for k, v in message["headers"]})
            await send(message)
        await app(scope, receive, sending)
    return keep


def test_a_successful_change_is_published_with_its_origin_and_cursor() -> None:
    stream = FakeStream()
    peers, settings = group(stream, "host-a")
    status, headers = asyncio.run(change(peers, settings, 3))
    assert status == 200 and settings == {"m": 3}
    assert headers["x-parityserve-peers"] == "published:1-0"
    [(entry_id, fields)] = stream.entries
    assert peer_log.decode(entry_id, fields, "test", TOKEN) == Change(
        "host-a", "POST", ROUTE, b'{"parallelism":3}', ZERO, peers.writer, 1)


def test_a_refused_change_is_not_published() -> None:
    stream = FakeStream()
    peers, settings = group(stream, "host-a")
    status, headers = asyncio.run(change(peers, settings, "lots"))
    assert status == 422 and "x-parityserve-peers" not in headers and stream.entries == []


def test_with_redis_down_a_change_is_refused_before_it_is_applied(caplog: Any) -> None:
    stream = FakeStream()
    stream.down = True
    peers, settings = group(stream, "host-a")
    with caplog.at_level(logging.ERROR):
        status, headers = asyncio.run(change(peers, settings, 3))
    assert status == 503 and headers["retry-after"] == "1"
    assert settings == {} and stream.entries == []  # nothing changed anywhere
    assert "Redis" in caplog.text


def test_a_caller_without_the_token_gets_401_not_a_word_about_redis() -> None:
    stream = FakeStream()
    stream.down = True
    peers, settings = group(stream, "host-a")
    status, _ = asyncio.run(change(peers, settings, 3, token="wrong"))
    assert status == 401 and settings == {}


def test_a_change_applied_when_the_append_fails_says_it_was_not_published(caplog: Any) -> None:
    stream = FakeStream()
    stream.fail_append = True
    peers, settings = group(stream, "host-a")
    with caplog.at_level(logging.ERROR):
        status, headers = asyncio.run(change(peers, settings, 3))
    assert status == 200 and settings == {"m": 3}
    assert headers["x-parityserve-peers"] == "unpublished"
    assert "not published" in caplog.text


def test_reads_and_other_routes_pass_through_unpublished() -> None:
    stream = FakeStream()
    stream.down = True  # so a change would be refused: these are not changes
    peers, settings = group(stream, "host-a")
    status, _ = asyncio.run(call(peers.wrap(admin_app(settings)), "GET", "/admin/state", b"",
                                 TOKEN))
    assert status == 200 and stream.entries == []


def test_a_starting_group_replays_the_stream_up_to_its_start_in_order(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")

    async def scenario() -> tuple[int, dict[str, int]]:
        for value in (1, 2):
            await change(a, a_settings, value)
        stream.raw({b"origin": b"intruder"})  # 3-0: skipped, logged
        await change(a, a_settings, 4)
        late, late_settings = group(stream, "host-b", until="3-0")
        return await late.replay(admin_app(late_settings)), late_settings

    with caplog.at_level(logging.WARNING):
        applied, settings = asyncio.run(scenario())
    assert applied == 2 and settings == {"m": 2}  # 4-0 came after it started: not replayed
    assert "skipping entry 3-0" in caplog.text


def test_a_late_joiner_that_lost_trimmed_changes_says_so(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    for value in (1, 2, 3):
        asyncio.run(change(a, a_settings, value))
    stream.trim(2)
    late, settings = group(stream, "host-b", until="3-0")
    with caplog.at_level(logging.ERROR):
        asyncio.run(late.replay(admin_app(settings)))
    assert settings == {"m": 3}
    assert "2 of the changes were trimmed" in caplog.text and "config" in caplog.text


def test_a_shard_restarted_after_its_start_was_trimmed_says_so(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    for value in (1, 2):
        asyncio.run(change(a, a_settings, value))
    restarted, settings = group(stream, "host-b", until="2-0")  # planned with both there
    stream.trim(1)
    with caplog.at_level(logging.ERROR):
        asyncio.run(restarted.replay(admin_app(settings)))
    assert "1 of the changes made before this frontend started were trimmed" in caplog.text


def test_followers_apply_each_others_changes_and_converge_on_the_stream_order() -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")

    async def scenario() -> None:
        a.follow(admin_app(a_settings))
        b.follow(admin_app(b_settings))
        await change(a, a_settings, 1)
        await _until(lambda: b_settings == {"m": 1})
        # concurrent: each applies its own before it reads the other's
        await a.close()
        await b.close()
        await change(a, a_settings, 2)
        await change(b, b_settings, 3)
        assert (a_settings, b_settings) == ({"m": 2}, {"m": 3})
        a.follow(admin_app(a_settings))
        b.follow(admin_app(b_settings))
        await _until(lambda: a.cursor.value.applied == b.cursor.value.applied == "3-0")
        await a.close()
        await b.close()

    asyncio.run(scenario())
    assert a_settings == b_settings == {"m": 3}  # the stream's last, on both


def test_a_follower_cut_off_from_redis_resumes_where_it_stopped(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")

    async def scenario() -> None:
        b.follow(admin_app(b_settings))
        stream.down = True
        await asyncio.sleep(0.05)
        stream.down = False
        await change(a, a_settings, 5)
        await _until(lambda: b_settings == {"m": 5}, timeout_s=5.0)  # retried after 1 s
        await b.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert caplog.text.count("cannot read the admin stream") == 1  # once per outage
    assert "trimmed" not in caplog.text and "anew" not in caplog.text  # it lost nothing


@pytest.mark.parametrize(("outage", "why"), [
    ("trim", "1 of the changes were trimmed"),  # the stream moved on without it
    ("restart", "made anew"),  # Redis came back empty
])
def test_a_follower_back_from_an_outage_says_what_it_lost(outage: str, why: str,
                                                          caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")

    async def scenario() -> None:
        b.follow(admin_app(b_settings))
        for value in (1, 2):
            await change(a, a_settings, value)
        await _until(lambda: b.cursor.value.applied == "2-0")
        stream.down = True
        await asyncio.sleep(0.05)
        if outage == "trim":
            stream.down = False
            for value in (3, 4):
                await change(a, a_settings, value)
            stream.trim(3)  # 3-0 goes before b could read it
        else:
            stream.entries, stream.added, stream.down = [], 0, False
            await change(a, a_settings, 9)
        await _until(lambda: why in caplog.text, timeout_s=5.0)
        await b.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())


async def _until(done: Any, timeout_s: float = 2.0) -> None:
    async def wait() -> None:
        while not done():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout_s)


@pytest.mark.parametrize("origin", ["host-a", "host-b"])
def test_an_entry_from_another_namespace_is_not_applied(origin: str, caplog: Any) -> None:
    stream = FakeStream()
    fields = peer_log.encode(Change(origin, "POST", ROUTE, b'{"parallelism": 9}', ZERO,
                                    f"{origin}/1", 1), "1-0", "other-namespace", TOKEN)
    stream.entries.append(("1-0", fields))
    late, settings = group(stream, "host-c", until="1-0")
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(late.replay(admin_app(settings))) == 0
    assert settings == {} and "signature" in caplog.text


def test_a_change_that_raises_here_is_logged_and_the_follower_goes_on(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")
    calls = []

    async def flaky(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        if len(calls) == 1:
            raise RuntimeError("a bug in a route")
        await admin_app(b_settings)(scope, receive, send)

    async def scenario() -> None:
        b.follow(flaky)
        await change(a, a_settings, 1)
        await change(a, a_settings, 2)
        await _until(lambda: b_settings == {"m": 2})
        await b.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert len(calls) == 2 and "applying entry 1-0 failed" in caplog.text


def test_a_restarted_shard_zero_resumes_from_the_groups_cursor_file(tmp_path: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    plan = PeerPlan("redis://unused:6379/0", "test", 1000, "host-b", ZERO, 0, 0,
                    tmp_path / "cursor.json")
    (tmp_path / "cursor.json").write_bytes(peer_log.Cursor().to_json())  # as plan_group does
    applied: list[int] = []

    def recording() -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            settings: dict[str, int] = {}
            await admin_app(settings)(scope, receive, send)
            applied.extend(settings.values())
        return app

    async def scenario() -> None:
        first = Peers(plan, TOKEN, stream)
        first.follow(recording())
        await change(a, a_settings, 1)
        await _until(lambda: applied == [1])
        await first.close()  # shard 0 dies; its successor reads the file
        await change(a, a_settings, 2)
        second = Peers(plan, TOKEN, stream)
        second.follow(recording())
        await _until(lambda: applied == [1, 2])
        await asyncio.sleep(0.05)
        await second.close()

    asyncio.run(scenario())
    assert applied == [1, 2]  # 1 was not applied twice
    assert peer_log.Cursor.from_json((tmp_path / "cursor.json").read_bytes()).seq == 2


# -- replays and forgeries (issue 38) ---------------------------------------------------------


def test_a_copy_of_a_signed_entry_appended_again_is_not_applied(caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")

    async def scenario() -> None:
        b.follow(admin_app(b_settings))
        await change(a, a_settings, 1)
        await change(a, a_settings, 2)
        await _until(lambda: b_settings == {"m": 2})
        copy = stream.copy("1-0")  # the old "1" again, at the end
        await _until(lambda: b.cursor.value.applied == copy)
        await b.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert b_settings == {"m": 2} and "skipping entry 3-0" in caplog.text
    late, late_settings = group(stream, "host-c", until="3-0")  # and a late joiner
    assert asyncio.run(late.replay(admin_app(late_settings))) == 2
    assert late_settings == {"m": 2}


def _signed(peers: Peers, entry_id: str, value: int, seq: int) -> dict[bytes, bytes]:
    """An entry signed with the key for its place: a rebuilt stream, or a frontend's bug."""
    change = Change(peers.plan.origin, "POST", ROUTE, orjson.dumps({"parallelism": value}),
                    ZERO, peers.writer, seq)
    return peer_log.encode(change, entry_id, "test", TOKEN)


def test_a_writers_change_at_or_below_the_last_taken_is_skipped_and_logged(
        caplog: Any) -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    b, b_settings = group(stream, "host-b")

    async def scenario() -> None:
        b.follow(admin_app(b_settings))
        await change(a, a_settings, 1)
        await change(a, a_settings, 2)
        await _until(lambda: b_settings == {"m": 2})
        stream.raw(_signed(a, "3-0", 1, seq=2))  # validly signed here, but a's 2nd again
        await _until(lambda: b.cursor.value.applied == "3-0")
        stream.raw(_signed(a, "4-0", 5, seq=3))  # a's 3rd: new
        await _until(lambda: b_settings == {"m": 5})
        await b.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "skipping entry 3-0" in caplog.text and "taken already" in caplog.text
    assert b.cursor.value.taken == {a.writer: 3}


def test_the_follower_knows_what_the_replay_took() -> None:
    stream = FakeStream()
    a, a_settings = group(stream, "host-a")
    asyncio.run(change(a, a_settings, 1))
    late, late_settings = group(stream, "host-b", until="1-0")

    async def scenario() -> None:
        await late.replay(admin_app(late_settings))
        late.follow(admin_app(late_settings))
        stream.raw(_signed(a, "2-0", 7, seq=1))  # a's 1st again, which the replay took
        await _until(lambda: late.cursor.value.applied == "2-0")
        await late.close()

    asyncio.run(scenario())
    assert late_settings == {"m": 1}


def open_admin_app(settings: dict[str, int]) -> Any:
    """admin_app with the routes open: no token asked (require_admin_token: false)."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        bearer = (b"authorization", f"Bearer {TOKEN}".encode())
        await admin_app(settings)(scope | {"headers": [*scope["headers"], bearer]}, receive,
                                  send)
    return app


def test_an_open_admin_api_still_signs_and_refuses_unsigned_entries(caplog: Any) -> None:
    stream = FakeStream()
    plan = PeerPlan("redis://unused:6379/0", "test", 1000, "host-a", ZERO, 0, 0)
    open_a = Peers(plan, None, stream, key=TOKEN)  # the routes ask no token; the stream does
    status, _ = asyncio.run(call(open_a.wrap(open_admin_app({})), "POST", ROUTE,
                                 b'{"parallelism": 4}', None))
    assert status == 200
    [(entry_id, fields)] = stream.entries
    assert peer_log.decode(entry_id, fields, "test", TOKEN).body == b'{"parallelism": 4}'
    stream.raw({**fields, b"sig": b""})  # 2-0, unsigned: never applied
    b_plan = PeerPlan("redis://unused:6379/0", "test", 1000, "host-b", "2-0", 2, 2)
    b_settings: dict[str, int] = {}
    with caplog.at_level(logging.WARNING):
        applied = asyncio.run(Peers(b_plan, None, stream, key=TOKEN).replay(
            open_admin_app(b_settings)))
    assert applied == 1 and b_settings == {"m": 4} and "skipping entry 2-0" in caplog.text


def test_without_a_key_there_is_no_stream() -> None:
    plan = PeerPlan("redis://unused:6379/0", "test", 1000, "host-a", ZERO, 0, 0)
    with pytest.raises(ConfigError, match="signing key"):
        Peers(plan, None, FakeStream())
