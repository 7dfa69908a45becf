"""Measurement: where a verification check's time goes inside `peerd orchestrate` (issue 32).

A packet's check runs in `peerd/orchestrate/review.py:verifying`: peerd makes a fresh detached
worktree of the packet's commit, runs the command there with `checks.run_check` (`/bin/sh -c`, its
own process group, the daemon's environment and CPU priority, no sandbox), and re-runs it once
when it fails. This script times, on this machine, the same command:

  by hand        `/bin/sh -c CMD` in the project's own checkout (its caches warm), subprocess.run
  run_check      `checks.run_check` in the same checkout (peerd's way of running it, same caches)
  fresh, cold    `checks.run_check` in a fresh detached worktree, as `verifying` made it before
                 issue 32 (cold: no .mypy_cache, .ruff_cache, .pytest_cache, __pycache__)
  fresh, seeded  the same in a fresh worktree seeded by `checks.seed_caches`, as `verifying` makes
                 it now (the checkout's CACHEDIR.TAG directories copied in; the copy counted)
  fresh, again   the cold worktree once more (peerd's re-run: the first run warmed it)
  worktree add   making that worktree (`git worktree add --detach`), which the check waits for

and prints the nice level a check runs at. Each row is the median of --reps runs, interleaved.

Run: PYTHONPATH=. .venv/bin/python bench/checks.py [--repo DIR] [--command CMD] [--reps 3]
The default command is a pytest file of this repository (a Python project like the one of the
report); `--command 'mypy peerd/orchestrate/steps.py'` shows a tool with a bigger cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peerd.orchestrate import checks
from peerd.runtime import git

DEFAULT = (
    f"{sys.executable} -m pytest -q -p no:randomly -p no:cacheprovider tests/unit/test_orchestrate_steps.py"
)


def by_hand(repo: Path, command: str) -> float:
    started = time.monotonic()
    subprocess.run(["/bin/sh", "-c", command], cwd=repo, capture_output=True, check=False)
    return time.monotonic() - started


async def fresh(repo: Path, command: str, where: Path) -> tuple[float, float, float, int | None]:
    started = time.monotonic()
    await git.add_detached(repo, where, await git.head(repo))
    made = time.monotonic() - started
    try:
        first = await checks.run_check(where, command)
        again = await checks.run_check(where, command)
    finally:
        await git.remove_worktree(repo, where, delete_branch=None)
    return made, first.seconds, again.seconds, first.exit_code


async def seeded(repo: Path, command: str, where: Path) -> float:
    await git.add_detached(repo, where, await git.head(repo))
    try:
        started = time.monotonic()
        await checks.seed_caches(repo, where)
        seeded = time.monotonic() - started
        return seeded + (await checks.run_check(where, command)).seconds
    finally:
        await git.remove_worktree(repo, where, delete_branch=None)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    parser.add_argument("--command", default=DEFAULT)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    repo = args.repo.resolve()
    names = ("by hand", "run_check", "fresh, cold", "fresh, seeded", "fresh, again", "worktree add")
    rows: dict[str, list[float]] = {k: [] for k in names}
    codes = set()
    with tempfile.TemporaryDirectory(prefix="peerd-checks-") as tmp:
        by_hand(repo, args.command)  # warm the checkout's caches, as a person's would be
        for n in range(args.reps):
            rows["by hand"].append(by_hand(repo, args.command))
            rows["run_check"].append((await checks.run_check(repo, args.command)).seconds)
            made, first, again, code = await fresh(repo, args.command, Path(tmp) / f"verify-{n}")
            codes.add(code)
            rows["fresh, cold"].append(first)
            rows["fresh, seeded"].append(await seeded(repo, args.command, Path(tmp) / f"seeded-{n}"))
            rows["fresh, again"].append(again)
            rows["worktree add"].append(made)
    nice = (await checks.run_check(repo, "python3 -c 'import os; print(os.nice(0))'")).output.strip()
    print(f"command: {args.command}\nrepo: {repo}\nexit codes in fresh trees: {sorted(codes, key=str)}")
    print(f"caches seeded: {', '.join(checks.cache_dirs(repo)) or 'none'}")
    print(f"nice level of a check: {nice} (this process: {os.nice(0)}); load: {os.getloadavg()[0]:.2f}")
    base = statistics.median(rows["by hand"])
    for name, values in rows.items():
        median = statistics.median(values)
        print(
            f"{name:<14} {median:7.2f} s  x{median / base:5.2f}   ({', '.join(f'{v:.2f}' for v in values)})"
        )


if __name__ == "__main__":
    asyncio.run(main())
