"""Delivery: `--push REMOTE` pushes the integration branch, `--pr` opens a pull request for it with
the report as its body, through the GitHub CLI (`gh`), a draft unless `--ready`.

The push goes through peerd's git runner (`runtime/git/runner.py:run`: no system or global config, no
hooks, no credential helper or askpass of the repository's) with, for this one command only, the
transports a remote needs (file, ssh, https), `ssh` as the ssh command and the stock
`git-receive-pack`, so the repository's config cannot name a program to run. For an https remote
and an installed `gh`, `gh auth git-credential` (found on PATH by peerd) is the only credential
helper. The remote must be one the checkout has configured (checked when the run starts).

`gh` runs with an argument list (never a shell), stdin closed, in the user's checkout. Before it
creates a pull request it is asked for an open one of the branch (`gh pr view`), so a delivery
repeated after a restart finds the one it made. Anything missing (gh not installed, not logged
in, the push refused) is said in the `delivery` receipt, with the command to run instead.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from peerd.errors import GitError, InvalidRequest
from peerd.orchestrate.models import DeliveryReceipt
from peerd.runtime import git
from peerd.runtime.gh import gh_path, run_gh

PR_BODY_MAX_CHARS = 60_000  # GitHub refuses bodies past 65,536 characters


async def check_remote(repo: Path, remote: str) -> str:
    """The push URL of `remote`, or InvalidRequest naming the remotes there are."""
    known = await git.remotes(repo)
    if remote not in known and known:
        raise InvalidRequest(
            f"--push {remote}: the checkout {repo} has no remote called {remote}. Its remotes are "
            f"{', '.join(sorted(known))}: name one of them, or add it with `git remote add {remote} URL`."
        )
    if remote not in known:
        raise InvalidRequest(
            f"--push {remote}: the checkout {repo} has no remotes. Add one with `git remote add {remote} URL`."
        )
    return known[remote]


async def gh_problem(repo: Path) -> str | None:
    """What keeps `--pr` from working here, in a sentence, or None."""
    if gh_path() is None:
        return (
            "gh (the GitHub CLI) is not installed on this machine: install it (https://cli.github.com) "
            "and run `gh auth login`"
        )
    status = await run_gh(repo, "auth", "status")
    if status.returncode != 0:
        return "gh is installed but not logged in: run `gh auth login`"
    return None


def _push_config(remote: str, url: str) -> list[str]:
    config = [
        "protocol.file.allow=always",
        "protocol.ssh.allow=always",
        "protocol.https.allow=always",
        "core.sshCommand=ssh",
        f"remote.{remote}.receivepack=git-receive-pack",
        "credential.helper=",
    ]
    binary = gh_path()
    if url.startswith("https://") and binary is not None:
        config.append(f"credential.helper=!{shlex.quote(binary)} auth git-credential")
    return [arg for setting in config for arg in ("-c", setting)]


async def push(repo: Path, remote: str, branch: str) -> None:
    """Push `branch` to the same name on `remote` (never forced)."""
    url = await check_remote(repo, remote)
    ref = f"refs/heads/{branch}"
    await git.run(repo, *_push_config(remote, url), "push", "--porcelain", "--", remote, f"{ref}:{ref}")


def pr_title(task: str, branch: str, packets: list[str]) -> str:
    first = next((line.strip() for line in task.splitlines() if line.strip()), "")
    if first and not first.startswith("```"):
        return first[:120]
    return f"peerd orchestrate: {', '.join(packets)}"[:120] if packets else f"peerd orchestrate {branch}"


async def open_pr(
    repo: Path, *, branch: str, base: str | None, title: str, body: str, draft: bool
) -> tuple[str | None, str | None]:
    """(url, None) for the pull request of `branch` (an open one is reused), or (None, problem)."""
    if problem := await gh_problem(repo):
        return None, f"{problem}, then `gh pr create --head {branch}`."
    existing = await run_gh(repo, "pr", "view", branch, "--json", "url", "--jq", ".url")
    if existing.returncode == 0 and existing.stdout.strip().startswith("http"):
        return existing.stdout.strip(), None
    if len(body) > PR_BODY_MAX_CHARS:
        body = body[:PR_BODY_MAX_CHARS] + "\n\n... (report cut; `peerd orchestrate status` has all of it)\n"
    with tempfile.TemporaryDirectory(prefix="peerd-pr-") as scratch:
        body_file = Path(scratch) / "body.md"
        body_file.write_text(body, encoding="utf-8")
        args = ["pr", "create", "--head", branch, "--title", title, "--body-file", str(body_file)]
        if base:
            args += ["--base", base]
        if draft:
            args.append("--draft")
        created = await run_gh(repo, *args)
    if created.returncode != 0:
        detail = (created.stderr or created.stdout).strip()[-1500:]
        return None, f"`gh pr create` failed (exit {created.returncode}): {detail}"
    url = next((w for w in created.stdout.split() if w.startswith("http")), created.stdout.strip())
    return url or None, None


async def deliver(
    repo: Path,
    *,
    branch: str,
    remote: str | None,
    pr: bool,
    ready: bool,
    base: str | None,
    title: str,
    body: str,
    merged: bool,
) -> DeliveryReceipt:
    receipt = DeliveryReceipt(branch=branch, remote=remote, pr_draft=not ready)
    if not merged:
        why = "nothing was integrated, so there is nothing to push"
        return receipt.model_copy(update={"push_problem": why, "pr_problem": why if pr else None})
    if remote is not None:
        try:
            await push(repo, remote, branch)
        except (GitError, InvalidRequest) as exc:
            problem = f"{exc.message} Push it yourself: `git push {remote} {branch}`."
            return receipt.model_copy(
                update={"push_problem": problem, "pr_problem": "not opened: the push failed" if pr else None}
            )
        receipt = receipt.model_copy(update={"pushed": True})
    if pr:
        url, pr_problem = await open_pr(
            repo, branch=branch, base=base, title=title, body=body, draft=not ready
        )
        receipt = receipt.model_copy(update={"pr_url": url, "pr_problem": pr_problem})
    return receipt
