"""One naming of fields (issue 30): every answer names an environment `environmentId`; the answers
that said `envId` before still send it beside, deprecated, until protocol 2, and read it from an
older peer that sends only that. A resource's own id is `id`; a reference to another is `<kind>Id`
(docs/reference/api.md, "Names")."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from peerd import contracts as c

ROOT = Path(__file__).resolve().parents[2]


def answer_models() -> list[type[c.Wire]]:
    return [
        m
        for m in vars(c).values()
        if inspect.isclass(m)
        and issubclass(m, c.Wire)
        and m.__module__ == c.__name__
        and not issubclass(m, c.Input)
    ]


def test_no_answer_names_an_environment_otherwise_than_environment_id() -> None:
    for model in answer_models():
        for name, field in model.model_fields.items():
            if name == "deprecated_env_id":
                assert issubclass(model, c.EnvironmentNamed) and field.alias == "envId" and field.deprecated
                continue
            assert name != "env_id", f"{model.__name__}.{name}: call it environment_id"
            assert "env_" not in name or name.startswith("environment"), f"{model.__name__}.{name}"


@pytest.mark.parametrize(
    "model", [m for m in answer_models() if issubclass(m, c.EnvironmentNamed) and m is not c.EnvironmentNamed]
)
def test_envid_is_sent_beside_environment_id_and_an_older_peers_envid_is_read(model: type[c.Wire]) -> None:
    assert "environment_id" in model.model_fields
    older = {**_minimal(model), "envId": "env_older"}
    read = model.model_validate(older)
    assert getattr(read, "environment_id") == "env_older"  # noqa: B009
    sent = read.wire()
    assert sent["environmentId"] == sent["envId"] == "env_older"
    assert model.model_validate(sent).wire() == sent  # what a new peer sends, a new peer reads alike
    made_here = model.model_validate({**_minimal(model), "environment_id": "env_here"}).wire()
    assert made_here["environmentId"] == made_here["envId"] == "env_here"  # the old name goes out too


def _minimal(model: type[c.Wire]) -> dict[str, object]:
    """Values for the required fields, from the model's schema in the OpenAPI document."""
    schemas = json.loads((ROOT / "docs/reference/openapi.json").read_text())["components"]["schemas"]
    out = _sample(schemas, schemas[model.__name__])
    assert isinstance(out, dict)
    out.pop("environmentId", None)
    return out


def _sample(schemas: dict[str, Any], prop: dict[str, Any]) -> object:
    if "$ref" in prop:
        return _sample(schemas, schemas[prop["$ref"].rsplit("/", 1)[-1]])
    if "enum" in prop:
        return prop["enum"][0]
    if "const" in prop:
        return prop["const"]
    if "anyOf" in prop:
        return _sample(schemas, prop["anyOf"][0])
    kind = prop.get("type")
    if kind == "object":
        return {name: _sample(schemas, prop["properties"][name]) for name in prop.get("required", [])}
    return {"string": "x", "integer": 1, "number": 1.0, "boolean": False, "array": []}.get(kind)


def test_a_resources_own_id_is_id_and_a_reference_names_its_kind() -> None:
    own = {"Thread": "thread", "Project": "project", "Run": "run", "Item": "item", "ClientInfo": "client"}
    for name, kind in own.items():
        fields = getattr(c, name).model_fields
        assert "id" in fields and f"{kind}_id" not in fields, name
    for model in answer_models():
        for field in model.model_fields:
            assert field == "id" or not field.endswith("id") or field.endswith("_id"), (
                f"{model.__name__}.{field}"
            )
