"""One model's serving path as a sans-I/O state machine, and the records its drivers share.

* ``pools``: pool and slot names, spelled once;
* ``records``: queries, tasks, coding groups, replicas (a leaf: drivers import it freely);
* ``settings``: the frozen settings a path schedules by;
* ``actions``: what the scheduler asks its driver to do;
* ``modes``: the redundancy modes (none, equal-resources, replication, reactive, ParM,
  Berrut, systematic Berrut);
* ``machine``: ``Scheduler``, the state machine itself.
"""

from parityserve.core.scheduling.actions import (
    Abort,
    Action,
    Answer,
    CodingFailed,
    Expire,
    Fail,
    Late,
    Located,
    Redundant,
    Send,
    WakeAt,
)
from parityserve.core.scheduling.machine import EXPIRED, UNFINISHABLE, Scheduler
from parityserve.core.scheduling.pools import (
    DATA_POOL,
    is_parity_slot,
    parity_index,
    parity_pool,
    parity_pools,
    slot_name,
)
from parityserve.core.scheduling.records import (
    GroupRun,
    InflightBatch,
    Query,
    Replica,
    ReplicaState,
    Task,
    TaskKind,
)
from parityserve.core.scheduling.settings import (
    MODES,
    PARALLELISM_MODES,
    Batching,
    ModeSettings,
    ParitySettings,
    check_parallelism,
)

__all__ = [
    "DATA_POOL",
    "EXPIRED",
    "MODES",
    "PARALLELISM_MODES",
    "UNFINISHABLE",
    "Abort",
    "Action",
    "Answer",
    "Batching",
    "CodingFailed",
    "Expire",
    "Fail",
    "GroupRun",
    "InflightBatch",
    "Late",
    "Located",
    "ModeSettings",
    "ParitySettings",
    "Query",
    "Redundant",
    "Replica",
    "ReplicaState",
    "Scheduler",
    "Send",
    "Task",
    "TaskKind",
    "WakeAt",
    "check_parallelism",
    "is_parity_slot",
    "parity_index",
    "parity_pool",
    "parity_pools",
    "slot_name",
]
