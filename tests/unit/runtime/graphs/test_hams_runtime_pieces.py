"""The pure pieces of HAMS serving: the flat state copy, the checkpoint-replay log, lineage on
the wire, and the benchmark's rules (phases, overhead ratios, the consistency oracle)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.hams_analysis import (
    ConsistencyOracle,
    latency_summary,
    overhead_rows,
    recovery_phases,
    render_markdown,
)
from parityserve.core.hams import Arrival, Executed, Hop
from parityserve.errors import ModelLoadError, ProtocolError
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_protocol import (
    Refusal,
    checkpoint_file,
    lineage_from_wire,
    lineage_to_wire,
    refusal,
)
from parityserve.runtime.graphs.hams_replay import ReplayLog
from parityserve.runtime.graphs.hams_state import FlatState
from parityserve.runtime.graphs.hams_worker import restore_checkpoint, save_checkpoint
from parityserve.runtime.workers import wire


def state() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "keys": torch.tensor([1, 0, 7], dtype=torch.int64),
            "b": torch.ones(5, dtype=torch.float64)}


def test_a_flat_copy_installs_the_same_bytes_and_is_independent_of_the_live_state() -> None:
    live = state()
    flat = FlatState.capture(4, live)
    live["w"].add_(100)  # the copy must not move with the live state
    target = {k: torch.zeros_like(v) for k, v in state().items()}
    FlatState.received(4, flat.layout, bytes(flat.frame())).install(target)
    for name, tensor in state().items():
        assert torch.equal(target[name], tensor)


def test_a_state_with_another_layout_is_refused_before_anything_is_written() -> None:
    flat = FlatState.capture(1, state())
    other = {"w": torch.zeros(4, 3), "keys": torch.zeros(3, dtype=torch.int64),
             "b": torch.zeros(5, dtype=torch.float64)}
    with pytest.raises(ProtocolError, match="layout differs"):
        flat.install(other)
    assert not other["w"].any()


@pytest.mark.parametrize("layout", [[["w", "|O", [3], 0]], [["w", "<f4", [10**6], 0]],
                                    [["w", "<f4"]], "nonsense"])
def test_a_peers_bad_layout_is_a_protocol_error(layout: Any) -> None:
    with pytest.raises(ProtocolError):
        FlatState.received(1, layout, b"\0" * 64).arrays()


def test_checkpoints_restore_the_one_the_frontend_names_whole(tmp_path: Any) -> None:
    path = str(tmp_path / "op.ckpt")
    target = {k: torch.zeros_like(v) for k, v in state().items()}
    assert restore_checkpoint(path, 0, target) == 0  # none yet: start from the initial state
    assert torch.equal(target["w"], torch.zeros_like(state()["w"]))
    save_checkpoint(path, FlatState.capture(150, state()))
    newer = {k: v + 1 for k, v in state().items()}
    save_checkpoint(path, FlatState.capture(160, newer))  # written, never announced
    assert sorted(os.listdir(tmp_path)) == ["op.ckpt.150", "op.ckpt.160"]
    assert restore_checkpoint(path, 150, target) == 150  # not the newest on disk
    assert torch.equal(target["w"], state()["w"])
    assert restore_checkpoint(path, 160, target) == 160
    assert torch.equal(target["w"], newer["w"])


def test_a_checkpoint_that_cannot_be_read_stops_the_process_with_its_number(
        tmp_path: Any) -> None:
    path = str(tmp_path / "op.ckpt")
    target = {k: torch.zeros_like(v) for k, v in state().items()}
    with pytest.raises(ModelLoadError, match="checkpoint 150 cannot be read"):
        restore_checkpoint(path, 150, target)
    save_checkpoint(path, FlatState.capture(150, state()))
    os.replace(checkpoint_file(path, 150), checkpoint_file(path, 170))  # a misnamed file
    with pytest.raises(ModelLoadError, match="checkpoint file for 170 holds the state after 150"):
        restore_checkpoint(path, 170, target)


def test_lineage_survives_the_wire_and_garbage_does_not_pass() -> None:
    lineage = (Hop("frontend", 7, "a", 1), Hop("a", 1, "b", 3))
    assert lineage_from_wire(lineage_to_wire(lineage)) == lineage
    with pytest.raises(ProtocolError):
        lineage_from_wire([["frontend", "x", "a"]])


def executed(seq: int) -> Executed[np.ndarray]:
    hop = Hop("frontend", seq, "op", seq)
    return Executed(seq, Arrival((), (("frontend", seq),), np.zeros(1)), (hop,))


def test_the_replay_log_keeps_what_follows_the_last_checkpoint_and_spots_conflicts() -> None:
    log = ReplayLog()
    for first in (1, 3, 5):
        log.logged({"seqs": [first, first + 1]}, [b"rows"])
        log.answered([executed(first), executed(first + 1)], np.array([[first], [first + 1]]))
    log.checkpointed(2)
    assert log.since_checkpoint == 2
    assert [h["seqs"] for h, _ in log.after(2)] == [[3, 4], [5, 6]]
    assert [h["seqs"] for h, _ in log.after(4)] == [[5, 6]]
    assert log.conflicts_with(5, [5]) is False and log.conflicts_with(5, [9]) is True
    assert log.conflicts_with(1, [42]) is False  # dropped with the checkpoint: unknown
    assert log.conflicts_with(99, [1]) is False  # never answered: nothing to differ from


def test_recovery_splits_into_detection_protocol_and_handover() -> None:
    phases = recovery_phases(10.0, {"detected_at": 10.02, "protocol_done_at": 10.025,
                                    "first_reply_at": 10.04})
    assert phases == pytest.approx({"detection_ms": 20.0, "protocol_ms": 5.0,
                                    "handover_ms": 15.0, "total_ms": 40.0})
    assert recovery_phases(1.0, {"detected_at": 1.1, "protocol_done_at": 1.2})[
        "total_ms"] is None


def test_overhead_is_the_median_over_repetitions_relative_to_bare() -> None:
    cell = [latency_summary([0.010] * 10, 100, 1.0), latency_summary([0.012] * 10, 80, 1.0)]
    faster = [latency_summary([0.011] * 10, 100, 1.0)]
    rows = overhead_rows({"bare": {8: cell}, "hams": {8: faster}})
    hams = next(r for r in rows if r["mode"] == "hams")
    assert hams["mean_vs_bare"] == pytest.approx(11 / 11)  # median of 10 and 12 ms is 11
    assert hams["tput_vs_bare"] == pytest.approx(100 / 90)
    assert "mean_vs_bare_paired" not in hams  # one repetition against two: nothing to pair
    paired = overhead_rows({"bare": {8: cell}, "hams": {8: [latency_summary([0.011] * 10, 1, 1),
                                                            latency_summary([0.024] * 10, 1, 1)]}})
    hams = next(r for r in paired if r["mode"] == "hams")
    assert hams["each_mean_ms"] == pytest.approx([11.0, 24.0])
    assert hams["mean_vs_bare_paired"] == pytest.approx((11 / 10 + 24 / 12) / 2)
    assert hams["mean_vs_bare"] == pytest.approx(17.5 / 11)  # the ratio of the medians
    assert "| hams | 8 |" in render_markdown({"overhead": rows})  # a run before open loop
    table = render_markdown({"overhead": {"rows": rows, "load_share": 0.5,
                                          "bare_saturation_rows_per_s": {"8": 1234.0}}})
    assert "| hams | 8 |" in table and "50% of `bare`'s saturation" in table
    assert "1234 at B=8" in table


def test_the_oracle_flags_two_values_for_one_sequence_number() -> None:
    oracle = ConsistencyOracle()
    oracle.record({"query_id": "1", "seqs": {"op": 1}, "output": [0.5]}, ["op"])
    oracle.record({"query_id": "2", "seqs": {"op": 2}, "output": [0.5]}, ["op"])
    assert not oracle.conflicts
    oracle.record({"query_id": "3", "seqs": {"op": 1}, "output": [0.7]}, ["op"])
    assert len(oracle.conflicts) == 1 and oracle.duplicates() == 0


def test_the_replay_check_gets_a_table_per_mode() -> None:
    run = {"mode": "hams", "kills": 3, "by_role": {}, "sent": 8, "answered": 8, "lost": 0,
           "duplicates": 0, "pairs": 8, "conflicts": 0}
    text = render_markdown({"consistency": {**run, "replay": {
        "hams": {**run, "failovers": 2, "requests": 8, "batches": 5,
                 "final_state_matches_replay": True, "backup_matches_primary": True, "why": ""},
        "checkpoint-replay": {**run, "mode": "checkpoint-replay", "requests": 8,
                              "final_state_matches_replay": False,
                              "why": "history: a gap"}}}})
    assert "| hams | 3 | 2 | 8 | 5 | yes | yes |  |" in text
    assert "| checkpoint-replay | 3 | – | 8 | – | **no** | – | history: a gap |" in text


def test_median_and_max_skip_runs_without_the_value() -> None:
    from benchmarks.hams_analysis import median_and_max

    stats = median_and_max([{"a": 1.0, "b": None}, {"a": 3.0, "b": None},
                            {"a": 8.0, "b": None}], ("a", "b"))
    assert stats["kills"] == 3 and stats["median"] == {"a": 3.0, "b": None}
    assert stats["max"]["a"] == 8.0


def row_outcomes(header: dict[str, Any], outputs: list[str] | None, n: int) -> list[Any]:
    """An OUT message's rows as the frontend reads them (``hams_messages.Out``)."""
    desc, frames = wire.pack_payload(outputs)
    body = {"outputs": desc} if outputs is not None else {}
    return hm.parse_report({"t": hp.OUT, "bid": 1, **header, **body}, frames).outcomes(n)


class _NoRoom(RuntimeError):
    retry_after_s = 2.5


def test_an_operator_answer_gives_each_row_its_output_or_its_refusal() -> None:
    """A batch the primary searched for its bad rows comes back as one message: the outputs
    of the rows it ran (``rows``) and a refusal for each other, with its kind."""
    assert refusal(1, _NoRoom("no slot")) == [1, "busy", "_NoRoom: no slot", 2.5]
    assert refusal(2, ValueError("width 2"))[:3] == [2, "bad_input", "ValueError: width 2"]
    assert refusal(3, RuntimeError("boom"))[1] == "error"
    header = {"rows": [0, 2], "refused": [refusal(1, ValueError("width 2"))]}
    out = row_outcomes(header, ["a", "c"], 3)
    assert out == ["a", Refusal(1, "bad_input", "ValueError: width 2"), "c"]
    assert row_outcomes({}, ["a", "b"], 2) == ["a", "b"]
    assert row_outcomes({"error": "E", "bad_input": True}, None, 2) == [
        Refusal(0, "bad_input", "E"), Refusal(1, "bad_input", "E")]
    with pytest.raises(ProtocolError, match="unanswered"):
        row_outcomes({"rows": [0]}, ["a"], 2)
