"""The ASGI frontend: KServe V2 routes, Clipper-style application routes, admin, metrics.

The frontend only parses, validates and encodes; every decision belongs to the
``ServingSystem`` behind it. Each endpoint returns ``(response, outcome)`` and one wrapper
turns errors into JSON bodies and records the request metric, so handlers stay short.
The predict and infer handlers are the hot path: orjson, no pydantic, no middleware, and
bodies read straight off the ASGI channel.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from importlib import metadata
from time import perf_counter
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from parityserve.config import (
    Application,
    Deployment,
    FaultConfig,
    Limits,
    ParityConfig,
    RedundancyConfig,
    SchedulerConfig,
    TensorSpec,
)
from parityserve.core.edge_guards import same_origin
from parityserve.core.scheduling import is_parity_slot
from parityserve.errors import (
    CrossOrigin,
    InvalidInput,
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
    UnknownApplication,
    UnknownModel,
    UnsupportedMediaType,
)
from parityserve.models.sources import SourcePolicy
from parityserve.runtime.frontend import clipper, v2
from parityserve.runtime.frontend.auth import AuthPolicy, authorized
from parityserve.runtime.frontend.openapi import build_openapi
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.api import (
    Answer,
    InferenceRequest,
    ModelMetadata,
    Prediction,
    ServingSystem,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_admin_app", "create_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_JSON = "application/json"
_DUMP = orjson.OPT_SERIALIZE_NUMPY
# Targets come from the URL; unknown names are folded into one label value so that a
# client probing random names cannot grow the metric's label set without bound.
_UNKNOWN_TARGET = "<unknown>"
_HEADER_LENGTH_KEY = v2.HEADER_LENGTH.lower().encode()  # ASGI header names are lowercase

Outcome = str
Handler = Callable[[Request], Awaitable[tuple[Response, Outcome]]]
Endpoint = Callable[[Request], Awaitable[Response]]
_M = TypeVar("_M", bound=BaseModel)


def create_app(system: ServingSystem, *, metrics: Metrics, auth: AuthPolicy,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               sources: SourcePolicy | None = None, limits: Limits | None = None,
               overload_status: int = 503) -> HotPaths:
    """The ASGI application serving ``system``: hot paths first, Starlette for the rest.

    ``auth`` has no default on purpose: pass ``AuthPolicy(token=...)`` (admin behind the
    token, the safe choice) or, knowingly, ``AuthPolicy.open()``. With
    ``auth.serve_admin=False`` the /admin routes are absent (404): see ``create_admin_app``.
    ``sources`` is what the admin API may deploy; the default allows zoo models only.
    """
    front = _Frontend(system, metrics, max_body_bytes, auth, sources=sources,
                      limits=limits or Limits(), overload_status=overload_status)
    routes = front.routes() + (front.admin_routes() if auth.serve_admin else [])
    front.describe(routes)
    app = Starlette(routes=routes, exception_handlers={HTTPException: front.http_error})
    return HotPaths(front, app)


def create_admin_app(system: ServingSystem, *, metrics: Metrics, auth: AuthPolicy,
                     max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                     sources: SourcePolicy | None = None) -> Starlette:
    """Only the /admin routes, for a listener of their own (``server.admin_host``)."""
    front = _Frontend(system, metrics, max_body_bytes, auth, sources=sources)
    return Starlette(routes=front.admin_routes(),
                     exception_handlers={HTTPException: front.http_error})


class HotPaths:
    """Sends ``POST /{app}/predict`` and the V2 infer routes straight to their handlers.

    Why hand-written: at saturation Starlette's two exception middlewares, its router (a
    regex per route) and its per-route wrapper cost about as much CPU as our own handler does
    for a no-op model. The guarded handlers already turn every error into a JSON answer, so
    nothing those layers do is lost. The match is exactly Starlette's for these paths (a
    non-empty segment without "/"); every other request, including a wrong method on these
    paths, goes to the Starlette app unchanged.
    """

    def __init__(self, front: _Frontend, app: Starlette) -> None:
        self.app = app
        self.endpoints = front.hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.route(scope) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)

    def route(self, scope: Scope) -> Endpoint | None:
        """The hot endpoint for an HTTP request's scope, with its path parameters and app set
        on the scope as Starlette's router sets them; None for every other request. Here and
        in ``runtime/frontend/hot_cycle.py``'s protocol path, this is the one rule of what is
        hot."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        found = self.match(scope["path"])
        if found is None:
            return None
        endpoint, scope["path_params"] = found
        scope["app"] = self.app  # url_for and friends need it
        return endpoint

    def match(self, path: str) -> tuple[Endpoint, dict[str, str]] | None:
        """The hot endpoint for ``path`` and its path parameters, or None."""
        parts = path.split("/")
        if len(parts) == 3 and parts[0] == "" and parts[1] and parts[2] == "predict":
            return self.endpoints["predict"], {"app": parts[1]}
        if len(parts) < 5 or parts[:3] != ["", "v2", "models"] or not parts[3] \
                or parts[-1] != "infer":
            return None
        if len(parts) == 5:
            return self.endpoints["infer"], {"model": parts[3]}
        if len(parts) == 7 and parts[4] == "versions" and parts[5]:
            return self.endpoints["infer"], {"model": parts[3], "version": parts[5]}
        return None


# ---------------------------------------------------------------- shared helpers


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data, option=_DUMP, default=_to_json), status, media_type=_JSON)


def _to_json(obj: Any) -> Any:
    """orjson's fallback for what it cannot serialize natively."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=str)
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def _error(status: int, code: str, message: str,
           headers: Mapping[str, str] | None = None) -> Response:
    body = orjson.dumps({"error": message, "code": code})
    return Response(body, status, headers=headers, media_type=_JSON)


async def _read_body(request: Request, limit: int, name: str = "server.max_body_bytes"
                     ) -> bytes:
    """The whole body, refusing it with 413 as soon as it is known to exceed ``limit`` (the
    setting ``name``)."""
    _check_declared_length(request, limit, name)
    chunks: list[bytes] = []
    size = 0
    receive = request.receive  # straight off the channel: cheaper than request.stream()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # Content-Length may be absent (chunked) or lie
            raise PayloadTooLarge(f"request body exceeds {name} = {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _header(request: Request, name: bytes) -> str | None:
    # A scan of the raw ASGI headers: cheaper than building request.headers on the hot path.
    for key, value in request.scope["headers"]:
        if key == name:
            return str(value, "latin-1")
    return None


def _check_declared_length(request: Request, limit: int, name: str) -> None:
    declared = _header(request, b"content-length")
    if declared is None:
        return
    try:
        length = int(declared)
    except ValueError:
        raise MalformedRequest(f"invalid Content-Length {declared!r}") from None
    if length > limit:
        raise PayloadTooLarge(f"request body of {length} bytes exceeds {name} = {limit} bytes")


def _version(request: Request) -> int | None:
    raw = request.path_params.get("version")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise UnknownModel(f"model {request.path_params['model']!r} has no version {raw!r}; "
                           "versions are positive integers")
    return int(raw)


def _header_length(request: Request) -> int | None:
    raw = _header(request, _HEADER_LENGTH_KEY)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise MalformedRequest(f"invalid {v2.HEADER_LENGTH} {raw!r}") from None


def _package_version() -> str:
    try:
        return metadata.version("parityserve")
    except metadata.PackageNotFoundError:
        return "0.1.0"


# ---------------------------------------------------------------- admin bodies


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _LinkBody(_Body):
    models: tuple[str, ...] = Field(min_length=1)


class _ReplicasBody(_Body):
    replicas: int = Field(ge=0, le=256)


class _GraphFaultBody(_Body):
    """Slow one stateful operator's state delivery (the HAMS Fig. 6 case); 0 clears it."""

    operator: str
    state_delay_ms: float = Field(ge=0, le=60_000)


class _FaultsBody(_Body):
    replica: str = "all"
    faults: FaultConfig = FaultConfig()

    @field_validator("replica")
    @classmethod
    def _replica(cls, value: str) -> str:
        index = value.isascii() and value.isdigit()  # ASCII: "²".isdigit() is True too
        if value != "all" and not index and not is_parity_slot(value):
            raise ValueError("must be a replica index, a parity replica like 'parity0-1', "
                             "or 'all'")
        return value



class _ParallelismBody(_Body):
    # Required, so that an empty body is an error rather than a silent "unlimited".
    parallelism: int | None = Field(ge=1, description="at most this many data replicas run "
                                    "a batch at once; null: no limit")


class _ThreadsBody(_Body):
    threads: int = Field(ge=1, le=256, description="intra-op threads per replica; "
                         "parallelism x threads must fit the cores unless oversubscribed")


class _RedundancyBody(_Body):
    redundancy: RedundancyConfig = RedundancyConfig()
    parity: ParityConfig | None = None


# Route name -> body model, for the OpenAPI document.
_ADMIN_BODIES: dict[str, type[BaseModel]] = {
    "admin_link_models": _LinkBody, "admin_replicas": _ReplicasBody,
    "admin_faults": _FaultsBody, "admin_redundancy": _RedundancyBody,
    "admin_parallelism": _ParallelismBody, "admin_threads": _ThreadsBody,
    "admin_scheduler": SchedulerConfig}


def _validate(model: type[_M], body: bytes, what: str) -> _M:
    try:
        return model.model_validate(clipper.json_object(body))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(body)'}: {e['msg']}"
                             for e in exc.errors())
        raise InvalidInput(f"invalid {what}: {problems}") from exc


# ---------------------------------------------------------------- V2 documents


def _tensor_meta(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": [-1, *spec.shape]}


def _metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
            "inputs": [_tensor_meta(s) for s in meta.inputs],
            "outputs": [_tensor_meta(s) for s in meta.outputs]}


def _config_tensor(spec: TensorSpec) -> dict[str, Any]:
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape)}


def _v2_parameters(answer: Answer) -> dict[str, Any] | None:
    """The response's parameters: the rows rebuilt by decoding, with each method's measured
    accuracy (a model), or where each row passed and whether it is durable (a graph)."""
    if answer.seqs is not None:
        return {"seqs": answer.seqs, "durable": answer.durable}
    if not answer.rebuilt:
        return None
    methods = sorted(set(answer.rebuilt.values()))
    return {"reconstructed_rows": sorted(answer.rebuilt), "reconstruction": methods,
            "reconstruction_expected_accuracy": [answer.expected.get(m) for m in methods]}


def _config_json(meta: ModelMetadata, limits: Limits) -> dict[str, Any]:
    """A minimal Triton model config: dims exclude the batch axis, as with max_batch_size > 0,
    which is the rows one request may carry (``config_max_batch``, as over gRPC)."""
    return {"name": meta.name, "platform": meta.platform, "backend": "parityserve",
            "max_batch_size": v2.config_max_batch(limits),
            "input": [_config_tensor(s) for s in meta.inputs],
            "output": [_config_tensor(s) for s in meta.outputs]}


# ---------------------------------------------------------------- browser-borne requests


def _failure_outcome(exc: Exception) -> Outcome:
    """Shed at admission is the server keeping its deadlines and a 4xx the client's mistake:
    neither is the server's error, which the SLO rules count (deploy/prometheus)."""
    if isinstance(exc, Overloaded | QueueFull):
        return "shed"
    return "bad_request" if isinstance(exc, RequestError) else "error"


def _predict_outcome(answer: Answer) -> Outcome:
    """A default anywhere in the request wins, then a rebuilt answer, then "ok" (a graph's
    answers are neither)."""
    predictions = [p for p in answer.answers if isinstance(p, Prediction)]
    if any(p.default for p in predictions):
        return "default"
    return "reconstructed" if any("reconstructed" in p.extra for p in predictions) else "ok"


def _from_no_web_page(handler: Handler) -> Handler:
    """``handler`` refusing what a web page can make a browser send: a request from another
    origin (403), and a body that is not JSON (415; a cross-site form post can send
    ``text/plain`` without asking, but ``application/json`` only after a CORS preflight,
    which this server never grants). Other clients send no ``Origin``."""
    async def checked(request: Request) -> tuple[Response, Outcome]:
        origin = _header(request, b"origin")
        if origin is not None and not same_origin(origin, _header(request, b"host"),
                                                  request.url.scheme):
            raise CrossOrigin(f"admin requests from a web page of another origin "
                              f"({origin[:100]!r}) are refused")
        if request.method not in ("GET", "HEAD", "DELETE") and not _is_json(request):
            raise UnsupportedMediaType("admin request bodies must be sent as Content-Type: "
                                       "application/json")
        return await handler(request)
    return checked


def _is_json(request: Request) -> bool:
    content_type = _header(request, b"content-type") or ""
    return content_type.partition(";")[0].strip().lower() == _JSON


# ---------------------------------------------------------------- the frontend


class _Frontend:
    def __init__(self, system: ServingSystem, metrics: Metrics, max_body_bytes: int,
                 auth: AuthPolicy, *, sources: SourcePolicy | None = None,
                 limits: Limits | None = None, overload_status: int = 503) -> None:
        self.system = system
        self.metrics = metrics
        self.limit = max_body_bytes
        self.auth = auth
        self.sources = sources or SourcePolicy()
        self.limits = limits or Limits()
        # Inference bodies of JSON: the smaller of the two limits, named in the 413.
        self.json_limit = ((self.limits.max_json_bytes, "server.limits.max_json_bytes")
                           if self.limits.max_json_bytes < max_body_bytes
                           else (max_body_bytes, "server.max_body_bytes"))
        self.overload_status = overload_status
        self.server_doc = {"name": "parityserve", "version": _package_version(),
                           "extensions": ["binary_tensor_data"]}
        # The hot routes' guarded endpoints, shared by HotPaths and the Starlette routes.
        # The token check is wrapped in only when asked for, so open hot paths pay nothing.
        infer_auth = auth.protect_inference
        self.hot = {"predict": self._guard(self._checked(self.predict, infer_auth),
                                           "predict", "app"),
                    "infer": self._guard(self._checked(self.infer, infer_auth), "infer", "model")}

    def _checked(self, handler: Handler, protect: bool) -> Handler:
        """``handler`` behind the token when ``protect`` and a token is set; else itself."""
        token = self.auth.token
        if not protect or token is None:
            return handler

        async def checked(request: Request) -> tuple[Response, Outcome]:
            if not authorized(request.headers.get("authorization"), token):
                raise Unauthorized("this route needs the admin token: send 'Authorization: "
                                   "Bearer <token>' (see `parityserve token`)")
            return await handler(request)
        return checked

    def routes(self) -> list[Route]:
        # Starlette tries routes in order, so the hot paths come first; none of the later
        # routes can match a path these match. (HotPaths answers most of these first.)
        r, v = self._route, "/v2/models/{model}/versions/{version}"
        inf = self.auth.protect_inference
        hot = [Route("/{app}/predict", self.hot["predict"], methods=["POST"],
                     name="predict"),
               Route("/v2/models/{model}/infer", self.hot["infer"], methods=["POST"],
                     name="infer"),
               Route(v + "/infer", self.hot["infer"], methods=["POST"], name="infer"),
               r("/{app}/update", self._checked(self.update, inf), "update", "app", ["POST"])]
        return [*hot, *self._v2_routes(),
                r("/metrics", self._checked(self.metrics_text, self.auth.protect_metrics),
                  "metrics"),
                r("/openapi.json", self.openapi, "openapi")]

    def describe(self, routes: list[Route]) -> None:
        """Build the OpenAPI document from the routes actually served, and what guards them."""
        secured = {name for name, on in (("metrics", self.auth.protect_metrics),
                                         ("predict", self.auth.protect_inference),
                                         ("update", self.auth.protect_inference),
                                         ("infer", self.auth.protect_inference),
                                         ("model_metadata", self.auth.protect_inference),
                                         ("model_config", self.auth.protect_inference)) if on}
        self.openapi_doc = build_openapi(routes, _ADMIN_BODIES, _package_version(),
                                         secured=frozenset(secured))

    async def openapi(self, request: Request) -> tuple[Response, Outcome]:
        return _json(self.openapi_doc), "ok"

    def _v2_routes(self) -> list[Route]:
        r, routes, inf = self._route, [], self.auth.protect_inference
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes += [r(prefix, self._checked(self.model_metadata, inf), "model_metadata",
                         "model"),
                       r(prefix + "/ready", self.model_ready, "model_ready", "model"),
                       r(prefix + "/config", self._checked(self.model_config, inf),
                         "model_config", "model")]
        return [r("/v2", self.server_metadata, "server_metadata"),
                r("/v2/health/live", self.live, "live"),
                r("/v2/health/ready", self.ready, "ready"), *routes]

    def admin_routes(self) -> list[Route]:
        """Every /admin route, each behind the token (unless the policy is open)."""
        r = self._admin_route
        apps, models = "/admin/applications", "/admin/models"
        return [r("/admin/state", self.state, "admin_state"),
                r(apps, self.add_application, "admin_add_application", None, ["POST"]),
                r(apps + "/{app}", self.remove_application, "admin_remove_application",
                  "app", ["DELETE"]),
                r(apps + "/{app}/models", self.link_models, "admin_link_models", "app",
                  ["POST"]),
                r(models, self.deploy, "admin_deploy", None, ["POST"]),
                r(models + "/{model}/replicas", self.set_replicas, "admin_replicas", "model",
                  ["POST"]),
                r(models + "/{model}/faults", self.set_faults, "admin_faults", "model",
                  ["POST"]),
                r(models + "/{model}/redundancy", self.set_redundancy, "admin_redundancy",
                  "model", ["POST"]),
                r(models + "/{model}/parallelism", self.set_parallelism, "admin_parallelism",
                  "model", ["POST"]),
                r(models + "/{model}/threads", self.set_threads, "admin_threads", "model",
                  ["POST"]),
                r(models + "/{model}/scheduler", self.set_scheduler, "admin_scheduler", "model",
                  ["POST"]),
                r(models + "/{model}/scheduler", self.remove_scheduler,
                  "admin_remove_scheduler", "model", ["DELETE"]),
                r("/admin/graphs/{graph}/faults", self.set_graph_fault, "admin_graph_faults",
                  "graph", ["POST"]),
                r("/admin/graphs/{graph}/digests", self.graph_digests, "admin_graph_digests",
                  "graph")]

    def _admin_route(self, path: str, handler: Handler, name: str, target: str | None = None,
                     methods: Sequence[str] = ("GET",)) -> Route:
        return self._route(path, self._checked(_from_no_web_page(handler), True), name,
                           target, methods)

    def _route(self, path: str, handler: Handler, name: str, target: str | None = None,
               methods: Sequence[str] = ("GET",)) -> Route:
        return Route(path, self._guard(handler, name, target), methods=list(methods), name=name)

    def _guard(self, handler: Handler, route: str, target_key: str | None
               ) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            start = perf_counter()
            target = request.path_params.get(target_key, "") if target_key else ""
            try:
                response, outcome = await handler(request)
            except Exception as exc:  # every error, expected or not, becomes a JSON answer
                # shed at admission is the server keeping its deadlines, not an error
                response, outcome = self._fail(exc, route), _failure_outcome(exc)
                if isinstance(exc, UnknownModel | UnknownApplication):
                    target = _UNKNOWN_TARGET
            self.metrics.request(route, target, outcome, perf_counter() - start)
            return response
        return endpoint

    def _fail(self, exc: Exception, route: str) -> Response:
        if isinstance(exc, Overloaded):
            return self._overloaded(exc)
        if isinstance(exc, RequestError):
            self.metrics.bad_request(exc.code)
            headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
            if isinstance(exc, TooManyStreams | TooManyInFlight):  # when to come back
                headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
            return _error(exc.status_code, exc.code, str(exc), headers)
        if isinstance(exc, ServiceError):
            return _error(exc.status_code, exc.code, str(exc))
        if isinstance(exc, QueueFull):  # overload is the server's state, like no replica
            return _error(self.overload_status, "overloaded", str(exc) or "queue full",
                          {"Retry-After": "1"})
        if isinstance(exc, ClientDisconnect):
            return Response(status_code=499)  # nobody reads it; nothing to log
        logger.exception("unexpected error on route %s", route)
        message = str(exc) if isinstance(exc, ParityServeError) else "internal server error"
        return _error(500, "internal_error", message)

    def _overloaded(self, exc: Overloaded) -> Response:
        """Shed at admission: 503 or 429, when to retry, and which queue is full."""
        wait = exc.retry_after_s if math.isfinite(exc.retry_after_s) else 1.0
        retry = str(max(1, math.ceil(wait)))
        body = orjson.dumps({"error": str(exc), "code": exc.code, "model": exc.model,
                             "queue_depth": exc.depth, "retry_after_s": int(retry)})
        return Response(body, self.overload_status, headers={"Retry-After": retry},
                        media_type=_JSON)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """Routing errors (unknown path, wrong method) as JSON, like every other error."""
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                 f"http_{exc.status_code}")
        if exc.status_code < 500:
            self.metrics.bad_request(code)
        message = f"{exc.detail}: {request.method} {quote(request.url.path)}"
        return _error(exc.status_code, code, message, exc.headers)

    # ------------------------------------------------------------ V2 handlers

    async def server_metadata(self, request: Request) -> tuple[Response, Outcome]:
        return _json(self.server_doc), "ok"

    async def live(self, request: Request) -> tuple[Response, Outcome]:
        return _json({"live": True}), "ok"

    async def ready(self, request: Request) -> tuple[Response, Outcome]:
        ready = self.system.is_ready()
        return _json({"ready": ready}, 200 if ready else 503), "ok"

    async def model_metadata(self, request: Request) -> tuple[Response, Outcome]:
        meta = self.system.model_metadata(request.path_params["model"], _version(request))
        return _json(_metadata_json(meta)), "ok"

    async def model_ready(self, request: Request) -> tuple[Response, Outcome]:
        ready = self.system.model_ready(request.path_params["model"], _version(request))
        return _json({"ready": ready}, 200 if ready else 503), "ok"

    async def model_config(self, request: Request) -> tuple[Response, Outcome]:
        meta = self.system.model_metadata(request.path_params["model"], _version(request))
        return _json(_config_json(meta, self.limits)), "ok"

    async def infer(self, request: Request) -> tuple[Response, Outcome]:
        model, version = request.path_params["model"], _version(request)
        binary = _header(request, _HEADER_LENGTH_KEY) is not None  # its JSON header: v2 checks
        body = await (_read_body(request, self.limit) if binary
                      else _read_body(request, *self.json_limit))
        decoded = v2.decode_infer_request(body, _header_length(request), self.limits)
        async with self._graph_share(request, model):
            answer = await self.system.infer(InferenceRequest(
                "v2", model, version, tensors=tuple((t.name, t.array) for t in decoded.inputs),
                outputs=tuple(o.name for o in decoded.outputs),
                parameters=decoded.parameters or {}, request_id=decoded.id))
        assert answer.output is not None
        name = answer.output_name
        out, headers = v2.encode_infer_response(
            model, answer.version, decoded.id, [(name, answer.output)],
            {name: decoded.wants_binary(name)}, _v2_parameters(answer))
        return Response(out, headers=headers), "reconstructed" if answer.rebuilt else "ok"

    def _graph_share(self, request: Request, target: str) -> AbstractAsyncContextManager[None]:
        """A graph request waits for a place among its client address's (shared with gRPC:
        ``ServingSystem.graph_share``)."""
        address = request.client.host if request.client is not None else ""
        return self.system.graph_share(address, target)

    # ------------------------------------------------------------ Clipper handlers

    async def predict(self, request: Request) -> tuple[Response, Outcome]:
        """An application's queries, or a stateful graph's rows: a graph's reply leaves once
        every state it depends on is durable (HAMS output commit); ``seqs`` says where it
        passed."""
        raw = await _read_body(request, *self.json_limit)
        decoded = clipper.predict_request(raw, request.path_params["app"], self.limits)
        async with self._graph_share(request, decoded.target):
            answer = await self.system.infer(decoded)
        bodies = answer.clipper_json()
        return _json(bodies if decoded.batched else bodies[0]), _predict_outcome(answer)

    async def update(self, request: Request) -> tuple[Response, Outcome]:
        raw = await _read_body(request, *self.json_limit)
        body = clipper.json_object(raw, self.limits)
        clipper.check_body(body, self.limits, len(raw))
        uid, item, label = clipper.update_fields(body)
        result = await self.system.update(request.path_params["app"], uid, item, label,
                                          clipper.optional_str(body, "query_id"))
        return _json(result), "ok"

    # ------------------------------------------------------------ admin handlers

    async def state(self, request: Request) -> tuple[Response, Outcome]:
        return _json(self.system.state()), "ok"

    async def add_application(self, request: Request) -> tuple[Response, Outcome]:
        app = _validate(Application, await self._body(request), "application")
        self.sources.check_application(app)
        await self.system.add_application(app)
        return _json(app.model_dump(mode="json"), 201), "ok"

    async def remove_application(self, request: Request) -> tuple[Response, Outcome]:
        name = request.path_params["app"]
        await self.system.remove_application(name)
        return _json({"removed": name}), "ok"

    async def link_models(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_LinkBody, await self._body(request), "link request")
        app = request.path_params["app"]
        await self.system.link_models(app, body.models)
        return _json({"application": app, "linked": list(body.models)}), "ok"

    async def deploy(self, request: Request) -> tuple[Response, Outcome]:
        deployment = _validate(Deployment, await self._body(request), "deployment")
        self.sources.check_deployment(deployment)
        await self.system.deploy(deployment)
        return _json(deployment.model_dump(mode="json"), 201), "ok"

    async def set_replicas(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_ReplicasBody, await self._body(request), "replicas request")
        model = request.path_params["model"]
        await self.system.set_replicas(model, body.replicas)
        return _json({"model": model, "replicas": body.replicas}), "ok"

    async def set_parallelism(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_ParallelismBody, await self._body(request), "parallelism request")
        model = request.path_params["model"]
        await self.system.set_parallelism(model, body.parallelism)
        return _json({"model": model, "parallelism": body.parallelism}), "ok"

    async def set_threads(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_ThreadsBody, await self._body(request), "threads request")
        model = request.path_params["model"]
        await self.system.set_threads(model, body.threads)
        return _json({"model": model, "threads": body.threads}), "ok"

    async def set_scheduler(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(SchedulerConfig, await self._body(request), "scheduler request")
        if body.profile is not None:  # read from the server's disk: only under model_roots
            self.sources.check_file(body.profile, "profile file")
        model = request.path_params["model"]
        await self.system.set_scheduler(model, body)
        return _json({"model": model, "scheduler": body.model_dump(mode="json")}), "ok"

    async def remove_scheduler(self, request: Request) -> tuple[Response, Outcome]:
        model = request.path_params["model"]
        stopped = await self.system.remove_scheduler(model)
        return _json({"model": model, "stopped": stopped}), "ok"

    async def set_redundancy(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_RedundancyBody, await self._body(request), "redundancy request")
        model = request.path_params["model"]
        if body.parity is not None:
            self.sources.check_parity(body.parity)
        await self.system.set_redundancy(model, body.redundancy, body.parity)
        return _json({"model": model, **body.model_dump(mode="json")}), "ok"

    async def set_faults(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_FaultsBody, await self._body(request), "faults request")
        model = request.path_params["model"]
        await self.system.set_faults(model, body.replica, body.faults)
        return _json({"model": model, "replica": body.replica,
                      "faults": body.faults.model_dump(mode="json")}), "ok"

    async def set_graph_fault(self, request: Request) -> tuple[Response, Outcome]:
        body = _validate(_GraphFaultBody, await self._body(request), "graph fault")
        graph = request.path_params["graph"]
        self.system.set_graph_fault(graph, body.operator, body.state_delay_ms)
        return _json({"graph": graph, "operator": body.operator,
                      "state_delay_ms": body.state_delay_ms}), "ok"

    async def graph_digests(self, request: Request) -> tuple[Response, Outcome]:
        """Each stateful operator's state digest on its primary and backup (the replay
        check reads them once the graph is idle)."""
        return _json(await self.system.graph_digests(request.path_params["graph"])), "ok"

    async def metrics_text(self, request: Request) -> tuple[Response, Outcome]:
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type), "ok"

    async def _body(self, request: Request) -> bytes:
        return await _read_body(request, self.limit)
