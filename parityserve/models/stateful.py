"""The stateful operator API (HAMS §V): a model whose work on a batch splits in two stages,
written in either of two forms.

```python
class MyOperator:                                             # the three-method form
    def initialize(self) -> dict[str, Tensor]: ...            # the state tensors, by name
    def compute(self, batch, state) -> tuple[outputs, pending]  # reads the state only
    def update(self, state, pending) -> None                    # writes the state only

class MyRunOperator:                                          # the run form
    def initialize(self) -> dict[str, Tensor]: ...
    def run(self, batch, state, event) -> outputs  # reads; event.wait(); then writes
```

Between the two stages the primary's state manager copies the *previous* state to send to
the backup, so nothing may be written before the copy is done: ``update`` runs, and
``event.wait()`` returns, only then (decision H2). ``run_batch`` drives either form through
the same ``CopyGate`` the server uses; in the run form the outputs leave after the writes,
in the three-method form they may leave before (see ``_stateful_run``).

**What counts as state** (H12): everything a later batch reads that an earlier one wrote.
Parameters and optimiser buffers of an online learner; BatchNorm running statistics; for a
sequence model, each stream's (h, c); the RNG state if the update draws random numbers
you want reproduced on the backup (injected noise here is deliberately *not* state: the
backup installs the primary's bytes, it never re-executes).

**The BatchNorm pitfall.** In train mode BatchNorm writes its running mean and variance
during the forward pass, i.e. in ``compute``. The copy could then catch a half-updated
state. Freeze BN (``eval()``) while fine-tuning online, or compute the new statistics into
``pending`` and write them in ``update``. ``writes_during_compute`` finds such writes;
``writes_before_event`` finds a run-form operator's writes before its ``event.wait()``.

**The batch.** The runtime hands ``compute`` an ``OperatorBatch``: float32 ``inputs``
[n, ...], one stream (session) key per row (``""``: none) and int64 ``labels`` (-1: none);
``OperatorBatch.from_numpy`` builds one from frames and raises ``ValueError`` on bad ones.
``state_nbytes(state)`` is what each state copy moves.

**The operators.** ``load_stateful(source, options)`` builds one: ``zoo:online-mlp``,
``zoo:stream-lstm``, ``zoo:stream-mean`` (``STATEFUL_ZOO``), ``python:pkg.mod:Class`` or
``python:path/file.py:Class``.

- ``OnlineMLP``: an MNIST MLP fine-tuned by SGD with momentum on labelled feedback, one
  optimiser step per batch; it outputs the predicted class.
- ``StreamLSTM``: an LSTM keeping each stream's (h, c) in a fixed table of ``max_streams``
  slots; a new stream with the table full raises ``StreamTableFull`` from ``compute``.
- ``StreamMean`` (the run form): each stream's running mean of its rows, in the same kind
  of slot table.

**Auditing** (``_stateful_audit``): injected noise draws one seed per batch from OS entropy
(``entropy_seed``), so a re-execution diverges; with ``audit: true`` the operator reports
each row's place in its batch and the batch's seed (``AUDIT_COLUMNS``), and
``replay_state`` runs the batches clients saw again through ``compute_seeded``, to compare
``state_digest`` with the server's.
"""

from parityserve.models._stateful_audit import (
    AUDIT_COLUMNS,
    SeededOperator,
    audit_columns,
    entropy_seed,
    replay_state,
    state_digest,
)
from parityserve.models._stateful_base import (
    OperatorBatch,
    State,
    StateBuffer,
    StateCopyTimeout,
    StatefulOperator,
    state_nbytes,
    writes_during_compute,
)
from parityserve.models._stateful_loader import STATEFUL_ZOO, load_stateful
from parityserve.models._stateful_ops import OnlineMLP
from parityserve.models._stateful_run import (
    CopyDone,
    CopyGate,
    EventStatefulOperator,
    run_batch,
    writes_before_event,
)
from parityserve.models._stream_lstm import StreamLSTM
from parityserve.models._stream_mean import StreamMean
from parityserve.models._stream_slots import StreamTableFull, stream_key

__all__ = ["AUDIT_COLUMNS", "STATEFUL_ZOO", "CopyDone", "CopyGate", "EventStatefulOperator",
           "OnlineMLP", "OperatorBatch", "SeededOperator", "State", "StateBuffer",
           "StateCopyTimeout", "StatefulOperator", "StreamLSTM", "StreamMean", "StreamTableFull",
           "audit_columns", "entropy_seed", "load_stateful", "replay_state", "run_batch",
           "state_digest", "state_nbytes", "stream_key", "writes_before_event",
           "writes_during_compute"]
