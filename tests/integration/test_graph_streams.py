"""Stateful streams are a resource with a policy (issue 38, items 3 and 4), served for real.

Once, after 1,024 distinct stream keys (one 1,024-row request does it) every new stream got
500 ``StreamTableFull`` until a restart, and the error failed its whole operator batch:
requests for existing streams mixed with new ones got 500 too. Now a new stream that finds
no free or idle slot gets 429 with ``Retry-After``, alone; an idle stream gives its slot to
a new one (LRU), its state dropped on primary and backup alike. A stream key is at most
``max_stream_key_bytes`` and a graph request at most ``max_batch_items`` rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_graph_isolation import GOOD, stocks_config

pytestmark = pytest.mark.integration

LONGEST = "k" * 256  # a key of max_stream_key_bytes, one of the 1,024 streams opened below
SLOTS = 4  # the small table of the "means" graph
IDLE_S = 1.0  # and how long one of its streams must be unused to give way


def config() -> dict[str, Any]:
    """The README's stocks graph (a table of 1,024 streams per LSTM, idle after 600 s), and
    a running-mean graph with a table of four streams, idle after a second."""
    base = stocks_config()
    base["models"].append({"name": "means", "source": "zoo:stream-mean",
                           "options": {"features": 4, "max_streams": SLOTS,
                                       "stream_idle_s": IDLE_S}})
    base["graphs"].append({"name": "means", "stream_key": "ticker",
                           "operators": [{"name": "mean", "model": "means",
                                          "inputs": ["frontend"], "stateful": True}],
                           "output": "mean"})
    return base


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(config(), tmp_path_factory.mktemp("streams"))
    yield running
    running.stop()


def post(url: str, graph: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/{graph}/predict", content=orjson.dumps(body), timeout=60)


def graph_state(url: str, graph: str) -> dict[str, Any]:
    return httpx.get(f"{url}/admin/state", timeout=30).json()["graphs"][graph]


def test_a_huge_stream_key_is_refused_naming_the_limit(server: RunningServer) -> None:
    """(A 10 MB key is refused before this, as any JSON body over max_json_bytes.)"""
    reply = post(server.url, "stocks", {"input": GOOD, "ticker": "k" * 4096})
    assert reply.status_code == 400, reply.text[:300]
    assert "max_stream_key_bytes = 256" in reply.json()["error"]
    many = post(server.url, "stocks", {"input_batch": [GOOD, GOOD],
                                       "streams": ["ok", "\u00e9" * 129]})  # 258 bytes
    assert many.status_code == 400 and "streams[1]" in many.json()["error"]
    assert post(server.url, "stocks", {"input": GOOD, "ticker": LONGEST}).status_code == 200


def test_a_graph_request_holds_at_most_max_batch_items_rows(server: RunningServer) -> None:
    """Rows of one number, so that the body stays within the limits on bytes and values."""
    reply = post(server.url, "stocks", {"input_batch": [[1]] * 5_000})
    assert reply.status_code == 400, reply.text[:300]
    assert "5000 rows, more than max_batch_items = 1024" in reply.json()["error"]


def test_a_full_stream_table_refuses_new_streams_alone_with_429(server: RunningServer) -> None:
    url = server.url
    # one request opens 1,024 streams: every slot of seq1's and seq2's tables
    rows = np.random.default_rng(0).random((1024, 4)).round(3).tolist()
    filled = post(url, "stocks", {"input_batch": rows,
                                  "streams": [LONGEST] + [f"s{i}" for i in range(1, 1024)]})
    assert filled.status_code == 200, filled.text[:300]

    def one(i: int) -> tuple[bool, httpx.Response]:
        old = i % 2 == 1  # existing and new streams interleaved, so they share batches
        stream = f"s{i}" if old else f"new{i}"
        return old, post(url, "stocks", {"input": GOOD, "ticker": stream})

    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(one, range(100)))
    for old, reply in replies:
        if old:  # always answered
            assert reply.status_code == 200, reply.text
            assert np.isfinite(reply.json()["output"]).all()
        else:
            assert reply.status_code == 429, reply.text
            assert int(reply.headers["Retry-After"]) >= 1
            assert reply.json()["code"] == "too_many_streams"
            assert "max_streams=1024" in reply.json()["error"]
            assert "'new" not in reply.json()["error"]  # nor any batch-mate's stream key
    wait_until(lambda: graph_state(url, "stocks")["records"] == 0, 30)
    assert httpx.get(f"{url}/v2/models/stocks/ready").status_code == 200

    # While seq1 says it has no room, a flood of new streams is refused at the door: its
    # rows no longer cross feat (1,024 rows, every two seconds, in the soak) to be refused
    state = graph_state(url, "stocks")
    assert state["operators"]["seq1"]["new_streams_refused_for_s"] > 0
    before = state["operators"]["feat"]["last_seq"]
    flood = post(url, "stocks", {"input_batch": [GOOD] * 1024,
                                 "streams": [f"flood{i}" for i in range(1024)]})
    assert flood.status_code == 429, flood.text[:300]
    assert int(flood.headers["Retry-After"]) >= 1
    assert "max_streams=1024" in flood.json()["error"]
    assert "refused at the graph's door" in flood.json()["error"]
    assert "flood" not in flood.json()["error"]
    # a held stream still passes the door, alone or beside a new one it is refused with
    assert post(url, "stocks", {"input": GOOD, "ticker": "s3"}).status_code == 200
    mixed = post(url, "stocks", {"input_batch": [GOOD, GOOD], "streams": ["s5", "brand-new"]})
    assert mixed.status_code == 429 and "input_batch[1]" in mixed.json()["error"]
    assert graph_state(url, "stocks")["operators"]["feat"]["last_seq"] == before + 1
    # over gRPC the same refusal is RESOURCE_EXHAUSTED with a retry-after, not a bad argument
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    assert server.grpc_url is not None
    client = triton.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.asarray([GOOD], dtype=np.float32))
        with pytest.raises(InferenceServerException, match="stream table full") as err:
            client.infer("stocks", [tensor], parameters={"streams": "grpc-new"})
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        client.close()


def test_an_idle_stream_gives_way_and_primary_and_backup_drop_it_alike(
        server: RunningServer) -> None:
    url = server.url
    wait_until(lambda: graph_state(url, "means")["operators"]["mean"]["backup_synced"], 60)
    first = post(url, "means", {"input_batch": [[float(i)] * 4 for i in range(SLOTS)],
                                "streams": ["a", "b", "c", "d"]})
    assert first.status_code == 200, first.text
    # a fifth stream waits (429) until the others have been idle for IDLE_S, then takes the
    # least recently used slot: a's (all four came in one batch; a has the lowest slot)
    wait_until(lambda: post(url, "means", {"input": [8.0] * 4, "ticker": "e"}).status_code
               == 200, 30)
    # a is a new stream again: it takes the slot of b (as idle as a was, and older than e)
    back = post(url, "means", {"input": [2.0] * 4, "ticker": "a"})
    assert back.status_code == 200, back.text
    assert back.json()["output"] == [2.0] * 4  # its mean starts over: its old row (0.0) is gone

    def same_state() -> bool:  # the eviction is in the state the backup installed
        digests = httpx.get(f"{url}/admin/graphs/means/digests", timeout=30).json()["mean"]
        backup = digests["backup"]
        return backup is not None and backup["seq"] == digests["primary"]["seq"] \
            and backup["digest"] == digests["primary"]["digest"]

    wait_until(same_state, 30)


def test_tritonclient_grpc_infers_on_the_graph_as_over_http(server: RunningServer) -> None:
    """gRPC advertised the graph (platform parityserve-graph) and then answered NOT_FOUND
    from ModelInfer (issue 40); it now serves the graph as the V2 HTTP route does, streams
    in the request's parameters, and refuses what HTTP refuses with INVALID_ARGUMENT."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    assert server.grpc_url is not None
    client = triton.InferenceServerClient(server.grpc_url)
    try:
        assert client.get_model_metadata("stocks").platform == "parityserve-graph"
        x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
        tensor = triton.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        # s1 and s2: streams the full-table test above opens (held there, so the door lets
        # them pass a full table), and room for them when this test runs alone
        result = client.infer("stocks", [tensor], parameters={"streams": '["s1", "s2"]'})
        assert result.as_numpy("output").shape == (2, 1)
        seqs = orjson.loads(result.get_response().parameters["seqs"].string_param)
        assert len(seqs) == 2 and all(s["seq1"] > 0 for s in seqs)
        assert result.get_response().parameters["durable"].bool_param is True
        # the same stream goes on over HTTP: its state is the one gRPC left
        one = triton.InferInput("x", [1, 4], "FP32")
        one.set_data_from_numpy(x[:1])
        bare = client.infer("stocks", [one], parameters={"streams": "s1"})
        assert bare.as_numpy("output").shape == (1, 1)
        after = post(server.url, "stocks", {"input": x[0].tolist(), "ticker": "s1"})
        assert after.status_code == 200 and after.json()["seqs"]["seq1"] > seqs[0]["seq1"]
        for params, needle in (({"streams": '["s1"]'}, "one stream per input"),
                               ({"streams": "[not json"}, "not a JSON list")):
            with pytest.raises(InferenceServerException, match=needle) as err:
                client.infer("stocks", [tensor], parameters=params)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        flat = triton.InferInput("x", [4], "FP32")
        flat.set_data_from_numpy(x[0])
        with pytest.raises(InferenceServerException, match=r"shape \[1, 4\]") as err:
            client.infer("stocks", [flat])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()
