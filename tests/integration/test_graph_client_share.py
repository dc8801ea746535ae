"""One client address's share of a stateful graph (issue 38), on a real server: past
``server.limits.max_graph_requests_per_address`` its requests wait at the door, in order,
while another address's go straight in; one that waits past the graph's deadline is a 429
``too_many_in_flight`` with a Retry-After, never a 5xx.

The graph is the README's ``stocks``, its seq1 slowed (each state waits 500 ms before it
leaves, so each reply takes that long: the output commit), its deadline 3 s, the limit 1.
Ten requests at once from 127.0.0.3 go through one at a time: the first are answered (one
reply takes a sixth of the deadline, room for a loaded machine), the last cannot get in
within the deadline (ten take 5 s). A request from 127.0.0.1 sent meanwhile is answered.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_sequences import config, synced

pytestmark = pytest.mark.integration


def test_one_address_past_its_share_waits_and_another_goes_straight_in(tmp_path: Path
                                                                        ) -> None:
    cfg = config(timeout_ms=3000)
    cfg["server"]["limits"] = {"max_graph_requests_per_address": 1}
    running = start_server(cfg, tmp_path)
    try:
        url = running.url
        wait_until(lambda: synced(url), 60)
        httpx.post(f"{url}/admin/graphs/stocks/faults", timeout=10, json={
            "operator": "seq1", "state_delay_ms": 500}).raise_for_status()

        async def burst_and_one_other() -> tuple[list[httpx.Response], httpx.Response]:
            burster = httpx.AsyncClient(base_url=url, timeout=30, transport=httpx.
                                        AsyncHTTPTransport(local_address="127.0.0.3"))
            other = httpx.AsyncClient(base_url=url, timeout=30)
            async with burster, other:
                burst = [asyncio.create_task(burster.post("/stocks/predict", json={
                    "input": [0.1, 0.2, 0.3, 0.4], "ticker": f"b{i}"})) for i in range(10)]
                await asyncio.sleep(0.2)  # the burst is at the door
                alone = await other.post("/stocks/predict", json={
                    "input": [0.1, 0.2, 0.3, 0.4], "ticker": "o"})
                return list(await asyncio.gather(*burst)), alone

        burst, alone = asyncio.run(burst_and_one_other())
        assert alone.status_code == 200, alone.text  # not behind the other address's queue
        statuses = sorted(r.status_code for r in burst)
        assert set(statuses) <= {200, 429}, [r.text for r in burst]
        assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses
        refused = next(r for r in burst if r.status_code == 429)
        assert refused.json()["code"] == "too_many_in_flight", refused.text
        assert "max_graph_requests_per_address" in refused.json()["error"]
        assert int(refused.headers["retry-after"]) >= 1
    finally:
        running.stop()


def test_grpc_requests_draw_on_the_same_share(tmp_path: Path) -> None:
    """gRPC has the gate too, with one count per address over both edges: ten V2 gRPC
    requests at once from 127.0.0.1 (tritonclient) go in one at a time, and the last get
    RESOURCE_EXHAUSTED ``too_many_in_flight``; an HTTP request from the same address meanwhile
    queues behind them in the same count, while one from 127.0.0.3 is answered. (Before, the
    gate was on the HTTP routes only: all ten were let in at once, and answered.)"""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    cfg = config(timeout_ms=3000)
    cfg["server"]["limits"] = {"max_graph_requests_per_address": 1}
    cfg["server"].pop("grpc_port", None)  # (with http_port 0: gRPC on a free port)
    running = start_server(cfg, tmp_path)
    try:
        url, grpc_url, gate = running.url, running.grpc_url, running.system.graph_gate
        assert grpc_url is not None
        wait_until(lambda: synced(url), 60)
        httpx.post(f"{url}/admin/graphs/stocks/faults", timeout=10, json={
            "operator": "seq1", "state_delay_ms": 500}).raise_for_status()
        outcomes: list[Any] = []

        def done(result: Any, error: Any) -> None:
            outcomes.append(error if error is not None else result)

        def post(local: str, ticker: str) -> httpx.Response:
            with httpx.Client(transport=httpx.HTTPTransport(local_address=local),
                              timeout=30) as client:
                return client.post(f"{url}/stocks/predict",
                                   json={"input": [0.1] * 4, "ticker": ticker})

        with tg.InferenceServerClient(grpc_url) as client, ThreadPoolExecutor(1) as pool:
            for i in range(10):
                x = tg.InferInput("x", [1, 4], "FP32")
                x.set_data_from_numpy(np.full((1, 4), 0.1, np.float32))
                client.async_infer("stocks", [x], done, parameters={"streams": f"g{i}"},
                                   client_timeout=30)
            def counted() -> int:  # 127.0.0.1's requests inside, waiting, or answered
                return gate.inside("127.0.0.1") + gate.waiting("127.0.0.1") + len(outcomes)

            wait_until(lambda: counted() == 10, 5)  # the burst is at the door
            same = pool.submit(post, "127.0.0.1", "same")
            wait_until(lambda: counted() == 11, 5)  # counted with it: one share, two edges
            other = post("127.0.0.3", "other")
            wait_until(lambda: len(outcomes) == 10, 30)
            assert same.result().status_code in (200, 429), same.result().text
        assert other.status_code == 200, other.text  # another address: straight in
        refused = [o for o in outcomes if isinstance(o, InferenceServerException)]
        assert 1 <= len(refused) < 10, outcomes
        assert all(e.status() == "StatusCode.RESOURCE_EXHAUSTED" for e in refused), refused
        assert all("max_graph_requests_per_address" in e.message() for e in refused), refused
    finally:
        running.stop()


def test_a_burst_gets_the_whole_share_alone_and_the_shared_share_beside_another(
        tmp_path: Path) -> None:
    """``max_graph_requests_per_address_shared``: the same burst of six from 127.0.0.3 has
    all six inside at once while it is alone, and two while 127.0.0.1 has a request in the
    graph; every request of both is answered. seq1 holds each reply 500 ms, so what is
    inside stays there long enough to count."""
    cfg = config(timeout_ms=8000)
    cfg["server"]["limits"] = {"max_graph_requests_per_address": 8,
                               "max_graph_requests_per_address_shared": 2}
    running = start_server(cfg, tmp_path)
    try:
        url, gate = running.url, running.system.graph_gate
        wait_until(lambda: synced(url), 60)
        httpx.post(f"{url}/admin/graphs/stocks/faults", timeout=10, json={
            "operator": "seq1", "state_delay_ms": 500}).raise_for_status()
        row = {"input": [0.1, 0.2, 0.3, 0.4]}

        async def burst(other: bool) -> tuple[int, int, list[int]]:
            burster = httpx.AsyncClient(base_url=url, timeout=30, transport=httpx.
                                        AsyncHTTPTransport(local_address="127.0.0.3"))
            one = httpx.AsyncClient(base_url=url, timeout=30)
            async with burster, one:
                tasks = []
                if other:
                    tasks.append(asyncio.create_task(
                        one.post("/stocks/predict", json={**row, "ticker": "o"})))
                    while gate.inside("127.0.0.1") == 0:
                        await asyncio.sleep(0.005)
                tasks += [asyncio.create_task(burster.post(
                    "/stocks/predict", json={**row, "ticker": f"b{i}"})) for i in range(6)]
                while gate.inside("127.0.0.3") + gate.waiting("127.0.0.3") < 6:
                    await asyncio.sleep(0.005)
                seen = (gate.inside("127.0.0.3"), gate.waiting("127.0.0.3"))
                replies = await asyncio.gather(*tasks)
                return seen[0], seen[1], [r.status_code for r in replies]

        alone_in, alone_waiting, alone = asyncio.run(burst(other=False))
        assert (alone_in, alone_waiting) == (6, 0) and alone == [200] * 6, alone
        time.sleep(1.2)  # past the horizon: nobody else has asked lately
        shared_in, shared_waiting, shared = asyncio.run(burst(other=True))
        assert (shared_in, shared_waiting) == (2, 4), (shared_in, shared_waiting)
        assert shared == [200] * 7, shared
        assert len(gate) == 0
    finally:
        running.stop()
