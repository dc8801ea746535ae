"""Frozen, validated settings. Unknown keys are rejected: a typo is an error, not a default.

A deployment is described in YAML (``load_config``) or built in Python from the same models
(``Server``, ``Deployment``, ``Application`` are re-exported from the package root).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from parityserve.errors import ConfigError

__all__ = [
    "Application",
    "BatchingConfig",
    "BurstConfig",
    "Deployment",
    "FaultConfig",
    "Server",
    "ServingConfig",
    "TensorSpec",
    "load_config",
    "parse_config",
]

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
_RESERVED_NAMES = {"v2", "admin", "metrics", "healthz", "docs"}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BatchingConfig(_Frozen):
    """Adaptive batching: AIMD between 1 and ``max_batch_size``; an optional delay lets a
    batch fill."""

    max_batch_size: int = Field(64, ge=1, le=65536, description="AIMD ceiling")
    max_delay_ms: float = Field(
        0.0, ge=0, le=10_000, description="wait this long for a batch to fill"
    )
    additive_step: int = Field(1, ge=1, description="AIMD additive increase per on-time batch")
    backoff: float = Field(0.9, gt=0, lt=1, description="AIMD multiplicative factor on an SLO miss")


class BurstConfig(_Frozen):
    """Bursts of extra delay, like background network transfers: bursts arrive as a Poisson
    process with mean gap ``every_ms`` and each lasts ``duration_ms``; batches served inside a
    burst are delayed by ``delay_ms`` more."""

    every_ms: float = Field(gt=0)
    duration_ms: float = Field(gt=0)
    delay_ms: float = Field(gt=0)


class FaultConfig(_Frozen):
    """Worker-side fault injection for one replica (or all of a model's replicas)."""

    delay_ms: float = Field(0.0, ge=0, description="mean added delay per batch")
    delay_distribution: Literal["constant", "exponential", "uniform"] = "constant"
    burst: BurstConfig | None = None
    wrong_probability: float = Field(
        0.0, ge=0, le=1, description="chance each query of a batch is corrupted")
    wrong_kind: Literal["noise", "labels"] = "noise"
    noise_sigma: float = Field(1.0, ge=0)
    crash_after_batches: int | None = Field(None, ge=0)
    hang_after_batches: int | None = Field(None, ge=0)
    seed: int | None = None

    @property
    def is_noop(self) -> bool:
        return self == FaultConfig()


class TensorSpec(_Frozen):
    """One tensor of a model's signature. ``shape`` excludes the batch dimension; -1 is any size."""

    name: str = "input"
    datatype: str = "FP32"
    shape: tuple[int, ...] = ()


class Deployment(_Frozen):
    """One deployed model version and its replicas."""

    name: str = Field(pattern=_NAME_PATTERN)
    source: str = Field(
        description="zoo:NAME, torch:pkg.mod:Class, torchscript:FILE, "
        "sklearn:FILE, onnx:FILE or python:pkg.mod:Class"
    )
    weights: str | None = None
    version: int = Field(1, ge=1)
    replicas: int = Field(1, ge=0, le=256)
    threads_per_replica: int = Field(1, ge=1, le=256)
    batching: BatchingConfig = BatchingConfig()
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the model"
    )
    input: TensorSpec | None = None
    output: TensorSpec | None = None
    timeout_ms: float = Field(10_000, gt=0, description="deadline for V2 queries that name no app")
    faults: dict[str, FaultConfig] = Field(
        default_factory=dict, description="replica index (or 'all') -> faults to inject"
    )

    @model_validator(mode="after")
    def _check_fault_keys(self) -> Deployment:
        for key in self.faults:
            if key != "all" and not key.isdigit():
                raise ValueError(f"fault key {key!r} must be a replica index or 'all'")
        return self

    def faults_for(self, replica: int) -> FaultConfig:
        return self.faults.get(str(replica), self.faults.get("all", FaultConfig()))


class Application(_Frozen):
    """A named endpoint over one or more models, with a latency SLO and a default output."""

    name: str = Field(pattern=_NAME_PATTERN)
    models: tuple[str, ...] = Field(min_length=1)
    slo_ms: float = Field(100.0, gt=0, le=600_000)
    default_output: Any = None
    policy: str = Field("single", description="single, exp3, exp4, robust-exp4, or "
                        "python:pkg.mod:Class for a policy of your own")
    policy_options: dict[str, Any] = Field(default_factory=dict,
                                           description="keyword arguments for the policy")
    loss: Literal["zero-one", "cross-entropy", "abs-error"] = "zero-one"
    confidence_threshold: float | None = Field(
        None, ge=0, le=1, description="below this confidence, answer with the default output")

    @model_validator(mode="after")
    def _check_name(self) -> Application:
        if self.name in _RESERVED_NAMES:
            raise ValueError(f"application name {self.name!r} is reserved")
        return self


class Server(_Frozen):
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    rpc_port: int = Field(0, ge=0, le=65535, description="ZeroMQ port for workers; 0 picks one")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    cache_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="prediction cache size; 0 disables"
    )
    heartbeat_interval_ms: float = Field(200, gt=0)
    heartbeat_timeout_ms: float = Field(2000, gt=0)
    max_queue: int = Field(100_000, ge=1, description="per-model queue capacity")
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    state_store: str = Field("memory", description="where selection state lives: memory, "
                             "sqlite:PATH or redis://HOST:PORT/DB")


class ServingConfig(_Frozen):
    server: Server = Server()
    models: tuple[Deployment, ...] = ()
    applications: tuple[Application, ...] = ()

    @model_validator(mode="after")
    def _check_references(self) -> ServingConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        apps = [a.name for a in self.applications]
        if len(set(apps)) != len(apps):
            raise ValueError(f"application names must be unique, got {apps}")
        for app in self.applications:
            missing = [m for m in app.models if m not in names]
            if missing:
                raise ValueError(f"application {app.name!r} links unknown models {missing}")
        return self


def parse_config(data: Any, *, where: str = "config") -> ServingConfig:
    """Validate a plain mapping (e.g. parsed YAML) into a ServingConfig."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return ServingConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from exc


def load_config(path: str | Path) -> ServingConfig:
    """Read and validate a YAML deployment file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from exc
    return parse_config(data, where=str(path))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top)"
        msg = "unknown key (check its spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
