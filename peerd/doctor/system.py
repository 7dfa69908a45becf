"""git and peerd's sandbox on this machine."""

from __future__ import annotations

from peerd.doctor.facts import (
    Check,
    ConfinementFacts,
    Facts,
)
from peerd.runtime.git.version import DIRECT_WORKTREE_TESTED, MINIMUM, parse_version
from peerd.runtime.sandbox import VISIBLE

# --- git ---------------------------------------------------------------------------------------


def check_git(facts: Facts) -> Check:
    """git runs, and is at least `MINIMUM` (else a failure); one outside the range peerd's fast
    worktree creation was tested with (`DIRECT_WORKTREE_TESTED`) is a warning: worktrees are then
    made by `git worktree add`, which works, slower in a repository with many worktrees."""
    need = ".".join(map(str, MINIMUM))
    if facts.git_version is None:
        return Check(
            "git",
            "fail",
            f"git does not run: {facts.git_error or 'not found on PATH'}",
            f"Install git {need} or newer (projects and their worktrees need it), on the daemon's PATH.",
        )
    version = parse_version(facts.git_version)
    shown = facts.git_version.strip()
    if version is None:
        return Check(
            "git",
            "warn",
            f"cannot read a version in {shown!r}",
            f"Check that `git --version` works and that git is {need} or newer.",
        )
    if version.release < MINIMUM:
        return Check(
            "git",
            "fail",
            f"{shown} is older than {need}, which peerd needs",
            f"Upgrade git to {need} or newer.",
        )
    where = f", {facts.git_path}" if facts.git_path else ""
    if version not in DIRECT_WORKTREE_TESTED:
        return Check(
            "git",
            "warn",
            f"{shown}{where}: outside {DIRECT_WORKTREE_TESTED}, the git versions peerd writes a new "
            "worktree's admin files for; new worktrees are made with `git worktree add` instead "
            "(it works, slower in a repository with many worktrees)",
            f"Nothing breaks. For the faster worktree creation use git {DIRECT_WORKTREE_TESTED}.",
        )
    return Check("git", "ok", f"{shown}{where}")


# --- confinement -------------------------------------------------------------------------------


def visibility_lines(found: ConfinementFacts) -> tuple[str, ...]:
    """What a confined run sees (`sandbox.VISIBLE`), with this machine's specifics."""
    rows = [f"{row.access:<25} {row.what}: {row.paths}" for row in VISIBLE]
    if found.etc_left_out:
        rows.append(f"{'left out of /etc here':<25} {', '.join(found.etc_left_out)}")
    if found.readable:
        rows.append(f"{'added by the owner':<25} {', '.join(found.readable)}")
    if found.run_as is not None:
        rows.append(f"{'runs as':<25} uid {found.run_as}, not root, with no capabilities")
    return tuple(rows)


def check_confinement(facts: Facts) -> Check | None:
    found = facts.confinement
    if found is None:
        return None
    if found.works:
        return Check(
            "confinement",
            "ok",
            f"{found.detail} peerd confines linked machines' runs, and the owner's below full-access: "
            "deny by default, a run sees only this:",
            table=visibility_lines(found),
        )
    install = "Install bubblewrap (Debian and Ubuntu: `sudo apt-get install bubblewrap`)"
    if found.allow_unconfined:
        return Check(
            "confinement",
            "warn",
            f"runs are not confined here: {found.detail} links.allow_unconfined = true, so a linked "
            "machine's runs go on with only the coder CLI's own sandbox (scripted run steps stay "
            "refused).",
            f"{install}, or remove allow_unconfined from the [links] table of {facts.config_path}.",
        )
    return Check(
        "confinement",
        "warn",
        f"runs are not confined here: {found.detail} A linked machine's runs above read-only are "
        "refused; the owner's runs use only the coder's own sandbox.",
        f"{install}; or, to accept the risk, set allow_unconfined = true in the [links] table of "
        f"{facts.config_path}.",
    )
