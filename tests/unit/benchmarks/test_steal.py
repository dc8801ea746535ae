"""benchmarks.steal: the hypervisor's stolen CPU, read from /proc/stat, and the answers
in flight while none was stolen."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.steal import StealSampler, StealSamples, read_ticks, steal_free

STAT = "cpu  100 0 50 800 5 0 5 40 0 0\ncpu0 50 0 25 400 2 0 2 20 0 0\n"


def _samples(times: list[float], steal: list[int], total: list[int] | None = None
             ) -> StealSamples:
    total = total or [1000 * i for i in range(len(times))]
    return StealSamples(np.array(times, float), np.array(steal, float), np.array(total, float))


def test_ticks_are_the_first_lines_steal_and_its_sum(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert read_ticks(stat) == (40, 100 + 50 + 800 + 5 + 5 + 40)


@pytest.mark.parametrize("text", ["", "cpu 1 2 3\n", "intr 1 2 3 4 5 6 7 8 9\n",
                                  "cpu a b c d e f g h\n"])
def test_a_stat_file_without_a_steal_field_measures_nothing(tmp_path: Path, text: str) -> None:
    stat = tmp_path / "stat"
    stat.write_text(text)
    assert read_ticks(stat) is None
    assert read_ticks(tmp_path / "absent") is None


def test_share_and_stalls_come_from_the_counters() -> None:
    s = _samples([0.0, 0.005, 0.010, 0.015], [0, 0, 3, 4], [0, 100, 200, 400])
    assert s.share() == pytest.approx(4 / 400)
    assert s.stalls() == 1  # only the jump of 3 ticks is 20 ms or more in one interval
    assert s.stalls(min_ticks=1) == 2


def test_during_counts_the_steal_while_each_interval_was_open() -> None:
    s = _samples([0.0, 1.0, 2.0, 3.0, 4.0], [0, 0, 2, 2, 5])
    ticks = s.during(np.array([0.2, 2.1, 1.5, -1.0]), np.array([0.9, 2.9, 3.5, 10.0]))
    # [0.2, 0.9] sits between samples 0 and 1: nothing; [2.1, 2.9]: between 2 and 3, nothing;
    # [1.5, 3.5] spans the jump at 2 and the one at 4; outside the samples: all of it
    assert ticks.tolist() == [0, 0, 5, 5]


def test_nothing_sampled_is_unmeasured_not_zero() -> None:
    s = _samples([1.0], [3])
    assert not s.measured
    assert s.share() is None and s.stalls() is None and s.during([0.0], [1.0]) is None
    out = steal_free(np.array([0.01]), np.array([True]), np.array([0.0]), s)
    assert set(out.values()) == {None}


def test_steal_free_keeps_only_answers_that_met_no_steal() -> None:
    s = _samples([0.0, 1.0, 2.0, 3.0], [0, 0, 4, 4])  # 40 ms stolen between 1 s and 2 s
    sends = np.array([0.1, 0.2, 1.5, 2.2, 2.3])
    latencies = np.array([0.010, 0.020, 0.030, 0.040, 0.500])
    ok = np.array([True, True, True, True, False])
    out = steal_free(latencies, ok, sends, s)
    assert out["clean_n"] == 3  # the one in flight at 1.5 s is dropped, the failed one too
    assert out["clean_share"] == pytest.approx(3 / 4)
    assert out["clean_p999_ms"] == pytest.approx(40.0)
    assert out["clean_p50_ms"] == pytest.approx(20.0)


def test_the_sampler_reads_the_real_counters_where_there_are_some() -> None:
    with StealSampler(interval_s=0.002) as sampler:
        time.sleep(0.05)
    samples = sampler.samples()
    if read_ticks() is None:
        assert not samples.measured
        return
    assert samples.measured and samples.times.size >= 3
    assert np.all(np.diff(samples.times) > 0) and np.all(np.diff(samples.steal) >= 0)
    assert 0.0 <= samples.share() <= 1.0


def test_the_sampler_measures_nothing_without_a_counter(tmp_path: Path) -> None:
    with StealSampler(path=tmp_path / "absent") as sampler:
        pass
    assert not sampler.samples().measured


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        StealSampler(interval_s=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_linux_has_the_steal_field() -> None:
    assert read_ticks() is not None
