"""The API described: `/openapi.json` (OpenAPI 3.1) and `/docs` (its HTML).

The document is generated: every body, query and JSON answer is a model of web/schemas/
(the same models that validate the requests and build the answers), written out by pydantic's
`models_json_schema` into `components.schemas`. What a model cannot say (each operation's
summary and the statuses it answers) each view declares with its route, its path written
once (`doc.route` in web/apidoc.py); this module gathers them, adds what every path shares
(the server's and the API keys' refusals, the path parameters) and serves the result. Limits
that come from the settings (the text length, the long-poll wait) are filled in per app.
Paths the running app does not serve are left out, and a test checks the converse: every
route the app serves is documented. `/docs` renders the same document to one self-contained
HTML page (no scripts, no fonts or styles from elsewhere).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from flask import Blueprint, current_app, jsonify, render_template
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from app.settings import Settings
from app.stores.idempotency import ROUTES

# Every blueprint's views, imported for the operations they declare (`doc.route`).
from web import (  # noqa: F401
    api,
    books,
    captioned,
    idempotency,
    models_admin,
    observability,
    openai_compat,
    page,
    streams,
    voices,
    ws,
)
from web import apidoc as doc
from web.auth import ADMIN_PREFIX, OPEN_PATHS
from web.helpers import farm
from web.schemas import responses
from web.schemas.document import document_for
from web.schemas.requests import SocketMessage

openapi = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"
# A key is needed only once the farm has one: no key, or either header (web/auth.py).
_SECURITY: list[dict[str, list]] = [{}, {"bearer": []}, {"apiKey": []}]


class _Generator(GenerateJsonSchema):
    """pydantic's JSON schema, less its noise: no `title` on every property, and no
    `"default": null` where leaving a field out is the default."""

    def field_title_should_be_set(self, schema) -> bool:
        return False

    def default_schema(self, schema) -> dict:
        out = super().default_schema(schema)
        if out.get("default", ...) is None:
            del out["default"]
        return out


_PATH_PARAMS: dict[str, dict] = {
    "job_id": {"description": "the job's id", "schema": {"type": "string"}},
    "book_id": {"schema": {"type": "string"}},
    "n": {"description": "the chapter's index", "schema": {"type": "integer", "minimum": 0}},
    "model_id": {"schema": {"type": "string"}},
    "route": {"description": "the create route the key was sent to",
              "schema": {"type": "string", "enum": list(ROUTES)}},
    "voice": {"description": "a Piper voice's name", "schema": {"type": "string"}},
    "name": {"description": "a voice's name: the farm's, or a custom voice's",
             "schema": {"type": "string"}},
}


# -- the document --------------------------------------------------------------------------


def _written_out(node: Any, models: set) -> Any:
    """`node` with each model replaced by its `$ref` (collected in `models`), and each
    operation's `x-query` model by its query parameters."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        models.add(node)
        return {"$ref": _REF.format(model=node.__name__)}
    if isinstance(node, dict):
        out = {k: _written_out(v, models) for k, v in node.items() if k != "x-query"}
        if "x-query" in node:
            out["parameters"] = out.get("parameters", []) + _query(node["x-query"])
        return out
    if isinstance(node, list):
        return [_written_out(v, models) for v in node]
    return node


def _query(model: type[BaseModel]) -> list[dict]:
    schema = model.model_json_schema(schema_generator=_Generator)
    out = []
    for name, prop in schema["properties"].items():
        description = prop.pop("description", None)
        out.append({"name": name, "in": "query", "schema": prop,
                    **({"description": description} if description else {})})
    return out


def _path_parameters(path: str) -> list[dict]:
    return [{"name": name, "in": "path", "required": True, **_PATH_PARAMS[name]}
            for name in re.findall(r"{(\w+)}", path)]


def build_spec(settings: Settings, served: set[str] | None = None) -> dict:
    """The OpenAPI document; with `served` (OpenAPI-style paths), only the paths in it."""
    models: set[type[BaseModel]] = set()
    with document_for(settings):
        paths = {}
        for path, item in doc.operations().items():
            if served is not None and path not in served:
                continue
            for operation in item.values():
                # The path's parameters, then the operation's own (a header it reads).
                operation["parameters"] = (_path_parameters(path)
                                           + operation.get("parameters", []))
                for status, answer in doc.SERVER_REFUSALS.items():
                    operation["responses"].setdefault(status, answer)
                if path not in OPEN_PATHS:
                    for status, answer in doc.KEY_REFUSALS.items():
                        operation["responses"].setdefault(status, answer)
                    operation["security"] = _SECURITY
                if path.startswith(ADMIN_PREFIX):
                    operation["responses"].setdefault(
                        "403", doc.error("the key is not an admin key (`forbidden`)"))
            paths[path] = _written_out(item, models)
        # The socket's frames, referenced from its operation's description.
        models.update(responses.SOCKET_EVENTS, {SocketMessage})
        _, defs = models_json_schema([(m, "validation") for m in sorted(models, key=str)],
                                     ref_template=_REF, schema_generator=_Generator)
    for item in paths.values():
        for operation in item.values():
            if not operation["parameters"]:
                del operation["parameters"]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "voxfarm",
            "version": "1",
            "description": "A text-to-speech synthesis farm. Submit text as a job and poll "
                           "it, long-poll its chunks, stream it over HTTP or a WebSocket, or "
                           "use the OpenAI speech API. Every error has one shape: "
                           "`{\"error\": {\"code\", \"message\", \"field\"?}}`.",
        },
        "tags": [{"name": n} for n in ("jobs", "streaming", "openai", "books", "voices", "farm",
                                       "admin", "health", "docs")],
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {}), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "an API key (`voxfarm keys create`), once any exists"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}},
    }


def served_paths(app) -> set[str]:
    """The app's routes in OpenAPI form (`<job_id>` -> `{job_id}`), static files aside."""
    out = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.endswith(".static"):
            continue
        out.add(doc.openapi_path(rule.rule))
    return out


def app_spec() -> dict:
    cached = current_app.extensions.get("voxfarm.openapi")
    if cached is None:
        cached = build_spec(farm().settings, served_paths(current_app))
        current_app.extensions["voxfarm.openapi"] = cached
    return copy.deepcopy(cached)


@doc.route(openapi, "/openapi.json", "get", doc.op("docs", "openapi", "This document", {
    "200": doc.json({"type": "object"}, "the OpenAPI document")}))
def openapi_json():
    return jsonify(app_spec())


# -- /docs ---------------------------------------------------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete")


def _resolve(spec: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


@doc.route(openapi, "/docs", "get", doc.op("docs", "docs", "This document, as a page", {
    "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}))
def docs():
    spec = app_spec()
    operations = []
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in _METHODS:
            op = item.get(method)
            if not op:
                continue
            body = None
            rb = op.get("requestBody")
            if rb:
                media, content = next(iter(rb["content"].items()))
                schema = content["schema"]
                name = schema.get("$ref", "").rsplit("/", 1)[-1]
                body = {"media": media, "name": name,
                        "schema": json.dumps(_resolve(spec, schema), indent=2)}
            operations.append({
                "method": method.upper(), "path": path, "op": op,
                "anchor": op.get("operationId", f"{method}-{path}"),
                "parameters": shared + op.get("parameters", []), "body": body,
                "responses": [{"status": status, "description": r.get("description", ""),
                               "media": list(r.get("content", {}))}
                              for status, r in op["responses"].items()],
            })
    schemas = {name: json.dumps(s, indent=2)
               for name, s in spec["components"]["schemas"].items()}
    return render_template("docs.html", spec=spec, operations=operations, schemas=schemas)
