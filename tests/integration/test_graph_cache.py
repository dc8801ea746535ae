"""A graph's stateless operators do not go through the prediction cache (issue 38: frontend
memory bounded). Their rows are mostly other operators' outputs, which never repeat: each
filled an entry, two per request of the README's graph, which grew the soak's frontend by
27 MB in 15 minutes and evicted what the model routes had cached. A request to the same
model on its own route still is cached."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_sequences import config, synced

pytestmark = pytest.mark.integration


def test_graph_rows_leave_the_cache_alone_and_the_model_route_still_fills_it(
        tmp_path: Path) -> None:
    running = start_server(config(), tmp_path)
    try:
        url, cache = running.url, running.system.cache
        wait_until(lambda: synced(url), 60)
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(40):
                reply = client.post("/stocks/predict", json={
                    "input": [0.1 * i, 0.2, 0.3, 0.4], "ticker": f"t{i % 4}"})
                assert reply.status_code == 200, reply.text
            assert len(cache) == 0, cache.statistics()
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                "data": [0.5, 0.6, 0.7, 0.8]}]}
            for _ in range(2):  # features on its own route: stored, then served from it
                reply = client.post("/v2/models/features/infer", json=body)
                assert reply.status_code == 200, reply.text
        stats = cache.statistics()
        assert (stats.entries, stats.hits) == (1, 1), stats
    finally:
        running.stop()
