"""KServe V2 inference over gRPC (``inference.GRPCInferenceService``), beside the HTTP routes.

The service runs on the frontend's own event loop (``grpc.aio``) and answers from the same
``ServingSystem`` the HTTP routes use, so a query costs the same whichever protocol carries
it: one decode at the edge into the same ``InferenceRequest`` V2 REST makes, one call of
``ServingSystem.infer`` (which decides model or graph, and what is refused), one encode. A
stateful graph is served as V2 REST serves it: one input tensor, a row per query, ``streams``
and ``labels`` in the request's parameters (a JSON list in a string parameter, or for one row
a bare stream key or int64 label), ``seqs`` (JSON) and ``durable`` in the reply's.

Stubs and messages come from ``tritonclient[grpc]`` (``service_pb2``/``service_pb2_grpc``),
the package that V2 clients install anyway, rather than protos vendored here.

Served: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
ModelStatistics and ModelInfer (``raw_input_contents`` or typed ``contents`` in; outputs always
as ``raw_output_contents``, which every Triton client reads). Not served: streaming
(``ModelStreamInfer``), shared memory, repository control, tracing and log settings; those
answer UNIMPLEMENTED, as grpc does for any method a servicer leaves out.
"""

from __future__ import annotations

import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import grpc
import numpy as np
import orjson
from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from parityserve.config import Limits, TensorSpec
from parityserve.core.inputs import decoded_one_by_one, take_elements
from parityserve.errors import (
    ConfigError,
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    LimitExceeded,
    MalformedRequest,
    Overloaded,
    ParityServeError,
    PayloadTooLarge,
    QueueFull,
    RequestError,
    ServiceError,
    TooManyInFlight,
    TooManyStreams,
    Unauthorized,
    Unavailable,
    UnknownModel,
)
from parityserve.runtime.frontend import v2
from parityserve.runtime.frontend.auth import AuthPolicy, authorized
from parityserve.runtime.serving.api import (
    Answer,
    InferenceRequest,
    ModelMetadata,
    ServingSystem,
)

__all__ = ["GrpcFrontend", "bind_grpc", "status_for"]

_R = TypeVar("_R")
logger = logging.getLogger(__name__)

# Which typed ``contents`` field carries each V2 datatype (FP16 and BF16 have none: raw only).
_CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                   "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                   "UINT16": "uint_contents", "UINT32": "uint_contents",
                   "UINT64": "uint64_contents", "FP32": "fp32_contents",
                   "FP64": "fp64_contents", "BYTES": "bytes_contents"}

# Our errors -> gRPC status codes, most specific first (isinstance order matters).
_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyStreams, grpc.StatusCode.RESOURCE_EXHAUSTED),  # a graph's full stream table
    (TooManyInFlight, grpc.StatusCode.RESOURCE_EXHAUSTED),  # an address's share of a graph
    (Unauthorized, grpc.StatusCode.UNAUTHENTICATED),
    (Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (UnknownModel, grpc.StatusCode.NOT_FOUND),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ServiceError, grpc.StatusCode.UNAVAILABLE),  # HTTP's 503
    (MalformedRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
)


def status_for(exc: Exception) -> grpc.StatusCode:
    """The gRPC status code that stands for one of our errors (INTERNAL for anything else)."""
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            return code
    if isinstance(exc, ParityServeError) and getattr(exc, "status_code", 500) == 404:
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.INTERNAL


class GrpcFrontend(pb_grpc.GRPCInferenceServiceServicer):
    """The V2 gRPC service over a ``ServingSystem``; one instance per server."""

    def __init__(self, system: ServingSystem, *, auth: AuthPolicy, limits: Limits,
                 version: str) -> None:
        self.system = system
        self.auth = auth
        self.limits = limits
        self.version = version

    # ---- health and metadata ---------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.system.is_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        async def ready() -> Any:
            version = _version(request.version)
            try:
                return pb.ModelReadyResponse(ready=self.system.model_ready(request.name, version))
            except UnknownModel:
                return pb.ModelReadyResponse(ready=False)  # as Triton: unknown is not ready
        return await self._answer(context, ready, guarded=False)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="parityserve", version=self.version,
                                         extensions=["binary_tensor_data"])

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def metadata() -> Any:
            meta = self.system.model_metadata(request.name, _version(request.version))
            return pb.ModelMetadataResponse(
                name=meta.name, versions=list(meta.versions), platform=meta.platform,
                inputs=[_tensor_metadata(s) for s in meta.inputs],
                outputs=[_tensor_metadata(s) for s in meta.outputs])
        return await self._answer(context, metadata)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def config() -> Any:
            meta = self.system.model_metadata(request.name, _version(request.version))
            return pb.ModelConfigResponse(config=_model_config(meta, self.limits))
        return await self._answer(context, config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def statistics() -> Any:
            state = self.system.state()
            wanted = [m for m in state["models"] if not request.name or m["name"] == request.name]
            if request.name and not wanted:
                raise UnknownModel(f"no model {request.name!r}")
            return pb.ModelStatisticsResponse(model_stats=[_model_stats(m) for m in wanted])
        return await self._answer(context, statistics)

    # ---- inference -------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async def infer() -> Any:
            if isinstance(request, _Unparsed):  # what the bounded deserializer left unparsed
                raise PayloadTooLarge(request.reason)
            decoded = _decoded(request, self.limits, context.time_remaining())
            async with self.system.graph_share(peer_host(context.peer()), decoded.target):
                answer = await self.system.infer(decoded)
            return _response(request, answer)
        return await self._answer(context, infer)

    async def _answer(self, context: Any, work: Callable[[], Awaitable[_R]], *,
                      guarded: bool = True) -> _R:
        """Run ``work``; our errors become gRPC status codes with the same message. Anything
        else is a bug: INTERNAL with an error id that the log has beside the traceback, never
        the exception's own text (it may hold paths, values or library internals)."""
        try:
            if guarded:
                self._check_token(context)
            return await work()
        except ParityServeError as exc:
            if isinstance(exc, Overloaded | TooManyStreams | TooManyInFlight):
                context.set_trailing_metadata((("retry-after", f"{exc.retry_after_s:g}"),))
            await context.abort(status_for(exc), str(exc))
            raise  # abort raises; this line only satisfies the type checker
        except Exception:
            error_id = secrets.token_hex(8)
            logger.exception("unexpected error in gRPC %s (error id %s)", work.__name__,
                             error_id)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"internal server error (error id {error_id})")
            raise

    def _check_token(self, context: Any) -> None:
        if not self.auth.protect_inference or self.auth.token is None:
            return
        header = dict(context.invocation_metadata() or ()).get("authorization")
        if not authorized(header, self.auth.token):
            raise Unauthorized("this server protects inference: send metadata "
                               "'authorization: Bearer <token>' (see `parityserve token`)")


def peer_host(peer: str) -> str:
    """The client's address in gRPC's peer string (``ipv4:127.0.0.1:5000``,
    ``ipv6:[::1]:5000``, ``unix:/path``): the host alone, as HTTP's ``request.client.host``
    gives it, so that one address has one share of a graph over both edges. gRPC 1.48 and
    later percent-encode the brackets (``ipv6:%5B::1%5D:5000``, grpc/grpc#30852): decoded,
    or one IPv6 client on both edges would count as two addresses, each the other's."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return urllib.parse.unquote(rest.rpartition(":")[0]).strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return rest or peer  # a Unix socket: its path (one local client)


def bind_grpc(system: ServingSystem, *, host: str, port: int, auth: AuthPolicy,
              limits: Limits, max_message_bytes: int, version: str,
              tls: tuple[bytes, bytes] | None = None, reuse_port: bool = False
              ) -> tuple[Any, int]:
    """The service bound to ``host:port`` (0 picks a free port), not yet started: (server,
    port). Call on the event loop that will run it; ``await server.start()`` to serve.

    ``max_message_bytes`` bounds a request as ``server.max_body_bytes`` bounds an HTTP body
    (grpc's own default, 4 MiB, would refuse a batch the HTTP route takes).
    """
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # a taken port must fail loudly, not be shared, unless frontend shards share it
        ("grpc.so_reuseport", int(reuse_port)),
    ])
    _add_servicer(GrpcFrontend(system, auth=auth, limits=limits, version=version), server,
                  limits.max_json_bytes)
    address = f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            key, cert = tls
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError as exc:  # grpc says only "Failed to bind"
        raise ConfigError(f"cannot serve gRPC on {address} ({exc}): is the port taken? Set "
                          "server.grpc_port (0 turns gRPC off)") from None
    return server, bound


class _Handlers:
    """Stands in for a grpc server to take the generated code's method handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers = handlers


_SERVICE = "inference.GRPCInferenceService"


def _add_servicer(servicer: GrpcFrontend, server: Any, max_parsed_bytes: int) -> None:
    """The generated handlers, but ModelInfer's request parsed only when what protobuf makes
    value by value (all of it but ``raw_input_contents``) is within ``max_parsed_bytes``:
    16 MiB of empty ``bytes_contents`` took 0.18 s to parse, before any handler could count
    them, while nobody else was answered (benchmarks/results/loop-block)."""
    taken = _Handlers()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, taken)
    handlers = dict(taken.handlers)
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=_bounded_parse(max_parsed_bytes),
        response_serializer=pb.ModelInferResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    server.add_registered_method_handlers(_SERVICE, handlers)


# ---- decoding ----------------------------------------------------------------------------


class _Unparsed(NamedTuple):
    """A ModelInferRequest left unparsed, and why (ModelInfer answers RESOURCE_EXHAUSTED)."""

    reason: str


def _bounded_parse(limit: int) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        if len(data) > limit:  # else it cannot be over: most requests
            parsed = _parsed_bytes(data, stop_past=limit)
            if parsed > limit:
                return _Unparsed(f"the request's protobuf less its raw_input_contents is "
                                 f"{parsed} bytes or more, more than max_json_bytes = {limit} "
                                 "(it is parsed value by value, as JSON is); send tensors in "
                                 "raw_input_contents or raise server.limits.max_json_bytes")
        return pb.ModelInferRequest.FromString(data)
    return parse


_RAW_INPUT_CONTENTS = 7  # ModelInferRequest's field number: bytes, each parsed as one copy
_MAX_FIELDS = 1024  # top-level fields: a few inputs, outputs and parameters in practice
_FIXED = {1: 8, 5: 4}  # wire types of fixed size: 64-bit, 32-bit


def _parsed_bytes(data: bytes, *, stop_past: int) -> int:
    """The bytes of a serialized ModelInferRequest that protobuf parses value by value: every
    top-level field but the payloads of ``raw_input_contents`` (their tags and lengths count).

    A walk of the top-level fields alone, stopped once the count is past ``stop_past``; past
    _MAX_FIELDS fields all of ``data`` counts. A malformed message counts 0: protobuf's own
    parse refuses it with its own words."""
    pos, parsed, end = 0, 0, len(data)
    try:
        for _ in range(_MAX_FIELDS):
            if pos >= end or parsed > stop_past:
                return parsed
            start = pos
            tag, pos = _varint(data, pos)
            wire, payload = tag & 7, 0
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 2:  # length-delimited: a string, bytes, or a message
                payload, pos = _varint(data, pos)
            elif wire in _FIXED:
                payload = _FIXED[wire]
            else:  # groups, or no wire type at all
                return 0
            raw = wire == 2 and tag >> 3 == _RAW_INPUT_CONTENTS
            parsed += pos - start + (0 if raw else payload)
            pos += payload
        return end if pos < end else parsed
    except IndexError:  # a varint runs past the end
        return 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:  # ten bytes at most: a longer one is no varint
            raise IndexError("varint too long")


def _version(raw: str) -> int | None:
    """'' means the latest version; otherwise a positive integer in ASCII digits."""
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise UnknownModel(f"no version {raw!r}; versions are positive integers")
    return int(raw)


def _decoded(request: Any, limits: Limits, timeout_s: float | None = None) -> InferenceRequest:
    """The serving system's request for a ModelInferRequest: its tensors decoded (each shape
    within ``limits`` before anything is sized by it), its parameters as plain values, and
    the client's deadline (``timeout_s`` left, or None when the call set none)."""
    version = _version(request.model_version)
    raws = request.raw_input_contents
    if raws and len(raws) != len(request.inputs):
        raise InvalidInput(f"{len(raws)} raw_input_contents for {len(request.inputs)} inputs: "
                           "send one raw buffer per input, or typed contents for all")
    tensors, taken = [], 0
    for i, tensor in enumerate(request.inputs):
        array, taken = _tensor(tensor, raws[i] if raws else None, limits, taken)
        tensors.append((tensor.name, array))
    return InferenceRequest(
        "v2", request.model_name, version, tensors=tuple(tensors),
        outputs=tuple(o.name for o in request.outputs),
        parameters=_plain(request.parameters), request_id=request.id or None,
        timeout_s=timeout_s)


def _tensor(tensor: Any, raw: bytes | None, limits: Limits, taken: int
            ) -> tuple[np.ndarray, int]:
    """One input tensor, and the request's values decoded one by one with it (``taken``
    before it), counted from its shape as V2 REST counts them."""
    if "shared_memory_region" in tensor.parameters:
        raise InvalidInput(f"input {tensor.name!r}: shared-memory tensors are not supported")
    count = v2.tensor_count(tensor.name, tensor.shape, limits)  # before anything is sized
    if decoded_one_by_one(tensor.datatype, raw=raw is not None):  # typed contents, raw BYTES
        taken = take_elements(taken, count, limit=limits.max_request_elements,
                              what=f"tensor {tensor.name!r}")
    shape = tuple(tensor.shape)
    if raw is not None:
        return v2.array_from_raw(tensor.name, tensor.datatype, shape, raw), taken
    return _from_contents(tensor, shape, count), taken


def _plain(params: Any) -> dict[str, Any]:
    """A request's parameters as plain values (a graph's ``streams`` and ``labels`` among
    them: ``runtime/serving/face.py`` reads them)."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, which) if which else None
    return out


def _from_contents(tensor: Any, shape: tuple[int, ...], count: int) -> np.ndarray:
    dtype = v2.datatype_to_dtype(tensor.datatype)
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidInput(f"input {tensor.name!r}: {tensor.datatype} has no typed contents; "
                           "send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidInput(f"input {tensor.name!r}: shape {list(shape)} needs {count} values, "
                           f"contents.{field} has {len(values)}")
    if tensor.datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    if values and np.issubdtype(dtype, np.integer):  # before numpy, which would raise
        _check_range(tensor.name, tensor.datatype, values, dtype)
    return np.array(values, dtype=dtype).reshape(shape)


def _check_range(name: str, datatype: str, values: Sequence[int], dtype: np.dtype[Any]) -> None:
    """INT8 rides in an int32 field: a value that does not fit is refused, not wrapped."""
    info = np.iinfo(dtype)
    low, high = min(values), max(values)
    if low < info.min or high > info.max:
        raise InvalidInput(f"input {name!r}: values must fit {datatype} "
                           f"[{info.min}, {info.max}], got {low}..{high}")


# ---- encoding ----------------------------------------------------------------------------


def _response(request: Any, answer: Answer) -> Any:
    assert answer.output is not None
    result = np.asarray(answer.output)
    datatype = v2.dtype_to_datatype(result.dtype)
    response = pb.ModelInferResponse(
        model_name=answer.target, model_version=request.model_version or answer.version or "",
        id=request.id,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name=answer.output_name,
                                                         datatype=datatype,
                                                         shape=list(result.shape))],
        raw_output_contents=[v2.array_to_raw(result, datatype)])
    if answer.rebuilt:  # rows answered by decoding (ParM or Berrut), as V2 REST reports them
        response.parameters["reconstructed_rows"].string_param = ",".join(
            str(r) for r in sorted(answer.rebuilt))
        methods = sorted(set(answer.rebuilt.values()))
        response.parameters["reconstruction"].string_param = ",".join(methods)
        # One per method, in the same order; "unmeasured" where nobody measured it.
        response.parameters["reconstruction_expected_accuracy"].string_param = ",".join(
            "unmeasured" if (a := answer.expected.get(m)) is None else f"{a:g}"
            for m in methods)
    if answer.seqs is not None:  # a graph's: where each row passed, as JSON, and durable
        response.parameters["seqs"].string_param = orjson.dumps(answer.seqs).decode()
        response.parameters["durable"].bool_param = bool(answer.durable)
    return response


def _tensor_metadata(spec: TensorSpec) -> Any:
    return pb.ModelMetadataResponse.TensorMetadata(name=spec.name, datatype=spec.datatype,
                                                   shape=[-1, *spec.shape])


def _model_config(meta: ModelMetadata, limits: Limits) -> Any:
    """A minimal Triton model config: dims exclude the batch axis (max_batch_size > 0, the
    rows one request may carry, as over HTTP)."""
    def tensor(spec: TensorSpec, kind: Any) -> Any:
        data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
        return kind(name=spec.name, data_type=config_pb.DataType.Value(data_type),
                    dims=list(spec.shape))
    return config_pb.ModelConfig(
        name=meta.name, platform=meta.platform, backend="parityserve",
        max_batch_size=v2.config_max_batch(limits),
        input=[tensor(s, config_pb.ModelInput) for s in meta.inputs],
        output=[tensor(s, config_pb.ModelOutput) for s in meta.outputs])


def _model_stats(model: dict[str, Any]) -> Any:
    """What the admin state knows, in Triton's shape: batches executed and the time workers
    spent on them. Per-query success/failure counts live in Prometheus (/metrics)."""
    replicas = model.get("replicas", [])
    batches = sum(int(r.get("served", 0)) for r in replicas)
    worker_ns = int(sum(float(r.get("worker_s", 0.0)) for r in replicas) * 1e9)
    stats = pb.InferStatistics()
    stats.compute_infer.count = batches
    stats.compute_infer.ns = worker_ns
    return pb.ModelStatistics(name=model["name"], version=str(model["version"]),
                              execution_count=batches, inference_stats=stats)
