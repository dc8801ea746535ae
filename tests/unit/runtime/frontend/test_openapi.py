"""/openapi.json: in sync with the router, and its body models agree with the hand parsers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.routing import Route
from starlette.testclient import TestClient
from test_http_frontend import FakeSystem

from parityserve.config import Limits
from parityserve.errors import MalformedRequest
from parityserve.runtime.frontend import clipper, http, schema
from parityserve.runtime.frontend.auth import AuthPolicy
from parityserve.runtime.modelpath.metrics import Metrics


@pytest.fixture
def app() -> http.HotPaths:
    return http.create_app(FakeSystem(), metrics=Metrics(), auth=AuthPolicy(token="t" * 32),
                           max_body_bytes=4096)


def _served(app: http.HotPaths) -> dict[str, set[str]]:
    served: dict[str, set[str]] = {}
    for route in app.app.routes:
        assert isinstance(route, Route)
        served.setdefault(route.path, set()).update(
            m.lower() for m in route.methods or () if m != "HEAD")
    return served


def test_every_served_route_is_documented_and_nothing_else(app: http.HotPaths) -> None:
    doc = TestClient(app).get("/openapi.json").json()
    documented = {path: set(ops) for path, ops in doc["paths"].items()}
    assert documented == _served(app)
    assert "/openapi.json" in documented


def test_path_parameters_match_the_templates(app: http.HotPaths) -> None:
    doc = TestClient(app).get("/openapi.json").json()
    for path, ops in doc["paths"].items():
        for op in ops.values():
            params = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            assert params == set(re.findall(r"{(\w+)}", path)), path


def test_admin_routes_declare_the_bearer_scheme(app: http.HotPaths) -> None:
    doc = TestClient(app).get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["adminBearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert ("security" in op) == path.startswith("/admin"), path


def test_every_reference_resolves(app: http.HotPaths) -> None:
    doc = TestClient(app).get("/openapi.json").json()
    names = set(doc["components"]["schemas"])
    refs = re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"',
                      TestClient(app).get("/openapi.json").text)
    assert refs and set(refs) <= names


# ---------------------------------------------------------------- differential: model vs parser

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                         max_size=3),
                     max_leaves=6)
_predict = st.dictionaries(st.sampled_from(["input", "input_batch", "uid", "x"]),
                           _json | st.lists(_json, max_size=2), max_size=4)
_update = st.dictionaries(st.sampled_from(["uid", "input", "label", "query_id", "x"]),
                          _json | st.text(max_size=2), max_size=5)


def _accepts(model: type[Any], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def _parses(parse: Any, body: dict[str, Any]) -> bool:
    try:
        parse(body)
    except MalformedRequest:
        return False
    return True


def _predict_parser(body: dict[str, Any]) -> None:
    clipper.predict_items(body, Limits())
    clipper.optional_str(body, "uid")


def _update_parser(body: dict[str, Any]) -> None:
    clipper.update_fields(body)
    clipper.optional_str(body, "query_id")


@settings(max_examples=300, deadline=None)
@given(_predict)
def test_predict_model_and_parser_agree(body: dict[str, Any]) -> None:
    assert _accepts(schema.PredictBody, body) == _parses(_predict_parser, body), body


@settings(max_examples=300, deadline=None)
@given(_update)
def test_update_model_and_parser_agree(body: dict[str, Any]) -> None:
    assert _accepts(schema.UpdateBody, body) == _parses(_update_parser, body), body
