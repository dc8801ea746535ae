"""One exception tree for parityserve.

    ParityServeError
    ├── ConfigError                  invalid settings or deployment file
    ├── DataError                    a dataset or weights file is missing or corrupt
    ├── ModelError
    │   ├── ModelLoadError           a model source could not be loaded
    │   └── PredictError             a model's predict() raised or returned garbage
    ├── RequestError                 the client's fault: maps to an HTTP 4xx
    │   ├── MalformedRequest   400   unparsable JSON / body, missing fields
    │   ├── InvalidInput       400   wrong shape, dtype or value
    │   ├── LimitExceeded      400   a configured limit (JSON depth, elements, batch length)
    │   ├── Unauthorized       401   missing or wrong admin token
    │   ├── Forbidden          403   authenticated, but not allowed (e.g. a code source)
    │   │   └── CrossOrigin    403   an admin request from another origin's web page
    │   ├── UnknownModel       404
    │   ├── UnknownApplication 404
    │   ├── UnknownQuery       404
    │   ├── Conflict           409   e.g. adding an application that exists
    │   ├── PayloadTooLarge    413
    │   ├── UnsupportedMediaType 415 an admin body that is not application/json
    │   ├── TooManyStreams     429   a stateful operator has no room for a new stream now
    │   └── TooManyInFlight    429   one client address's graph requests waited too long
    ├── ServiceError                 the server's state: maps to an HTTP 5xx
    │   ├── Unavailable        503   no ready replica
    │   ├── Overloaded   503 or 429   shed at admission: the queue holds all it can serve in time
    │   └── DeadlineExceeded   504   no answer before the deadline (V2 routes)
    ├── QueueFull                    raised by non-waiting ``try_put`` calls
    ├── CodingError                  an encoder or decoder cannot do what was asked
    └── WorkerError
        ├── WorkerCrashed            a replica died with work in flight
        └── ProtocolError            a malformed RPC frame

Outside errors are translated where they enter (``raise ... from exc``).
"""

from __future__ import annotations

__all__ = [
    "CodingError",
    "ConfigError",
    "Conflict",
    "CrossOrigin",
    "DataError",
    "DeadlineExceeded",
    "Forbidden",
    "InvalidInput",
    "LimitExceeded",
    "MalformedRequest",
    "Overloaded",
    "ModelError",
    "ModelLoadError",
    "ParityServeError",
    "PayloadTooLarge",
    "PredictError",
    "ProtocolError",
    "QueueFull",
    "RequestError",
    "ServiceError",
    "TooManyStreams",
    "Unauthorized",
    "Unavailable",
    "UnknownApplication",
    "UnknownModel",
    "UnknownQuery",
    "UnsupportedMediaType",
    "WorkerCrashed",
    "WorkerError",
]


class ParityServeError(Exception):
    """Base of every error parityserve raises on purpose."""


class ConfigError(ParityServeError, ValueError):
    """Settings or a deployment file are invalid."""


class DataError(ParityServeError):
    """A dataset or weights file is missing or corrupt."""


class ModelError(ParityServeError):
    """A user model misbehaved."""


class ModelLoadError(ModelError):
    """A model source could not be resolved or loaded."""


class PredictError(ModelError):
    """A model's predict() raised or returned something unusable."""


class RequestError(ParityServeError):
    """The request is wrong; the server state is unchanged."""

    status_code = 400
    code = "bad_request"


class MalformedRequest(RequestError):
    code = "malformed_request"


class InvalidInput(RequestError):
    code = "invalid_input"


class LimitExceeded(RequestError):
    code = "limit_exceeded"


class Unauthorized(RequestError):
    status_code = 401
    code = "unauthorized"


class Forbidden(RequestError):
    status_code = 403
    code = "forbidden"


class CrossOrigin(Forbidden):
    code = "cross_origin"


class UnknownModel(RequestError):
    status_code = 404
    code = "unknown_model"


class UnknownApplication(RequestError):
    status_code = 404
    code = "unknown_application"


class UnknownQuery(RequestError):
    status_code = 404
    code = "unknown_query"


class Conflict(RequestError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(RequestError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    status_code = 415
    code = "unsupported_media_type"


class TooManyStreams(RequestError):
    """A stateful operator's stream table holds as many streams as it may, none idle long
    enough to give way: a new stream waits ``retry_after_s`` (the ``Retry-After`` header).
    The other rows of its batch, existing streams among them, are answered."""

    status_code = 429
    code = "too_many_streams"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooManyInFlight(RequestError):
    """One client address already has ``server.limits.max_graph_requests_per_address``
    requests inside a graph (``..._shared`` while other addresses use the graphs too), and
    this one waited the graph's deadline for a place
    (``runtime/serving/client_gate.py``); come back after ``retry_after_s``."""

    status_code = 429
    code = "too_many_in_flight"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceError(ParityServeError):
    """The server cannot answer right now."""

    status_code = 503
    code = "unavailable"


class Unavailable(ServiceError):
    pass


class Overloaded(ServiceError):
    """Shed at admission: the model's queue already holds what it can serve in time.

    ``retry_after_s`` is when the queue should have room again (the ``Retry-After`` header);
    the HTTP status is ``server.overload_status`` (503 by default, or 429).
    """

    code = "overloaded"

    def __init__(self, message: str, *, model: str, depth: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.model = model
        self.depth = depth
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServiceError):
    status_code = 504
    code = "deadline_exceeded"


class QueueFull(ParityServeError):
    """A non-waiting put found the queue at capacity."""


class CodingError(ParityServeError):
    """A coded-computation encoder or decoder got inputs it cannot use.

    Too few outputs to rebuild what is missing, a rank-deficient system, mismatched
    shapes, or non-finite values. The caller falls back to waiting or to a default output.
    """


class WorkerError(ParityServeError):
    """A worker process failed."""


class WorkerCrashed(WorkerError):
    pass


class ProtocolError(WorkerError):
    pass
