"""Parity-model training: encoders, targets, decoders, coefficients, checkpoints, config errors.

The loop tests use a tiny digits run (a few hundred images, one or two short epochs) with
untrained DigitsMLP weights, so they take a few seconds and need no shared data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from parityserve.cli import main as cli_main
from parityserve.core.coding.parity import (
    AdditionEncoder,
    ConcatEncoder,
    LinearCode,
    SubtractionDecoder,
)
from parityserve.errors import ConfigError, DataError, ModelLoadError
from parityserve.models import load_model
from parityserve.training import TrainConfig, default_coefficients, train_parity
from parityserve.training.checkpoint import load_checkpoint, weights_paths
from parityserve.training.codes import (
    addition_encode,
    combine,
    concat_encode,
    decode_softmax,
    decode_subtraction,
    soft_labels,
)
from parityserve.training.data import DATASETS, Split
from parityserve.training.deployed import build_net, frozen_net, load_deployed, save_npz
from parityserve.training.parity import build_batch, sample_groups

# --- encoders ------------------------------------------------------------------------------


def test_addition_encoder_sums_the_k_queries() -> None:
    stacked = torch.randn(3, 5, 64)
    torch.testing.assert_close(addition_encode(stacked), stacked[0] + stacked[1] + stacked[2])


def test_linear_encoder_weights_each_query() -> None:
    stacked = torch.randn(3, 4, 10)
    out = combine(stacked, torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(out, stacked[0] + 2 * stacked[1] + 4 * stacked[2])


def test_concat_k2_pools_the_width_and_tiles_side_by_side() -> None:
    a = torch.arange(16.0).reshape(1, 1, 4, 4)
    b = 100 + torch.arange(16.0).reshape(1, 1, 4, 4)
    out = concat_encode(torch.stack([a, b]), (1, 4, 4))
    assert out.shape == (1, 1, 4, 4)
    torch.testing.assert_close(out[0, 0, :, :2], (a[0, 0, :, ::2] + a[0, 0, :, 1::2]) / 2)
    torch.testing.assert_close(out[0, 0, :, 2:], (b[0, 0, :, ::2] + b[0, 0, :, 1::2]) / 2)


def test_concat_k4_fills_the_quadrants_in_reading_order() -> None:
    images = torch.stack([torch.full((2, 3, 8, 8), float(i)) for i in range(4)])  # (4, B=2, ...)
    out = concat_encode(images, (3, 8, 8))
    assert out.shape == (2, 3, 8, 8)
    quadrants = [out[..., :4, :4], out[..., :4, 4:], out[..., 4:, :4], out[..., 4:, 4:]]
    for i, quadrant in enumerate(quadrants):
        assert torch.all(quadrant == i)


def test_concat_keeps_flat_query_shapes() -> None:
    flat = torch.rand(2, 7, 64)  # digits rows: (k, B, 64) seen as 1x8x8 images
    out = concat_encode(flat, (1, 8, 8))
    assert out.shape == (7, 64)
    left = out.reshape(7, 8, 8)[:, :, :4]
    torch.testing.assert_close(left, torch.nn.functional.avg_pool2d(
        flat[0].reshape(7, 1, 8, 8), (1, 2)).reshape(7, 8, 4))


@pytest.mark.parametrize(("k", "shape"), [(2, (64,)), (4, (64,)), (2, (784,)), (4, (3, 32, 32))])
def test_torch_encoders_match_the_serving_encoders(k: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(k)
    queries = rng.random((k, 3, *shape), dtype=np.float32)  # (k, B, ...)
    image_shape = shape if len(shape) == 3 else (1, *(2 * (math.isqrt(shape[0]),)))
    ours = concat_encode(torch.from_numpy(queries), image_shape).numpy()
    sums = addition_encode(torch.from_numpy(queries)).numpy()
    for b in range(3):
        group = list(queries[:, b])
        np.testing.assert_allclose(ours[b], ConcatEncoder(k).encode(group), rtol=1e-6)
        np.testing.assert_allclose(sums[b], AdditionEncoder(k).encode(group), rtol=1e-6)


def test_linear_rows_match_the_serving_linear_code() -> None:
    code = LinearCode.default(3, 2)
    queries = np.random.default_rng(0).random((3, 4, 5), dtype=np.float32)
    rows = default_coefficients(3, 2)
    for b in range(4):
        expected = code.encode(list(queries[:, b]))
        for j, row in enumerate(rows):
            ours = combine(torch.from_numpy(queries[:, b : b + 1]), row).numpy()[0]
            np.testing.assert_allclose(ours, expected[j], rtol=1e-5)


def test_subtraction_decoder_matches_the_serving_decoder() -> None:
    outputs = torch.randn(4, 2, 10)
    parity = torch.randn(4, 10)
    ours = decode_subtraction(parity, outputs, default_coefficients(2, 1)[0])
    for g in range(4):
        served = SubtractionDecoder().decode({1: outputs[g, 1].numpy()}, parity[g].numpy(), 2)
        np.testing.assert_allclose(ours[g, 0].numpy(), served, rtol=1e-5, atol=1e-6)


# --- coefficients, targets and decoders ----------------------------------------------------


def test_coefficient_rows_are_powers_of_one_to_k() -> None:
    assert default_coefficients(3, 3).tolist() == [[1, 1, 1], [1, 2, 3], [1, 4, 9]]
    assert default_coefficients(2, 1).tolist() == [[1, 1]]
    np.testing.assert_array_equal(default_coefficients(4, 3), LinearCode.default(4, 3).coefficients)
    with pytest.raises(ConfigError):
        default_coefficients(0, 1)


def test_targets_are_the_same_linear_combination_of_deployed_outputs() -> None:
    x, outputs = torch.randn(20, 64), torch.randn(20, 10)
    labels = torch.arange(20) % 10
    groups = torch.tensor([[0, 5], [3, 3], [19, 7]])
    coeffs = default_coefficients(2, 2)
    inputs, targets = build_batch(x, outputs, labels, groups, encoder="addition",
                                  coefficients=coeffs, image_shape=(1, 8, 8))
    assert len(inputs) == len(targets) == 2
    torch.testing.assert_close(inputs[0], x[groups[:, 0]] + x[groups[:, 1]])
    torch.testing.assert_close(targets[0], outputs[groups[:, 0]] + outputs[groups[:, 1]])
    torch.testing.assert_close(targets[1], outputs[groups[:, 0]] + 2 * outputs[groups[:, 1]])
    torch.testing.assert_close(inputs[1], x[groups[:, 0]] + 2 * x[groups[:, 1]])


def test_concat_targets_are_normalised_summed_one_hot_labels() -> None:
    x, outputs = torch.rand(8, 64), torch.randn(8, 10)
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    groups = torch.tensor([[1, 2], [4, 4]])
    inputs, targets = build_batch(x, outputs, labels, groups, encoder="concat",
                                  coefficients=default_coefficients(2, 1), image_shape=(1, 8, 8))
    assert inputs[0].shape == (2, 64)
    expected = torch.zeros(2, 10)
    expected[0, 1] = expected[0, 2] = 0.5
    expected[1, 4] = 1.0
    torch.testing.assert_close(targets[0], expected)
    torch.testing.assert_close(soft_labels(labels[groups.T], 10), expected)


def test_subtraction_decoder_inverts_an_exact_parity() -> None:
    outputs = torch.randn(6, 3, 10)  # (groups, k, classes)
    for row in default_coefficients(3, 3):
        parity = torch.einsum("l,glc->gc", row, outputs)
        torch.testing.assert_close(decode_subtraction(parity, outputs, row), outputs)


def test_softmax_decoder_inverts_an_exact_concat_parity() -> None:
    outputs = torch.randn(5, 2, 10)
    parity_logits = outputs.softmax(-1).mean(dim=1).log()
    torch.testing.assert_close(decode_softmax(parity_logits, outputs), outputs.softmax(-1))


def test_sample_groups_walks_permutations() -> None:
    generator = torch.Generator().manual_seed(0)
    groups = sample_groups(10, 3, 10, generator)
    assert groups.shape == (10, 3)
    for column in groups.T:
        assert sorted(column.tolist()) == list(range(10))
    assert sample_groups(10, 2, 25, generator).shape == (25, 2)


# --- config errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"encoder": "concat", "k": 3}, "concat works for k in"),
        ({"encoder": "concat", "r": 2}, "trains one parity model"),
        ({"encoder": "xor"}, "--encoder 'xor'"),
        ({"k": 1}, "k >= 2"),
        ({"r": 0}, "r >= 1"),
        ({"dataset": "imagenet"}, "--dataset 'imagenet'"),
        ({"epochs": 0}, "--epochs must be a positive integer"),
        ({"init": "random"}, "--init 'random'"),
        ({"device": "tpu"}, "--device 'tpu'"),
        ({"out": "parity.npz"}, "give the checkpoint path"),
    ],
)
def test_bad_settings_raise_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**{"dataset": "digits", **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "zoo:resnet20"}, "does not take digits inputs"),
        ({"model": "zoo:noop"}, "train-parity takes a zoo net"),
    ],
)
def test_bad_models_raise_config_errors(kwargs: dict, match: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        train_parity(TrainConfig(dataset="digits", cache_dir=str(tmp_path), **kwargs))


def test_model_without_published_weights_needs_weights(tmp_path: Path) -> None:
    empty = Split(*(torch.zeros(0) for _ in range(4)))
    with pytest.raises(ConfigError, match="zoo:lenet5 has no published weights"):
        load_deployed("lenet5", DATASETS["mnist"], weights=None, data_dir=tmp_path,
                      cache_dir=tmp_path, split=empty)


def test_missing_published_weights_is_a_data_error(tmp_path: Path) -> None:
    empty = Split(*(torch.zeros(0) for _ in range(4)))
    with pytest.raises(DataError, match="parm-mnist-base-mlp.npz not found"):
        load_deployed("parm-mlp", DATASETS["mnist"], weights=None, data_dir=tmp_path,
                      cache_dir=tmp_path, split=empty)


def test_missing_dataset_is_a_data_error(tmp_path: Path) -> None:
    config = TrainConfig(dataset="mnist", data_dir=str(tmp_path), weights=str(tmp_path / "w"))
    with pytest.raises(DataError, match="not found"):
        train_parity(config)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        train_parity(TrainConfig(dataset="digits", device="cuda", cache_dir=str(tmp_path)))


def test_cli_reports_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["train-parity", "--dataset", "digits", "--encoder", "concat", "--k", "3"])
    assert code == 2
    assert "concat works for k in [2, 4], not k=3" in capsys.readouterr().err


# --- the loop: checkpoint, resume, export --------------------------------------------------


@pytest.fixture(scope="module")
def untrained_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deployed") / "digits-mlp.npz"
    save_npz(build_net("digits-mlp", seed=7).state_dict(), path)
    return path


def test_frozen_net_holds_the_weights_for_inference_only(untrained_weights: Path) -> None:
    net = frozen_net("digits-mlp", untrained_weights)  # what benchmarks/accuracy.py evaluates
    assert not net.training and not any(p.requires_grad for p in net.parameters())
    saved = build_net("digits-mlp", seed=7).state_dict()
    assert all(torch.equal(value, saved[key]) for key, value in net.state_dict().items())
    with pytest.raises(ModelLoadError, match=f"weights {untrained_weights} do not fit"):
        frozen_net("parm-mlp", untrained_weights)


def _tiny(tmp_path: Path, weights: Path, **overrides: object) -> TrainConfig:
    settings: dict = {
        "dataset": "digits", "weights": str(weights), "out": str(tmp_path / "p.pt"),
        "epochs": 1, "train_limit": 200, "val_limit": 100, "samples_per_epoch": 128,
        "threads": 1, "progress": False, **overrides,
    }
    return TrainConfig(**settings)


def test_checkpoint_round_trip_and_resume(tmp_path: Path, untrained_weights: Path) -> None:
    lines: list[str] = []
    first = train_parity(_tiny(tmp_path, untrained_weights), log=lines.append)
    assert first.epoch == 1
    state = load_checkpoint(first.checkpoint)
    assert state["epoch"] == 1 and state["coefficients"] == [[1.0, 1.0]]
    assert state["config"]["model"] == "zoo:digits-mlp"
    assert state["optimizers"][0]["state"][0]["step"] == 2  # 128 samples / batch 64
    assert state["best_accuracy_degraded"] == first.best_accuracy_degraded

    second = train_parity(_tiny(tmp_path, untrained_weights, epochs=2, resume=True),
                          log=lines.append)
    assert second.epoch == 2
    resumed = load_checkpoint(second.checkpoint)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert resumed["optimizers"][0]["state"][0]["step"] == 4
    assert any("resumed from" in line and "after epoch 1" in line for line in lines)
    changed = [k for k in state["models"][0]
               if not torch.equal(state["models"][0][k], resumed["models"][0][k])]
    assert changed  # the second epoch trained the resumed weights


def test_resume_refuses_a_different_code(tmp_path: Path, untrained_weights: Path) -> None:
    train_parity(_tiny(tmp_path, untrained_weights), log=lambda _: None)
    with pytest.raises(ConfigError, match="k: checkpoint 2, now 4"):
        train_parity(_tiny(tmp_path, untrained_weights, k=4, epochs=2, resume=True))


def test_resume_without_a_checkpoint(tmp_path: Path, untrained_weights: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint"):
        train_parity(_tiny(tmp_path, untrained_weights, resume=True))


def test_export_is_deployable_with_zoo_weights(tmp_path: Path, untrained_weights: Path) -> None:
    result = train_parity(_tiny(tmp_path, untrained_weights, r=2), log=lambda _: None)
    assert result.weights == tuple(weights_paths(result.checkpoint, 2))
    deployed_keys = set(np.load(untrained_weights).files)
    for path in result.weights:
        assert set(np.load(path).files) == deployed_keys
        model = load_model("zoo:digits-mlp", weights=str(path))
        assert model.predict(np.zeros((3, 64), dtype=np.float32)).shape == (3, 10)
    info = json.loads(result.sidecar.read_text())
    assert info["k"] == 2 and info["r"] == 2 and info["encoder"] == "addition"
    assert info["coefficients"] == [[1.0, 1.0], [1.0, 2.0]]
    assert len(info["accuracy_degraded_per_parity"]) == 2
    assert 0 <= info["accuracy_degraded"] <= 1 and 0 <= info["accuracy_available"] <= 1
    assert result.yaml_snippet.startswith("parity: {weights: [")
    assert "k: 2, encoder: addition, r: 2" in result.yaml_snippet


def test_concat_run_reports_accuracies(tmp_path: Path, untrained_weights: Path) -> None:
    result = train_parity(_tiny(tmp_path, untrained_weights, encoder="concat"),
                          log=lambda _: None)
    info = json.loads(result.sidecar.read_text())
    assert info["decoder"] == "softmax-subtraction" and info["encoder"] == "concat"
    assert result.yaml_snippet.startswith(f"parity: {{weights: {result.weights[0].resolve()}, ")


def test_bad_deployed_weights_are_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        train_parity(_tiny(tmp_path, tmp_path / "missing.npz"))
