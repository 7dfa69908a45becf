"""The git mechanics of `peerd orchestrate`: packet commits, containment recovery, integration
merges, bundles between machines, and verification commands.

Every work packet runs in its own worktree on a branch `orchestrate/<run>/<packet>` made from an
exact base commit. This module is what the engine calls around that:

- `commit_all` turns a coder's edits in its worktree into one commit (`head`, `changed_files`,
  `diff_stat` and `diff_text` describe it to the reviewer);
- `dirty_paths` and `recover_escaped` implement the containment check of the workflow's "Verify"
  step for local packets: a coder that wrote into the orchestrator's own checkout instead of its
  worktree has those edits moved into the worktree, scoped strictly to the packet's files (never
  on a box, never on a link's request);
- `create_branch` and `merge_into` implement "Integrate": `--no-ff` merges into a peerd-owned
  integration worktree, a conflicting merge is reported and aborted so the branch stays clean;
- `create_bundle`, `fetch_bundle`, `has_commit` and `ref_tips` move commits between a laptop and a
  linked box as git bundles (the box's result commits one way, a base commit the other);
- `run_check` runs a packet's verification command in its own process group with a timeout.

Git runs through `peerd.runtime.gitrun`'s runner (argument lists, no system or global config, no
config-run programs, `GitError` with git's own stderr); a worktree an agent wrote is named by its
recorded location (`GitLocation`). Commits and merges pass their identity with `-c`, so they work on
a machine without a git identity and never wait on a signing agent; no hook runs (the packet's
verification command is the gate, not a hook that may be interactive or rewrite the tree).
"""

from __future__ import annotations

from peerd.orchestrate.bundles import create_bundle, fetch_bundle, has_commit, ref_tips
from peerd.orchestrate.checks import CheckResult, run_check
from peerd.orchestrate.containment import dirty_paths, recover_escaped
from peerd.orchestrate.gitbase import DEFAULT_AUTHOR, changed_files, commit_all, diff_stat, diff_text, head
from peerd.orchestrate.gitbase import _current_branch as current_branch
from peerd.orchestrate.merging import MergeResult, create_branch, merge_into

__all__ = [
    "DEFAULT_AUTHOR",
    "CheckResult",
    "MergeResult",
    "changed_files",
    "commit_all",
    "create_branch",
    "create_bundle",
    "current_branch",
    "diff_stat",
    "diff_text",
    "dirty_paths",
    "fetch_bundle",
    "has_commit",
    "head",
    "merge_into",
    "recover_escaped",
    "ref_tips",
    "run_check",
]
