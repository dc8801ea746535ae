"""The scheduler's busy hold (``Scheduler.busy_hold_s``): a partial batch waits for more
queries only while the driver's loop is saturated and queries come faster than the hold."""

from __future__ import annotations

from parityserve.core.scheduling import ModeSettings
from tests.unit.core.scheduling.scheduler_rig import Rig

HOLD = 0.002


def busy_rig(*, saturated: bool, gap_s: float = 0.0003, busy_delay_s: float = HOLD,
             slo_s: float = 0.1) -> Rig:
    """Twenty queries ``gap_s`` apart, each answered as it comes (the arrival-gap estimate
    learns the gap), then the loop ``saturated`` or not."""
    rig = Rig(ModeSettings(), busy_delay_s=busy_delay_s, slo_s=slo_s)
    rig.add("r0", initial=4)
    for _ in range(20):
        rig.submit()
        rig.echo("r0")
        rig.at(gap_s)
    rig.lines.clear()
    rig.machine.saturated = saturated
    return rig


def test_an_idle_loop_sends_a_lone_query_at_once() -> None:
    rig = busy_rig(saturated=False)
    rig.submit()
    assert rig.lines == ["send r0 data [20]"]


def test_a_saturated_loop_holds_a_partial_batch_until_it_fills() -> None:
    rig = busy_rig(saturated=True)
    rig.submit()
    assert rig.lines == ["wake +8ms"]  # T0 + 20 gaps of 0.3 ms, + the 2 ms hold
    for _ in range(3):
        rig.at(0.0003).submit()
    assert rig.lines[-1] == "send r0 data [20, 21, 22, 23]"  # full (AIMD's 4): no waiting


def test_a_held_batch_leaves_when_the_hold_is_over() -> None:
    rig = busy_rig(saturated=True)
    rig.submit()
    rig.at(0.0005).submit()
    rig.tick()
    assert rig.lines[-1] == "send r0 data [20, 21]"


def test_a_rarely_asked_model_does_not_wait_on_a_busy_loop() -> None:
    rig = busy_rig(saturated=True, gap_s=0.05)  # a query every 50 ms: none joins in 2 ms
    rig.submit()
    assert rig.lines == ["send r0 data [20]"]


def test_the_hold_never_exceeds_a_tenth_of_the_slo() -> None:
    rig = busy_rig(saturated=True, busy_delay_s=0.05, slo_s=0.01)
    assert rig.machine.busy_hold_s() == 0.001
    rig.submit()
    assert rig.lines == ["wake +7ms"]  # 6 ms of arrivals, then a tenth of the 10 ms SLO


def test_zero_turns_the_hold_off() -> None:
    rig = busy_rig(saturated=True, busy_delay_s=0.0)
    rig.submit()
    assert rig.lines == ["send r0 data [20]"]


def test_a_loop_that_stops_being_saturated_releases_the_held_batch_at_its_next_pump() -> None:
    rig = busy_rig(saturated=True)
    rig.submit()
    assert rig.lines == ["wake +8ms"]
    rig.machine.saturated = False
    rig.at(0.0003).submit()
    assert rig.lines[-1] == "send r0 data [20, 21]"
