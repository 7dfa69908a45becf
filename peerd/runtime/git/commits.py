"""Commits peerd makes of what a worktree holds: `commit_all` (on the worktree's branch) and
`snapshot` (a commit kept under a ref, nothing in the worktree moved: a move's snapshot,
handoff/gitwork.py). Both hash the files (`content.content_tree`), never trust the index's stat
data, and use plumbing only (`commit-tree`, `update-ref`, `read-tree`): no hook, no editor, and no
`git status` run inside a nested repository an agent made. Their identity is passed with `-c`
(`commit_config`), so they work on a machine without a git identity and never wait on a signing
agent.

Functions that touch a worktree an agent wrote take a `GitLocation` (`locations.locate_worktree`):
git then uses the recorded git dir, never the worktree's own `.git`."""

from __future__ import annotations

import re

from peerd.errors import InvalidRequest
from peerd.runtime.git.content import content_tree
from peerd.runtime.git.repo import head
from peerd.runtime.git.runner import Where, run

__all__ = ["DEFAULT_AUTHOR", "commit_all", "commit_config", "snapshot"]

DEFAULT_AUTHOR = "peerd orchestrate <orchestrate@peerd.invalid>"

_AUTHOR = re.compile(r"^\s*(?P<name>[^<>]*?)\s*<(?P<email>[^<>]*)>\s*$")


def _identity(author: str) -> tuple[str, str]:
    match = _AUTHOR.match(author)
    if match is None or not match["name"] or not match["email"]:
        raise InvalidRequest(f"Invalid git author {author!r}: expected 'Name <email>'.")
    return match["name"], match["email"]


def commit_config(author: str) -> tuple[str, ...]:
    """`-c` options that make a commit independent of the machine's git identity and signing;
    `author` is `Name <email>` (`InvalidRequest` otherwise)."""
    name, email = _identity(author)
    return (
        "-c",
        f"user.name={name}",
        "-c",
        f"user.email={email}",
        "-c",
        "commit.gpgSign=false",
    )


async def commit_all(worktree: Where, message: str, *, author: str = DEFAULT_AUTHOR) -> str | None:
    """Commit everything `worktree` holds (new, modified, deleted and untracked files; ignored ones
    stay out) as `author` on the branch HEAD is on; return the new commit's id, or None when there
    was nothing to commit. Afterwards the worktree's index matches HEAD.

    The tree is hashed from the files (`content.content_tree`, a temporary index without stat
    data), never taken from the worktree's index's stat data, which an agent's tools can make lie
    (an mtime put back, `--assume-unchanged`, a repository's `core.checkStat`). The index is then
    set to the commit (`read-tree --reset`: it keeps the stat data of entries whose content did
    not change, and records none for the others, so git hashes those next time).

    Plumbing only (`ls-files`, `update-index`, `write-tree`, `commit-tree`, `update-ref`,
    `read-tree`): `git add` and `git commit` run `git status` inside every nested repository the
    agent made (with that repository's own config, so its filters), and `git commit` consults hooks
    and an editor. A nested repository is staged as what it is to git, a commit id (its HEAD)."""
    if not message.strip():
        raise InvalidRequest("A commit message must not be empty.")
    config = commit_config(author)
    parent = await head(worktree)
    tree = await content_tree(worktree)
    before = await run(worktree, "rev-parse", "--verify", "--end-of-options", f"{parent}^{{tree}}")
    sha: str | None = None
    if tree != before.stdout.strip():
        created = await run(
            worktree, *config, "commit-tree", "--no-gpg-sign", "-p", parent, "-m", message, tree
        )
        sha = created.stdout.strip()
        # The old value makes the move atomic: a HEAD that moved meanwhile is not overwritten.
        subject = f"peerd: {message.splitlines()[0][:100]}"
        await run(worktree, "update-ref", "-m", subject, "HEAD", sha, parent)
    await run(worktree, "read-tree", "--reset", tree)
    return sha


async def snapshot(worktree: Where, *, ref: str, message: str, author: str) -> tuple[str, bool]:
    """The commit of what `worktree` holds now: its HEAD when the files are HEAD's tree, else a new
    commit on top of HEAD (as `author`, with `message`), kept under `ref` either way. Returns
    (commit, whether a commit was made). The worktree, its index and its branch are not changed."""
    parent = await head(worktree)
    tree = await content_tree(worktree)
    before = (await run(worktree, "rev-parse", "--verify", "--end-of-options", f"{parent}^{{tree}}")).stdout
    made = tree != before.strip()
    commit = parent
    if made:
        created = await run(
            worktree,
            *commit_config(author),
            "commit-tree",
            "--no-gpg-sign",
            "-p",
            parent,
            "-m",
            message,
            tree,
        )
        commit = created.stdout.strip()
    await run(worktree, "update-ref", "-m", "peerd: move", ref, commit)
    return commit, made
