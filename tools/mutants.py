"""Mutation checks: break one critical rule at a time on purpose and watch its tests fail.

Each `[[mutant]]` of tools/mutants.toml names a rule, a file, an exact snippet of it (found exactly
once), the snippet's replacement, and the tests that guard the rule. This runner copies the
repository's files to a scratch directory (the tree you work in is never touched, also on Ctrl-C),
runs every named test there once unchanged (they must pass, or a kill would mean nothing), then
for each mutant writes its replacement into the scratch copy, runs its tests, and puts the file
back. A mutant is killed when every one of its tests fails; it survived when any of them passed.

    python tools/mutants.py              # all of them (`make mutants`)
    python tools/mutants.py NAME ...     # those whose name contains NAME
    python tools/mutants.py --list       # the rules and their tests
    python tools/mutants.py --file F     # the mutants of another list (to try one out)

Exit status: 0 when every mutant selected was killed, 1 otherwise (a survivor, a snippet no longer
found, or tests that fail unchanged), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "tools" / "mutants.toml"
TIMEOUT_S = 600  # one mutant's tests; a rule broken into a hang fails its tests by their own timeouts


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    snippet: str
    replacement: str
    tests: tuple[str, ...]


def load(path: Path = LIST) -> list[Mutant]:
    raw = tomllib.loads(path.read_text())
    mutants = [
        Mutant(m["name"], m["file"], m["snippet"], m["replacement"], tuple(m["tests"])) for m in raw["mutant"]
    ]
    names = [m.name for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path.name}: names used twice: {', '.join(duplicates)}")
    return mutants


def problems(mutant: Mutant, root: Path = REPO) -> list[str]:
    """What makes an entry unusable: a file that is gone, a snippet not found exactly once, no change,
    no tests, or a test file that does not exist."""
    found: list[str] = []
    path = root / mutant.file
    if not path.is_file():
        return [f"{mutant.file} does not exist"]
    count = path.read_text().count(mutant.snippet)
    if count != 1:
        found.append(f"its snippet occurs {count} times in {mutant.file} (it must occur once)")
    if mutant.snippet == mutant.replacement:
        found.append("its replacement is its snippet")
    if not mutant.tests:
        found.append("it names no test")
    found += [f"{test}: no such file" for test in mutant.tests if not (root / test.split("::")[0]).is_file()]
    return found


def tracked_files(root: Path) -> list[str]:
    """The repository's files as they are in the working tree (git's list when there is one)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        return [f for f in out.decode().split("\0") if f and (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".cache", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
        return [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(root).parts)
        ]


def scratch_copy(root: Path, into: Path) -> None:
    for name in tracked_files(root):
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    cache = root / ".cache"  # the pinned CLIs and the signal files confined runs wait for
    if cache.exists():
        (into / ".cache").symlink_to(cache.resolve())


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@dataclass
class Outcome:
    failed: list[str]
    passed: list[str]
    returncode: int
    tail: str
    seconds: float


def run_tests(where: Path, tests: list[str]) -> Outcome:
    report = where / ".mutants-report.xml"
    report.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--junitxml",
        str(report),
    ]
    env = {**os.environ, "PYTHONPATH": str(where)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*argv, *tests],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as late:
        returncode, output = -1, f"{late.stdout or ''}\ntimed out after {TIMEOUT_S} s"
    failed: list[str] = []
    passed: list[str] = []
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314  # pytest's own report
            node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            if case.find("skipped") is not None:
                continue
            bad = case.find("failure") is not None or case.find("error") is not None
            (failed if bad else passed).append(node)
    tail = "\n".join(str(output).strip().splitlines()[-15:])
    return Outcome(failed, passed, returncode, tail, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only the mutants whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="print the rules and their tests, run nothing")
    parser.add_argument("--file", type=Path, default=LIST, help="another list of mutants (to try one out)")
    args = parser.parse_args(argv)
    mutants = [m for m in load(args.file) if not args.names or any(n in m.name for n in args.names)]
    if not mutants:
        sys.stderr.write(f"no mutant's name contains {' or '.join(args.names)}\n")
        return 2
    if args.list:
        for m in mutants:
            say(f"{m.name}: {m.file}\n  " + "\n  ".join(m.tests))
        return 0
    unusable = {m.name: problems(m) for m in mutants if problems(m)}
    for name, found in unusable.items():
        say(f"{name}: " + "; ".join(found))
    if unusable:
        return 1

    results: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="peerd-mutants-") as tmp:
        where = Path(tmp)
        scratch_copy(REPO, where)
        every = sorted({t for m in mutants for t in m.tests})
        say(f"{len(mutants)} mutants, {len(every)} tests; first, the tests unchanged ...")
        unchanged = run_tests(where, every)
        if unchanged.returncode != 0 or unchanged.failed or not unchanged.passed:
            say(f"the tests fail without any mutant (exit {unchanged.returncode}):\n{unchanged.tail}")
            return 1
        say(f"  {len(unchanged.passed)} passed in {unchanged.seconds:.0f} s")
        for m in mutants:
            path = where / m.file
            original = path.read_text()
            path.write_text(original.replace(m.snippet, m.replacement, 1))
            try:
                outcome = run_tests(where, list(m.tests))
            finally:
                path.write_text(original)
            if outcome.passed:
                verdict = "SURVIVED"
                detail = "still passing: " + ", ".join(outcome.passed)
            elif outcome.failed and outcome.returncode == 1:
                verdict, detail = "killed", f"{len(outcome.failed)} failed"
            else:  # nothing ran, or pytest itself failed (a mutant that breaks the import, say)
                verdict, detail = "ERROR", f"exit {outcome.returncode}\n{outcome.tail}"
            results.append((m.name, verdict, outcome.seconds))
            say(f"{verdict:8}  {m.name}  ({outcome.seconds:.0f} s; {detail})")
    killed = sum(1 for _, verdict, _ in results if verdict == "killed")
    say(f"\n{killed} of {len(results)} killed in {sum(s for *_, s in results):.0f} s")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
