"""The tool catalogue agents load into their context: small, and nothing a model needs left out."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest

from peerd.agent_tools import CATALOGUE, HIDDEN, PARAMS, TOOL_SPECS
from peerd.api.mcp_server import tool_list

# The `tools/list` answer `peerd mcp` gave before the catalogue was made compact (SDK 2.3.0, every
# tool with an output schema and pydantic's full input schema), in bytes.
BEFORE_BYTES = 24_622


def listed() -> dict[str, Any]:
    return json.loads(
        types.ListToolsResult(tools=tool_list()).model_dump_json(by_alias=True, exclude_none=True)
    )


def walk(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every schema node inside `schema` (property maps are not nodes: their keys are names)."""
    found = [schema]
    for field in schema.get("properties", {}).values():
        found += walk(field)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += walk(schema[key])
    for option in schema.get("anyOf", []):
        found += walk(option)
    return found


@pytest.mark.slow
def test_the_catalogue_is_at_most_half_its_old_size() -> None:
    size = len(types.ListToolsResult(tools=tool_list()).model_dump_json(by_alias=True, exclude_none=True))
    assert size <= BEFORE_BYTES // 2, size


def test_every_parameter_a_model_may_pass_is_published_with_its_type() -> None:
    for spec in CATALOGUE:
        full, published = spec.input_schema(), spec.published_schema()
        hidden = set(HIDDEN.get(spec.name, ()))
        assert set(published["properties"]) == set(full["properties"]) - hidden, spec.name
        assert published.get("required", []) == full.get("required", []), spec.name
        for name, field in published["properties"].items():
            assert "type" in field or "enum" in field or "anyOf" in field, (spec.name, name, field)


def test_nested_parameters_and_enums_survive() -> None:
    delegate = TOOL_SPECS["delegate_task"].published_schema()["properties"]
    assert set(delegate["target"]["properties"]) == {"environmentId", "projectId", "provider", "model"}
    assert delegate["mode"] == {"default": "async", "enum": ["async", "wait"], "type": "string"}
    assert "full-access" in delegate["runtimeMode"]["enum"]
    assert TOOL_SPECS["thread_wait"].published_schema()["properties"]["timeout"]["maximum"] == 45.0
    assert TOOL_SPECS["thread_read"].published_schema()["properties"]["limit"]["maximum"] == 100


def test_no_noise_is_published() -> None:
    for tool in listed()["tools"]:
        assert "outputSchema" not in tool, tool["name"]  # see agent_tools' docstring: Gemini validates
        for node in walk(tool["inputSchema"]):
            assert not {"title", "$ref", "$defs", "minLength", "maxLength"} & set(node), (tool["name"], node)
            assert {"type": "null"} not in node.get("anyOf", []), (tool["name"], node)
            assert node.get("default", "unset") is not None, (tool["name"], node)


def test_each_tool_keeps_its_description_and_every_note_names_a_real_parameter() -> None:
    for tool in listed()["tools"]:
        assert tool["description"] == TOOL_SPECS[tool["name"]].description
        assert tool["annotations"]["readOnlyHint"] == TOOL_SPECS[tool["name"]].read_only
    for name, notes in PARAMS.items():
        schema = TOOL_SPECS[name].published_schema()
        for path in notes:
            node = schema
            for part in path.split("."):
                node = node["properties"][part]
            assert node["description"] == notes[path], (name, path)
