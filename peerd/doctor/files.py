"""The daemon, peerd's files and permissions, the store and the identity key."""

from __future__ import annotations

from peerd.doctor.facts import (
    Check,
    Facts,
    FileFacts,
    FileKind,
)
from peerd.doctor.text import (
    KIND_WORDS,
    quoted,
    who_can,
)

# --- the daemon --------------------------------------------------------------------------------


def check_daemon(facts: Facts) -> Check:
    start = (
        f"Start it: `peerd --home {quoted(facts.home)} serve` "
        f"(or, where a systemd unit runs it, `systemctl --user start peerd` or "
        f"`sudo systemctl start peerd@{quoted(facts.user)}`)."
    )
    status = facts.status
    if status is None:
        if facts.daemon.answered:
            return Check(
                "daemon",
                "fail",
                f"the daemon at {facts.socket.path} answered with an error: {facts.daemon.error}",
                "If it is still starting, wait a moment and run `peerd doctor` again; otherwise read its log "
                "(stderr of `peerd serve`, or `journalctl --user -u peerd` under systemd) and restart it.",
            )
        return Check("daemon", "fail", f"no daemon answers at {facts.socket.path}", start)
    detail = (
        f"running: {status.label} ({status.environment_id}), version {status.version}, at {facts.socket.path}"
    )
    if status.version != facts.cli_version:
        return Check(
            "daemon",
            "warn",
            f"{detail}; this command is version {facts.cli_version}",
            "Restart the daemon so it runs the installed version (stop it, then `peerd serve`).",
        )
    return Check("daemon", "ok", detail)


# --- files and permissions ---------------------------------------------------------------------


def check_path(
    name: str,
    f: FileFacts,
    *,
    expect: FileKind,
    mode: int,
    facts: Facts,
    lenient: bool = False,
    missing: Check | None = None,
    owner_fix: str | None = None,
) -> Check:
    """OK when `f` is of kind `expect`, owned by this user, with permission bits `mode`; else what is wrong.

    Group or other bits fail (`lenient`: only write bits fail, read and enter bits warn); missing
    owner bits fail. A missing path is skipped while the daemon is down, else `missing` (a fail).
    """
    path = f.path
    if f.error is not None:
        return Check(
            name,
            "fail",
            f"cannot look at {path}: {f.error}",
            "Check the permissions of the directories above it; they must let you in.",
        )
    if f.kind == "missing":
        if not facts.daemon_up:
            return Check(name, "skip", f"{path} does not exist yet; the daemon creates it when it starts")
        return missing or Check(
            name,
            "fail",
            f"{path} is missing although the daemon is running",
            "Restart the daemon (`peerd serve`).",
        )
    if f.kind != expect:
        return Check(
            name,
            "fail",
            f"{path} is a {KIND_WORDS[f.kind]}, not a {KIND_WORDS[expect]}",
            f"Move it away (`mv {quoted(path)} {quoted(path + '.old')}`), then restart the daemon.",
        )
    if f.uid != facts.uid:
        return Check(
            name,
            "fail",
            f"{path} is owned by {f.owner}, not by you ({facts.user})",
            owner_fix
            or f"Run peerd as {f.owner}, or take it over: `sudo chown {quoted(facts.user)} {quoted(path)}`.",
        )
    is_dir = expect == "dir"
    extra = f.mode & 0o077
    lacking = mode & ~f.mode & 0o700
    if extra or lacking:
        problems = []
        if extra:
            problems.append(who_can(extra, is_dir=is_dir))
        if lacking:
            verbs = [
                v
                for v, m in (("read", 0o400), ("write", 0o200), ("enter" if is_dir else "run", 0o100))
                if lacking & m
            ]
            problems.append(f"you cannot {' or '.join(verbs)} it")
        severe = lacking or (extra & 0o022) or not lenient
        return Check(
            name,
            "fail" if severe else "warn",
            f"{path} is mode {f.mode:04o}, expected {mode:04o}: {'; '.join(problems)}",
            f"Run `chmod {mode:o} {quoted(path)}`.",
        )
    return Check(name, "ok", f"{path}: mode {f.mode:04o}, yours")


def check_home(facts: Facts) -> Check:
    f = facts.home_dir
    if f.kind == "missing" and not facts.daemon_up:
        return Check("home", "skip", f"{f.path} does not exist: no daemon has run with this home yet")
    return check_path("home", f, expect="dir", mode=0o700, facts=facts, lenient=True)


def check_socket_dir(facts: Facts) -> Check | None:
    f = facts.socket_dir
    if f is None:
        return None
    # The daemon refuses to start on a fallback socket dir that is not private: fail on any bit.
    away = (
        f"Remove it (`rm -r {quoted(f.path)}`) and restart the daemon, or use a shorter --home so the "
        "socket fits in it."
    )
    return check_path("socket-dir", f, expect="dir", mode=0o700, facts=facts, owner_fix=away)


def check_socket(facts: Facts) -> Check:
    f = facts.socket
    if not facts.daemon_up:
        if f.kind == "missing":
            return Check("socket", "skip", f"no socket at {f.path}: the daemon is not running")
        if f.kind == "socket" and f.error is None:
            return Check(
                "socket", "skip", f"{f.path} is left from a daemon that stopped; the next start replaces it"
            )
    return check_path("socket", f, expect="socket", mode=0o600, facts=facts)


def check_db_file(facts: Facts, f: FileFacts) -> Check:
    suffix = f.path.rsplit("peerd.db", 1)[-1]
    name = "database" + suffix  # database, database-wal, database-shm
    lost = facts.status.store if facts.status is not None else None
    # A restart over a missing store is refused while the identity exists (store/health.py:refusal):
    # the way out is a restore, or a new store asked for by name.
    fix = (
        lost.message
        if lost is not None and lost.state != "ok" and lost.message
        else "Stop the daemon, then put the store back with `peerd restore BACKUP` (a file made by "
        "`peerd backup`) and start it again, or start with a new, empty store (no projects, threads, "
        "tasks or links) with `peerd serve --new-store`."
    )
    missing = Check(name, "fail", f"{f.path} is missing although the daemon is running", fix)
    return check_path(name, f, expect="file", mode=0o600, facts=facts, missing=missing)


def check_store_file(facts: Facts) -> Check | None:
    """Is the file at the store's path still the store the running daemon writes? (the daemon's
    `status` says: store/fileguard.py). None when no daemon answers or it does not say."""
    store = facts.status.store if facts.status is not None else None
    if store is None:
        return None
    if store.state == "ok":
        return Check("database-file", "ok", f"{store.path} is the store the daemon writes")
    return Check(
        "database-file",
        "fail",
        f"the running daemon's store is not the file at {store.path} any more ({store.state}); "
        "it refuses every write",
        store.message or "Stop the daemon and run `peerd doctor` again.",
    )


def check_store(facts: Facts) -> Check | None:
    """The store's integrity (`PRAGMA quick_check`), whether it is peerd's, and its schema version."""
    found = facts.store
    if found is None or found.state == "missing":  # a missing file is the database check's to report
        return None
    name = "database-integrity"
    if found.ok:
        return Check(name, "ok", f"{found.path}: integrity check ok, schema version {found.version}")
    path = quoted(found.path)
    if found.state == "newer":
        return Check(
            name, "fail", f"{found.path} {found.detail}", "Upgrade peerd to the version that wrote it."
        )
    if found.state == "unreadable":
        return Check(
            name,
            "warn",
            f"{found.path} {found.detail}",
            "Run `peerd doctor` again once nothing else holds it.",
        )
    return Check(
        name,
        "fail",
        f"{found.path} {found.detail}",
        "Stop the daemon, then put a backup back with `peerd restore BACKUP` (made by `peerd backup`); "
        f"or move it aside (`mv {path} {quoted(found.path + '.damaged')}`, with its -wal and -shm files) and "
        "start with `peerd serve --new-store` (an empty store: projects, threads, tasks and links are gone).",
    )


def check_identity_dir(facts: Facts) -> Check:
    return check_path("identity-dir", facts.identity_dir, expect="dir", mode=0o700, facts=facts)


def check_identity_key(facts: Facts) -> Check:
    f = facts.identity_key
    restore = (
        f"Restore {f.path} from a backup before the daemon restarts: a new key is a new environment id, "
        "and every link to or from this machine would have to be made again."
    )
    missing = Check(
        "identity-key",
        "fail",
        f"{f.path} is missing; the running daemon still holds the key, but its next start makes a new one",
        restore,
    )
    found = check_path("identity-key", f, expect="file", mode=0o600, facts=facts, missing=missing)
    if found.status == "ok" and facts.key_error is not None:
        return Check(
            "identity-key", "fail", f"{f.path} is not a usable Ed25519 key: {facts.key_error}", restore
        )
    return found
