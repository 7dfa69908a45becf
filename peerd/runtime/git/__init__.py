"""Git, in one place: every git process peerd starts, and every git operation runs, orchestration
and moves use. Import this package (`from peerd.runtime import git`) and use its public names;
nothing outside it imports a private (`_`) name from it or builds a git command line itself
(tests/unit/test_git_boundary.py).

- `runner.py`: the one safe runner (`run`, `run_raw`): argument lists, a worker thread pool
  (`GIT_THREADS`) never the event loop, a fixed environment and `-c` overrides (`SAFE_CONFIG`) so
  repository content runs no code; `GitLocation` names a repository explicitly.
- `locations.py`: a checkout's own git dir, a linked worktree's recorded admin directory
  (`locate_worktree`), never a `.git` file an agent could rewrite.
- `version.py`: the installed git (`installed_version`, asked once), `MINIMUM`, and the range whose
  worktree admin files peerd writes itself (`DIRECT_WORKTREE_TESTED`).
- `repo.py`: repository and ref questions (`toplevel`, `repository_key`, `head`, `branch_exists`,
  `resolve_commit`, `is_ancestor`, ...) and ref moves (`update_ref`, `delete_ref`).
- `worktrees.py` (and `direct.py`, the fast path): a thread's worktree on its own branch.
- `status.py`, `diffs.py`: what a working tree changed, patches, applying one.
- `content.py`: the tree of exactly what a worktree's files hold (hashed, no stat data).
- `commits.py`: `commit_all` and `snapshot` (a move's snapshot commit).
- `bundles.py`: commits between machines as checked, quarantined bundles.
- `merges.py`: branches at a commit and `--no-ff` integration merges (`merge_into`).
- `locks.py`: one lock per (operation, directory).
"""

from peerd.runtime.git.bundles import create_bundle, fetch_bundle, has_commit, ref_tips
from peerd.runtime.git.commits import DEFAULT_AUTHOR, commit_all, commit_config, snapshot
from peerd.runtime.git.content import content_tree
from peerd.runtime.git.diffs import apply_patch, cap, changed_files, diff, diff_stat, diff_text, paths_patch
from peerd.runtime.git.locations import (
    WorktreeRecord,
    admin_root_of,
    checkout_location,
    common_dir,
    find_record,
    locate_worktree,
    own_common_dir,
)
from peerd.runtime.git.locks import path_lock
from peerd.runtime.git.merges import (
    CONFLICT_TEXT_MAX_CHARS,
    MergeResult,
    create_branch,
    merge_into,
    protected_branches,
)
from peerd.runtime.git.repo import (
    branch_exists,
    check_rev,
    check_sha,
    checked_out,
    commit_exists,
    current_branch,
    delete_ref,
    head,
    head_commit,
    is_ancestor,
    merge_base,
    origin_url,
    remotes,
    repository_key,
    require_branch_name,
    resolve_commit,
    toplevel,
    update_ref,
    valid_branch_name,
    verify,
)
from peerd.runtime.git.runner import (
    DIFF_OPTIONS,
    GIT_THREADS,
    IGNORE_NESTED,
    REPO_LOCATION_VARS,
    SAFE_CONFIG,
    GitLocation,
    RawResult,
    Result,
    Where,
    dir_of,
    raise_for,
    run,
    run_raw,
    trim_stderr,
)
from peerd.runtime.git.status import StatusEntry, restore_from_head, status_entries, status_porcelain
from peerd.runtime.git.version import (
    DIRECT_WORKTREE_TESTED,
    MINIMUM,
    GitVersion,
    VersionProbe,
    VersionRange,
    direct_worktree_tested,
    installed_version,
    parse_version,
    probe_version,
)
from peerd.runtime.git.worktrees import (
    Worktree,
    add_detached,
    create_worktree,
    list_worktrees,
    remove_worktree,
    same_path,
)

__all__ = [
    "CONFLICT_TEXT_MAX_CHARS",
    "DEFAULT_AUTHOR",
    "DIFF_OPTIONS",
    "DIRECT_WORKTREE_TESTED",
    "GIT_THREADS",
    "IGNORE_NESTED",
    "MINIMUM",
    "REPO_LOCATION_VARS",
    "SAFE_CONFIG",
    "GitLocation",
    "GitVersion",
    "MergeResult",
    "RawResult",
    "Result",
    "StatusEntry",
    "VersionProbe",
    "VersionRange",
    "Where",
    "Worktree",
    "WorktreeRecord",
    "add_detached",
    "admin_root_of",
    "apply_patch",
    "branch_exists",
    "cap",
    "changed_files",
    "check_rev",
    "check_sha",
    "checked_out",
    "checkout_location",
    "commit_all",
    "commit_config",
    "commit_exists",
    "common_dir",
    "content_tree",
    "create_branch",
    "create_bundle",
    "create_worktree",
    "current_branch",
    "delete_ref",
    "diff",
    "diff_stat",
    "diff_text",
    "dir_of",
    "direct_worktree_tested",
    "fetch_bundle",
    "find_record",
    "has_commit",
    "head",
    "head_commit",
    "installed_version",
    "is_ancestor",
    "list_worktrees",
    "locate_worktree",
    "merge_base",
    "merge_into",
    "origin_url",
    "own_common_dir",
    "parse_version",
    "path_lock",
    "paths_patch",
    "probe_version",
    "protected_branches",
    "raise_for",
    "ref_tips",
    "remotes",
    "remove_worktree",
    "repository_key",
    "require_branch_name",
    "resolve_commit",
    "restore_from_head",
    "run",
    "run_raw",
    "same_path",
    "snapshot",
    "status_entries",
    "status_porcelain",
    "toplevel",
    "trim_stderr",
    "update_ref",
    "valid_branch_name",
    "verify",
]
