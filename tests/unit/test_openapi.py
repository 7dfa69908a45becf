"""The OpenAPI document and the API reference: generated from the route tables, valid, current.

The real daemon's route tables are compared with the document in `tests/fuzz/test_api_document.py`;
the fuzzing itself is `tests/fuzz/test_fuzz.py`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pydantic
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from peerd.api import openapi
from peerd.api.openapi import LISTENERS, Operation, document, operations
from peerd.api.routes import Route

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tools" / "gen_openapi.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_openapi", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _routes() -> list[Route]:
    return list({id(r): r for listener in LISTENERS for r in listener.routes}.values())


def test_the_committed_document_and_reference_are_current() -> None:
    gen = _generator()
    assert gen.JSON_OUT.read_text(encoding="utf-8") == gen.render_json(), (
        "docs/reference/openapi.json is stale: run `make docs` (python tools/gen_openapi.py)"
    )
    assert gen.MD_OUT.read_text(encoding="utf-8") == gen.render_md(), (
        "docs/reference/api.md is stale: run `make docs` (python tools/gen_openapi.py)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("view", [None, "network"])
def test_the_document_is_openapi_3_1_with_valid_schemas(view: Any) -> None:
    doc = json.loads(json.dumps(document(view)))
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema), name
    refs = {m for m in json.dumps(doc).split('"#/components/schemas/')[1:]}
    missing = {ref.split('"', 1)[0] for ref in refs} - set(doc["components"]["schemas"])
    assert not missing


def test_the_network_view_holds_only_the_listeners_routes_and_its_credential() -> None:
    doc = document("network")
    served = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    network = next(x for x in LISTENERS if x.name == "network")
    assert served == {(m, r.document_path) for r in network.routes for m in r.methods}
    assert ("GET", "/v1/status") not in served
    assert ("POST", "/v1/pair") not in served
    assert set(doc["components"]["securitySchemes"]) == {"linkBearer", "agentBearer"}
    for path, item in doc["paths"].items():
        for op in item.values():
            assert op["x-peerd-listeners"] == ["network"]
            if path == "/mcp":  # an outside agent signed in over OAuth (issue 29)
                assert op["security"] == [{"agentBearer": []}]
                continue
            assert op["security"] == ([{"linkBearer": []}] if path.startswith("/v1/") else [{}])
            if path.startswith("/v1/"):
                assert "401" in op["responses"]


def test_every_route_of_every_listener_is_an_operation() -> None:
    doc = document()
    described = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    for route in _routes():
        if route.variants:
            for v in route.variants:
                assert ("POST", route.path.replace("{name}", v.value)) in described
        else:
            assert {(m, route.document_path) for m in route.methods} <= described
    names = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(names) == len(set(names))


def test_every_error_code_a_route_declares_has_a_status() -> None:
    for route in _routes():
        for code in route.errors:
            assert code in route.error_status, f"{route.method} {route.path}: {code} has no HTTP status"


def test_each_status_lists_its_codes_and_the_generic_ones() -> None:
    op = document()["paths"]["/v1/threads/{id}"]["get"]
    codes = {s: r["content"]["application/json"]["schema"]["properties"]["code"]["enum"]
             for s, r in op["responses"].items() if s != "200"}  # fmt: skip
    assert "thread_not_found" in codes["404"]
    assert "not_found" in codes["404"]  # generic: a path id that matches no route
    assert "capability_denied" in codes["403"]  # generic: Origin
    assert codes["401"] == ["capability_denied"]  # the network listener's token check
    assert "shutting_down" in codes["503"]


def _validate(model: Any, data: Any) -> None:
    if model is None:
        assert isinstance(data, dict)
    else:
        pydantic.TypeAdapter(model).validate_python(data)


def _examples() -> list[Operation]:
    return [op for op in operations() if op.example is not None]


@pytest.mark.parametrize("op", _examples(), ids=lambda op: op.op_id)
def test_each_example_is_what_its_models_take_and_give(op: Operation) -> None:
    example = op.example
    assert example is not None
    _validate(op.answer, example.answer)
    if op.body is not None:
        op.body.model_validate(example.body or {})
    else:
        assert example.body is None
    if op.route.query is not None:
        query = {op.route.renames.get(k, k): v for k, v in (example.query or {}).items()}
        op.route.query.model_validate(query)
    assert set(example.path) <= set(op.route.params)


def test_every_operation_has_an_example_and_every_path_parameter_a_meaning() -> None:
    for op in operations():
        assert op.example is not None, f"{op.method} {op.path} has no example"
        for name in op.route.params:
            assert "{" + name + "}" in op.route.document_path
    assert openapi.PARAMETERS  # shared query parameters are described
