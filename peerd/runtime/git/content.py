"""The tree of exactly what a worktree holds, from its files' bytes: what peerd takes when it takes a
worktree's work (a move's snapshot, `handoff/gitwork.py:snapshot`; a commit of a coder's or a
thread's worktree, `commits.py:commit_all`).

**Hashes, never stat data.** git decides that a tracked file is unchanged when its `lstat` matches
what the index recorded (mtime and ctime in whole seconds in the git peerd runs, size, inode) and
the index file itself is newer than that mtime. The second condition is git's "racy git" guard: an
entry recorded in the same second the index was written is compared by content. It holds only for
the index git wrote: a *copy* of it (the snapshot's temporary index used to be one) has a newer
mtime, so an entry the real index still treats as racy is trusted in the copy, and a same-size edit
made in the second the worktree was checked out (`a - b` -> `a + b`) is taken as unchanged (issue
26, case 1: the move said it took the edit; the snapshot was the base). Tools that restore an mtime
(`touch -r`, `cp -p`, `rsync -t`) or a repository's `core.checkStat=minimal` / `core.trustctime=
false` make stat data lie to the real index too, and `--assume-unchanged` entries are never looked
at. So the temporary index here holds the real index's entries *without any stat data*
(`ls-files --stage` -> `update-index --index-info` into a fresh file): git then compares every
tracked file by content (an entry whose recorded size is 0 is always hashed), and what is taken is
what the files hold.

`content_tree` builds that index and writes its tree:

1. the real index's entries, read only (`ls-files --stage -t`: stages of a conflict included,
   skip-worktree bits kept, the assume-unchanged bit dropped), into a fresh temporary index; a
   worktree with no index file starts from HEAD's tree (`read-tree`, which records no stat data);
2. `ls-files --modified --deleted --others --exclude-standard` on it, every tracked file hashed;
3. those paths `update-index --add --remove --replace`d: edits (staged or not), deletions,
   renames (a deletion and a new file), new untracked files that are not ignored, executable-bit
   and type changes, symbolic links as links; ignored files stay out unless the index tracks them
   (a `git add -f`); a nested repository is what git stages for it, its HEAD commit, and git never
   runs inside it;
4. `write-tree`.

The worktree, its real index and its branch are not changed. The cost is reading and hashing every
tracked file once: on a 2-core machine at load 7, 4,000 files of 2 KB took 120-185 ms (80-95 ms
trusting stat data), 4,000 files of 20 KB (80 MB) 0.5-0.9 s (30-55 ms). Cheaper ways are not sound:
a copy that keeps the real index's mtime inherits git's racy rule but still trusts stat data that
lie and assume-unchanged entries; a copy with mtime 0 makes no entry racy at all (git treats a
zero index time as "never racy"). Every command goes through peerd's runner (`runner.py`: no hooks,
fsmonitor or untracked cache).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from peerd.runtime.git.runner import GitLocation, Where, run, run_raw

__all__ = ["content_tree"]


async def _index_file(worktree: Where) -> Path:
    if isinstance(worktree, GitLocation):
        return worktree.git_dir / "index"
    found = (await run(worktree, "rev-parse", "--path-format=absolute", "--git-path", "index")).stdout
    return Path(found.strip())


def _stat_free(listed: bytes) -> tuple[bytes, bytes]:
    """`ls-files --stage -t -z` records ("T mode sha stage\\tpath") -> the `--index-info` records
    and the skip-worktree paths (tag `S`), both NUL-terminated."""
    entries: list[bytes] = []
    skipped: list[bytes] = []
    for record in listed.split(b"\0"):
        if len(record) < 3:
            continue
        info = record[2:]
        entries.append(info)
        if record[:1] == b"S":
            skipped.append(info.split(b"\t", 1)[1])
    return b"".join(e + b"\0" for e in entries), b"".join(p + b"\0" for p in skipped)


async def content_tree(worktree: Where) -> str:
    """The id of the tree of what `worktree` holds now (see the module docstring), built in a
    temporary index from the files' content; nothing in the worktree or its index is changed."""
    real = await _index_file(worktree)
    with tempfile.TemporaryDirectory(prefix="peerd-take-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if real.is_file():
            listed = await run_raw(worktree, "ls-files", "-z", "--stage", "-t")
            entries, skipped = _stat_free(listed.stdout)
            if entries:
                await run_raw(worktree, "update-index", "-z", "--index-info", stdin=entries, env=env)
            if skipped:
                await run_raw(
                    worktree, "update-index", "-z", "--skip-worktree", "--stdin", stdin=skipped, env=env
                )
        else:
            head = await run(worktree, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", ok=(0, 1))
            if head.returncode == 0 and head.stdout.strip():
                await run(worktree, "read-tree", head.stdout.strip(), env=env)
        changed = await run_raw(
            worktree, "ls-files", "-z", "--modified", "--deleted", "--others", "--exclude-standard", env=env
        )
        # A nested repository is listed as `dir/`; the index names it without the slash.
        paths = dict.fromkeys(p.rstrip(b"/") for p in changed.stdout.split(b"\0") if p)
        if paths:
            stdin = b"".join(p + b"\0" for p in paths)
            await run_raw(
                worktree,
                "update-index",
                "--add",
                "--remove",
                "--replace",
                "-z",
                "--stdin",
                stdin=stdin,
                env=env,
            )
        return (await run(worktree, "write-tree", env=env)).stdout.strip()
