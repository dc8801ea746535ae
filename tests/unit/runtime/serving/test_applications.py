"""The application runtime's memory of answered queries (for feedback by query id)."""

from __future__ import annotations

import numpy as np
import pytest

from parityserve.config import Application
from parityserve.errors import UnknownQuery
from parityserve.runtime.serving import applications
from parityserve.runtime.serving.applications import AppRuntime, QueryRecord, approx_bytes


def _runtime() -> AppRuntime:
    return AppRuntime.build(Application(name="app", models=("m",)))


def _record(item) -> QueryRecord:
    return QueryRecord("app", "ctx", {"m": item}, ("m",))


def test_approx_bytes_grows_with_the_input() -> None:
    small, big = [0.5] * 10, [0.5] * 1000
    assert approx_bytes(big) > 50 * approx_bytes(small)
    assert approx_bytes([[1.0] * 784] * 4) > 4 * 784 * 32
    assert approx_bytes(np.zeros((4, 784), np.float32)) == 112 + 4 * 784 * 4
    assert approx_bytes([]) == 56 and approx_bytes("abc") == 52 and approx_bytes(3) == 32
    assert approx_bytes({"m": [1.0] * 10}) > approx_bytes([1.0] * 10)


def test_recall_returns_what_was_remembered() -> None:
    app = _runtime()
    app.remember("1", _record([1.0, 2.0]))
    assert app.recall("1").item == {"m": [1.0, 2.0]}
    with pytest.raises(UnknownQuery, match="no record of query '2'"):
        app.recall("2")


def test_memory_is_bounded_by_bytes_oldest_first(monkeypatch) -> None:
    app = _runtime()
    one = approx_bytes({"m": [0.0] * 1000})
    monkeypatch.setattr(applications, "_REMEMBERED_BYTES", 10 * one)
    for i in range(25):
        app.remember(str(i), _record([0.0] * 1000))
    assert list(app.queries) == [str(i) for i in range(15, 25)]
    assert app.remembered_bytes == 10 * one
    with pytest.raises(UnknownQuery, match="send the input with the feedback"):
        app.recall("14")


def test_memory_is_bounded_by_count(monkeypatch) -> None:
    app = _runtime()
    monkeypatch.setattr(applications, "_REMEMBERED_QUERIES", 3)
    for i in range(5):
        app.remember(str(i), _record(1.0))
    assert list(app.queries) == ["2", "3", "4"]
    assert app.remembered_bytes == 3 * approx_bytes({"m": 1.0})


def test_one_input_over_the_budget_is_not_kept(monkeypatch) -> None:
    app = _runtime()
    monkeypatch.setattr(applications, "_REMEMBERED_BYTES", 100)
    app.remember("1", _record([0.0] * 1000))
    assert not app.queries and app.remembered_bytes == 0


def test_a_malformed_stored_state_is_discarded_and_logged(caplog) -> None:
    from parityserve.runtime.serving.state_store import MemoryStore

    app = AppRuntime.build(Application(name="app", models=("m",), policy="exp3"))
    store = MemoryStore()
    store.update("app/u", lambda _: {"log_weights": "x", "rounds": 4})
    with caplog.at_level("WARNING", logger="parityserve.runtime.serving.applications"):
        assert app.current_state(store.get("app/u"), "u") == app.policy.init(["m"])
    assert "discarding the stored selection state of context 'u'" in caplog.text
    assert "'log_weights' is 'x'" in caplog.text
    kept = {**app.policy.init(["m"]), "rounds": 4}  # a well-formed one is used as it is
    assert app.current_state(kept, "u")["rounds"] == 4
