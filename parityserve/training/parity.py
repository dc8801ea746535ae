"""The ParM parity-model training loop (Kosaian et al., SOSP'19, section 4.4), in PyTorch.

Each training sample is a group of k random dataset samples. The encoder turns the group into
one parity query; the parity model (the deployed model's architecture) learns to output the
same linear combination of the frozen deployed model's outputs on the k samples (MSE), or for
the concat encoder, the k labels with weight 1/k each (cross-entropy). With r > 1, parity
model j learns row j of ``default_coefficients(k, r)``.

Validation reports degraded-mode accuracy A_d: for each group of k test samples, each output
in turn is treated as unavailable, rebuilt from the parity output and the other k-1 outputs,
and its argmax scored against the true label. A_a is the deployed model's own accuracy.

``train_parity(TrainConfig(...))`` runs it; ``parityserve train-parity`` is the command line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from parityserve.errors import ConfigError
from parityserve.training import checkpoint as ckpt
from parityserve.training.codes import (
    check_code,
    combine,
    concat_encode,
    decode_softmax,
    decode_subtraction,
    default_coefficients,
    soft_labels,
)
from parityserve.training.data import DatasetInfo, Split, dataset_info, load_split
from parityserve.training.deployed import build_net, deployed_outputs, load_deployed, parse_model

__all__ = [
    "EpochReport",
    "TrainConfig",
    "TrainResult",
    "build_batch",
    "resolve_device",
    "sample_groups",
    "train_parity",
    "train_step",
    "validate",
    "yaml_snippet",
]

INITS = ("deployed", "scratch")
DEVICES = ("auto", "cpu", "cuda")
Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run; invalid combinations raise ``ConfigError``."""

    dataset: str
    model: str | None = None  # zoo:NAME; None picks the dataset's default net
    weights: str | None = None  # deployed weights; None uses the published / cached ones
    k: int = 2
    r: int = 1
    encoder: str = "addition"
    epochs: int = 10  # total epochs; with resume, training continues up to this number
    out: str | None = None  # checkpoint path; default <cache_dir>/parity/<name>.pt
    resume: bool = False
    data_dir: str | None = None
    cache_dir: str = ".cache"
    device: str = "auto"
    seed: int = 0
    init: str = "deployed"  # parity weights start from the deployed weights, or from scratch
    batch_size: int | None = None  # default 64 for k=2, else 32 (as in ParM)
    lr: float = 1e-3
    weight_decay: float = 1e-5
    samples_per_epoch: int | None = None  # parity samples per epoch; default: training-set size
    train_limit: int | None = None  # use only this many training images (quick runs)
    val_limit: int | None = None  # use only this many test images
    threads: int | None = None
    progress: bool | None = None  # tqdm bar; None shows it only on a terminal

    def __post_init__(self) -> None:
        check_code(self.k, self.r, self.encoder)
        dataset_info(self.dataset)
        _choice("--init", self.init, INITS)
        _choice("--device", self.device, DEVICES)
        for name in (
            "epochs",
            "batch_size",
            "samples_per_epoch",
            "train_limit",
            "val_limit",
            "threads",
        ):
            _positive(name, getattr(self, name), allow_none=name != "epochs")
        if not (self.lr > 0 and self.weight_decay >= 0):
            raise ConfigError(f"need lr > 0, weight_decay >= 0: {self.lr}, {self.weight_decay}")
        if self.out is not None and Path(self.out).suffix in (".npz", ".json"):
            raise ConfigError(
                f"--out {self.out}: give the checkpoint path (e.g. NAME.pt); the "
                ".npz weights and .json sidecar are written next to it"
            )

    @property
    def batch(self) -> int:
        return self.batch_size or (64 if self.k == 2 else 32)

    def checkpoint_path(self, model_name: str) -> Path:
        if self.out is not None:
            return Path(self.out)
        rows = f"-r{self.r}" if self.r > 1 else ""
        name = f"{model_name}-{self.dataset}-k{self.k}-{self.encoder}{rows}.pt"
        return Path(self.cache_dir) / "parity" / name


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} {value!r}: use one of {list(choices)}")


def _positive(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    train_loss: float
    val_loss: float
    accuracy_available: float  # A_a: the deployed model on the test samples
    accuracy_degraded: float  # A_d: mean over the r parity models
    accuracy_degraded_per_parity: tuple[float, ...]
    seconds: float


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path
    weights: tuple[Path, ...]
    sidecar: Path
    epoch: int
    report: EpochReport | None
    best_accuracy_degraded: float
    yaml_snippet: str


@dataclass
class _Run:
    """Everything one run holds; ``prepare`` builds it, the loop mutates epoch/best/history."""

    config: TrainConfig
    info: DatasetInfo
    model_name: str
    device: torch.device
    coefficients: torch.Tensor
    split: Split
    train_outputs: torch.Tensor
    test_outputs: torch.Tensor
    deployed_weights: Path
    checkpoint: Path
    models: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    epoch: int = 0
    best: float = -1.0
    history: list[dict[str, Any]] = field(default_factory=list)


# --- set-up ----------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available; use --device auto or cpu")
    return torch.device(name)


def _prepare(config: TrainConfig, log: Log) -> _Run:
    info = dataset_info(config.dataset)
    name = parse_model(config.model, info)
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    split = load_split(
        info.name,
        data_dir=config.data_dir,
        seed=config.seed,
        train_limit=config.train_limit,
        val_limit=config.val_limit,
    )
    deployed, weights = load_deployed(
        name,
        info,
        weights=config.weights,
        data_dir=config.data_dir,
        cache_dir=Path(config.cache_dir),
        split=split,
    )
    log(
        f"deployed model zoo:{name} from {weights}; {len(split.x_train)} training and "
        f"{len(split.x_test)} test samples; device {device}"
    )
    models = [_parity_net(name, deployed, config, j).to(device) for j in range(config.r)]
    return _Run(
        config,
        info,
        name,
        device,
        default_coefficients(config.k, config.r),
        split,
        deployed_outputs(deployed, split.x_train, device),
        deployed_outputs(deployed, split.x_test, device),
        weights,
        config.checkpoint_path(name),
        models,
        [_optimizer(m, config) for m in models],
    )


def _parity_net(name: str, deployed: nn.Module, config: TrainConfig, row: int) -> nn.Module:
    net = build_net(name, seed=config.seed * 1009 + row + 1)
    if config.init == "deployed":
        net.load_state_dict(deployed.state_dict())
    return net.requires_grad_(True)


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


# --- batches and steps -----------------------------------------------------------------------


def sample_groups(n: int, k: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """(count, k) dataset indices: column l walks through fresh random permutations of n."""
    laps = math.ceil(count / n)
    columns = [
        torch.cat([torch.randperm(n, generator=generator) for _ in range(laps)])[:count]
        for _ in range(k)
    ]
    return torch.stack(columns, dim=1)


def build_batch(
    x: torch.Tensor,
    outputs: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    *,
    encoder: str,
    coefficients: torch.Tensor,
    image_shape: tuple[int, int, int],
    num_classes: int = 10,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Parity inputs and targets for each parity model, for index groups (B, k)."""
    stacked = x[groups.T]  # (k, B, ...)
    if encoder == "concat":
        return [concat_encode(stacked, image_shape)], [soft_labels(labels[groups.T], num_classes)]
    outs = outputs[groups.T]
    inputs = [combine(stacked, row) for row in coefficients]
    targets = [combine(outs, row) for row in coefficients]
    return inputs, targets


def loss_function(encoder: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """MSE against the combined outputs; soft-label cross-entropy for concat."""
    return F.cross_entropy if encoder == "concat" else F.mse_loss


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> float:
    model.train()
    loss = loss_fn(model(inputs), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _batch(
    run: _Run, groups: torch.Tensor, x: torch.Tensor, outputs: torch.Tensor, labels: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    inputs, targets = build_batch(
        x,
        outputs,
        labels,
        groups,
        encoder=run.config.encoder,
        coefficients=run.coefficients,
        image_shape=run.info.image_shape,
        num_classes=run.info.num_classes,
    )
    return [t.to(run.device) for t in inputs], [t.to(run.device) for t in targets]


def _train_epoch(run: _Run, epoch: int) -> float:
    config, split = run.config, run.split
    generator = torch.Generator().manual_seed(config.seed * 100_003 + epoch)
    count = config.samples_per_epoch or len(split.x_train)
    groups = sample_groups(len(split.x_train), config.k, count, generator).split(config.batch)
    loss_fn, total = loss_function(config.encoder), 0.0
    bar = tqdm(
        groups,
        desc=f"epoch {epoch}/{config.epochs}",
        unit="batch",
        leave=False,
        disable=None if config.progress is None else not config.progress,
    )
    for step, idx in enumerate(bar, 1):
        inputs, targets = _batch(run, idx, split.x_train, run.train_outputs, split.y_train)
        losses = [
            train_step(m, o, x, t, loss_fn)
            for m, o, x, t in zip(run.models, run.optimizers, inputs, targets, strict=True)
        ]
        total += sum(losses) / len(losses)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{total / step:.4f}")
    bar.close()
    return total / max(len(groups), 1)


# --- validation ------------------------------------------------------------------------------


def validate(run: _Run, *, chunk: int = 1024) -> tuple[float, float, list[float]]:
    """(val loss, A_a, [A_d per parity model]) on groups of k consecutive test samples."""
    split, k = run.split, run.config.k
    groups = torch.arange(len(split.x_test) // k * k).reshape(-1, k)
    available = (run.test_outputs.argmax(-1) == split.y_test).float().mean().item()
    sums = torch.zeros(2, run.config.r)  # rows: loss * count, correct decodes
    for idx in groups.split(chunk):
        inputs, targets = _batch(run, idx, split.x_test, run.test_outputs, split.y_test)
        for j, (model, x, target) in enumerate(zip(run.models, inputs, targets, strict=True)):
            sums[:, j] += torch.tensor(_score(run, j, model, x, target, idx))
    n = max(len(groups), 1)
    loss = (sums[0] / n).mean().item()
    return loss, available, (sums[1] / (n * k)).tolist()


def _score(
    run: _Run, row: int, model: nn.Module, x: torch.Tensor, target: torch.Tensor, idx: torch.Tensor
) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        parity = model(x).float().cpu()
    loss = loss_function(run.config.encoder)(parity, target.cpu()).item() * len(idx)
    outputs, labels = run.test_outputs[idx], run.split.y_test[idx]
    if run.config.encoder == "concat":
        decoded = decode_softmax(parity, outputs)
    else:
        decoded = decode_subtraction(parity, outputs, run.coefficients[row])
    return loss, float((decoded.argmax(-1) == labels).sum())


def _report(run: _Run, epoch: int, train_loss: float, started: float) -> EpochReport:
    val_loss, available, degraded = validate(run)
    return EpochReport(
        epoch,
        train_loss,
        val_loss,
        available,
        sum(degraded) / len(degraded),
        tuple(degraded),
        time.perf_counter() - started,
    )


def _describe(report: EpochReport, best: float, total: int) -> str:
    per = ""
    if len(report.accuracy_degraded_per_parity) > 1:
        per = " (" + ", ".join(f"{a:.4f}" for a in report.accuracy_degraded_per_parity) + ")"
    return (
        f"epoch {report.epoch}/{total}: train loss {report.train_loss:.4f}, "
        f"val loss {report.val_loss:.4f}, A_a {report.accuracy_available:.4f}, "
        f"A_d {report.accuracy_degraded:.4f}{per}, best A_d {best:.4f}, "
        f"{report.seconds:.1f}s"
    )


# --- checkpoints -----------------------------------------------------------------------------


def _config_dict(run: _Run) -> dict[str, Any]:
    return {
        **asdict(run.config),
        "model": f"zoo:{run.model_name}",
        "deployed_weights": str(run.deployed_weights),
    }


def _save(run: _Run) -> None:
    ckpt.save_checkpoint(
        run.checkpoint,
        {
            "epoch": run.epoch,
            "config": _config_dict(run),
            "coefficients": run.coefficients.tolist(),
            "models": [{k: v.cpu() for k, v in m.state_dict().items()} for m in run.models],
            "optimizers": [o.state_dict() for o in run.optimizers],
            "best_accuracy_degraded": run.best,
            "history": run.history,
        },
    )


def _restore(run: _Run, log: Log) -> None:
    state = ckpt.load_checkpoint(run.checkpoint)
    ckpt.check_resumable(state, _config_dict(run), run.checkpoint)
    if state["coefficients"] != run.coefficients.tolist():
        raise ConfigError(f"cannot resume from {run.checkpoint}: its coefficients differ")
    for model, saved in zip(run.models, state["models"], strict=True):
        model.load_state_dict(saved)
    for optimizer, saved in zip(run.optimizers, state["optimizers"], strict=True):
        optimizer.load_state_dict(saved)
    run.epoch, run.best = int(state["epoch"]), float(state["best_accuracy_degraded"])
    run.history = list(state["history"])
    log(f"resumed from {run.checkpoint} after epoch {run.epoch}")


# --- the run ---------------------------------------------------------------------------------


def train_parity(config: TrainConfig, *, log: Log | None = None) -> TrainResult:
    """Train (or resume) the parity model(s), checkpoint every epoch, export .npz + JSON."""
    log = log or (lambda line: tqdm.write(line))
    run = _prepare(config, log)
    if config.resume:
        _restore(run, log)
    else:
        _log_start(run, log)
    if run.epoch >= config.epochs:
        log(f"already trained for {run.epoch} epochs (--epochs {config.epochs}); exporting")
    for epoch in range(run.epoch + 1, config.epochs + 1):
        started = time.perf_counter()
        report = _report(run, epoch, _train_epoch(run, epoch), started)
        run.epoch, run.best = epoch, max(run.best, report.accuracy_degraded)
        run.history.append(asdict(report))
        _save(run)
        log(_describe(report, run.best, config.epochs))
    return _finish(run, log)


def _log_start(run: _Run, log: Log) -> None:
    if run.checkpoint.exists():
        log(f"overwriting {run.checkpoint} (pass --resume to continue it instead)")
    loss, available, degraded = validate(run)
    log(
        f"before training ({run.config.init} init): val loss {loss:.4f}, A_a {available:.4f}, "
        f"A_d {sum(degraded) / len(degraded):.4f}"
    )


def _finish(run: _Run, log: Log) -> TrainResult:
    if not run.history:
        raise ConfigError("nothing trained yet: --epochs must exceed the checkpoint's epochs")
    report = EpochReport(
        **{
            **run.history[-1],
            "accuracy_degraded_per_parity": tuple(run.history[-1]["accuracy_degraded_per_parity"]),
        }
    )
    weights = ckpt.export_weights([m.state_dict() for m in run.models], run.checkpoint)
    sidecar = run.checkpoint.with_suffix(".json")
    ckpt.write_sidecar(sidecar, _sidecar(run, report, weights))
    snippet = yaml_snippet(run, weights)
    log(
        f"parity weights: {', '.join(map(str, weights))}\nsidecar: {sidecar}\n"
        f"A_a {report.accuracy_available:.4f}, A_d {report.accuracy_degraded:.4f} "
        f"after {run.epoch} epochs\nadd to the deployed model's entry in the deployment YAML:\n"
        f"{snippet}"
    )
    return TrainResult(
        run.checkpoint, tuple(weights), sidecar, run.epoch, report, run.best, snippet
    )


def _decoder(encoder: str) -> str:
    return "softmax-subtraction" if encoder == "concat" else "subtraction"


def _sidecar(run: _Run, report: EpochReport, weights: list[Path]) -> dict[str, Any]:
    config = run.config
    return {
        "model": f"zoo:{run.model_name}",
        "dataset": config.dataset,
        "k": config.k,
        "r": config.r,
        "encoder": config.encoder,
        "decoder": _decoder(config.encoder),
        "coefficients": run.coefficients.tolist(),
        "weights": [str(p.resolve()) for p in weights],
        "accuracy_degraded": report.accuracy_degraded,
        "accuracy_degraded_per_parity": list(report.accuracy_degraded_per_parity),
        "accuracy_available": report.accuracy_available,
        "best_accuracy_degraded": run.best,
        "epochs": run.epoch,
        "deployed_weights": str(run.deployed_weights),
        "init": config.init,
        "seed": config.seed,
        "checkpoint": str(run.checkpoint.resolve()),
    }


def yaml_snippet(run: _Run, weights: list[Path]) -> str:
    """The ``parity:`` entry a user adds next to the deployed model's ``source``/``weights``."""
    config = run.config
    paths = [str(p.resolve()) for p in weights]
    where = paths[0] if len(paths) == 1 else "[" + ", ".join(paths) + "]"
    rows = f", r: {config.r}, coefficients: {run.coefficients.tolist()}" if config.r > 1 else ""
    line = f"parity: {{weights: {where}, k: {config.k}, encoder: {config.encoder}{rows}}}"
    if config.encoder == "concat":
        line += "  # decode in probability space: k*softmax(parity) - sum(softmax(others))"
    return line
