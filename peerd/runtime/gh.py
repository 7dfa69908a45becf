"""The one way peerd runs the GitHub CLI (`gh`): orchestrate's `--pr` (`orchestrate/deliver.py`)
and the waits on a pull request (`waits/gh.py`) both go through `run_gh`.

`gh` is found on PATH, run with an argument list (never a shell), stdin closed, in the checkout it
is asked about, without the repository-location variables git would read (`GIT_DIR` ...), with
prompts, the update notifier, colours and the pager off, and bounded by `GH_TIMEOUT_S`. Its
credentials are its own (`gh auth login`): peerd never passes a token on its command line or
logs what it prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from peerd.runtime import git

GH_TIMEOUT_S = 120.0
_GH_ENV = {"GH_PROMPT_DISABLED": "1", "GH_NO_UPDATE_NOTIFIER": "1", "NO_COLOR": "1", "GH_PAGER": "cat"}


@dataclass(frozen=True)
class GhResult:
    returncode: int
    stdout: str
    stderr: str


def gh_path() -> str | None:
    return shutil.which("gh")


def _gh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in git.REPO_LOCATION_VARS}
    env.update(_GH_ENV)
    return env


async def run_gh(repo: Path, *args: str, timeout_s: float = GH_TIMEOUT_S) -> GhResult:
    """`gh ARGS` in the checkout, argument list, stdin closed, bounded."""
    binary = gh_path()
    if binary is None:
        return GhResult(127, "", "gh is not installed")
    proc = await asyncio.create_subprocess_exec(
        binary, *args, cwd=repo, env=_gh_env(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return GhResult(124, "", f"gh {args[0]} did not answer within {timeout_s:g} s")
    except asyncio.CancelledError:  # the caller was cancelled (a wait ended, the daemon stops)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.communicate())  # reaped and its pipes closed, not leaked
        raise
    return GhResult(proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
