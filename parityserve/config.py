"""Frozen, validated settings. Unknown keys are rejected: a typo is an error, not a default.

A deployment is described in YAML (``load_config``) or built in Python from the same models
(``Server``, ``Deployment``, ``Application`` are re-exported from the package root).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from parityserve.core.coding.berrut import minimum_workers
from parityserve.core.edge_guards import check_host_entry
from parityserve.core.emulation import ServiceProfile, profile_named
from parityserve.core.hams.door import door_shape
from parityserve.core.hams.topology import GraphError, Topology
from parityserve.core.reconstruction import ExpectedAccuracy
from parityserve.core.scheduling.settings import check_parallelism
from parityserve.datatypes import DATATYPES
from parityserve.errors import ConfigError

__all__ = [
    "Application",
    "BatchingConfig",
    "BurstConfig",
    "ParityConfig",
    "PeersConfig",
    "REDUNDANCY_MODES",
    "RedundancyConfig",
    "SchedulerConfig",
    "Deployment",
    "EmulationConfig",
    "FaultConfig",
    "LauncherConfig",
    "Limits",
    "ReplicaResources",
    "Server",
    "ServingConfig",
    "TLSConfig",
    "TensorSpec",
    "is_loopback",
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
    busy_delay_ms: float = Field(
        2.0, ge=0, le=10_000,
        description="while the frontend's event loop is saturated and queries arrive faster "
        "than this, a partial batch waits up to this long for more (never over a tenth of the "
        "model's SLO); 0 turns it off. An idle frontend sends a lone query at once")
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
    delay_distribution: Literal["constant", "exponential", "uniform", "pareto"] = "constant"
    delay_tail_index: float = Field(
        2.0, gt=1, description="pareto only: the tail index a of P(delay > d) = "
        "(1 + d/s)^-a, s set so the mean is delay_ms; smaller is heavier")
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


class EmulationConfig(_Frozen):
    """An emulated accelerator (see ``parityserve.core.emulation``): each worker computes the
    real output, then holds the batch for a service time drawn from a profile, sleeping. Name
    a built-in ``profile`` or give ``base_ms``, ``per_query_ms`` and ``source``. Results
    measured this way are emulation and must say so."""

    profile: str | None = Field(None, description="a built-in profile, e.g. parm-gpu-resnet18")
    base_ms: float | None = Field(None, ge=0, description="per-batch time")
    per_query_ms: float | None = Field(None, ge=0, description="added per query of a batch")
    distribution: Literal["constant", "lognormal"] = "lognormal"
    cv: float = Field(0.0, ge=0, le=10, description="lognormal coefficient of variation")
    source: str | None = Field(None, max_length=1000, description="where the numbers come from")
    seed: int | None = None

    @model_validator(mode="after")
    def _check(self) -> EmulationConfig:
        self.service_profile()  # raises ConfigError (a ValueError) naming the problem
        return self

    def service_profile(self) -> ServiceProfile:
        custom = (self.base_ms, self.per_query_ms, self.source)
        if self.profile is not None:
            if any(v is not None for v in custom) or {"cv", "distribution"} & \
                    self.model_fields_set:
                raise ConfigError("emulation: give a profile or your own numbers (base_ms, "
                                  "per_query_ms, distribution, cv, source), not both")
            return profile_named(self.profile)
        if self.base_ms is None or self.per_query_ms is None or not self.source:
            raise ConfigError("emulation: name a profile, or give base_ms, per_query_ms and "
                              "source (where the service times come from)")
        return ServiceProfile("custom", self.base_ms, self.per_query_ms, self.source,
                              self.distribution, self.cv)


class TensorSpec(_Frozen):
    """One tensor of a model's signature. ``shape`` excludes the batch dimension; -1 is any size."""

    name: str = "input"
    datatype: str = Field("FP32", description=f"a KServe V2 datatype: {', '.join(DATATYPES)}")
    shape: tuple[int, ...] = ()

    @field_validator("datatype")
    @classmethod
    def _check_datatype(cls, datatype: str) -> str:
        # Refused where it is written (a config, an admin deploy), not in a worker later.
        if datatype not in DATATYPES:
            raise ValueError(f"{datatype!r} is not a KServe V2 datatype; use one of "
                             f"{', '.join(DATATYPES)}")
        return datatype


REDUNDANCY_MODES = ("none", "equal-resources", "replication", "reactive", "parm", "berrut",
                    "systematic-berrut")


class ParityConfig(_Frozen):
    """ParM's learned parity models for one deployment, as ``train-parity`` prints them.

    One line deploys them: ``parity: {weights: parity.npz, k: 2, encoder: addition}``.
    """

    weights: str | tuple[str, ...] | None = Field(
        None, description="one parity model's weights per linear combination (r of them); "
        "omit to evaluate the deployed model itself on the parity query (exact only for "
        "bias-free linear models)")
    source: str | None = Field(None, description="parity model source; default: the model's")
    k: int = Field(2, ge=2, le=16, description="batches per coding group")
    r: int = Field(1, ge=1, le=4, description="parity models: rebuild up to r missing batches")
    encoder: Literal["addition", "concat"] = "addition"
    decoder: Literal["subtraction", "linear", "softmax-subtraction"] | None = Field(
        None, description="default: subtraction (r = 1), linear (r > 1), softmax-subtraction "
        "(concat)")
    coefficients: tuple[tuple[float, ...], ...] | None = Field(
        None, description="the (r, k) combination matrix; default: rows [1..k] ** j")
    replicas: int | None = Field(
        None, ge=1, le=256, description="replicas per parity model; default ceil(m / k)")
    timeout_ms: float | None = Field(
        None, gt=0, description="wait at least this long for a late batch before decoding it "
        "(default: decode as soon as the group can)")
    group_wait_ms: float = Field(
        5.0, ge=0, description="close a coding group that has not filled after this long")
    options: dict[str, Any] | None = Field(None, description="default: the model's options")

    @property
    def weight_files(self) -> tuple[str | None, ...]:
        if self.weights is None:
            return (None,) * self.r
        return (self.weights,) if isinstance(self.weights, str) else self.weights

    @model_validator(mode="after")
    def _check(self) -> ParityConfig:
        if self.weights is not None and len(self.weight_files) != self.r:
            raise ValueError(f"parity: r = {self.r} needs {self.r} weight files, "
                             f"got {len(self.weight_files)}")
        if self.encoder == "concat":
            if self.k not in (2, 4):
                raise ValueError(f"parity: the concat encoder needs k = 2 or 4, not {self.k}")
            if self.r != 1:
                raise ValueError("parity: the concat encoder has one parity model (r = 1)")
        if self.decoder is not None and (
                (self.decoder == "softmax-subtraction") != (self.encoder == "concat")):
            raise ValueError("parity: the concat encoder decodes with softmax-subtraction, and "
                             "only it does (addition decodes with subtraction or linear)")
        if self.decoder == "subtraction" and self.r != 1:
            raise ValueError("parity: the subtraction decoder rebuilds one batch (r = 1); "
                             "use decoder: linear for r > 1")
        if self.coefficients is not None:
            rows = self.coefficients
            if len(rows) != self.r or any(len(row) != self.k for row in rows):
                raise ValueError(f"parity: coefficients must be an (r={self.r}, k={self.k}) "
                                 "matrix")
        return self

    def resolved_decoder(self) -> str:
        if self.decoder is not None:
            return self.decoder
        if self.encoder == "concat":
            return "softmax-subtraction"
        return "subtraction" if self.r == 1 else "linear"


class RedundancyConfig(_Frozen):
    """How a deployment guards against slow, failed or wrong replicas (see the README).

    ``none``; ``equal-resources`` (``extra`` more plain replicas); ``replication`` (each batch
    to ``d`` replicas, first answer wins); ``reactive`` (re-issue after ``timeout_ms``);
    ``parm`` (learned parity models: set ``parity``); ``berrut`` (ApproxIFER: ``K`` batches
    coded onto N+1 replicas, tolerating ``S`` stragglers and ``E`` Byzantine replicas);
    ``systematic-berrut`` (the K batches as they are plus ``S`` Berrut-coded ones).
    """

    mode: Literal["none", "equal-resources", "replication", "reactive", "parm", "berrut",
                  "systematic-berrut"] = "none"
    extra: int | None = Field(None, ge=0, le=256,
                              description="equal-resources: added replicas; default ceil(m/2)")
    d: int = Field(2, ge=2, le=16, description="replication: copies of each batch")
    timeout_ms: float | None = Field(None, gt=0, description="reactive: re-issue after this")
    K: int = Field(2, ge=1, le=64, description="berrut: batches per group")
    S: int = Field(1, ge=0, le=64, description="berrut: stragglers tolerated")
    E: int = Field(0, ge=0, le=16, description="berrut: Byzantine replicas tolerated")
    workers: int | None = Field(
        None, ge=2, le=256, description="berrut: replicas per group; default the fewest that "
        "tolerate S and E (K + S, or 2(K + E) + S); more decode more accurately")
    decoder: Literal["interpolate", "subtract"] = Field(
        "interpolate", description="systematic-berrut: how a missing answer is rebuilt "
        "(subtract: exact for affine models; see the README before using either)")
    group_wait_ms: float = Field(
        0.0, ge=0, le=10_000, description="berrut modes: a group with fewer than K x batch "
        "queries waits up to this long (from its oldest query) for more before it is coded; "
        "every group costs its K + S (or N + 1) tasks however few queries it holds")

    @model_validator(mode="after")
    def _check(self) -> RedundancyConfig:
        if self.mode == "reactive" and self.timeout_ms is None:
            raise ValueError("redundancy: reactive needs timeout_ms (re-issue after how long?)")
        if self.mode == "systematic-berrut" and self.E:
            raise ValueError("redundancy: systematic-berrut does not locate errors; use E: 0")
        if self.mode in ("berrut", "systematic-berrut") and self.K + self.S < 2:
            raise ValueError("redundancy: a Berrut group needs K + S >= 2 tasks")
        if self.decoder != "interpolate" and self.mode != "systematic-berrut":
            raise ValueError(f"redundancy: decoder is only used by systematic-berrut, not "
                             f"{self.mode}")
        if self.group_wait_ms and self.mode not in ("berrut", "systematic-berrut"):
            raise ValueError(f"redundancy: group_wait_ms is only used by the berrut modes, not "
                             f"{self.mode} (ParM's is parity.group_wait_ms)")
        if self.workers is not None:
            if self.mode != "berrut":
                raise ValueError(f"redundancy: workers is only used by berrut, not {self.mode}")
            least = minimum_workers(self.K, self.S, self.E)
            if self.workers < least:
                raise ValueError(f"redundancy: berrut with K={self.K}, S={self.S}, E={self.E} "
                                 f"needs at least {least} workers, got {self.workers}")
        return self

    def coded_tasks(self) -> int:
        """Replicas one group occupies in the berrut modes."""
        if self.mode == "systematic-berrut":
            return self.K + self.S
        return self.workers or minimum_workers(self.K, self.S, self.E)


class SchedulerConfig(_Frozen):
    """The online parallelism controller of one model (issue 18): every ``period_s`` it
    estimates the arrival rate over ``window_s`` and sets c (and intra) live."""

    policy: Literal["serf", "fixed", "queue-length"]
    period_s: float = Field(5.0, ge=0.005, le=3600, description="seconds between decisions")
    window_s: float = Field(30.0, gt=0, le=86_400, description="arrival-rate window")
    profile: str | None = Field(None, description="serf: the JSON `parityserve profile` "
                                "wrote for this model (relative to the config's folder)")
    slo_p99_ms: float | None = Field(None, gt=0, le=3_600_000, description="serf: be "
                                     "tail-aware, running the fewest cores whose p99 meets "
                                     "this SLO (the profile needs a table for it)")
    gain_threshold: float = Field(0.1, ge=0, lt=1, description="serf: switch only when the "
                                  "predicted mean latency falls by more than this fraction, "
                                  "two periods in a row")
    c: int | None = Field(None, ge=1, le=256, description="fixed: requests at once")
    intra: int | None = Field(None, ge=1, le=256, description="fixed, queue-length: threads "
                              "per request (default: threads_per_replica)")
    target_ongoing_requests: float = Field(2.0, gt=0, description="queue-length (Ray Serve)")
    min_c: int = Field(1, ge=1, le=256, description="queue-length: fewest requests at once")
    max_c: int | None = Field(None, ge=1, le=256, description="queue-length: most at once "
                              "(default: the data replicas)")
    upscale_delay_s: float = Field(30.0, ge=0, description="queue-length (Ray Serve)")
    downscale_delay_s: float = Field(600.0, ge=0, description="queue-length (Ray Serve)")
    look_back_period_s: float = Field(30.0, gt=0, description="queue-length (Ray Serve)")

    @model_validator(mode="after")
    def _check_policy(self) -> SchedulerConfig:
        if self.policy == "serf" and not self.profile:
            raise ValueError("scheduler.profile: policy serf needs the profile file "
                             "(write one with `parityserve profile -c CONFIG --model M`)")
        if self.policy != "serf" and (self.profile or self.slo_p99_ms is not None):
            field_name = "profile" if self.profile else "slo_p99_ms"
            raise ValueError(f"scheduler.{field_name} is only used by policy serf, not "
                             f"{self.policy}")
        if self.policy == "fixed" and self.c is None:
            raise ValueError("scheduler.c: policy fixed needs c (requests at once)")
        if self.policy != "fixed" and self.c is not None:
            raise ValueError(f"scheduler.c is only used by policy fixed, not {self.policy}")
        if self.max_c is not None and self.max_c < self.min_c:
            raise ValueError(f"scheduler.max_c ({self.max_c}) is below min_c ({self.min_c})")
        return self


class ReconstructionConfig(_Frozen):
    """Measured accuracy of rebuilt answers (issue 21), per decoding method, and its source;
    without it, ParM reads the degraded-mode accuracy ``train-parity`` stored beside the
    parity weights (``core/reconstruction.py``)."""

    expected_accuracy: dict[str, float] = Field(
        min_length=1, description="decoding method (parm-subtraction, parm-linear, "
        "parm-concat, berrut, systematic-berrut) -> accuracy of a rebuilt answer, 0..1")
    source: str = Field(min_length=1, max_length=1000,
                        description="where the numbers were measured (a results file, a run)")

    @model_validator(mode="after")
    def _check(self) -> ReconstructionConfig:
        ExpectedAccuracy(self.expected_accuracy, self.source)  # ValueError naming the problem
        return self


class ReplicaResources(_Frozen):
    """CPU, GPU and memory one replica reserves on a cluster node (the Ray launcher)."""

    cpu: float = Field(1.0, ge=0)
    gpu: float = Field(0.0, ge=0)
    memory_mb: float = Field(0.0, ge=0)


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
    threads_per_replica: int = Field(
        1, ge=1, le=256, description="intra-op threads per replica (SERF's intra); changed "
        "live with POST /admin/models/{model}/threads, never restarting a process")
    resources: ReplicaResources | None = Field(
        None, description="what one replica asks a cluster launcher (Ray) for; default: "
        "threads_per_replica CPUs")
    batching: BatchingConfig = BatchingConfig()
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the model"
    )
    input: TensorSpec | None = None
    output: TensorSpec | None = None
    json_inputs: Literal["arrays", "python"] = Field(
        "arrays", description="what a model with no input signature gets from the Clipper JSON "
        "route: 'arrays' turns a rectangular list of numbers into one numpy array (int64 when "
        "all are integers, else float64; anything else stays as decoded); 'python' keeps every "
        "input as decoded JSON (lists of Python numbers). V2 inputs are arrays either way")
    timeout_ms: float = Field(10_000, gt=0, description="deadline for V2 queries that name no app")
    allow_nonfinite: bool = Field(
        False, description="accept NaN and infinity in inputs (and serve them in outputs)")
    faults: dict[str, FaultConfig] = Field(
        default_factory=dict, description="replica index (or 'all') -> faults to inject"
    )
    redundancy: RedundancyConfig = RedundancyConfig()
    parity: ParityConfig | None = Field(None, description="ParM parity models (mode parm)")
    emulation: EmulationConfig | None = Field(
        None, description="emulate an accelerator: real outputs, profiled service times")
    parallelism: int | None = Field(
        None, ge=1, description="service parallelism c: at most this many data replicas run "
        "a batch at once, the rest stay warm but do not pull (null: every ready replica "
        "pulls). Changed live with POST /admin/models/{model}/parallelism, never restarting "
        "a process. Only with redundancy none, equal-resources or parm (data replicas only)")
    reconstruction: ReconstructionConfig | None = Field(
        None, description="expected accuracy of rebuilt answers, flagged on each of them")
    oversubscribe: bool = Field(
        False, description="allow parallelism x threads_per_replica up to twice the cores "
        "(a labelled extension of SERF's faithful c x intra <= cores) when threads are set live")
    scheduler: SchedulerConfig | None = Field(
        None, description="choose c and intra online: serf, fixed or queue-length (null: off)")

    @model_validator(mode="before")
    @classmethod
    def _parity_implies_parm(cls, data: Any) -> Any:
        # One line of config deploys a trained parity model: ``parity:`` alone selects ParM.
        if isinstance(data, dict) and data.get("parity") is not None and not data.get(
                "redundancy"):
            return {**data, "redundancy": {"mode": "parm"}}
        return data

    @model_validator(mode="after")
    def _check_fault_keys(self) -> Deployment:
        for key in self.faults:
            if key != "all" and not (key.isascii() and key.isdigit()):
                raise ValueError(f"fault key {key!r} must be a replica index or 'all'")
        return self

    @model_validator(mode="after")
    def _check_redundancy(self) -> Deployment:
        mode = self.redundancy.mode
        if mode == "parm" and self.parity is None:
            raise ValueError(f"model {self.name!r}: redundancy parm needs a 'parity' entry "
                             "(train one with `parityserve train-parity`)")
        if mode != "parm" and self.parity is not None:
            raise ValueError(f"model {self.name!r}: 'parity' is only used with mode parm, "
                             f"not {mode}")
        need = {"replication": self.redundancy.d, "berrut": self.redundancy.coded_tasks(),
                "systematic-berrut": self.redundancy.coded_tasks()}.get(mode, 1)
        if self.replicas and self.replicas < need:
            raise ValueError(f"model {self.name!r}: redundancy {mode} needs at least {need} "
                             f"replicas (one per task of a group), got {self.replicas}")
        try:
            check_parallelism(self.parallelism, mode)
            if self.scheduler is not None:  # it sets c, so it needs a mode c applies to
                check_parallelism(1, mode)
        except ValueError as exc:
            where = "scheduler: " if self.scheduler is not None else ""
            raise ValueError(f"model {self.name!r}: {where}{exc}") from None
        return self

    def data_replicas(self) -> int:
        """Replicas running the model itself (equal-resources adds its extra ones)."""
        if self.redundancy.mode != "equal-resources":
            return self.replicas
        extra = self.redundancy.extra
        return self.replicas + (extra if extra is not None else -(-self.replicas // 2))

    def parity_replicas(self) -> int:
        """Replicas per parity model: ParM's m/k (at least one)."""
        if self.parity is None:
            return 0
        return self.parity.replicas or max(1, -(-self.replicas // self.parity.k))

    def worker_processes(self) -> int:
        """Worker processes this deployment runs: its data replicas and every parity pool."""
        pools = self.parity.r if self.redundancy.mode == "parm" and self.parity else 0
        return self.data_replicas() + pools * self.parity_replicas()

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
    min_expected_accuracy: float | None = Field(
        None, ge=0, le=1, description="a rebuilt answer expected to be right less often than "
        "this (or never measured) is replaced by the default output, flagged")

    @model_validator(mode="after")
    def _check_name(self) -> Application:
        if self.name in _RESERVED_NAMES:
            raise ValueError(f"application name {self.name!r} is reserved")
        return self


# -- stateful service graphs (HAMS, issue 19) --------------------------------------------
class GraphOperator(_Frozen):
    """One node of a graph: a deployed model, the operators (or ``frontend``) it reads."""

    name: str = Field(pattern=_NAME_PATTERN)
    model: str
    inputs: tuple[str, ...] = Field(min_length=1, description="two or more make a join")
    stateful: bool = Field(False, description="kept by a primary and a hot backup")


_MAX_ROW_RANK = 8  # a graph row's dimensions at most: a row is a feature vector or an image


class Graph(_Frozen):
    """A DAG of operators served at ``POST /{name}/predict``; ``output`` answers the client."""

    name: str = Field(pattern=_NAME_PATTERN)
    operators: tuple[GraphOperator, ...] = Field(min_length=1)
    output: str
    stream_key: str = Field("stream", description="request field naming per-stream state")
    fault_tolerance: Literal["hams", "remus", "checkpoint-replay", "bare"] = Field(
        "hams", description="hams: non-stop primary-backup; remus: stop, copy, hold outputs "
        "until the backup has the state; checkpoint-replay: a checkpoint every "
        "checkpoint_every batches and the requests since then logged, replayed on a fresh "
        "process after a failure (Lineage Stash's way); bare: no backup (a lost primary "
        "loses its state)")
    checkpoint_every: int = Field(150, ge=1, description="checkpoint-replay: batches between "
                                  "checkpoints (the paper's baseline: 150)")
    max_batch: int = Field(64, ge=1, le=4096, description="requests per operator batch")
    timeout_ms: float = Field(
        30_000, gt=0, description="how long a client waits for a reply, and a batch may be in "
        "flight at an operator before the watchdog fails it (and the graph reads not ready)")
    detection: Literal["exit", "timeout"] = Field(
        "exit", description="how a lost operator process is noticed: its exit (the kernel "
        "tells the frontend at once), or missed heartbeats alone")
    heartbeat_timeout_ms: float = Field(
        200, gt=0, description="an operator silent this long is lost; it sends a "
        "heartbeat after 50 ms without any other message")
    data_path_detection: bool = Field(
        True, description="also suspect a primary that is silent while it holds batches, "
        "after 4 of its operator's slowest recent round trips (at least 100 ms, at most "
        "heartbeat_timeout_ms; HAMS's data-path timeout): a lost machine is noticed in a "
        "fraction of the heartbeat timeout under load. One seen working on this host is "
        "left to the heartbeat, and bare and checkpoint-replay (where a wrong verdict "
        "restarts a primary from scratch) keep the heartbeat alone; false: the heartbeat "
        "timeout alone")
    full_state_every: int = Field(
        50, ge=1, le=1_000_000, description="a stateful operator that declares what each "
        "batch changed (zoo:stream-lstm's stream slots) sends its backup only those rows, and "
        "the full state on seeding and every this many batches; 1: the full state every time")
    state_link: Literal["unix", "tcp"] = Field(
        "unix", description="how a primary sends states to its backup: a Unix socket in a "
        "0700 folder (same host; the kernel checks the user), or TCP with CURVE (encrypted, "
        "for hosts apart; costs the encryption of every state byte). With launcher kind ray, "
        "members on different nodes use TCP whatever this says")
    input_shape: tuple[StrictInt, ...] | None = Field(
        None, description="the shape of one row (e.g. [4]): rows of another shape get 400 "
        "before any batch. null: only an entry model's declared input shape is checked, "
        "else any shape reaches the operators, which refuse what they cannot take")

    @field_validator("input_shape")
    @classmethod
    def _check_input_shape(cls, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if shape is not None and not 1 <= len(shape) <= _MAX_ROW_RANK:
            raise ValueError(f"input_shape has 1 to {_MAX_ROW_RANK} dimensions, got "
                             f"{len(shape)}")
        if shape is not None and min(shape) < 1:
            raise ValueError(f"input_shape's dimensions are positive, got {list(shape)}")
        return shape

    def topology(self) -> Topology:
        edges = [(i, op.name) for op in self.operators for i in op.inputs]
        return Topology.build([op.name for op in self.operators],
                              [*edges, (self.output, "frontend")],
                              [op.name for op in self.operators if op.stateful])

    def door(self, models: Iterable[Deployment]) -> tuple[int, ...] | None:
        """The row shape refused at the door (-1: any size): ``input_shape`` and the entry
        operators' models' declared ``input`` shapes, never one learned from traffic (a
        client could then choose it); None when nothing is declared."""
        specs = {m.name: m.input for m in models}
        entries = sorted({op.model for op in self.operators if "frontend" in op.inputs})
        return door_shape(self.input_shape, [spec.shape for m in entries
                                             if (spec := specs.get(m)) is not None])

    @model_validator(mode="after")
    def _check_shape(self) -> Graph:
        if self.name in _RESERVED_NAMES:
            raise ValueError(f"graph name {self.name!r} is reserved")
        try:
            self.topology()
        except GraphError as exc:
            raise ValueError(f"graph {self.name!r}: {exc}") from None
        return self


_LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    return host in _LOOPBACK_HOSTS or host.startswith("127.")


class TLSConfig(_Frozen):
    """HTTPS for every HTTP listener: PEM files, relative to the config file's folder."""

    cert: str = Field(description="PEM certificate chain")
    key: str = Field(description="PEM private key")


class Limits(_Frozen):
    """What one request or connection may use. Each limit answers a 4xx that names it."""

    max_json_depth: int = Field(32, ge=2, le=1000, description="nesting of JSON arrays/objects")
    max_input_elements: int = Field(
        1 << 22, ge=1, description="numbers (or strings) in one query's input")
    max_batch_items: int = Field(
        1024, ge=1, description="queries in one request (input_batch, or V2 rows)")
    max_stream_key_bytes: int = Field(
        256, ge=1, description="UTF-8 bytes of one stream key on a graph route (the "
        "stream_key field, or each of 'streams')")
    # The two below keep one request's decoding near 50 ms of event loop on a 2-core VM
    # (benchmarks/results/loop-block): the frontend makes a Python object of each such value,
    # and while it does, nobody else (health checks included) is answered.
    max_request_elements: int = Field(
        1 << 16, ge=1, description="values of one request that are decoded one by one: every "
        "JSON value of a Clipper or graph body and of a V2 tensor's JSON data (lists "
        "included), every BYTES element, every typed gRPC content. Binary numeric tensors "
        "are read in place: only max_body_bytes bounds them")
    max_json_bytes: int = Field(
        1 << 19, ge=1024, description="JSON of one inference request (a JSON body, or the "
        "header of a V2 binary one; for gRPC, the message less its raw_input_contents), "
        "parsed value by value before anything can be counted")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="request line plus headers")
    header_timeout_s: float = Field(
        10.0, gt=0, description="a connection must send its whole head within this")
    body_timeout_s: float = Field(
        30.0, gt=0, description="and then its whole body within this")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="close idle connections after")
    max_connections: int = Field(1024, ge=1, description="open connections per listener")
    # A quarter of max_connections: it takes four addresses to fill the listener, and it is
    # above what one ordinary client opens (browsers 6, requests 10, httpx and aiohttp 100,
    # parityserve's load tool 256). Raise it behind a proxy, whose address is every client's.
    max_connections_per_address: int = Field(
        256, ge=1, description="open connections from one client address per listener; the "
        "excess is answered 429 at once and closed")
    # One address's burst must not queue every other client behind it in a graph's one
    # pipeline (benchmarks/results/graph-burst: 25 at once each second put another client's
    # p99 at 3.6x its calm one, 8 at a time at 1.8x). Raise it behind a proxy.
    max_graph_requests_per_address: int = Field(
        8, ge=1, description="requests of one client address inside a stateful graph at "
        "once, over HTTP and gRPC together; the excess waits its turn at the door, in order, "
        "up to the graph's timeout_ms, then gets 429 too_many_in_flight (gRPC: "
        "RESOURCE_EXHAUSTED)")
    # 8 a time still let one address's burst hold the pipeline and the cores whenever another
    # client's request came (the soak: that client's p99 2.4-2.8x its calm one); 1 a time
    # did not (1.4-1.8x) but serialised a lone client's own Poisson arrivals. So the small
    # share holds only while the graphs are shared (runtime/serving/client_gate.py).
    max_graph_requests_per_address_shared: int = Field(
        2, ge=1, description="the same, while another client address has a request in a "
        "stateful graph or at its door, or asked within the last second: a client alone gets "
        "max_graph_requests_per_address, clients together this many each (at most "
        "max_graph_requests_per_address)")


class PeersConfig(_Frozen):
    """Frontends that share a Redis state store share their admin changes through a Redis
    stream (README: Frontends on several hosts; runtime/cluster/peers.py)."""

    namespace: str = Field(
        "default", pattern=_NAME_PATTERN, description="frontends on one Redis with the same "
        "namespace act as one server for admin changes; give each deployment its own")
    max_changes: int = Field(
        10_000, ge=100, le=10_000_000, description="the stream keeps about this many changes "
        "(MAXLEN ~); a frontend that starts later does not see older ones (it logs so)")


class Server(_Frozen):
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    rpc_port: int = Field(0, ge=0, le=65535, description="ZeroMQ port for workers; 0 picks one")
    grpc_port: int | None = Field(
        None, ge=0, le=65535, description="KServe V2 over gRPC; default: beside the HTTP port "
        "(8001 with 8000, as Triton), a free port when http_port is 0; 0 turns gRPC off")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    cache_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="prediction cache size, each entry counted "
        "with its key and bookkeeping (about 290 bytes beyond its value); the model routes' "
        "predictions, not a graph's operator rows; 0 disables"
    )
    heartbeat_interval_ms: float = Field(200, gt=0)
    heartbeat_timeout_ms: float = Field(2000, gt=0)
    max_queue: int | None = Field(
        None, ge=1, description="per-model queue capacity; default: what the model can still "
        "serve within its SLO at its measured service rate")
    overload_status: Literal[429, 503] = Field(
        503, description="status of a query shed because its model is overloaded")
    fork_server: bool = Field(
        True, description="start local model replicas and stateful graph operators "
        "(primaries, backups, spares) by forking one zygote process per server that imported "
        "their code (and torch, when a model or operator needs it) once, instead of a fresh "
        "Python each (0.5-2 CPU-seconds of imports apiece); Linux only, else, or when false, "
        "each is spawned")
    max_local_workers: int = Field(
        64, ge=1, le=4096, description="worker processes this host may run for all models "
        "together (replicas and parity models); a deploy or scale past it is refused")
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    state_store: str = Field("memory", description="where selection state lives: memory, "
                             "sqlite:PATH or redis://HOST:PORT/DB")
    peers: PeersConfig | None = Field(
        PeersConfig(), description="with a Redis state_store, share admin changes with the "
        "other frontends on it; null keeps each change on the frontend that took it")
    # ---- security (see the README's Security section) ----
    admin_token: SecretStr | None = Field(
        None, description="bearer token for /admin routes; default: $PARITYSERVE_ADMIN_TOKEN, "
        "else the token file (generated on first start)")
    admin_token_file: str | None = Field(
        None, description="where the admin token is kept; default "
        "$PARITYSERVE_HOME/admin-token ($PARITYSERVE_HOME defaults to ~/.parityserve)")
    require_admin_token: bool = Field(
        True, description="false opens the admin API to anyone who can connect: allowed only "
        "when every listener is on loopback")
    admin_host: str | None = Field(
        None, description="serve /admin routes on their own listener (e.g. 127.0.0.1)")
    admin_port: int | None = Field(None, ge=0, le=65535, description="with admin_host")
    protect_metrics: bool = Field(False, description="/metrics also needs the admin token")
    protect_inference: bool = Field(
        False, description="inference routes also need the token (health stays open)")
    model_roots: tuple[str, ...] = Field(
        (), description="folders the admin API may deploy model files from (default: the "
        "config file's folder)")
    allow_code_sources: bool = Field(
        False, description="let the admin API deploy python:, torch:, torchscript: and pickle "
        "(sklearn:) sources, non-.npz weights and python: policies, which run code on this host")
    tls: TLSConfig | None = None
    allowed_hosts: tuple[str, ...] = Field(
        (), description="Host header names served besides the listeners' addresses and "
        "localhost names (a DNS-rebinding guard; others get 421): 'api.example.com', "
        "'.example.com' (it and its subdomains), or '*' (any: behind a proxy that checks Host)")
    worker_auth: bool = Field(
        True, description="workers authenticate with ZeroMQ CURVE keys; false accepts any peer "
        "(allowed only when the worker port is on loopback)")
    worker_keys_dir: str | None = Field(
        None, description="the frontend's keypair and the allowed worker public keys "
        "(see `parityserve keys`); default: keys made in memory for local workers only")
    limits: Limits = Limits()
    frontends: int = Field(1, ge=1, le=256, description="frontend processes sharing the HTTP "
                           "and gRPC ports (SO_REUSEPORT); each owns its workers (README: "
                           "Sharded frontends)")

    def shares_admin_changes(self) -> bool:
        """True when admin changes go through the Redis stream to the other frontends."""
        return self.peers is not None and self.state_store.strip().startswith(
            ("redis://", "rediss://"))

    def grpc_listen_port(self) -> int | None:
        """The port to bind gRPC on (0: a free one), or None when gRPC is off."""
        if self.grpc_port == 0:
            return None
        if self.grpc_port is not None:
            return self.grpc_port
        return self.http_port + 1 if 0 < self.http_port < 65535 else 0

    @model_validator(mode="after")
    def _check_safe(self) -> Server:
        hosts = [self.host, *([self.admin_host] if self.admin_host else [])]
        if not self.require_admin_token and not all(is_loopback(h) for h in hosts):
            raise ValueError(
                "require_admin_token: false is allowed only when every listener is on loopback "
                f"(listening on {', '.join(hosts)}); anyone who reaches the port could deploy "
                "models. Set an admin_token instead.")
        if not self.worker_auth and not is_loopback(self.host):
            raise ValueError(
                f"worker_auth: false is allowed only on loopback, not {self.host}: any peer "
                "that reaches the worker port could read queries and forge answers")
        if (self.admin_port is not None) != (self.admin_host is not None):
            raise ValueError("admin_host and admin_port go together")
        for entry in self.allowed_hosts:
            check_host_entry(entry)
        # Settings that would do nothing are a mistake (the default passes: a dump of a
        # memory-store config holds it, and must load again).
        if self.peers not in (None, PeersConfig()) and not self.shares_admin_changes():
            raise ValueError("server.peers shares admin changes through Redis: it needs "
                             "state_store: redis://HOST:PORT/DB (or remove server.peers)")
        if self.frontends > 1 and self.rpc_port != 0:
            raise ValueError(f"frontends: {self.frontends} needs rpc_port: 0: each frontend "
                             "shard owns its workers on a port of its own")
        return self


class LauncherConfig(_Frozen):
    """Where worker replicas run: local subprocesses (default), or Ray actors on a cluster."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = Field(
        None, description="ray: 'auto' (the cluster this host belongs to), ray://HOST:PORT, "
        "or null for a private single-node Ray started by the frontend")

    @model_validator(mode="after")
    def _check_address(self) -> LauncherConfig:
        if self.kind == "local" and self.address is not None:
            raise ValueError("launcher.address is only used with kind: ray")
        return self


class ServingConfig(_Frozen):
    server: Server = Server()
    launcher: LauncherConfig = LauncherConfig()
    models: tuple[Deployment, ...] = ()
    applications: tuple[Application, ...] = ()
    graphs: tuple[Graph, ...] = ()

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
        _check_graphs(self.graphs, self.models, apps)
        workers = sum(m.worker_processes() for m in self.models)
        if workers > self.server.max_local_workers:
            raise ValueError(f"the models need {workers} worker processes, more than "
                             f"server.max_local_workers = {self.server.max_local_workers}")
        return self


def _check_graphs(graphs: tuple[Graph, ...], deployments: tuple[Deployment, ...],
                  apps: list[str]) -> None:
    models = [m.name for m in deployments]
    routes = [g.name for g in graphs] + apps
    if len(set(routes)) != len(routes):
        raise ValueError(f"graph and application names share one route space, got {routes}")
    for graph in graphs:
        missing = sorted({op.model for op in graph.operators} - set(models))
        if missing:
            raise ValueError(f"graph {graph.name!r} uses undeployed models {missing}")
        try:
            graph.door(deployments)
        except GraphError as exc:
            raise ValueError(f"graph {graph.name!r}: input_shape and its entry models' "
                             f"input shapes: {exc}") from None


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
