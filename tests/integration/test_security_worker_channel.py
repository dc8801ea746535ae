"""Attacks on the worker channel against a real server with real workers (issue #15).

The server runs with CURVE on (the default) and a keys folder that admits one remote worker
key ("remote"): the tests use it both for a real `parityserve worker` and for an admitted
peer that misbehaves. Cheap models only (``zoo:echo``); the cache is off, so every query
reaches a worker.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from conftest import wait_until

from parityserve.client import Client
from parityserve.config import Deployment
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.keys import ClientKeys, generate, new_client_keys

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [2]}
FORGED = 666.0


def _app(name: str) -> dict:
    return {"name": name, "models": [name], "slo_ms": 5000, "default_output": "DEFAULT"}


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    generate(folder, "server")
    generate(folder, "remote")
    return folder


@pytest.fixture(scope="module")
def served(server_factory, keys_dir):
    models = [{"name": n, "source": "zoo:echo", "replicas": r, "input": VECTOR,
               "output": {**VECTOR, "name": "output"}}
              for n, r in (("echo", 1), ("victim", 1), ("remote", 0), ("rolled", 1))]
    return server_factory({
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 3000,
                   "worker_keys_dir": str(keys_dir)},
        "models": models,
        "applications": [_app(m["name"]) for m in models],
    })


@pytest.fixture
def client(served) -> Iterator[Client]:
    with Client(served.url) as c:
        yield c


class _Context(zmq.Context):
    """Closes every socket it made at the end of a test (unclosed ones warn)."""

    made: list[zmq.Socket]

    def socket(self, *args, **kwargs):  # type: ignore[override]
        sock = super().socket(*args, **kwargs)
        self.made.append(sock)
        return sock


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = _Context()
    context.made = []
    yield context
    for sock in context.made:
        sock.close(linger=0)
    context.term()


def _remote_keys(keys_dir: Path) -> ClientKeys:
    return ClientKeys.from_files(keys_dir / "server.key", keys_dir / "remote.key_secret")


def _dealer(ctx: zmq.Context, address: str, identity: bytes,
            keys: ClientKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey = keys.server_public, keys.public
        sock.curve_secretkey = keys.secret
    sock.connect(address)
    return sock


def _rejected(served, reason: str) -> float:
    text = served.system.metrics.render()[0].decode()
    found = re.search(rf'^parityserve_worker_messages_rejected_total\{{reason="{reason}"\}} (\S+)$',
                      text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _ask(client: Client, app: str, n: int, offset: float = 0.0) -> list[tuple[list, dict]]:
    xs = [[offset + i, -(offset + i)] for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: client.predict(app, x), xs))
    return list(zip(xs, answers, strict=True))


def _try_send(sock: zmq.Socket, frames: list) -> None:
    """Send if the socket will take it: one whose handshake failed has nowhere to queue."""
    with contextlib.suppress(zmq.Again):
        sock.send_multipart(frames, flags=zmq.NOBLOCK)


def _forge(sock: zmq.Socket, bids: range) -> None:
    """Results for plausible batch ids, with an answer nobody computed."""
    for bid in bids:
        desc, frames = wire.pack_payload(np.full((1, 2), FORGED, np.float32))
        header = {"t": wire.RESULT, "bid": bid, "ok": True, "out": desc}
        _try_send(sock, wire.encode(header, [bytes(f) for f in frames]))


@pytest.mark.parametrize("who", ["no CURVE", "unknown key", "wrong server key"])
def test_an_unauthenticated_peer_gets_no_query_and_cannot_inject_an_answer(
        served, client, ctx, who) -> None:
    address = served.system.rpc_address
    keys = {"no CURVE": None,
            "unknown key": new_client_keys(_remote_keys(Path(served.system.config.server
                                                             .worker_keys_dir)).server_public),
            "wrong server key": new_client_keys(new_client_keys(b"x" * 40).public)}[who]
    live = next(iter(served.system.models["echo"].replicas))
    rogues = [_dealer(ctx, address, ident, keys)
              for ident in (b"rogue-" + who.encode(), b"echo/v1/0#99-0", live.encode())]
    for rogue in rogues:  # say hello as a worker of the model, then forge results
        _try_send(rogue, wire.encode({"t": wire.HELLO, "replica": "x", "model": "echo",
                                      "version": 1}))
        _forge(rogue, range(1, 3000))
    answers = _ask(client, "echo", 40)
    for rogue in rogues:
        _forge(rogue, range(1, 3000))
    answers += _ask(client, "echo", 20, offset=100)
    assert all(a["default"] is False and a["output"] == x for x, a in answers)
    assert not any(rogue.poll(100) for rogue in rogues)  # no query, no STOP, nothing at all
    assert len(served.system.models["echo"].replicas) == 1


def test_local_workers_get_their_keys_outside_argv(served) -> None:
    rid, replica = next(iter(served.system.models["echo"].replicas.items()))
    public = served.system._replica_keys[rid]
    cmdline = Path(f"/proc/{replica.pid}/cmdline").read_bytes()
    assert public not in cmdline and b"KEYS" not in cmdline and b"secret" not in cmdline
    environ = Path(f"/proc/{replica.pid}/environ")
    assert b"PARITYSERVE_WORKER_KEYS=" in environ.read_bytes()  # readable by its user only
    assert environ.stat().st_mode & 0o077 == 0


def test_a_spoofed_failed_does_not_block_a_new_version(served, client, ctx, keys_dir) -> None:
    address = served.system.rpc_address
    admitted = _dealer(ctx, address, b"spoofer", _remote_keys(keys_dir))
    rolled = served.system.models["rolled"]
    before = _rejected(served, "unknown_replica")
    failed = {"t": wire.FAILED, "model": "rolled", "version": 2, "error": "spoofed"}
    admitted.send_multipart(wire.encode(failed))
    wait_until(lambda: _rejected(served, "unknown_replica") > before, 10)
    # Now roll out version 2: the spoofed report must not stop it.
    deployment = Deployment.model_validate({**rolled.deployment.model_dump(), "version": 2})
    served.call(lambda: served.system.deploy(deployment), timeout_s=120)
    assert served.system.models["rolled"].version == 2
    assert all(a["output"] == x for x, a in _ask(client, "rolled", 5))


def test_a_real_remote_worker_with_key_files_joins_and_serves(served, client, keys_dir,
                                                              tmp_path) -> None:
    cmd = [sys.executable, "-m", "parityserve.cli", "worker", "--connect",
           served.system.rpc_address, "--model", "remote", "--source", "zoo:echo",
           "--server-key", str(keys_dir / "server.key"),
           "--client-key", str(keys_dir / "remote.key_secret")]
    with (tmp_path / "worker.log").open("wb") as log:
        proc = subprocess.Popen(cmd, env={**os.environ}, stderr=log)
    try:
        path = served.system.models["remote"]
        wait_until(lambda: path.ready_replicas(), 120)
        (rid,) = path.replicas
        assert re.fullmatch(r"remote/v1/ext-.+-\d+-[0-9a-f]{16}", rid)  # unguessable
        assert all(a["default"] is False and a["output"] == x
                   for x, a in _ask(client, "remote", 10))
        assert path.replicas[rid].served > 0
    finally:
        proc.terminate()
        proc.wait(30)
    wait_until(lambda: not served.system.models["remote"].replicas, 10)


def _bad_replies(bid: int, rows: int, turn: int) -> Iterator[list[bytes]]:
    """Every way to answer batch ``bid`` (of ``rows`` queries) wrongly: the ``turn``-th batch
    the rogue gets has the ``turn % 8``-th, so any eight batches provoke every one.
    Each reply but the first has the batch's row count, so that the check it is meant to
    provoke is the one that refuses it (the frontend sends a pass's queries as one batch)."""
    def result(out: np.ndarray | object) -> list[bytes]:
        desc, frames = wire.pack_payload(out)
        return wire.encode({"t": wire.RESULT, "bid": bid, "ok": True, "out": desc},
                           [bytes(f) for f in frames])
    yield from itertools.islice(itertools.cycle([
        result(np.zeros((rows + 6, 2), np.float32)),  # wrong number of rows
        result(np.array([["a", "b"]] * rows)),  # wrong dtype
        result(np.full((rows, 2), np.nan, np.float32)),  # NaN
        result(np.full((rows, 2), np.inf, np.float32)),  # inf
        result(12),  # not one row per input
        [msgpack.packb({"t": wire.RESULT, "bid": bid, "ok": True,
                        "out": {"k": "nd", "dtype": "<f4", "shape": [rows, 2]}})],  # no buffer
        [msgpack.packb({"t": wire.RESULT, "bid": bid, "ok": True,
                        "out": {"k": "nd", "dtype": "<f4", "shape": [rows, 2]}}),
         b"\0" * 8 * rows, b"\0" * 8],  # one buffer too many
        [msgpack.packb({"t": wire.RESULT, "bid": str(bid), "ok": "yes"})],  # wrong types
    ]), turn % 8, turn % 8 + 1)


def _garbage() -> list[list[bytes]]:
    return [[b"\xc1\xc1 not msgpack"], [msgpack.packb([1, 2, 3])], [b"\xdd\xff\xff\xff\xff"],
            [msgpack.packb({"t": 5})], [msgpack.packb({"t": "res", "bid": 10**12, "ok": True,
                                                       "out": {"k": "obj", "v": [1]}})],
            [msgpack.packb({"t": "hb"}), *[b""] * 20]]


def _misbehave(sock: zmq.Socket, stop: threading.Event, answered: list[int]) -> None:
    """Join ``victim`` as a worker, then answer every batch it gets wrongly."""
    sock.send_multipart(wire.encode({"t": wire.HELLO, "replica": "bad", "model": "victim",
                                     "version": 1, "input": VECTOR}))
    while not stop.is_set():
        if sock.poll(50):
            header, _ = wire.decode(sock.recv_multipart())
            if header["t"] == wire.PREDICT:
                rows = int(header["in"]["shape"][0])
                for frames in [*_garbage(), *_bad_replies(header["bid"], rows, len(answered))]:
                    sock.send_multipart(frames)
                answered.append(header["bid"])
        sock.send_multipart(wire.encode({"t": wire.HEARTBEAT}))
    sock.send_multipart(wire.encode({"t": wire.BYE}))


def test_bad_frames_from_an_admitted_worker_lose_no_query_and_crash_nothing(
        served, client, ctx, keys_dir) -> None:
    sock = _dealer(ctx, served.system.rpc_address, b"victim/v1/bad-peer",
                   _remote_keys(keys_dir))
    stop, answered = threading.Event(), []
    thread = threading.Thread(target=_misbehave, args=(sock, stop, answered))
    thread.start()
    try:
        path = served.system.models["victim"]
        wait_until(lambda: len(path.ready_replicas()) == 2, 20)
        answers = _ask(client, "victim", 120)
        # Until every kind of bad reply was sent: the rogue answers each batch it gets with
        # the next kind, and how many batches it gets depends on how queries batch.
        for more in range(1, 60):
            if len(answered) >= 8:
                break
            answers += _ask(client, "victim", 20, offset=1000 * more)
        assert len(answered) >= 8, f"the rogue got only {len(answered)} batches"
        answers += _ask(client, "victim", 40, offset=100_000)
    finally:
        stop.set()
        thread.join(10)
    # _ask raises unless every query got its one HTTP response: here they all did.
    assert len(answers) >= 160
    served_ok = [a for x, a in answers if a["default"] is False]
    wrong = [(x, a) for x, a in answers if a["default"] is False and a["output"] != x]
    assert not wrong, wrong[:3]
    defaults = [a for _, a in answers if a["default"]]
    odd = [a for a in defaults if not a["default_explanation"].startswith("error:")]
    assert not odd, odd[:3]
    assert served_ok and defaults  # the real replica served; the rogue's batches were refused
    assert not any(FORGED in a["output"] for a in served_ok if isinstance(a["output"], list))
    for reason in ("malformed", "wrong_shape", "wrong_dtype", "nonfinite", "unknown_batch"):
        assert _rejected(served, reason) > 0, reason
    assert all(a["default"] is False for _, a in _ask(client, "victim", 5, offset=5000))


def test_a_refused_worker_is_not_told_what_is_served(served, ctx, keys_dir) -> None:
    sock = _dealer(ctx, served.system.rpc_address, b"prober", _remote_keys(keys_dir))
    sock.send_multipart(wire.encode({"t": wire.HELLO, "replica": "p", "model": "guess",
                                     "version": 1}))
    assert sock.poll(10_000)
    header, _ = wire.decode(sock.recv_multipart())
    assert header["t"] == wire.STOP and "guess" in header["error"]
    assert not any(name in header["error"] for name in ("echo", "victim", "rolled"))


def test_with_worker_auth_off_on_loopback_local_workers_still_serve(server_factory) -> None:
    server = server_factory({
        "server": {"http_port": 0, "cache_bytes": 0, "worker_auth": False},
        "models": [{"name": "open", "source": "zoo:echo", "replicas": 1, "input": VECTOR}],
        "applications": [_app("open")],
    })
    assert server.system._keys is None
    with Client(server.url) as c:
        assert all(a["output"] == x for x, a in _ask(c, "open", 5))
