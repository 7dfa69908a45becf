"""`peerd doctor`: what is wrong with this machine's peerd, and how to fix each thing.

The checks here are pure: each takes facts gathered beforehand (file modes and owners, the
daemon's answers or why there were none, the certificate, `git --version`) and returns a `Check`
with a status, a one-line detail and, for a problem, the fix. `peerd/cli/doctor.py` gathers the
facts and prints the checks. Statuses: `ok`; `warn`, a problem that breaks nothing by itself;
`fail`, a problem to fix (the command exits 1); `skip`, not checked, the detail says why.
"""

from __future__ import annotations

import re
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from peerd import contracts as c
from peerd.peer.client import is_loopback_url
from peerd.store.health import StoreHealth

CheckStatus = Literal["ok", "warn", "fail", "skip"]
FileKind = Literal["dir", "file", "socket", "other", "missing"]

GIT_MIN = (2, 20)  # worktree commands peerd relies on
CERT_WARN_DAYS = 30
TOKEN_WARN_DAYS = 7
DAY_S = 86_400.0

INSTALL = {
    "codex": "the Codex CLI (`npm install -g @openai/codex`)",
    "claude": "Claude Code (`npm install -g @anthropic-ai/claude-code`)",
    "gemini": "the Gemini CLI (`npm install -g @google/gemini-cli`)",
}
LABELS: dict[CheckStatus, str] = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class FileFacts:
    """One path as `stat` saw it (following symlinks)."""

    path: str
    kind: FileKind
    mode: int = 0  # permission bits (S_IMODE)
    uid: int = -1
    owner: str = ""  # the owner's user name, else the uid as text
    error: str | None = None  # why it could not be looked at (kind is then "other")


@dataclass(frozen=True)
class CertFacts:
    path: str
    exists: bool
    error: str | None = None  # why it does not load
    not_before: float | None = None
    not_after: float | None = None
    fingerprint: str | None = None  # "sha256:<hex>" of the DER, as `peerd status` shows it
    for_key: bool | None = None  # made for identity/key.pem? None when the key cannot be read


@dataclass(frozen=True)
class DaemonFacts:
    """What the daemon answered on the socket, or why it did not."""

    status: c.Status | None  # /v1/status; None when it did not answer
    error: str | None = None
    answered: bool = False  # something answered on the socket (with an error, if no status)
    links: Sequence[c.LinkInfo] | None = None
    links_error: str | None = None
    providers: Sequence[c.ProviderInfo] | None = None
    providers_error: str | None = None


@dataclass(frozen=True)
class ConfinementFacts:
    works: bool
    detail: str  # what the probe found: the binary that works, or why none does
    allow_unconfined: bool = False  # links.allow_unconfined in the config file


@dataclass(frozen=True)
class Facts:
    home: str
    uid: int
    user: str
    now: float
    cli_version: str
    config_path: str  # the default config file, for fixes that edit it
    home_dir: FileFacts
    socket: FileFacts
    socket_dir: FileFacts | None  # the fallback dir in the temp dir, when the socket is not in the home
    db_files: Sequence[FileFacts]  # peerd.db, then -wal and -shm where they exist
    identity_dir: FileFacts
    identity_key: FileFacts
    key_error: str | None  # the key exists but does not load as an Ed25519 PEM key
    certificate: CertFacts
    daemon: DaemonFacts
    git_version: str | None = None  # what `git --version` printed
    git_path: str | None = None
    git_error: str | None = None
    # peerd's sandbox (runtime/sandbox.py): does bwrap work here, and does the config let a link's
    # runs go on without it. None: not looked at.
    confinement: ConfinementFacts | None = None
    # `PRAGMA quick_check` and friends on peerd.db (store/health.py). None: not looked at.
    store: StoreHealth | None = None

    @property
    def status(self) -> c.Status | None:
        return self.daemon.status

    @property
    def daemon_up(self) -> bool:
        return self.daemon.status is not None


# --- helpers ----------------------------------------------------------------------------------


def _q(text: str) -> str:
    return shlex.quote(text)


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _days(seconds: float) -> str:
    days = seconds / DAY_S
    if days < 1:
        hours = max(1, round(seconds / 3600))
        return f"{hours} hour{'s' if hours != 1 else ''}"
    n = int(days)
    return f"{n} day{'s' if n != 1 else ''}"


_KIND_WORDS: dict[FileKind, str] = {
    "dir": "directory",
    "file": "regular file",
    "socket": "socket",
    "other": "special file",
    "missing": "missing path",
}


def _who_can(bits: int, *, is_dir: bool) -> str:
    """E.g. `group and others can read it` for the group and other bits of a mode."""
    who = [name for name, mask in (("group", 0o070), ("others", 0o007)) if bits & mask]
    union = ((bits >> 3) | bits) & 0o7
    verbs = [
        verb for verb, mask in (("read", 4), ("write", 2), ("enter" if is_dir else "run", 1)) if union & mask
    ]
    return f"{' and '.join(who)} can {_and(verbs)} it"


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def kind_of(st_mode: int) -> FileKind:
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    if stat.S_ISSOCK(st_mode):
        return "socket"
    return "other"


def parse_git_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"git version (\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


# --- the daemon --------------------------------------------------------------------------------


def check_daemon(facts: Facts) -> Check:
    start = (
        f"Start it: `peerd --home {_q(facts.home)} serve` "
        f"(or, where a systemd unit runs it, `systemctl --user start peerd` or "
        f"`sudo systemctl start peerd@{_q(facts.user)}`)."
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
    detail = f"running: {status.label} ({status.env_id}), version {status.version}, at {facts.socket.path}"
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
            f"{path} is a {_KIND_WORDS[f.kind]}, not a {_KIND_WORDS[expect]}",
            f"Move it away (`mv {_q(path)} {_q(path + '.old')}`), then restart the daemon.",
        )
    if f.uid != facts.uid:
        return Check(
            name,
            "fail",
            f"{path} is owned by {f.owner}, not by you ({facts.user})",
            owner_fix
            or f"Run peerd as {f.owner}, or take it over: `sudo chown {_q(facts.user)} {_q(path)}`.",
        )
    is_dir = expect == "dir"
    extra = f.mode & 0o077
    lacking = mode & ~f.mode & 0o700
    if extra or lacking:
        problems = []
        if extra:
            problems.append(_who_can(extra, is_dir=is_dir))
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
            f"Run `chmod {mode:o} {_q(path)}`.",
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
    away = f"Remove it (`rm -r {_q(f.path)}`) and restart the daemon, or use a shorter --home so the socket fits in it."
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
    missing = Check(
        name,
        "fail",
        f"{f.path} is missing although the daemon is running",
        "Restart the daemon; it starts a new, empty database (restore the old one from a backup first to keep it).",
    )
    return check_path(name, f, expect="file", mode=0o600, facts=facts, missing=missing)


def check_store(facts: Facts) -> Check | None:
    """The store's integrity (`PRAGMA quick_check`), whether it is peerd's, and its schema version."""
    found = facts.store
    if found is None or found.state == "missing":  # a missing file is the database check's to report
        return None
    name = "database-integrity"
    if found.ok:
        return Check(name, "ok", f"{found.path}: integrity check ok, schema version {found.version}")
    path = _q(found.path)
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
        f"or move it aside (`mv {path} {_q(found.path + '.damaged')}`, with its -wal and -shm files) and "
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


# --- the certificate ---------------------------------------------------------------------------


def check_certificate(facts: Facts) -> Check:
    cert = facts.certificate
    name = "certificate"
    relink = "each laptop linked to this machine must then link again (`peerd pair` here, `peerd link` there)"
    rebuild = (
        f"Move it away (`mv {_q(cert.path)} {_q(cert.path + '.old')}`) and restart the daemon: it makes a new "
        f"certificate for the same environment id, with a new fingerprint; {relink}."
    )
    restore = f"Restore {cert.path} from a backup before the daemon restarts; otherwise {relink}."
    if not cert.exists:
        if not facts.daemon_up:
            return Check(
                name, "skip", f"{cert.path} does not exist yet; the daemon creates it when it starts"
            )
        return Check(
            name,
            "fail",
            f"{cert.path} is missing; the daemon's next start makes a new one, with a new fingerprint",
            restore,
        )
    if cert.error is not None:
        return Check(name, "fail", f"{cert.path} does not load: {cert.error}", restore)
    if cert.for_key is False:
        return Check(
            name,
            "fail",
            f"{cert.path} is not the certificate of the identity key; the daemon's next start replaces it, "
            "with a new fingerprint",
            restore,
        )
    status = facts.status
    if status is not None and cert.fingerprint is not None and cert.fingerprint != status.fingerprint:
        return Check(
            name,
            "fail",
            f"{cert.path} ({cert.fingerprint}) is not the certificate the running daemon presents "
            f"({status.fingerprint}); it changed since the daemon started",
            restore,
        )
    if cert.not_after is not None and cert.not_after <= facts.now:
        return Check(name, "fail", f"{cert.path} expired on {_date(cert.not_after)}", rebuild)
    if cert.not_before is not None and cert.not_before > facts.now:
        return Check(
            name,
            "warn",
            f"{cert.path} is not valid before {_date(cert.not_before)}",
            "Check this machine's clock (`timedatectl` or `date`); the certificate was made at a later time.",
        )
    compared = (
        "matches the running daemon" if status is not None else "not compared: the daemon is not running"
    )
    if cert.not_after is not None and cert.not_after - facts.now < CERT_WARN_DAYS * DAY_S:
        return Check(
            name,
            "warn",
            f"{cert.path} expires on {_date(cert.not_after)}, in {_days(cert.not_after - facts.now)}; {compared}",
            rebuild,
        )
    until = f", valid until {_date(cert.not_after)}" if cert.not_after is not None else ""
    return Check(name, "ok", f"{cert.fingerprint}{until}; {compared}")


# --- listeners, links, providers ---------------------------------------------------------------


def _daemon_down(facts: Facts) -> str:
    if facts.daemon.answered:
        return "not checked: the daemon did not give its status"
    return "not checked: the daemon is not running"


def check_listeners(facts: Facts) -> Check:
    status = facts.status
    if status is None:
        return Check("listeners", "skip", _daemon_down(facts))
    tcp = [x for x in status.listeners if x.kind == "tcp"]
    if not tcp:
        return Check(
            "listeners",
            "warn",
            "only the local socket: other machines cannot link to this one (it can still link to them)",
            "To let other machines link here, restart the daemon with `--listen HOST:PORT` "
            "(or set `listen` in the config file).",
        )
    addresses = ", ".join(x.address for x in tcp)
    plain = [x.address for x in tcp if not x.tls]
    if plain:
        return Check(
            "listeners",
            "warn",
            f"{', '.join(plain)} is plain HTTP: nothing is pinned, fit for tests only",
            "Restart the daemon without `--no-tls` (and without `tls = false` in the config file).",
        )
    if all(is_loopback_url(x.address) for x in tcp):
        return Check(
            "listeners",
            "ok",
            f"{addresses} (loopback only: other machines reach it only through a tunnel or proxy)",
        )
    return Check("listeners", "ok", addresses)


def check_link(link: c.LinkInfo, now: float) -> Check:
    name = f"link:{link.label}"
    label = _q(link.label)
    where = ", ".join(link.urls) or "no address"
    relink = (
        f"Make a new pairing code on {link.label} (`peerd pair` there) and link again here "
        "(`peerd link CODE`); the new link replaces this one."
    )
    if link.status == "expired":
        return Check(
            name,
            "fail",
            f"the link to {link.label} expired: {link.last_error or 'its lifetime ran out'}",
            relink,
        )
    if link.status == "revoked":
        why = link.last_error or f"{link.label} no longer accepts this link"
        return Check(name, "fail", f"the link to {link.label} was revoked: {why}", relink)
    token = ""
    soon = False
    if link.expires_at is not None:
        left = link.expires_at - now
        token = f"; its token expires on {_date(link.expires_at)}, in {_days(max(left, 0.0))}"
        soon = left < TOKEN_WARN_DAYS * DAY_S
    if link.status == "unreachable":
        return Check(
            name,
            "warn",
            f"{link.label} does not answer: {link.last_error or 'no address answered'}{token}",
            f"Check that {link.label} is up and its daemon runs with a listener (`peerd status` there), and that "
            f"this machine reaches {where}; `peerd environment show {label}` tries again.",
        )
    if soon:
        return Check(
            name,
            "warn",
            f"reachable at {where}{token}",
            f"Use the link before then to renew its token (e.g. `peerd project list --env {label}`); a link made "
            f"with --max-age ends then anyway: make a new code on {link.label} and link again.",
        )
    return Check(name, "ok", f"reachable at {where}{token}, {link.access} access")


def check_links(facts: Facts) -> list[Check]:
    if facts.daemon.links is None:
        if not facts.daemon_up:
            return [Check("links", "skip", _daemon_down(facts))]
        return [
            Check(
                "links",
                "fail",
                f"the daemon could not list its links: {facts.daemon.links_error}",
                "Read the daemon's log (stderr of `peerd serve`), then run `peerd environment list`.",
            )
        ]
    if not facts.daemon.links:
        return [Check("links", "ok", "no linked environments")]
    return [check_link(link, facts.now) for link in facts.daemon.links]


def check_provider(p: c.ProviderInfo, config_path: str) -> Check:
    name = f"provider:{p.name}"
    config = f"the config file ({config_path} unless the daemon was given another)"
    if p.kind == "script":
        return Check(name, "ok", "built in")
    if p.kind == "command":
        if not p.found:
            return Check(
                name,
                "warn",
                f"custom command: {p.problem or 'its program was not found'}",
                f"Install {p.binary or 'its program'}, or correct providers.{p.name}.command in {config}; "
                "then restart the daemon.",
            )
        if not p.approved:
            return Check(
                name,
                "warn",
                f"custom command not approved, so it does not run: {p.command}",
                f"Read the command, then approve it: `peerd provider approve {_q(p.name)}`.",
            )
        return Check(name, "ok", f"approved custom command, {p.path}")
    product = INSTALL.get(p.kind, p.binary or p.name)
    if not p.found:
        return Check(
            name,
            "warn",
            f"{p.binary or p.kind!r} not found on the daemon's PATH (needed only for {p.name} threads)",
            f"Install {product}, or set providers.{p.name}.binary in {config} to where it is; "
            "then restart the daemon.",
        )
    if p.version is None:
        return Check(
            name,
            "warn",
            f"found at {p.path}, but `{p.path} --version` did not answer",
            f"Run `{_q(p.path or p.name)} --version` yourself to see what is wrong (a broken install, a prompt).",
        )
    return Check(name, "ok", f"{p.version}, {p.path}")


def check_providers(facts: Facts) -> list[Check]:
    if facts.daemon.providers is None:
        if not facts.daemon_up:
            return [Check("providers", "skip", _daemon_down(facts))]
        return [
            Check(
                "providers",
                "fail",
                f"the daemon could not list its providers: {facts.daemon.providers_error}",
                "Read the daemon's log (stderr of `peerd serve`), then run `peerd provider list`.",
            )
        ]
    return [check_provider(p, facts.config_path) for p in facts.daemon.providers]


# --- git ---------------------------------------------------------------------------------------


def check_git(facts: Facts) -> Check:
    need = ".".join(map(str, GIT_MIN))
    if facts.git_version is None:
        return Check(
            "git",
            "fail",
            f"git does not run: {facts.git_error or 'not found on PATH'}",
            f"Install git {need} or newer (projects and their worktrees need it), on the daemon's PATH.",
        )
    version = parse_git_version(facts.git_version)
    shown = facts.git_version.strip()
    if version is None:
        return Check(
            "git",
            "warn",
            f"cannot read a version in {shown!r}",
            f"Check that `git --version` works and that git is {need} or newer.",
        )
    if version[:2] < GIT_MIN:
        return Check(
            "git",
            "fail",
            f"{shown} is older than {need}, which peerd's worktrees need",
            f"Upgrade git to {need} or newer.",
        )
    where = f", {facts.git_path}" if facts.git_path else ""
    return Check("git", "ok", f"{shown}{where}")


# --- confinement -------------------------------------------------------------------------------


def check_confinement(facts: Facts) -> Check | None:
    found = facts.confinement
    if found is None:
        return None
    if found.works:
        return Check(
            "confinement",
            "ok",
            f"{found.detail} peerd confines linked machines' runs, and the owner's below full-access "
            "(peerd's home, sockets and the checkouts hidden from them).",
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


# --- all of them -------------------------------------------------------------------------------


def run_checks(facts: Facts) -> list[Check]:
    checks = [check_daemon(facts), check_home(facts)]
    socket_dir = check_socket_dir(facts)
    if socket_dir is not None:
        checks.append(socket_dir)
    checks.append(check_socket(facts))
    checks += [check_db_file(facts, f) for f in facts.db_files]
    store = check_store(facts)
    if store is not None:
        checks.append(store)
    checks += [
        check_identity_dir(facts),
        check_identity_key(facts),
        check_certificate(facts),
        check_listeners(facts),
    ]
    checks += check_links(facts)
    checks += check_providers(facts)
    confinement = check_confinement(facts)
    if confinement is not None:
        checks.append(confinement)
    checks.append(check_git(facts))
    return checks


def passed(checks: Sequence[Check]) -> bool:
    """No check failed; warnings and skips do not fail."""
    return all(ch.status != "fail" for ch in checks)


def summary(checks: Sequence[Check]) -> str:
    counts = {s: sum(1 for ch in checks if ch.status == s) for s in LABELS}
    parts = [
        f"{counts['ok']} ok",
        f"{counts['warn']} warning{'s' if counts['warn'] != 1 else ''}",
        f"{counts['fail']} failed",
        f"{counts['skip']} skipped",
    ]
    return ", ".join(parts)


def render(checks: Sequence[Check]) -> list[str]:
    """One line per check (`STATUS  name  detail`), an indented `fix:` line under each problem,
    then the summary."""
    width = max((len(ch.name) for ch in checks), default=0)
    lines = []
    for ch in checks:
        lines.append(f"{LABELS[ch.status]:<4}  {ch.name.ljust(width)}  {ch.detail}".rstrip())
        if ch.fix and ch.status in ("warn", "fail"):
            lines.append(f"      fix: {ch.fix}")
    lines.append("")
    lines.append(summary(checks))
    return lines
