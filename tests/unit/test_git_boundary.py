"""Rule: git has one owner, `peerd/runtime/git/`. No module outside it imports a private (`_`) name
from it (or reads one off a module of it), and none builds a git command line itself: every git
process goes through the package's runner (`peerd/runtime/git/runner.py`), which is what keeps
repository content from running code (docs/security.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PEERD = Path(__file__).resolve().parents[2] / "peerd"
PACKAGE = "peerd.runtime.git"
OWNER = PEERD / "runtime" / "git"

# Functions that start a process from an argument list or a command line.
SPAWNERS = frozenset(
    {
        "Popen",
        "run",
        "call",
        "check_call",
        "check_output",
        "getoutput",
        "getstatusoutput",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "subprocess_exec",
        "subprocess_shell",
        "system",
        "popen",
        "spawnv",
        "spawnvp",
        "spawnlp",
        "execv",
        "execvp",
        "execvpe",
        "execlp",
        "posix_spawn",
        "posix_spawnp",
    }
)


def _is_git_word(node: ast.AST) -> bool:
    """`"git"`, a path ending in `/git`, or a shell line that starts with `git `."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    text = node.value.strip()
    return text == "git" or text.endswith("/git") or text.startswith("git ")


def _names_git(node: ast.AST) -> bool:
    if _is_git_word(node):
        return True
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        return _is_git_word(node.elts[0])
    return False


def _in_package(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def problems_in(source: str, name: str) -> Iterator[str]:
    """What in `source` (the module `name`) breaks the rule, one line each."""
    tree = ast.parse(source)
    aliases: set[str] = set()  # names bound to a module of the package
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _in_package(node.module) and alias.name.startswith("_"):
                    yield f"{name}:{node.lineno} imports the private {full}"
                if _in_package(full):
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _in_package(alias.name):
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        yield f"{name}:{node.lineno} imports the private {alias.name}"
                    aliases.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                yield f"{name}:{node.lineno} reads the private {ast.unparse(node)}"
        if isinstance(node, ast.Call):
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if called in SPAWNERS and node.args and _names_git(node.args[0]):
                yield f"{name}:{node.lineno} runs git itself ({called})"
        if isinstance(node, ast.List | ast.Tuple) and node.elts and _is_git_word(node.elts[0]):
            yield f"{name}:{node.lineno} builds a git command line"


def modules_outside() -> Iterator[tuple[Path, str]]:
    for path in sorted(PEERD.rglob("*.py")):
        if OWNER not in path.parents:
            yield path, path.relative_to(PEERD.parent).as_posix()


def test_nothing_outside_the_git_package_uses_its_privates_or_spawns_git() -> None:
    found = [line for path, name in modules_outside() for line in problems_in(path.read_text(), name)]
    assert found == [], "\n".join(found)


def test_the_package_is_where_it_is_looked_for() -> None:
    assert (OWNER / "__init__.py").is_file()
    assert (OWNER / "runner.py").is_file()


def test_the_check_sees_each_way_of_breaking_the_rule() -> None:
    # Each form the check must catch, and forms it must let through.
    caught = {
        "from peerd.runtime.git.runner import _env": 1,
        "from peerd.runtime.git import _x as y": 1,
        "from peerd.runtime import git\ngit._run(1)": 1,
        "from peerd.runtime.git import runner\nrunner._EXECUTOR.submit": 1,
        "import peerd.runtime.git.runner\npeerd.runtime.git.runner._argv": 1,
        "import subprocess\nsubprocess.run(['git', 'status'])": 2,  # the call and the list
        "import asyncio\nasyncio.create_subprocess_exec('git', '--version')": 1,
        "import os\nos.system('git status')": 1,
        "argv = ('/usr/bin/git', '-C', '.')": 1,
    }
    for source, count in caught.items():
        assert len(list(problems_in(source, "m"))) == count, source
    allowed = [
        "from peerd.runtime import git\ngit.run(1)",
        "from peerd.runtime.git import GitLocation",
        "x = {'git': 9418}",
        "route('GET', '/x', 'git')",
        "import other\nother._private",
        "subprocess.run(['gh', 'pr'])",
    ]
    for source in allowed:
        assert list(problems_in(source, "m")) == [], source
