"""The import contract (pyproject.toml's [tool.importlinter], run by `make lint`) holds, states the
layers docs/internals/architecture.md states, lists every accepted exception with its reason, and
fails when a rule is broken."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
ARCHITECTURE = ROOT / "docs" / "internals" / "architecture.md"
# Imports that run up the layers, each listed with its reason: the ceiling.
MAX_UPWARD = 8
# File-level import loops the contract accepts, each with its reason.
MAX_LOOPS = 2


def contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` as `make lint` runs it, over the package found in `cwd`."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            str(cwd / "pyproject.toml"),
        ],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_the_contract() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def broken(tmp_path: Path, **imports: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over a copy of the tree where each named module (a path below peerd/, `/` as
    `__`) also imports the given module inside a function (lazy imports count too)."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "peerd", copy / "peerd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, copy / "pyproject.toml")
    for module, target in imports.items():
        path = copy / "peerd" / (module.replace("__", "/") + ".py")
        path.write_text(
            path.read_text() + f"\n\ndef _late() -> None:\n    import {target}  # noqa: F401, PLC0415\n"
        )
    return lint(copy)


def test_a_broken_layer_rule_fails_the_contract(tmp_path: Path) -> None:
    """The store importing the composition root: `lint-imports` names it and fails."""
    done = broken(tmp_path, store__ids="peerd.daemon")
    assert done.returncode == 1, done.stdout
    assert "peerd.store.ids -> peerd.daemon" in done.stdout


def test_a_package_cycle_fails_the_contract(tmp_path: Path) -> None:
    """core importing the store (which imports core): a cycle between sibling packages."""
    done = broken(tmp_path, core__text="peerd.store.ids")
    assert done.returncode == 1, done.stdout
    assert "No cycles are allowed in peerd." in done.stdout


def test_a_loop_between_two_modules_of_one_package_fails_the_contract(tmp_path: Path) -> None:
    """Two modules of one package importing each other."""
    done = broken(tmp_path, core__backoff="peerd.core.clock", core__clock="peerd.core.backoff")
    assert done.returncode == 1, done.stdout
    assert "No cycles are allowed in peerd.core." in done.stdout


def _exceptions(contract_id: str) -> list[str]:
    """The contract's ignore_imports lines as written, comments included."""
    text = PYPROJECT.read_text()
    block = re.search(rf'id = "{contract_id}".*?ignore_imports = \[(.*?)\n\]', text, re.S)
    return [] if block is None else [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_every_accepted_exception_says_why() -> None:
    for contract_id in contracts():
        for line in _exceptions(contract_id):
            assert re.fullmatch(r'"[\w.*]+ -> [\w.*]+",\s+# \S.{10,}', line), (
                f"{contract_id}: every accepted import needs a reason after it: {line}"
            )


def test_the_exceptions_stay_few() -> None:
    assert len(_exceptions("layers")) <= MAX_UPWARD
    assert len(_exceptions("loops")) <= MAX_LOOPS


def test_architecture_states_the_contracts_layers() -> None:
    """docs/internals/architecture.md lists the layers, top first, in a ```layers block; the
    contract is generated from nothing, so the two are compared here."""
    doc = ARCHITECTURE.read_text()
    block = re.search(r"```text\n# layers, highest first\n(.*?)```", doc, re.S)
    assert block is not None, "architecture.md lost its layers block"
    stated = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert stated == [str(layer) for layer in contracts()["layers"]["layers"]]  # type: ignore[union-attr]
