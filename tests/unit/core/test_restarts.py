"""The supervisor's relaunch decision: back off while a slot keeps failing, then give up."""

from __future__ import annotations

import pytest

from parityserve.core import restarts
from parityserve.core.restarts import RestartPolicy, restart_delay

DEFAULT = RestartPolicy()
PATIENT = RestartPolicy(first_delay_s=1.0, max_delay_s=3.0, give_up_after=8)


def test_public_names() -> None:
    assert sorted(restarts.__all__) == ["RestartPolicy", "restart_delay"]


@pytest.mark.parametrize(("failures", "policy", "delay"), [
    (1, DEFAULT, 0.0),     # a first crash relaunches at once
    (2, DEFAULT, 0.25),
    (3, DEFAULT, 0.5),
    (4, DEFAULT, 1.0),
    (5, DEFAULT, None),    # gives up: the model is marked failed
    (6, DEFAULT, None),
    (50, DEFAULT, None),
    (2, PATIENT, 1.0),
    (3, PATIENT, 2.0),
    (4, PATIENT, 3.0),     # capped
    (7, PATIENT, 3.0),
    (8, PATIENT, None),
    (1, RestartPolicy(give_up_after=1), None),  # never retry
])
def test_restart_delay(failures, policy, delay) -> None:
    assert restart_delay(failures, policy) == delay
