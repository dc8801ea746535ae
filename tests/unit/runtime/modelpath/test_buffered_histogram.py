"""The buffered histogram exposes exactly what prometheus_client's Histogram does for the
same observations, folded at any point, and every observation is in the next scrape."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from parityserve.runtime.modelpath import buffered_histogram
from parityserve.runtime.modelpath.buffered_histogram import BufferedHistogram
from parityserve.runtime.modelpath.metrics import LATENCY_BUCKETS

BOUNDS = LATENCY_BUCKETS


def exposition(registry: CollectorRegistry) -> list[Any]:
    """The text a scrape gets, without the library's creation timestamps; a sum is a number
    compared approximately (numpy adds pairwise, the library one value at a time)."""
    lines: list[Any] = []
    for line in generate_latest(registry).decode().splitlines():
        if "_created" in line:
            continue
        name, _, value = line.rpartition(" ")
        lines.append((name, pytest.approx(float(value))) if "_sum{" in name else line)
    return lines


def pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, BufferedHistogram]:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    library = Histogram("t_seconds", "doc", ["route", "target"], buckets=BOUNDS,
                        registry=theirs)
    buffered = BufferedHistogram("t_seconds", "doc", ["route", "target"], buckets=BOUNDS,
                                 registry=ours)
    return theirs, library, ours, buffered


values = st.one_of(st.sampled_from(BOUNDS), st.floats(-1.0, 20.0, allow_nan=False),
                   st.floats(0, 1e-3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), values), max_size=60),
       st.integers(1, 7))
def test_the_exposition_equals_the_librarys(observed: list[tuple[str, float]],
                                            fold_at: int) -> None:
    theirs, library, ours, buffered = pair()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(buffered_histogram, "_FOLD_AT", fold_at)  # folds mid-way too
        for label, value in observed:
            library.labels(label, "m").observe(value)
            buffered.labels(label, "m").observe(value)
        assert exposition(ours) == exposition(theirs)


def test_a_scrape_sees_every_observation_made_before_it() -> None:
    theirs, library, ours, buffered = pair()
    for value in (0.001, 0.002):
        library.labels("r", "t").observe(value)
        buffered.labels("r", "t").observe(value)
        assert exposition(ours) == exposition(theirs)
    assert ours.get_sample_value("t_seconds_count", {"route": "r", "target": "t"}) == 2


def test_wrong_labels_and_no_bounds_are_refused() -> None:
    _, _, _, buffered = pair()
    with pytest.raises(ValueError, match="takes labels \\('route', 'target'\\)"):
        buffered.labels("only-one")
    with pytest.raises(ValueError, match="at least one finite bucket bound"):
        BufferedHistogram("u", "doc", [], buckets=[float("inf")], registry=CollectorRegistry())
