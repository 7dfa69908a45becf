"""Which git this machine has, and what peerd does with it.

`parse_version` reads what `git --version` prints (a vendor's suffix included: `2.43.0.windows.1`,
`2.39.3 (Apple Git-146)`); `installed_version` asks git once per process and keeps the answer.
Two ranges matter:

- `MINIMUM`: below it peerd's commands fail (`peerd doctor` says so, a failure);
- `DIRECT_WORKTREE_TESTED`: the versions whose worktree admin files `direct.py` writes itself. Outside
  it (or when the version cannot be read) a new worktree is made by `git worktree add`, the slower
  path that reads every other worktree but lets git write its own files (`worktrees.py`; `peerd
  doctor` warns).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import GitError, InvalidRequest
from peerd.runtime.git.runner import run

__all__ = [
    "DIRECT_WORKTREE_TESTED",
    "MINIMUM",
    "GitVersion",
    "VersionProbe",
    "VersionRange",
    "direct_worktree_tested",
    "installed_version",
    "parse_version",
    "probe_version",
]


@dataclass(frozen=True, order=True, slots=True)
class GitVersion:
    major: int
    minor: int
    patch: int = 0

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor): what the ranges below compare."""
        return self.major, self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True, slots=True)
class VersionRange:
    """The releases `first` to `last`, both included, any patch level."""

    first: tuple[int, int]
    last: tuple[int, int]

    def __contains__(self, version: object) -> bool:
        return isinstance(version, GitVersion) and self.first <= version.release <= self.last

    def __str__(self) -> str:
        return f"{self.first[0]}.{self.first[1]}-{self.last[0]}.{self.last[1]}"


# The oldest git peerd's commands work with: `git rev-parse --path-format=absolute` (the index of a
# worktree, content.py) and `--end-of-options` in rev-parse (refs.py, commits.py) came in git 2.31;
# `git restore` (containment) in 2.23.
MINIMUM = (2, 31)

# The releases whose `git worktree add -b` writes the admin files `direct.py` writes itself, as it
# writes them: `locked`, `gitdir` (an absolute path), `commondir` (`../..`), `HEAD`, and the
# worktree's `.git`. 2.39 is the oldest the test suite runs against (this machine's, Debian 12's);
# git 2.48 added `worktree.useRelativePaths`, which records these paths relative (and marks the
# repository with `extensions.relativeWorktrees`): a git past 2.47 may write, and expect, other
# files. Outside this range a new worktree takes `git worktree add` (worktrees.py).
DIRECT_WORKTREE_TESTED = VersionRange((2, 39), (2, 47))

_VERSION = re.compile(r"git version (\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> GitVersion | None:
    """The version in what `git --version` printed, or None when there is none."""
    match = _VERSION.search(text)
    if match is None:
        return None
    return GitVersion(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def direct_worktree_tested(version: GitVersion | None) -> bool:
    """Whether peerd may write a new worktree's admin files itself with this git (`direct.py`)."""
    return version in DIRECT_WORKTREE_TESTED


# The installed version, once known (one entry). A list, not a global rebound: tests set it.
_known: list[GitVersion | None] = []


async def installed_version() -> GitVersion | None:
    """This machine's git version, asked once per process (`git --version` through the runner);
    None when git does not run or says something else."""
    if not _known:
        try:
            answer = await run(Path(os.sep), "--version")
        except (GitError, InvalidRequest, OSError):
            found = None
        else:
            found = parse_version(answer.stdout)
        if not _known:
            _known.append(found)
    return _known[0]


@dataclass(frozen=True, slots=True)
class VersionProbe:
    """What `peerd doctor` learns of git: what `git --version` printed (None when it did not run),
    where git is on PATH, and why it did not run."""

    text: str | None
    path: str | None
    error: str | None


async def probe_version(timeout_s: float) -> VersionProbe:
    """Run `git --version` now (through the runner, bounded by `timeout_s`), for `peerd doctor`."""
    path = shutil.which("git")
    try:
        answer = await asyncio.wait_for(run(Path(os.sep), "--version", ok=range(256)), timeout_s)
    except TimeoutError:
        return VersionProbe(None, path, f"`git --version` did not answer within {timeout_s:g} s")
    except GitError:  # the runner's word for "no git executable"
        return VersionProbe(None, path, "not found on PATH")
    except OSError as exc:
        return VersionProbe(None, path, str(exc))
    if answer.returncode != 0:
        return VersionProbe(
            None, path, answer.stderr.strip() or f"`git --version` exited {answer.returncode}"
        )
    return VersionProbe(answer.stdout.strip(), path, None)
