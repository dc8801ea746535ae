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
from pathlib import Path

import httpx
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
