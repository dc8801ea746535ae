"""A small synchronous Python client for a parityserve server.

Server errors come back as the matching ``parityserve.errors`` class (chosen by the JSON
body's ``code``) with the server's message; a server that cannot be reached raises
``Unavailable`` naming the URL.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import orjson

from parityserve.config import Deployment
from parityserve.errors import (
    Conflict,
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    LimitExceeded,
    MalformedRequest,
    Overloaded,
    ParityServeError,
    PayloadTooLarge,
    ProtocolError,
    RequestError,
    ServiceError,
    Unauthorized,
    Unavailable,
    UnknownApplication,
    UnknownModel,
    UnknownQuery,
)
from parityserve.runtime.frontend import auth, v2

__all__ = ["Client"]

_ERRORS: dict[str, type[ParityServeError]] = {
    cls.code: cls for cls in (MalformedRequest, InvalidInput, UnknownModel, UnknownApplication,
                              UnknownQuery, Conflict, PayloadTooLarge, Unavailable,
                              DeadlineExceeded, Forbidden, LimitExceeded, RequestError)
}
_DUMP = orjson.OPT_SERIALIZE_NUMPY


def _numpy_to_json(obj: Any) -> Any:
    # Arrays orjson cannot take natively (non-contiguous, object dtype) end up here.
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__} as JSON")


def _dumps(payload: Any) -> bytes:
    return orjson.dumps(payload, option=_DUMP, default=_numpy_to_json)


def _error_from(response: httpx.Response) -> ParityServeError:
    """The parityserve error a non-2xx response stands for."""
    try:
        body = orjson.loads(response.content)
        message, code = str(body["error"]), body.get("code")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message, code = response.text or response.reason_phrase, None
    if code == Overloaded.code:  # 429 or 503: shed at admission, with when to retry
        return _overloaded(message, body, response)
    fallback = RequestError if response.status_code < 500 else ServiceError
    return _ERRORS.get(code, fallback)(message)


def _overloaded(message: str, body: Any, response: httpx.Response) -> Overloaded:
    try:
        retry = float(response.headers.get("retry-after", "1"))
    except ValueError:
        retry = 1.0
    depth = body.get("queue_depth") if isinstance(body, dict) else None
    model = body.get("model") if isinstance(body, dict) else None
    return Overloaded(message, model=str(model or ""),
                      depth=depth if isinstance(depth, int) else 0, retry_after_s=retry)


def _with_uid(body: dict[str, Any], uid: str | None) -> dict[str, Any]:
    return body if uid is None else {**body, "uid": uid}


def _q(name: str) -> str:
    return quote(str(name), safe="")


def _model_path(model: str, version: int | str | None) -> str:
    path = f"/v2/models/{_q(model)}"
    return path if version is None else f"{path}/versions/{_q(str(version))}"


def _find_token() -> tuple[str | None, str]:
    """The admin token from $PARITYSERVE_ADMIN_TOKEN or the default file, and where we looked."""
    path = auth.default_token_file()
    where = f"${auth.ENV_TOKEN}, then {path}"
    env = os.environ.get(auth.ENV_TOKEN)
    return (env or auth.read_token(path)), where


def _tls(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """A CA bundle path becomes a context (httpx deprecates passing the path itself)."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


class Client:
    """``with Client("http://host:8000") as c: c.predict("app", [1, 2, 3])``.

    ``token``: the admin token, sent as ``Authorization: Bearer``; by default it is read from
    ``$PARITYSERVE_ADMIN_TOKEN`` or the token file ``parityserve start`` writes
    (``$PARITYSERVE_HOME/admin-token``). ``verify``: for https, False or a CA bundle path
    (e.g. a self-signed certificate). ``admin_url``: where /admin is served, when the server
    has a separate admin listener.
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float = 30.0,
                 http: httpx.Client | None = None, token: str | None = None,
                 verify: bool | str | ssl.SSLContext = True,
                 admin_url: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.admin_url = (admin_url or url).rstrip("/")
        found, self._token_where = (token, "the token= argument") if token else _find_token()
        self._auth = {"Authorization": f"Bearer {found}"} if found else {}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout,
                                                                  verify=_tls(verify))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ transport

    def _send(self, method: str, path: str, *, body: bytes | None = None,
              headers: dict[str, str] | None = None,
              accept: Sequence[int] = ()) -> httpx.Response:
        base = self.admin_url if path.startswith("/admin") else self.url
        url = base + path
        headers = {**self._auth, **(headers or {})} if self._auth else headers
        try:
            response = self._http.request(method, url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unavailable(f"cannot connect to parityserve at {self.url}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"{method} {url} timed out: {exc}") from exc
        except httpx.TransportError as exc:
            raise Unavailable(f"{method} {url} failed: {exc}") from exc
        if response.is_success or response.status_code in accept:
            return response
        if response.status_code == 401:
            sent = "a token" if self._auth else "no token"
            raise Unauthorized(f"{method} {url}: the server wants the admin token; this client "
                               f"sent {sent} (looked in {self._token_where}). Pass token=, or "
                               "see `parityserve token`")
        raise _error_from(response)

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else _dumps(payload)
        headers = None if body is None else {"content-type": "application/json"}
        return orjson.loads(self._send(method, path, body=body, headers=headers).content)

    # ------------------------------------------------------------ Clipper-style routes

    def predict(self, app: str, x: Any, *, uid: str | None = None) -> dict[str, Any]:
        """One query; ``uid`` names the user/session whose selection state applies."""
        return self._call("POST", f"/{_q(app)}/predict", _with_uid({"input": x}, uid))

    def predict_batch(self, app: str, xs: Sequence[Any], *,
                      uid: str | None = None) -> list[dict[str, Any]]:
        body = _with_uid({"input_batch": list(xs)}, uid)
        return self._call("POST", f"/{_q(app)}/predict", body)

    def predict_graph(self, graph: str, x: Any, *, stream: str = "", label: int = -1,
                      stream_key: str = "stream") -> dict[str, Any]:
        """One request through a stateful service graph. ``stream`` names the per-stream
        state it reads and extends (an LSTM's session); ``label`` is feedback for an online
        learner (-1: none). The reply arrives once every state it depends on is durable."""
        body = {"input": x, stream_key: stream, "label": label}
        return self._call("POST", f"/{_q(graph)}/predict", body)

    def predict_graph_batch(self, graph: str, xs: Sequence[Any], *,
                            streams: Sequence[str] | None = None,
                            labels: Sequence[int] | None = None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"input_batch": list(xs)}
        if streams is not None:
            body["streams"] = list(streams)
        if labels is not None:
            body["labels"] = list(labels)
        return self._call("POST", f"/{_q(graph)}/predict", body)

    def update(self, app: str, uid: str, x: Any, label: Any, *,
               query_id: str | None = None) -> dict[str, Any]:
        """Feedback: the true ``label`` for input ``x``, optionally naming the query answered."""
        body = {"uid": uid, "input": x, "label": label}
        if query_id is not None:
            body["query_id"] = query_id
        return self._call("POST", f"/{_q(app)}/update", body)

    # ------------------------------------------------------------ V2 routes

    def infer(self, model: str, array: np.ndarray, *, version: int | str | None = None,
              binary: bool = True, input_name: str | None = None) -> np.ndarray:
        """Run a batch (first axis = queries) through ``model`` over the V2 protocol."""
        body, headers = v2.encode_infer_request([(input_name or "input", np.asarray(array))],
                                                binary=binary, binary_output=binary)
        response = self._send("POST", _model_path(model, version) + "/infer", body=body,
                              headers=headers)
        length = response.headers.get(v2.HEADER_LENGTH)
        outputs = v2.decode_infer_response(response.content,
                                           None if length is None else int(length))
        if not outputs:
            raise ProtocolError(f"model {model!r} answered with no output tensor")
        return next(iter(outputs.values()))

    def live(self) -> bool:
        try:
            return self._send("GET", "/v2/health/live").status_code == 200
        except ServiceError:
            return False

    def ready(self) -> bool:
        return self._send("GET", "/v2/health/ready", accept=(503,)).status_code == 200

    def model_metadata(self, model: str, version: int | str | None = None) -> dict[str, Any]:
        return self._call("GET", _model_path(model, version))

    # ------------------------------------------------------------ admin

    def state(self) -> dict[str, Any]:
        return self._call("GET", "/admin/state")

    def graph_digests(self, graph: str) -> dict[str, Any]:
        """Per stateful operator of ``graph``: ``{"primary": {"seq", "digest", "pid"},
        "backup": {..., "synced"}}`` (None where there is no such process)."""
        return self._call("GET", f"/admin/graphs/{_q(graph)}/digests")

    def add_application(self, name: str, models: Sequence[str], *, slo_ms: float = 100.0,
                        default_output: Any = None) -> dict[str, Any]:
        return self._call("POST", "/admin/applications",
                          {"name": name, "models": list(models), "slo_ms": slo_ms,
                           "default_output": default_output})

    def remove_application(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/admin/applications/{_q(name)}")

    def deploy(self, deployment: Deployment | dict[str, Any]) -> dict[str, Any]:
        if isinstance(deployment, Deployment):
            deployment = deployment.model_dump(mode="json")
        return self._call("POST", "/admin/models", deployment)

    def set_replicas(self, model: str, n: int) -> dict[str, Any]:
        return self._call("POST", f"/admin/models/{_q(model)}/replicas", {"replicas": n})

    def set_parallelism(self, model: str, c: int | None) -> dict[str, Any]:
        """At most ``c`` data replicas of ``model`` run a batch at once (None: no limit)."""
        return self._call("POST", f"/admin/models/{_q(model)}/parallelism", {"parallelism": c})

    def set_threads(self, model: str, threads: int) -> dict[str, Any]:
        """Every replica of ``model`` runs later batches with ``threads`` intra-op threads (no
        restart); each replica's heartbeat then reports it in ``/admin/state``."""
        return self._call("POST", f"/admin/models/{_q(model)}/threads", {"threads": threads})

    def set_scheduler(self, model: str, policy: str, **settings: Any) -> dict[str, Any]:
        """Change ``model``'s parallelism controller live, e.g. ``set_scheduler("m", "fixed",
        c=2, intra=1)``, ``set_scheduler("m", "serf", profile="m.profile.json")`` or
        ``set_scheduler("m", "queue-length", target_ongoing_requests=2)``; the fields are
        the YAML ``scheduler:`` section's."""
        return self._call("POST", f"/admin/models/{_q(model)}/scheduler",
                          {"policy": policy, **settings})

    def remove_scheduler(self, model: str) -> dict[str, Any]:
        """Stop ``model``'s parallelism controller; the c and threads it set stay, to be
        changed by hand. ``{"stopped": False}`` when none was running."""
        return self._call("DELETE", f"/admin/models/{_q(model)}/scheduler")

    def link_models(self, app: str, models: Sequence[str]) -> dict[str, Any]:
        return self._call("POST", f"/admin/applications/{_q(app)}/models",
                          {"models": list(models)})

    def set_redundancy(self, model: str, mode: str = "none", *,
                       parity: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
        """Switch a model's redundancy mode, e.g. ``set_redundancy("m", "berrut", K=4, S=1)``
        or ``set_redundancy("m", "parm", parity={"k": 2, "weights": "parity.npz"})``."""
        body: dict[str, Any] = {"redundancy": {"mode": mode, **options}}
        if parity is not None:
            body["parity"] = parity
        return self._call("POST", f"/admin/models/{_q(model)}/redundancy", body)

    def set_faults(self, model: str, replica: str = "all", **faults: Any) -> dict[str, Any]:
        return self._call("POST", f"/admin/models/{_q(model)}/faults",
                          {"replica": str(replica), "faults": faults})

    def metrics_text(self) -> str:
        return self._send("GET", "/metrics").text
