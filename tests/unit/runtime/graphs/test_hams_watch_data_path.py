"""HAMS's data-path detector (``Watch._data_path_loss``, §IV-E): a primary silent while it
holds a batch, past a limit scaled by its operator's recent round trips, is suspected before
the heartbeat timeout; one seen working, a backup, an idle primary, and a frontend that hears
nobody are not. Pure: a fake graph context, the real ``InFlight``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from parityserve.core.hams.inflight import RTT_WINDOW, InFlight
from parityserve.runtime.graphs import hams_watch
from parityserve.runtime.graphs.hams_context import Pair
from parityserve.runtime.graphs.hams_watch import DATA_LIMIT_FLOOR_S, Watch


def _member(last_beat: float, *, here: bool = False) -> Any:
    return SimpleNamespace(last_beat=last_beat, hello=SimpleNamespace(done=lambda: True), lost=None,
                           on_this_host=here, pid=4321, worker_id="g/op/primary-1")


class _Voucher:
    """A member always heard just now."""

    lost, hello = None, SimpleNamespace(done=lambda: True)
    last_beat = float("inf")


def _rig(rtt_s: float | None, *, primary: Any, backup: Any = None, on: bool = True
         ) -> tuple[Watch, InFlight]:
    """A watch over one operator whose last batches came back in ``rtt_s`` (None: none did);
    ``on``: the graph's ``data_path_detection``."""
    out: InFlight[list[int]] = InFlight(0.0)
    if rtt_s is not None:
        out.add(1, [0], 0.0)
        out.pop(1, rtt_s)
    ctx = SimpleNamespace(graph=SimpleNamespace(heartbeat_timeout_ms=200, data_path_detection=on),
                          pairs={"op": Pair("op", primary=primary, backup=backup)},
                          inflight={"op": out}, plan=object())
    # another member that spoke just now vouches that the frontend hears (its time is moved
    # along by each test where that matters)
    members = SimpleNamespace(by_id={"p": ("op", primary), "v": ("op", _Voucher())})
    return Watch(ctx, members, None, None, None), out  # type: ignore[arg-type]


def test_a_primary_silent_holding_a_batch_is_suspected_past_four_round_trips() -> None:
    primary = _member(10.0)
    watch, out = _rig(0.03, primary=primary)  # batches came back in 30 ms: limit 120 ms
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.11, hearing=True) is None
    silent, limit = watch._data_path_loss("op", primary, 10.13, hearing=True)
    assert limit == pytest.approx(0.12) and silent == pytest.approx(0.13)


def test_the_limit_is_at_least_the_floor_and_at_most_the_heartbeat_timeout() -> None:
    assert pytest.approx(0.1) == DATA_LIMIT_FLOOR_S  # two heartbeat intervals
    primary = _member(10.0)
    fast, out = _rig(0.001, primary=primary)
    out.add(2, [1], 10.0)
    assert fast._data_path_loss("op", primary, 10.0 + DATA_LIMIT_FLOOR_S * 0.9, True) is None
    assert fast._data_path_loss("op", primary, 10.0 + DATA_LIMIT_FLOOR_S * 1.1, True)
    slow, out = _rig(0.5, primary=primary)  # 4 x 500 ms: capped at the 200 ms timeout
    out.add(2, [1], 10.0)
    assert slow._data_path_loss("op", primary, 10.19, True) is None
    assert slow._data_path_loss("op", primary, 10.21, True)[1] == pytest.approx(0.2)


def test_the_silence_counts_from_the_batchs_send_not_from_an_idle_members_last_beat() -> None:
    primary = _member(10.0)  # idle, last beat at 10.0; the batch leaves at 10.04
    watch, out = _rig(0.01, primary=primary)
    out.add(2, [1], 10.04)
    assert watch._data_path_loss("op", primary, 10.13, True) is None  # 90 ms since it left
    assert watch._data_path_loss("op", primary, 10.15, True)  # 110 ms > the 100 ms floor


def test_an_idle_primary_a_backup_and_one_never_measured_are_left_to_the_heartbeat() -> None:
    primary, backup = _member(10.0), _member(10.0)
    watch, _ = _rig(0.01, primary=primary, backup=backup)
    assert watch._data_path_loss("op", primary, 15.0, True) is None  # nothing in flight
    watch, out = _rig(0.01, primary=primary, backup=backup)
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", backup, 15.0, True) is None  # holds no batch
    unmeasured, out = _rig(None, primary=primary)
    out.add(2, [1], 10.0)
    assert unmeasured._data_path_loss("op", primary, 15.0, True) is None


def test_no_verdict_while_the_frontend_hears_nobody_or_its_loop_just_stalled() -> None:
    primary = _member(10.0)
    watch, out = _rig(0.01, primary=primary)
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.2, hearing=False) is None
    watch._forgive_stall(0.15, now=10.18)  # the loop was away: its unread news is no silence
    assert watch._data_path_loss("op", primary, 10.2, True) is None
    assert watch._data_path_loss("op", primary, 10.27, True) is None  # 90 ms since
    assert watch._data_path_loss("op", primary, 10.29, True)


def test_no_verdict_while_no_other_member_was_heard_within_half_the_limit() -> None:
    """Every member silent at once is the frontend not hearing (its socket's thread without a
    core), not every member lost: another member must have spoken lately."""
    primary, backup = _member(10.0), _member(10.0)
    watch, out = _rig(0.01, primary=primary, backup=backup)
    watch.members.by_id["v"] = ("op", backup)  # the only other member: as quiet
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.15, True) is None  # the backup as quiet
    backup.last_beat = 10.11  # the backup spoke 40 ms ago: the frontend hears
    assert watch._data_path_loss("op", primary, 10.15, True)


def test_a_lone_primary_has_nobody_to_vouch_and_gets_no_data_path_verdict() -> None:
    primary = _member(10.0)
    watch, out = _rig(0.01, primary=primary)
    del watch.members.by_id["v"]
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.19, True) is None


def test_bare_and_checkpoint_replay_keep_the_heartbeat_alone() -> None:
    """No plan: a wrong verdict would restart the primary from scratch (its state lost)."""
    primary = _member(10.0)
    watch, out = _rig(0.01, primary=primary)
    watch.ctx.plan = None
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.19, True) is None


def test_a_failover_drops_the_old_primarys_round_trips() -> None:
    primary = _member(10.0)
    watch, out = _rig(0.01, primary=primary)
    out.add(2, [1], 10.0)
    out.clear()  # the batches go to the promoted backup: its own round trips decide
    out.add(3, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.19, True) is None
    out.pop(3, 10.05)
    out.add(4, [1], 10.05)
    assert watch._data_path_loss("op", primary, 10.2, True) is None  # 4 x 50 ms = 200 ms
    assert watch._data_path_loss("op", primary, 10.26, True)


def test_a_graph_that_turned_it_off_has_the_heartbeat_alone() -> None:
    primary = _member(10.0)
    watch, out = _rig(0.01, primary=primary, on=False)
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", primary, 10.19, True) is None


@pytest.mark.parametrize(("states", "judged_here"), [
    ("RSS", False), ("DS", False),  # computing, starved, or in the kernel: seen working
    ("SSSSSSSS", True), ("ZZ", True), ("", True), ("TTT", True)])  # asleep, dead, gone, stopped
def test_a_primary_seen_working_on_this_host_is_judged_by_the_heartbeat(
        monkeypatch, states: str, judged_here: bool) -> None:
    """Asleep is not spared: a crashed node's processes look asleep (or alive at all) for
    200-900 ms while the kernel tears them down on a loaded machine."""
    primary = _member(10.0, here=True)
    watch, out = _rig(0.01, primary=primary)
    out.add(2, [1], 10.0)
    monkeypatch.setattr(hams_watch, "thread_states", lambda pid: states)
    assert bool(watch._data_path_loss("op", primary, 10.15, True)) is judged_here
    remote = _member(10.0)  # on another host: no /proc to read, the rule as it is
    watch, out = _rig(0.01, primary=remote)
    out.add(2, [1], 10.0)
    assert watch._data_path_loss("op", remote, 10.15, True)


def test_inflight_keeps_the_slowest_of_its_recent_round_trips_and_the_oldest_send() -> None:
    out: InFlight[list[int]] = InFlight(0.0)
    assert out.slowest_recent() is None and out.oldest_sent() is None
    out.add(1, [0], 1.0)
    out.pop(1, 1.5)  # 500 ms
    for bid in range(2, 2 + RTT_WINDOW):
        assert out.slowest_recent() == pytest.approx(0.5)
        out.add(bid, [0], 10.0)
        out.pop(bid, 10.01)
    assert out.slowest_recent() == pytest.approx(0.01)  # the slow one left the window
    out.add(99, [0], 20.0)
    out.add(100, [0], 21.0)
    assert out.oldest_sent() == 20.0
