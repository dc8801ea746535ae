"""HAMS: stateful service graphs that survive a crash, the pure decisions.

* ``lineage``: hops and lineages (Alg. 1's record);
* ``requests``: one operator's request manager, held by the frontend's graph router;
* ``durability``: watermarks, the backup's apply rule (Alg. 2) and the frontend's output commit;
* ``shipping``: the primary's non-stop state shipping (copy gate, one state in flight);
* ``deltas``: per copy, the full state or only the rows an operator declared it changed;
* ``topology``: a validated graph, with next/previous stateful operators;
* ``recovery``: which backups to promote and what is speculation after a failure;
* ``recovery_plan``: the whole recovery as one state machine, any loss folded into it;
* ``router``: the frontend's graph router (every operator's request manager, the commit);
* ``history``: an operator's durable history rebuilt from client replies (the replay check);
* ``bisect``: which rows of a failed batch fail it, found in row order;
* ``streams``: a per-stream operator's slot table (which idle stream a new one evicts);
* ``inflight``: an operator's batches in flight, their deadlines and its progress;
* ``door``: the row shape a graph refuses before any batch, from declarations only;
* ``placement``: which node runs each operator's primary, backup and spare (issue 41, imported
  from its module: the runtime does not use it yet).
"""

from parityserve.core.hams.bisect import Part, RowBisection
from parityserve.core.hams.deltas import DeltaLedger, Shipment
from parityserve.core.hams.door import admits, door_shape
from parityserve.core.hams.durability import (
    BackupApplier,
    Heard,
    Held,
    OutputCommit,
    StateRecord,
    Watermarks,
)
from parityserve.core.hams.history import AuditRow, HistoryBatch, HistoryError, durable_batches
from parityserve.core.hams.inflight import InFlight, InFlightStats
from parityserve.core.hams.lineage import (
    FRONTEND,
    Hop,
    Lineage,
    client_of,
    extend,
    frontier,
    merge,
    seq_at,
    speculative,
)
from parityserve.core.hams.recovery import Failover, plan_failover
from parityserve.core.hams.recovery_plan import RecoveryPlan
from parityserve.core.hams.requests import Arrival, Executed, RequestManager
from parityserve.core.hams.router import GraphRouter
from parityserve.core.hams.shipping import CopyOrder, PrimaryShipper, ShipperStats
from parityserve.core.hams.streams import StreamPlan, plan_streams
from parityserve.core.hams.topology import GraphError, Topology

__all__ = [
    "FRONTEND", "Arrival", "AuditRow", "BackupApplier", "CopyOrder", "DeltaLedger", "Executed",
    "Failover",
    "GraphError", "GraphRouter", "Heard", "Held", "HistoryBatch", "HistoryError", "Hop", "InFlight",
    "InFlightStats", "Lineage", "OutputCommit", "Part", "PrimaryShipper", "RecoveryPlan",
    "RequestManager", "RowBisection", "Shipment", "ShipperStats", "StateRecord", "StreamPlan",
    "Topology", "Watermarks",
    "admits", "client_of", "door_shape", "durable_batches", "extend", "frontier", "merge",
    "plan_failover",
    "plan_streams", "seq_at", "speculative",
]
