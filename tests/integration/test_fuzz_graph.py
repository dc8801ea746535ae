"""A short, derandomized pass of the graph fuzzer (``fuzz_graph.py``): rounds of good and
hostile requests sent at once to the README's ``stocks`` graph and one model (issue 38)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzz_graph import (
    CONFIG,
    GRAPH,
    HOSTILE,
    _wait_ready,
    answers_in_time,
    fuzz,
    open_good_streams,
    stuck_operators,
)

from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server

pytestmark = pytest.mark.integration

ROUNDS = 60  # about 500 requests (10 s here); derandomized, so every run sends the same ones


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(CONFIG, tmp_path_factory.mktemp("fuzz-graph"))
    yield running
    running.stop()


@pytest.mark.timeout(300)
def test_mixed_good_and_hostile_rows_never_5xx_or_wedge_the_graph(server: RunningServer
                                                                   ) -> None:
    _wait_ready(server.url)
    open_good_streams(server.url)
    report = fuzz(server.url, ROUNDS)
    assert not report.failures, "\n".join(
        f"{f['kind']}: {f['why']}; {f['path']} {f['request'][:120]!r} -> {f['answer'][:200]!r}"
        for f in report.failures)
    kinds = {key.split(":")[0] for key in report.counts}
    assert report.rounds == ROUNDS and len(kinds) >= len(HOSTILE), report.counts
    if report.known:  # another engineer's to fix (fuzz_graph.KNOWN_ELSEWHERE): say so
        print(f"known elsewhere: {report.known}")
    stuck = stuck_operators(server.url)
    assert stuck is None, f"graph {GRAPH!r} still busy after the rounds: {stuck}"
    # within the graph's own 30 s deadline: a wedged operator answers 504 only after it
    assert answers_in_time(server.url) < 30.0
