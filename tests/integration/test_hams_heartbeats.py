"""A loaded operator process is not a hung one (issue 39, item 3 of the overhead work): with
exit detection, a member silent for ``heartbeat_timeout_ms`` (200 ms) is lost, and a full
garbage collection over a worker's heap (torch, the model: 70-80 ms of CPU on this 2-core
box, over 200 ms of wall time beside other work) silenced a healthy primary that long. The
operator processes freeze what they loaded, so such a pass never walks it again.

The operator here loads a big heap (a million lists) and runs a full collection on some
batches, as a model that allocates a lot would trigger one: it says how many objects its
process had frozen (none on the code before: the test fails there), and the graph must lose
no member while it runs (without the freeze each pass took about 106 ms here, unloaded:
that check alone catches it only on a slower or busier box)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.integration.conftest import start_server, wait_until

OPERATOR = '''
import gc
import time

import torch


class BigHeap:
    """A stateful operator with a million lists loaded at start; every 5th batch runs a
    full garbage collection. Outputs: [objects frozen in this process, that pass in ms]."""

    def __init__(self) -> None:
        self.heap = [[] for _ in range(1_000_000)]
        self.batches = 0

    def initialize(self):
        return {"n": torch.zeros(1, dtype=torch.int64)}

    def compute(self, batch, state):
        self.batches += 1
        took = 0.0
        if self.batches % 5 == 0:
            start = time.perf_counter()
            gc.collect()
            took = (time.perf_counter() - start) * 1e3
        row = [float(gc.get_freeze_count()), took]
        return torch.tensor([row] * len(batch), dtype=torch.float64), len(batch)

    def update(self, state, pending):
        state["n"] += pending
'''


def test_a_full_garbage_collection_in_an_operator_is_not_a_lost_member(tmp_path: Path
                                                                       ) -> None:
    (tmp_path / "big_heap.py").write_text(OPERATOR)
    config = {
        "server": {"http_port": 0, "require_admin_token": False},
        "models": [{"name": "big", "source": f"python:{tmp_path / 'big_heap.py'}:BigHeap"}],
        "graphs": [{"name": "g", "max_batch": 1, "operators": [
            {"name": "op", "model": "big", "inputs": ["frontend"], "stateful": True}],
            "output": "op"}]}
    running = start_server(config, tmp_path)
    try:
        url = running.url

        def state() -> dict:
            return httpx.get(f"{url}/admin/state", timeout=30).json()["graphs"]["g"]

        wait_until(lambda: state()["operators"]["op"]["backup_synced"], 60)
        outputs = []
        with httpx.Client(timeout=60) as client:
            for _ in range(20):  # four full collections on the primary
                reply = client.post(f"{url}/g/predict", json={"input": [1.0]})
                assert reply.status_code == 200, reply.text
                outputs.append(reply.json()["output"])
        assert min(frozen for frozen, _ in outputs) >= 1_000_000  # the heap was frozen
        assert sum(1 for _, took in outputs if took > 0) == 4
        graph = state()
        assert graph["losses"] == [] and graph["failovers"] == []
    finally:
        running.stop()
