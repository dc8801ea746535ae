"""The stateful operator API: the batch type, the MNIST MLP learning online (on real data
where PARITYSERVE_DATA is set), and the per-stream LSTM (tiny sizes, random inputs)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from torch import Tensor

torch = pytest.importorskip("torch")

from parityserve.errors import ModelLoadError  # noqa: E402
from parityserve.models import stateful  # noqa: E402
from parityserve.models.datasets import load_mnist  # noqa: E402
from parityserve.models.stateful import (  # noqa: E402
    STATEFUL_ZOO,
    OnlineMLP,
    OperatorBatch,
    StateBuffer,
    StateCopyTimeout,
    StreamLSTM,
    StreamTableFull,
    load_stateful,
    run_batch,
    state_nbytes,
    stream_key,
    writes_during_compute,
)


def mnist(data_dir: Path, split: str, n: int) -> tuple[Tensor, Tensor]:
    x, y = load_mnist("train" if split == "train" else "test", data_dir=data_dir)
    return torch.from_numpy(x[:n]), torch.from_numpy(y[:n])


def go() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def test_online_learning_on_mnist_feedback_learns(data_dir: Path) -> None:
    """200 feedback batches of 32 from a random start: measured 76% on 2,000 test images
    (lr 0.05, momentum 0.9, seed 1); chance is 10%."""
    op = OnlineMLP(seed=1)
    state = op.initialize()
    x, y = mnist(data_dir, "train", 6400)
    tx, ty = mnist(data_dir, "test", 2000)
    unlabelled = (tx, torch.full_like(ty, -1))
    untrained = (run_batch(op, unlabelled, state, go()) == ty).float().mean().item()
    for i in range(0, 6400, 32):
        run_batch(op, (x[i:i + 32], y[i:i + 32]), state, go())
    trained = (run_batch(op, unlabelled, state, go()) == ty).float().mean().item()
    assert untrained < 0.3 and trained > 0.7


def test_compute_writes_no_state_and_batchnorm_in_train_mode_does(data_dir: Path) -> None:
    op = OnlineMLP(seed=2)
    state = op.initialize()
    batch = mnist(data_dir, "train", 16)
    assert writes_during_compute(op, batch, state) == []
    op.net.insert(1, torch.nn.BatchNorm1d(200))  # the pitfall: train-mode BN
    state = {**state, **{f"bn.{k}": v for k, v in op.net[1].named_buffers()}}
    assert "bn.running_mean" in writes_during_compute(op, batch, state)


def test_update_waits_for_the_copy_signal(data_dir: Path) -> None:
    op = OnlineMLP(seed=3)
    state = op.initialize()
    before = {k: v.clone() for k, v in state.items()}
    with pytest.raises(StateCopyTimeout):
        run_batch(op, mnist(data_dir, "train", 8), state, threading.Event(), timeout_s=0)
    assert all(torch.equal(before[k], v) for k, v in state.items())


def test_backup_installs_the_primary_bytes_even_when_noise_makes_replay_diverge(
        data_dir: Path) -> None:
    batch = mnist(data_dir, "train", 32)
    primary, replay = OnlineMLP(noise=1e-3, seed=4), OnlineMLP(noise=1e-3, seed=4)
    p_state, r_state = primary.initialize(), replay.initialize()
    run_batch(primary, batch, p_state, go())
    run_batch(replay, batch, r_state, go())
    assert not torch.equal(p_state["0.weight"], r_state["0.weight"])  # replay diverges
    buffer = StateBuffer(p_state)
    buffer.capture(p_state)
    backup = OnlineMLP(seed=5)
    b_state = backup.initialize()
    buffer.install(b_state)
    assert all(torch.equal(p_state[k], b_state[k]) for k in p_state)
    assert torch.equal(backup.net[0].weight, primary.net[0].weight)  # live model updated


def test_without_noise_the_step_is_deterministic(data_dir: Path) -> None:
    batch = mnist(data_dir, "train", 32)
    a, b = OnlineMLP(seed=6), OnlineMLP(seed=6)
    sa, sb = a.initialize(), b.initialize()
    run_batch(a, batch, sa, go())
    run_batch(b, batch, sb, go())
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


# --- OperatorBatch ------------------------------------------------------------------------


def test_public_names() -> None:
    assert sorted(stateful.__all__) == sorted([
        "AUDIT_COLUMNS", "STATEFUL_ZOO", "CopyDone", "CopyGate", "EventStatefulOperator",
        "OnlineMLP", "OperatorBatch", "SeededOperator", "State", "StateBuffer",
        "StateCopyTimeout", "StatefulOperator", "StreamLSTM", "StreamMean", "StreamTableFull",
        "audit_columns", "entropy_seed", "load_stateful", "replay_state", "run_batch",
        "state_digest", "state_nbytes", "stream_key", "writes_before_event",
        "writes_during_compute"])


def test_operator_batch_from_numpy_casts_and_fills_missing_labels() -> None:
    images = np.arange(2 * 784, dtype=np.uint8).reshape(2, 1, 28, 28)[:, :, ::-1]  # strided
    batch = OperatorBatch.from_numpy(images, np.array(["a", ""]), None)
    assert batch.inputs.dtype == torch.float32 and batch.inputs.shape == (2, 1, 28, 28)
    assert torch.equal(batch.inputs, torch.from_numpy(images.astype(np.float32)))
    assert batch.streams == ("a", "") and type(batch.streams[0]) is str
    assert batch.labels.dtype == torch.int64 and batch.labels.tolist() == [-1, -1]
    read_only = np.zeros((1, 3), np.float32)
    read_only.flags.writeable = False  # a frame straight off the socket: copied, no warning
    assert OperatorBatch.from_numpy(read_only, ["s"], [3]).labels.tolist() == [3]
    assert len(OperatorBatch.from_numpy(np.zeros((0, 3)), [], [])) == 0


def test_a_part_of_a_batch_keeps_its_rows_streams_labels_and_time() -> None:
    """What the primary runs again without the rows its operator refused."""
    batch = OperatorBatch.from_numpy(np.arange(6).reshape(3, 2), ["a", "b", "c"], [1, 2, 3],
                                     at=7.5)
    part = batch.rows([2, 0])
    assert part.inputs.tolist() == [[4, 5], [0, 1]] and part.streams == ("c", "a")
    assert part.labels.tolist() == [3, 1] and part.at == 7.5
    with pytest.raises(ValueError, match="at must be a finite number"):
        OperatorBatch.from_numpy(np.zeros((1, 2)), [""], None, at=float("nan"))


@pytest.mark.parametrize(("inputs", "streams", "labels", "match"), [
    (np.zeros((2, 3)), ["a"], None, "one key per row: got 1 for 2 rows"),
    (np.zeros((2, 3)), "ab", None, "sequence of str, one per row; got str"),
    (np.zeros((2, 3)), ["a", 7], None, r"streams\[1\] must be a str"),
    (np.zeros((2, 3)), ["a", "b"], [1], r"labels must have shape \[2\]"),
    (np.zeros((2, 3)), ["a", "b"], [[1, 2]], r"labels must have shape \[2\]"),
    (np.zeros((2, 3)), ["a", "b"], [1.0, 2.0], "labels must be integers.*float64"),
    (np.zeros((2, 3)), ["a", "b"], [True, False], "labels must be integers.*bool"),
    (np.zeros((2, 3)), ["a", "b"], [0, -2], "-1 for no label; got -2"),
    (np.array([["x"], ["y"]]), ["a", "b"], None, "real numeric array.*<U1"),
    (np.zeros((2, 3), np.complex64), ["a", "b"], None, "real numeric array.*complex64"),
    (np.float32(1.0), [], None, r"shape \[n, ...\]; got dtype float32 with shape \(\)"),
])
def test_operator_batch_from_numpy_rejects(inputs: Any, streams: Any, labels: Any,
                                           match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OperatorBatch.from_numpy(inputs, streams, labels)


def test_operator_batch_checks_tensors_given_directly() -> None:
    labels = torch.tensor([-1, 2])
    with pytest.raises(ValueError, match="float32 tensor.*torch.float64"):
        OperatorBatch(torch.zeros(2, 3, dtype=torch.float64), ("a", "b"), labels)
    with pytest.raises(ValueError, match="int64 tensor; got torch.int32"):
        OperatorBatch(torch.zeros(2, 3), ("a", "b"), labels.int())
    with pytest.raises(ValueError, match="got 3 for 2 rows"):
        OperatorBatch(torch.zeros(2, 3), ("a", "b", "c"), labels)
    assert OperatorBatch(torch.zeros(2, 3), ["a", "b"], labels).streams == ("a", "b")  # a list


def test_state_nbytes_counts_every_tensor() -> None:
    state = {"w": torch.zeros(3, 4), "keys": torch.zeros(5, dtype=torch.int64)}
    assert state_nbytes(state) == 3 * 4 * 4 + 5 * 8
    assert state_nbytes(OnlineMLP().initialize()) == 2 * 4 * (784 * 200 + 200 + 200 * 100 + 100
                                                               + 100 * 10 + 10)


# --- OnlineMLP on OperatorBatch (random images: the API, not the learning) --------------------


def test_online_mlp_takes_an_operator_batch_flat_or_as_images() -> None:
    rng = np.random.default_rng(0)
    images = rng.random((4, 1, 28, 28), dtype=np.float32)
    labels = np.array([3, -1, 7, 0])
    flat = OperatorBatch.from_numpy(images.reshape(4, 784), ["a", "b", "", "a"], labels)
    square = OperatorBatch.from_numpy(images, ["a", "b", "", "a"], labels)
    a, b, c = OnlineMLP(seed=7), OnlineMLP(seed=7), OnlineMLP(seed=7)
    sa, sb, sc = a.initialize(), b.initialize(), c.initialize()
    assert writes_during_compute(a, square, sa) == []
    out = run_batch(a, flat, sa, go())
    assert out.dtype == torch.int64 and out.shape == (4,)
    assert torch.equal(run_batch(b, square, sb, go()), out)
    assert torch.equal(run_batch(c, (flat.inputs, flat.labels), sc, go()), out)  # old form
    assert all(torch.equal(sa[k], sb[k]) and torch.equal(sa[k], sc[k]) for k in sa)
    assert not torch.equal(sa["0.weight"], OnlineMLP(seed=7).initialize()["0.weight"])


def test_online_mlp_rejects_a_wrong_width_or_label_before_touching_state() -> None:
    op = OnlineMLP(seed=8)
    state = op.initialize()
    with pytest.raises(ValueError, match=r"784 features per row .*got shape \[2, 1, 27, 27\]"):
        op.compute(OperatorBatch.from_numpy(np.zeros((2, 1, 27, 27)), ["", ""], None), state)
    with pytest.raises(ValueError, match="classes 0-9 .*got 10"):
        op.compute(OperatorBatch.from_numpy(np.zeros((1, 784)), [""], [10]), state)


# --- StreamLSTM (input 3, hidden 4, outputs 2: tiny) ----------------------------------------

ROWS = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))


def lstm(**options: Any) -> StreamLSTM:
    return StreamLSTM(**{"input_size": 3, "hidden": 4, "outputs": 2, "max_streams": 4,
                         **options})


def rows(streams: str, at: int = 0, when: float = 0.0) -> OperatorBatch:
    """A batch with one row per letter of ``streams`` ("." is a row with no stream), inputs
    from ROWS[at:], formed at time ``when``."""
    names = ["" if s == "." else s for s in streams]
    return OperatorBatch(ROWS[at:at + len(names)].clone(), tuple(names),
                         torch.full((len(names),), -1), when)


def feed(op: StreamLSTM, state: dict[str, Tensor], *batches: OperatorBatch) -> Tensor:
    return torch.cat([run_batch(op, batch, state, go()) for batch in batches])


def test_stream_lstm_state_is_a_fixed_slot_table() -> None:
    op = lstm(max_streams=5)
    state = op.initialize()
    assert {k: (tuple(v.shape), v.dtype) for k, v in state.items()} == {
        "h": ((5, 4), torch.float32), "c": ((5, 4), torch.float32),
        "keys": ((5,), torch.int64), "used": ((5,), torch.float64)}
    assert state_nbytes(state) == 2 * 5 * 4 * 4 + 5 * 8 + 5 * 8
    out = feed(op, state, rows("ab.a"))
    assert out.shape == (4, 2) and out.dtype == torch.float32
    assert state["keys"].tolist() == [stream_key("a"), stream_key("b"), 0, 0, 0]


def test_stream_key_is_stable_non_zero_and_63_bit() -> None:
    assert stream_key("a") == 2340832890917691671  # blake2b: the same in every process
    keys = [stream_key(f"user-{i}") for i in range(200)] + [stream_key("\ud800")]
    assert all(0 < k < 2**63 for k in keys) and len(set(keys)) == len(keys)


def test_stream_lstm_compute_writes_no_state() -> None:
    op = lstm()
    state = op.initialize()
    feed(op, state, rows("ab"))
    assert writes_during_compute(op, rows("abc.a", at=1), state) == []


def test_two_streams_keep_independent_state() -> None:
    alone = lstm()
    a_alone = feed(alone, alone.initialize(), rows("a", 0), rows("a", 2))
    mixed = lstm()
    out = feed(mixed, mixed.initialize(), rows("ab", 0), rows("ba", 1))
    torch.testing.assert_close(out[[0, 3]], a_alone)  # a's rows: 0 and 2 of ROWS
    assert not torch.equal(out[2], out[1])  # b's second step differs from its first


def test_rows_of_one_stream_in_one_batch_chain_in_row_order() -> None:
    one, two = lstm(), lstm()
    s1, s2 = one.initialize(), two.initialize()
    together = feed(one, s1, rows("aa"))
    apart = feed(two, s2, rows("a", 0), rows("a", 1))
    torch.testing.assert_close(together, apart)
    torch.testing.assert_close(s1["h"], s2["h"])
    torch.testing.assert_close(s1["c"], s2["c"])
    assert not torch.allclose(together[0], together[1])


def test_rows_without_a_stream_start_from_zero_and_are_not_kept() -> None:
    op = lstm()
    state = op.initialize()
    out = feed(op, state, rows("..", 0), rows(".", 0))
    torch.testing.assert_close(out[2], out[0])  # the same input from zeros, twice
    assert not bool(state["keys"].any()) and not bool(state["h"].any())


def test_state_installed_on_a_backup_with_the_same_seed_reproduces_the_outputs() -> None:
    primary, backup = lstm(seed=3), lstm(seed=3)
    p_state, b_state = primary.initialize(), backup.initialize()
    feed(primary, p_state, rows("ab"), rows("a.c", 2))
    buffer = StateBuffer(p_state)
    buffer.capture(p_state)
    buffer.install(b_state)
    later = rows("cba", 3)
    torch.testing.assert_close(feed(backup, b_state, later), feed(primary, p_state, later),
                               rtol=0, atol=0)
    assert all(torch.equal(p_state[k], b_state[k]) for k in p_state)


def test_noise_makes_a_replay_diverge_and_no_noise_keeps_it_identical() -> None:
    def replays(noise: float) -> list[Tensor]:
        ops = [lstm(noise=noise, seed=4), lstm(noise=noise, seed=4)]
        return [feed(op, op.initialize(), rows("ab"), rows("ba", 2)) for op in ops]

    noisy = replays(1e-3)
    assert not torch.equal(*noisy)
    torch.testing.assert_close(*noisy, rtol=0, atol=0.1)  # noise, not another model
    exact = replays(0.0)
    assert torch.equal(*exact)


def test_a_full_table_raises_and_leaves_the_state_unchanged() -> None:
    op = lstm(max_streams=2)
    state = op.initialize()
    feed(op, state, rows("ab"))
    before = {k: v.clone() for k, v in state.items()}
    with pytest.raises(StreamTableFull, match=r"max_streams=2 ") as full:
        run_batch(op, rows("bcc"), state, go())  # b is held; c finds no slot
    assert full.value.rows == (1, 2)  # c's rows, and only they
    assert full.value.retry_after_s == 600.0  # a and b were used at 0: idle at 600
    assert all(torch.equal(before[k], v) for k, v in state.items())
    assert isinstance(StreamTableFull("x"), RuntimeError)
    feed(op, state, rows("ba.", 2))  # the held streams and streamless rows still run
    assert state["keys"].tolist() == [stream_key("a"), stream_key("b")]


def test_an_idle_stream_gives_its_slot_to_a_new_one_and_its_state_is_dropped() -> None:
    """LRU with an idle time, on the batch's clock: a and b were used at 0 and 5; at 20 with
    stream_idle_s 10 both are idle, and c takes a's (the least recently used)."""
    op = lstm(max_streams=2, stream_idle_s=10)
    state = op.initialize()
    first_a = feed(op, state, rows("a", 0, when=0.0))
    feed(op, state, rows("b", 1, when=5.0))
    with pytest.raises(StreamTableFull) as full:  # at 9 neither is idle yet
        run_batch(op, rows("c", 2, when=9.0), state, go())
    assert full.value.retry_after_s == 1.0  # a turns idle at 10
    feed(op, state, rows("c", 2, when=20.0))
    assert state["keys"].tolist() == [stream_key("c"), stream_key("b")]
    assert state["used"].tolist() == [20.0, 5.0]
    # a comes back as a new stream (b's slot is idle too): it starts from zeros again
    again = feed(op, state, rows("a", 0, when=30.0))
    torch.testing.assert_close(again, first_a, rtol=0, atol=0)


def test_a_stream_of_the_batch_is_never_evicted_for_another_of_the_batch() -> None:
    op = lstm(max_streams=1, stream_idle_s=10)
    state = op.initialize()
    feed(op, state, rows("a", 0, when=0.0))
    with pytest.raises(StreamTableFull) as full:  # a is idle, but it is in this batch
        run_batch(op, rows("ab", 1, when=50.0), state, go())
    assert full.value.rows == (1,)


def test_a_full_table_names_no_stream_key() -> None:
    """The error goes to the client of every refused row, and rows of several clients share
    a batch: naming the new streams told each client the others' keys (user ids, tickers)."""
    op = lstm(max_streams=1)
    state = op.initialize()
    feed(op, state, rows("a"))
    with pytest.raises(StreamTableFull, match=r"max_streams=1 ") as full:
        run_batch(op, OperatorBatch(ROWS[1:3].clone(), ("alice-7f3", "bob-91c"),
                                    torch.full((2,), -1)), state, go())
    assert full.value.rows == (0, 1)
    assert "alice" not in str(full.value) and "bob" not in str(full.value)


@pytest.mark.parametrize(("options", "match"), [
    ({"hidden": 0}, "hidden must be an int >= 1, got 0"),
    ({"max_streams": 2.5}, "max_streams must be an int >= 1, got 2.5"),
    ({"input_size": True}, "input_size must be an int >= 1, got True"),
    ({"noise": -1e-3}, "noise must be a finite number >= 0, got -0.001"),
    ({"noise": float("nan")}, "noise must be a finite number >= 0, got nan"),
    ({"stream_idle_s": 0}, "stream_idle_s must be a finite number > 0, got 0"),
    ({"stream_idle_s": float("inf")}, "stream_idle_s must be a finite number > 0, got inf"),
])
def test_stream_lstm_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        lstm(**options)


def test_stream_lstm_rejects_a_wrong_width_or_a_bare_tensor() -> None:
    op = lstm()
    state = op.initialize()
    with pytest.raises(ValueError, match=r"input_size=3\) takes 3 features .*got shape \[1, 4\]"):
        op.compute(OperatorBatch.from_numpy(np.zeros((1, 4)), ["a"], None), state)
    with pytest.raises(TypeError, match="takes an OperatorBatch, got Tensor"):
        op.compute(ROWS, state)  # type: ignore[arg-type]


# --- load_stateful ---------------------------------------------------------------------------


class Counter:
    """A python: source under test: counts the rows it has seen."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def initialize(self) -> dict[str, Tensor]:
        return {"seen": torch.zeros(1, dtype=torch.int64)}

    def compute(self, batch: OperatorBatch, state: dict[str, Tensor]) -> tuple[Tensor, int]:
        return state["seen"] + self.step * len(batch), self.step * len(batch)

    def update(self, state: dict[str, Tensor], pending: int) -> None:
        state["seen"] += pending


class NoUpdate:
    def initialize(self) -> dict[str, Tensor]:
        return {}

    def compute(self, batch: Any, state: dict[str, Tensor]) -> tuple[Any, Any]:
        return batch, None


def test_stateful_zoo_names() -> None:
    assert STATEFUL_ZOO == ("online-mlp", "stream-lstm", "stream-mean")


def test_load_stateful_from_the_zoo_with_options() -> None:
    op = load_stateful("zoo:stream-lstm", {"input_size": 3, "hidden": 4, "max_streams": 2})
    assert isinstance(op, StreamLSTM) and op.initialize()["h"].shape == (2, 4)
    assert isinstance(load_stateful("zoo:online-mlp", {"lr": 0.01}), OnlineMLP)
    assert isinstance(load_stateful("zoo:stream-lstm"), StreamLSTM)


def test_load_stateful_from_a_python_module_and_a_file(tmp_path: Path) -> None:
    op = load_stateful(f"python:{__name__}:Counter", {"step": 2})
    state = op.initialize()
    assert run_batch(op, rows("ab"), state, go()).tolist() == [4]
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "lstm_op.py").write_text(
        "from parityserve.models.stateful import StreamLSTM\n\n"
        "class Small(StreamLSTM):\n"
        "    def __init__(self, **options):\n"
        "        super().__init__(input_size=3, hidden=2, **options)\n")
    small = load_stateful("python:ops/lstm_op.py:Small", {"max_streams": 3},
                          base_dir=tmp_path)
    assert small.initialize()["h"].shape == (3, 2)
    absolute = load_stateful(f"python:{tmp_path / 'ops' / 'lstm_op.py'}:Small")
    assert type(absolute) is type(small)  # one module per file, imported once


@pytest.mark.parametrize(("source", "options", "match"), [
    ("zoo:lstm", None, "unknown stateful operator 'zoo:lstm': the stateful zoo has "
                       "zoo:online-mlp, zoo:stream-lstm, zoo:stream-mean"),
    ("zoo:resnet20", None, "the stateful zoo has zoo:online-mlp"),
    ("torch:pkg.mod:Net", None, "expected zoo:NAME with NAME one of online-mlp, stream-lstm, "
                                "stream-mean, python:package.module:Class or "
                                "python:path/file.py:Class"),
    ("stream-lstm", None, "cannot load stateful operator source 'stream-lstm'"),
    ("python:", None, "cannot load stateful operator source 'python:'"),
    ("zoo:stream-lstm", {"hiden": 4}, "unknown option.* hiden; it accepts input_size, hidden, "
                                      "outputs, max_streams, noise, seed"),
    ("zoo:stream-lstm", {"hidden": -1}, "constructor raised ValueError: hidden must be an int"),
    ("zoo:online-mlp", {"momentum": 0.9, "steps": 3}, "unknown option.* steps; it accepts lr"),
    (f"python:{__name__}:Counter", {"step": 1, "x": 2}, "unknown option.* x; it accepts step"),
    (f"python:{__name__}:NoUpdate", None, r"NoUpdate is not a stateful operator: it fits "
                                          r"neither form \(the three-method form lacks "
                                          r"update\(\)\); \(the run form lacks run\(\)\)\. "
                                          r"The three-method form defines initialize\(\)"),
    (f"python:{__name__}:NoUpdate", {"bad": 1}, r"NoUpdate is not a stateful operator"),
    (f"python:{__name__}:go", None, r"Event is not a stateful operator: it fits neither "
                                    r"form \(the three-method form lacks initialize\(\), "
                                    r"compute\(\), update\(\)\); \(the run form lacks "
                                    r"initialize\(\), run\(\)\)"),
    ("python:no_such_module_ps:Op", None, "cannot import module 'no_such_module_ps'"),
    (f"python:{__name__}:Absent", None, "has no attribute 'Absent'"),
    ("python:nowhere/op.py:Op", None, r"Python file nowhere/op.py does not exist"),
])
def test_load_stateful_errors_say_what_is_wrong(source: str, options: dict[str, Any] | None,
                                                match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        load_stateful(source, options)
