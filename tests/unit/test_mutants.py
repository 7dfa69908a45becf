"""tools/mutants.toml stays usable as the code moves: every snippet is still found exactly once and
every test it names still exists (`make mutants` then runs them; here nothing is mutated)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants", REPO / "tools" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants", module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


MUTANTS = runner().load()


def test_at_least_fifteen_rules_are_checked_each_by_its_own_name() -> None:
    assert len(MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_still_applies_and_names_tests_that_exist(mutant: object) -> None:
    assert runner().problems(mutant) == []
    for node in mutant.tests:  # type: ignore[attr-defined]
        path, _, name = node.partition("::")
        function = name.partition("[")[0]
        defined = {
            n.name
            for n in ast.walk(ast.parse((REPO / path).read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert function in defined, f"{node}: no test {function} in {path}"
