"""Counters a dashboard reads with increase() exist at 0 before their first event.

The 10-minute observability run showed the Replica restarts and Connections refused panels
flat after a replica was killed and a bad connection was refused: their series were born at 1
by that first event, and increase() has no earlier sample to count from."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import parityserve.runtime.frontend.connection as connection
from parityserve.errors import RequestError
from parityserve.runtime.modelpath.metrics import BAD_REQUEST_CODES, REFUSAL_REASONS, Metrics


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def test_a_replica_restart_count_exists_at_zero_from_its_first_report() -> None:
    metrics = Metrics()
    metrics.set_replica_up("m", "m-0", True)
    assert _samples(metrics, "parityserve_replica_restarts_total") == {
        (("model", "m"), ("replica", "m-0")): 0.0}
    metrics.restart("m", "m-0")
    assert _samples(metrics, "parityserve_replica_restarts_total")[
        (("model", "m"), ("replica", "m-0"))] == 1.0


def test_every_connection_refusal_reason_exists_at_zero() -> None:
    seen = _samples(Metrics(), "parityserve_connections_refused_total")
    assert seen == {(("reason", r),): 0.0 for r in REFUSAL_REASONS}


def test_the_reasons_list_names_every_refusal_the_connection_guard_makes() -> None:
    """Each Refusal(status, code, message, reason) in connection.py: its reason is listed."""
    tree = ast.parse(Path(connection.__file__).read_text())
    reasons = {call.args[3].value for call in ast.walk(tree)
               if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Refusal"
               and len(call.args) >= 4 and isinstance(call.args[3], ast.Constant)}
    assert reasons and reasons == set(REFUSAL_REASONS)


def test_every_bad_request_code_exists_at_zero() -> None:
    """The 10-minute run's Bad requests panel stayed flat after its one bad request: the
    malformed_request series was born at 1."""
    seen = _samples(Metrics(), "parityserve_bad_requests_total")
    assert seen == {(("code", c),): 0.0 for c in BAD_REQUEST_CODES}
    assert {"malformed_request", "invalid_input", "too_many_streams", "not_found",
            "method_not_allowed"} <= set(BAD_REQUEST_CODES)


def test_the_codes_list_names_every_request_error() -> None:
    """Each 4xx error type's code is listed, a new one included (the list is derived)."""
    def codes(cls: type[RequestError]) -> set[str]:
        return {cls.code}.union(*(codes(sub) for sub in cls.__subclasses__()))
    assert codes(RequestError) <= set(BAD_REQUEST_CODES)
