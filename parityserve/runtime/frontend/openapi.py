"""The OpenAPI 3.1 document served at ``GET /openapi.json``, built from pydantic models.

Paths and methods come from the live Starlette routes, so the document cannot list a route
the server does not serve (or miss one); bodies come from ``runtime.frontend.schema`` and the admin
models in ``config``/``http``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import Route

from parityserve.config import Application, Deployment
from parityserve.runtime.frontend import schema

__all__ = ["build_openapi"]

_REF = "#/components/schemas/{model}"
_SECURITY = "adminBearer"
_ERROR_STATUSES = ("400", "404", "413", "500", "503")


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json_content(model: type[BaseModel], *, many: bool = False) -> dict[str, Any]:
    body = {"type": "array", "items": _ref(model)} if many else _ref(model)
    return {"application/json": {"schema": body}}


def _operation(name: str, method: str, params: list[str],
               bodies: Mapping[str, type[BaseModel]],
               answers: Mapping[str, type[BaseModel]], secured: bool) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{name}_{method}",
        "parameters": [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                       for p in params],
        "responses": {s: {"description": "error", "content": _json_content(schema.ErrorBody)}
                      for s in _ERROR_STATUSES},
    }
    ok = answers.get(name)
    op["responses"]["200"] = ({"description": "ok", "content": _json_content(ok)} if ok
                              else {"description": "ok"})
    if name in bodies:
        op["requestBody"] = {"required": True, "content": _json_content(bodies[name])}
    if name == "infer":  # the binary extension: JSON header then raw tensor buffers
        op["requestBody"]["content"]["application/octet-stream"] = {
            "schema": {"type": "string", "format": "binary"}}
        op["parameters"].append({"name": "Inference-Header-Content-Length", "in": "header",
                                 "required": False,
                                 "schema": {"type": "integer", "minimum": 0}})
    if secured:
        op["security"] = [{_SECURITY: []}]
        op["responses"]["401"] = {"description": "missing or wrong token",
                                  "content": _json_content(schema.ErrorBody)}
    return op


def build_openapi(routes: Iterable[Route], admin_bodies: Mapping[str, type[BaseModel]],
                  version: str, secured: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The document for ``routes``; ``admin_bodies`` maps route names to their body models.

    Every /admin route needs the bearer token; so do the routes named in ``secured`` (the
    metrics and inference routes, when the server protects them).
    """
    bodies: dict[str, type[BaseModel]] = {
        "predict": schema.PredictBody, "update": schema.UpdateBody,
        "infer": schema.InferRequestBody, "admin_add_application": Application,
        "admin_deploy": Deployment, **admin_bodies}
    answers: dict[str, type[BaseModel]] = {
        "infer": schema.InferResponseBody, "model_metadata": schema.ModelMetadataResponse,
        "server_metadata": schema.ServerMetadataResponse, "live": schema.LiveResponse,
        "ready": schema.ReadyResponse, "model_ready": schema.ReadyResponse,
        "admin_add_application": Application, "admin_deploy": Deployment}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        methods = sorted(m.lower() for m in (route.methods or ()) if m != "HEAD")
        params = list(route.param_convertors)
        for method in methods:
            paths.setdefault(route.path, {})[method] = _operation(
                route.name, method, params, bodies, answers,
                secured=route.name.startswith("admin_") or route.name in secured)
    models: set[type[BaseModel]] = {*bodies.values(), *answers.values(), schema.ErrorBody,
                                    schema.Prediction}
    ordered = sorted(models, key=lambda m: m.__name__)
    _, defs = models_json_schema([(m, "validation") for m in ordered],
                                 ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": "parityserve", "version": version},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {_SECURITY: {"type": "http", "scheme": "bearer",
                                            "description": "the admin token"}},
        },
    }
