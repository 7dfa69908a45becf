"""docs/reference/cli.md is generated from the CLI; this fails when a command changed without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tools" / "gen_cli_docs.py"
REFERENCE = ROOT / "docs" / "reference" / "cli.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current() -> None:
    rendered = _generator().render()
    assert REFERENCE.read_text(encoding="utf-8") == rendered, (
        "docs/reference/cli.md is stale: run `.venv/bin/python tools/gen_cli_docs.py`"
    )


def test_rendering_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _generator()
    wide = gen.render()
    monkeypatch.setenv("COLUMNS", "40")
    assert gen.render() == wide
