"""`peerd doctor`'s checks: each status of each check, with its detail and fix, from made-up facts;
and the gatherer's file and certificate facts from real files."""

from __future__ import annotations

import dataclasses
import io
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from peerd import contracts as c
from peerd.cli.output import colour_wanted
from peerd.doctor import (
    CertFacts,
    Check,
    DaemonFacts,
    check_certificate,
    check_daemon,
    check_git,
    check_link,
    check_links,
    check_listeners,
    check_provider,
    check_providers,
    passed,
    render,
    run_checks,
    summary,
)
from peerd.doctor.gather import file_facts, identity_facts
from peerd.peer.identity import load_or_create_identity
from tests.support.doctor import (
    DAY,
    DOWN,
    FP,
    HOME,
    NOW,
    OTHER_FP,
    facts,
    ff,
    link,
    provider,
    status,
    up,
)


def only(checks: list[Check], name: str) -> Check:
    found = [ch for ch in checks if ch.name == name]
    assert len(found) == 1, [ch.name for ch in checks]
    return found[0]


def expect(check: Check, status: str, detail: str, fix: str | None) -> None:
    assert check.status == status, check
    assert detail in check.detail, check
    if fix is None:
        assert check.fix is None, check
    else:
        assert check.fix is not None and fix in check.fix, check


# --- all together ------------------------------------------------------------------------------------


def test_a_healthy_machine_passes_every_check_in_order() -> None:
    checks = run_checks(facts())
    assert [ch.name for ch in checks] == [
        "daemon",
        "home",
        "socket",
        "database",
        "identity-dir",
        "identity-key",
        "certificate",
        "listeners",
        "link:box",
        "provider:codex",
        "provider:script",
        "git",
    ]
    assert {ch.status for ch in checks} == {"ok"}
    assert all(ch.fix is None for ch in checks)
    assert passed(checks)


def test_without_a_daemon_the_files_are_still_checked_and_the_rest_is_skipped() -> None:
    checks = run_checks(facts(daemon=DOWN, socket=ff(f"{HOME}/peerd.sock", "missing", 0)))
    by_name = {ch.name: ch for ch in checks}
    expect(by_name["daemon"], "fail", f"no daemon answers at {HOME}/peerd.sock", "`peerd --home /h serve`")
    assert "systemctl --user start peerd" in (by_name["daemon"].fix or "")
    for name in ("home", "database", "identity-dir", "identity-key", "git"):
        assert by_name[name].status == "ok", by_name[name]
    expect(by_name["certificate"], "ok", "not compared: the daemon is not running", None)
    for name in ("socket", "listeners", "links", "providers"):
        assert by_name[name].status == "skip", by_name[name]
    assert "the daemon is not running" in by_name["links"].detail
    assert not passed(checks)


def test_warnings_and_skips_pass_failures_do_not() -> None:
    assert passed([Check("a", "ok", ""), Check("b", "warn", "", "x"), Check("c", "skip", "")])
    assert not passed([Check("a", "ok", ""), Check("b", "fail", "", "x")])


def test_render_puts_the_fix_under_each_problem_and_a_summary_last() -> None:
    checks = [
        Check("daemon", "ok", "running"),
        Check("database", "fail", "/h/peerd.db is mode 0644", "Run `chmod 600 /h/peerd.db`."),
        Check("links", "skip", "not checked"),
        Check("provider:codex", "warn", "not found", "Install it."),
    ]
    assert render(checks) == [
        "OK    daemon          running",
        "FAIL  database        /h/peerd.db is mode 0644",
        "      fix: Run `chmod 600 /h/peerd.db`.",
        "SKIP  links           not checked",
        "WARN  provider:codex  not found",
        "      fix: Install it.",
        "",
        "1 ok, 1 warning, 1 failed, 1 skipped",
    ]
    assert (
        summary([Check("a", "warn", ""), Check("b", "warn", "")]) == "0 ok, 2 warnings, 0 failed, 0 skipped"
    )
    assert Check("x", "fail", "d", "f").wire() == {"name": "x", "status": "fail", "detail": "d", "fix": "f"}


def test_on_a_persons_terminal_the_status_is_coloured_and_nowhere_else() -> None:
    checks = [Check("daemon", "ok", "running"), Check("database", "fail", "bad", "fix it")]
    coloured = render(checks, colour=True)
    assert coloured[0] == "\x1b[32mOK  \x1b[0m  daemon    running"
    assert coloured[1].startswith("\x1b[1;31mFAIL\x1b[0m  database")
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in coloured] == render(checks)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert colour_wanted(Tty(), {"TERM": "xterm"})
    assert not colour_wanted(
        Tty(), {"TERM": "xterm", "NO_COLOR": ""}
    )  # no-color.org: set, whatever its value
    assert not colour_wanted(Tty(), {"TERM": "dumb"})
    assert not colour_wanted(io.StringIO(), {"TERM": "xterm"})  # a pipe or a file


# --- the daemon ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("daemon", "cli_version", "status_", "detail", "fix"),
    [
        (up(), "0.1.0", "ok", "running: laptop (AAAAAA-BBBBBB-CCCCCC-DDDDDD), version 0.1.0", None),
        (
            up(status=status(version="0.0.9")),
            "0.1.0",
            "warn",
            "this command is version 0.1.0",
            "Restart the daemon",
        ),
        (DOWN, "0.1.0", "fail", "no daemon answers at /h/peerd.sock", "`peerd --home /h serve`"),
        (
            DaemonFacts(None, "unavailable: The daemon is still starting.", answered=True),
            "0.1.0",
            "fail",
            "answered with an error: unavailable: The daemon is still starting.",
            "run `peerd doctor` again",
        ),
    ],
)
def test_daemon(daemon: DaemonFacts, cli_version: str, status_: str, detail: str, fix: str | None) -> None:
    expect(check_daemon(facts(daemon=daemon, cli_version=cli_version)), status_, detail, fix)


# --- files and permissions ---------------------------------------------------------------------------

KEY = f"{HOME}/identity/key.pem"
DB = f"{HOME}/peerd.db"
SOCK = f"{HOME}/peerd.sock"
TMP_DIR = "/tmp/peerd-1000"

FILE_CASES: list[tuple[str, dict[str, Any], str, str, str, str | None]] = [
    # (case, facts overrides, check name, status, detail, fix)
    ("db ok", {}, "database", "ok", f"{DB}: mode 0600, yours", None),
    (
        "db readable by all",
        {"db_files": [ff(DB, "file", 0o644)]},
        "database",
        "fail",
        "mode 0644, expected 0600: group and others can read it",
        f"Run `chmod 600 {DB}`.",
    ),
    (
        "db readable by group",
        {"db_files": [ff(DB, "file", 0o640)]},
        "database",
        "fail",
        "group can read it",
        f"`chmod 600 {DB}`",
    ),
    (
        "db not writable",
        {"db_files": [ff(DB, "file", 0o400)]},
        "database",
        "fail",
        "you cannot write it",
        f"`chmod 600 {DB}`",
    ),
    (
        "wal readable",
        {"db_files": [ff(DB, "file", 0o600), ff(DB + "-wal", "file", 0o644)]},
        "database-wal",
        "fail",
        "group and others can read it",
        f"`chmod 600 {DB}-wal`",
    ),
    (
        "db owned by another user",
        {"db_files": [ff(DB, "file", 0o600, uid=0, owner="root")]},
        "database",
        "fail",
        "owned by root, not by you (me)",
        f"`sudo chown me {DB}`",
    ),
    (
        "db is a directory",
        {"db_files": [ff(DB, "dir", 0o700)]},
        "database",
        "fail",
        "is a directory, not a regular file",
        f"`mv {DB} {DB}.old`",
    ),
    (
        "db missing with the daemon up",
        {"db_files": [ff(DB, "missing", 0)]},
        "database",
        "fail",
        "missing although the daemon is running",
        "`peerd restore BACKUP`",
    ),
    (
        "db missing with the daemon down",
        {"db_files": [ff(DB, "missing", 0)], "daemon": DOWN},
        "database",
        "skip",
        "does not exist yet",
        None,
    ),
    (
        "db cannot be looked at",
        {"db_files": [ff(DB, "other", 0, error="Permission denied")]},
        "database",
        "fail",
        "cannot look at /h/peerd.db: Permission denied",
        "directories above it",
    ),
    (
        "home readable by others",
        {"home_dir": ff(HOME, "dir", 0o755)},
        "home",
        "warn",
        "mode 0755, expected 0700: group and others can read and enter it",
        "`chmod 700 /h`",
    ),
    (
        "home writable by group",
        {"home_dir": ff(HOME, "dir", 0o775)},
        "home",
        "fail",
        "group and others can read, write and enter it",
        "`chmod 700 /h`",
    ),
    (
        "home missing, daemon down",
        {"home_dir": ff(HOME, "missing", 0), "daemon": DOWN},
        "home",
        "skip",
        "no daemon has run with this home yet",
        None,
    ),
    (
        "identity dir open",
        {"identity_dir": ff(f"{HOME}/identity", "dir", 0o750)},
        "identity-dir",
        "fail",
        "group can read and enter it",
        "`chmod 700 /h/identity`",
    ),
    (
        "key readable by others",
        {"identity_key": ff(KEY, "file", 0o604)},
        "identity-key",
        "fail",
        "others can read it",
        f"`chmod 600 {KEY}`",
    ),
    (
        "key unusable",
        {"key_error": "Could not deserialize key data."},
        "identity-key",
        "fail",
        "not a usable Ed25519 key: Could not deserialize key data.",
        "Restore /h/identity/key.pem from a backup",
    ),
    (
        "key missing, daemon up",
        {"identity_key": ff(KEY, "missing", 0)},
        "identity-key",
        "fail",
        "its next start makes a new one",
        "a new key is a new environment id",
    ),
    ("socket ok", {}, "socket", "ok", f"{SOCK}: mode 0600, yours", None),
    (
        "socket open to all",
        {"socket": ff(SOCK, "socket", 0o666)},
        "socket",
        "fail",
        "group and others can read and write it",
        f"`chmod 600 {SOCK}`",
    ),
    (
        "socket is a file",
        {"socket": ff(SOCK, "file", 0o600)},
        "socket",
        "fail",
        "is a regular file, not a socket",
        "then restart the daemon",
    ),
    (
        "stale socket",
        {"daemon": DOWN},
        "socket",
        "skip",
        "left from a daemon that stopped",
        None,
    ),
    (
        "socket missing, daemon down",
        {"socket": ff(SOCK, "missing", 0), "daemon": DOWN},
        "socket",
        "skip",
        "the daemon is not running",
        None,
    ),
    (
        "fallback socket dir ok",
        {"socket_dir": ff(TMP_DIR, "dir", 0o700)},
        "socket-dir",
        "ok",
        f"{TMP_DIR}: mode 0700, yours",
        None,
    ),
    (
        "fallback socket dir readable",
        {"socket_dir": ff(TMP_DIR, "dir", 0o755)},
        "socket-dir",
        "fail",  # the daemon refuses to start on it: never only a warning
        "group and others can read and enter it",
        f"`chmod 700 {TMP_DIR}`",
    ),
    (
        "fallback socket dir of another user",
        {"socket_dir": ff(TMP_DIR, "dir", 0o700, uid=1001, owner="eve")},
        "socket-dir",
        "fail",
        "owned by eve",
        f"`rm -r {TMP_DIR}`",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "name", "status_", "detail", "fix"),
    [case[1:] for case in FILE_CASES],
    ids=[case[0] for case in FILE_CASES],
)
def test_files_and_permissions(
    overrides: dict[str, Any], name: str, status_: str, detail: str, fix: str | None
) -> None:
    expect(only(run_checks(facts(**overrides)), name), status_, detail, fix)


def test_paths_in_fixes_are_shell_quoted() -> None:
    odd = "/home/me/my peerd/peerd.db"
    check = only(run_checks(facts(db_files=[ff(odd, "file", 0o644)])), "database")
    assert check.fix == f"Run `chmod 600 '{odd}'`."


# --- the certificate ---------------------------------------------------------------------------------

CERT = f"{HOME}/identity/cert.pem"
GOOD_CERT = facts().certificate
RELINK = "each laptop linked to this machine must then link again"


@pytest.mark.parametrize(
    ("cert", "daemon", "status_", "detail", "fix"),
    [
        (GOOD_CERT, up(), "ok", f"{FP}, valid until 2046-03-16", None),
        (GOOD_CERT, DOWN, "ok", "not compared: the daemon is not running", None),
        (CertFacts(CERT, exists=False), DOWN, "skip", "does not exist yet", None),
        (CertFacts(CERT, exists=False), up(), "fail", "is missing", f"Restore {CERT} from a backup"),
        (
            CertFacts(CERT, exists=True, error="Unable to load PEM file"),
            up(),
            "fail",
            "does not load",
            RELINK,
        ),
        (
            dataclasses.replace(GOOD_CERT, for_key=False),
            up(),
            "fail",
            "is not the certificate of the identity key",
            f"Restore {CERT}",
        ),
        (
            dataclasses.replace(GOOD_CERT, fingerprint=OTHER_FP),
            up(),
            "fail",
            f"({OTHER_FP}) is not the certificate the running daemon presents ({FP})",
            RELINK,
        ),
        (dataclasses.replace(GOOD_CERT, fingerprint=OTHER_FP), DOWN, "ok", "not compared", None),
        (
            dataclasses.replace(GOOD_CERT, not_after=NOW - DAY),
            up(),
            "fail",
            "expired on 2027-01-14",
            f"`mv {CERT} {CERT}.old`",
        ),
        (
            dataclasses.replace(GOOD_CERT, not_after=NOW + 10 * DAY),
            up(),
            "warn",
            "in 10 days; matches the running daemon",
            RELINK,
        ),
        (
            dataclasses.replace(GOOD_CERT, not_before=NOW + DAY),
            up(),
            "warn",
            "is not valid before",
            "Check this machine's clock",
        ),
    ],
)
def test_certificate(
    cert: CertFacts, daemon: DaemonFacts, status_: str, detail: str, fix: str | None
) -> None:
    expect(check_certificate(facts(certificate=cert, daemon=daemon)), status_, detail, fix)


# --- listeners ------------------------------------------------------------------------------------------

UNIX = c.Listener(kind="unix", address=SOCK, tls=False)


@pytest.mark.parametrize(
    ("daemon", "status_", "detail", "fix"),
    [
        (up(), "ok", "https://100.64.0.1:7433", None),
        (
            up(
                status=status(
                    listeners=[UNIX, c.Listener(kind="tcp", address="https://127.0.0.1:7433", tls=True)]
                )
            ),
            "ok",
            "loopback only",
            None,
        ),
        (
            up(status=status(listeners=[UNIX])),
            "warn",
            "other machines cannot link to this one",
            "`--listen HOST:PORT`",
        ),
        (
            up(
                status=status(
                    listeners=[UNIX, c.Listener(kind="tcp", address="http://127.0.0.1:7433", tls=False)]
                )
            ),
            "warn",
            "http://127.0.0.1:7433 is plain HTTP",
            "without `--no-tls`",
        ),
        (DOWN, "skip", "the daemon is not running", None),
    ],
)
def test_listeners(daemon: DaemonFacts, status_: str, detail: str, fix: str | None) -> None:
    expect(check_listeners(facts(daemon=daemon)), status_, detail, fix)


# --- links ------------------------------------------------------------------------------------------------

RELINK_BOX = "Make a new pairing code on box (`peerd pair` there) and link again here (`peerd link CODE`)"


@pytest.mark.parametrize(
    ("info", "status_", "detail", "fix"),
    [
        (link(), "ok", "reachable at https://box:7433; its token expires on", None),
        (link(expires_at=None), "ok", "reachable at https://box:7433, auto access", None),
        (
            link(expires_at=NOW + 2 * DAY),
            "warn",
            "its token expires on 2027-01-17 08:00 UTC, in 2 days",
            "`peerd project list --env box`",
        ),
        (
            link(status="unreachable", last_error="box did not answer at https://box:7433."),
            "warn",
            "box does not answer: box did not answer at https://box:7433.",
            "`peerd environment show box`",
        ),
        (link(status="unreachable"), "warn", "no address answered", "this machine reaches https://box:7433"),
        (
            link(status="expired", last_error="The link to box expired.", expires_at=NOW - DAY),
            "fail",
            "the link to box expired: The link to box expired.",
            RELINK_BOX,
        ),
        (link(status="revoked"), "fail", "box no longer accepts this link", RELINK_BOX),
        (
            link(label="my box", status="unreachable"),
            "warn",
            "my box does not answer",
            "`peerd environment show 'my box'`",
        ),
    ],
)
def test_link(info: c.LinkInfo, status_: str, detail: str, fix: str | None) -> None:
    check = check_link(info, NOW)
    assert check.name == f"link:{info.label}"
    expect(check, status_, detail, fix)


@pytest.mark.parametrize(
    ("daemon", "status_", "detail", "fix"),
    [
        (up(links=[]), "ok", "no linked environments", None),
        (DOWN, "skip", "not checked: the daemon is not running", None),
        (
            DaemonFacts(None, "unavailable: starting", answered=True),
            "skip",
            "the daemon did not give its status",
            None,
        ),
        (
            up(links=None, links_error="internal_error: boom"),
            "fail",
            "could not list its links",
            "`peerd environment list`",
        ),
    ],
)
def test_links_as_a_whole(daemon: DaemonFacts, status_: str, detail: str, fix: str | None) -> None:
    [check] = check_links(facts(daemon=daemon))
    assert check.name == "links"
    expect(check, status_, detail, fix)


# --- providers ----------------------------------------------------------------------------------------------

CONFIG = "/cfg/peerd/config.toml"


@pytest.mark.parametrize(
    ("info", "status_", "detail", "fix"),
    [
        (
            provider(name="script", kind="script", binary=None, path=None, version="built in"),
            "ok",
            "built in",
            None,
        ),
        (provider(), "ok", "codex-cli 0.171.0, /usr/bin/codex", None),
        (
            provider(path=None, found=False, version=None),
            "warn",
            "'codex' not found on the daemon's PATH",
            "`npm install -g @openai/codex`), or set providers.codex.binary in the config file (/cfg/",
        ),
        (
            provider(name="claude", kind="claude", binary="claude", path=None, found=False, version=None),
            "warn",
            "'claude' not found",
            "`npm install -g @anthropic-ai/claude-code`",
        ),
        (
            provider(name="gemini", kind="gemini", binary="gemini", path=None, found=False, version=None),
            "warn",
            "'gemini' not found",
            "`npm install -g @google/gemini-cli`",
        ),
        (
            provider(name="fast", kind="claude", binary="/opt/claude", path=None, found=False, version=None),
            "warn",
            "'/opt/claude' not found",
            "set providers.fast.binary",
        ),
        (
            provider(version=None),
            "warn",
            "`/usr/bin/codex --version` did not answer",
            "`/usr/bin/codex --version`",
        ),
        (
            provider(
                name="mine",
                kind="command",
                binary="my-coder",
                path="/usr/bin/my-coder",
                version=None,
                command="my-coder {SPEC}",
                approved=False,
            ),
            "warn",
            "custom command not approved, so it does not run: my-coder {SPEC}",
            "`peerd provider approve mine`",
        ),
        (
            provider(
                name="mine",
                kind="command",
                binary="my-coder",
                path=None,
                found=False,
                version=None,
                command="my-coder {SPEC}",
                approved=False,
                problem="'my-coder' not found on PATH",
            ),
            "warn",
            "'my-coder' not found on PATH",
            "Install my-coder, or correct providers.mine.command",
        ),
        (
            provider(
                name="mine",
                kind="command",
                binary="my-coder",
                path="/usr/bin/my-coder",
                version=None,
                command="my-coder {SPEC}",
                approved=True,
            ),
            "ok",
            "approved custom command, /usr/bin/my-coder",
            None,
        ),
    ],
)
def test_provider(info: c.ProviderInfo, status_: str, detail: str, fix: str | None) -> None:
    check = check_provider(info, CONFIG)
    assert check.name == f"provider:{info.name}"
    expect(check, status_, detail, fix)


@pytest.mark.parametrize(
    ("daemon", "status_", "detail", "fix"),
    [
        (DOWN, "skip", "not checked: the daemon is not running", None),
        (
            up(providers=None, providers_error="internal_error: boom"),
            "fail",
            "could not list its providers: internal_error: boom",
            "`peerd provider list`",
        ),
    ],
)
def test_providers_as_a_whole(daemon: DaemonFacts, status_: str, detail: str, fix: str | None) -> None:
    [check] = check_providers(facts(daemon=daemon))
    expect(check, status_, detail, fix)


# --- git -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "error", "status_", "detail", "fix"),
    [
        ("git version 2.39.5", None, "ok", "git version 2.39.5, /usr/bin/git", None),
        ("git version 2.47.3", None, "ok", "git version 2.47.3", None),
        ("git version 2.39.3 (Apple Git-145)", None, "ok", "Apple Git-145", None),
        ("git version 2.43.0.windows.1", None, "ok", "2.43.0.windows.1", None),
        # Works, but outside the range whose worktree admin files peerd writes itself: a warning.
        ("git version 2.48.0", None, "warn", "outside 2.39-2.47", "Nothing breaks"),
        ("git version 3.0.0", None, "warn", "`git worktree add` instead", "use git 2.39-2.47"),
        (
            "git version 2.31.0",
            None,
            "warn",
            "git version 2.31.0, /usr/bin/git: outside 2.39-2.47",
            "Nothing",
        ),
        ("git version 2.30.9", None, "fail", "older than 2.31", "Upgrade git to 2.31 or newer."),
        ("git version 1.8.3.1", None, "fail", "older than 2.31", "Upgrade git"),
        ("hub version 2.14", None, "warn", "cannot read a version in 'hub version 2.14'", "`git --version`"),
        (
            None,
            "not found on PATH",
            "fail",
            "git does not run: not found on PATH",
            "Install git 2.31 or newer",
        ),
    ],
)
def test_git(version: str | None, error: str | None, status_: str, detail: str, fix: str | None) -> None:
    expect(check_git(facts(git_version=version, git_error=error)), status_, detail, fix)


def test_an_untested_git_is_a_warning_line_and_fails_nothing() -> None:
    checks = run_checks(facts(git_version="git version 2.50.1"))
    assert passed(checks)
    line = next(line for line in render(checks) if " git " in line)
    assert line.startswith("WARN") and "git version 2.50.1" in line and "outside 2.39-2.47" in line, line


# --- the gatherer's file and identity facts, from real files ----------------------------------------------------


def test_file_facts_see_kind_mode_and_owner(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o640)
    (tmp_path / "d").mkdir(mode=0o700)
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        kinds = {name: file_facts(tmp_path / name) for name in ("f", "d", "s", "nothing")}
    assert (kinds["f"].kind, kinds["f"].mode) == ("file", 0o640)
    assert (kinds["d"].kind, kinds["d"].mode) == ("dir", 0o700)
    assert kinds["s"].kind == "socket"
    assert kinds["nothing"].kind == "missing"
    assert kinds["f"].uid == (tmp_path / "f").stat().st_uid


def test_identity_facts_load_the_certificate_and_compare_it_with_the_key(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path)
    key_error, cert = identity_facts(tmp_path / "identity")
    assert key_error is None
    assert cert.exists and cert.error is None and cert.for_key is True
    assert cert.fingerprint == identity.fingerprint_text
    assert cert.not_after is not None and cert.not_before is not None and cert.not_before < cert.not_after


def test_identity_facts_notice_a_certificate_for_another_key(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    other = load_or_create_identity(tmp_path / "other")
    (tmp_path / "identity" / "cert.pem").write_bytes(other.cert_pem)
    _, cert = identity_facts(tmp_path / "identity")
    assert cert.for_key is False


@pytest.mark.parametrize(
    ("damage", "key_broken", "cert_broken"),
    [
        (lambda d: (d / "cert.pem").write_text("not a certificate"), False, True),
        (lambda d: (d / "key.pem").write_text("not a key"), True, False),
        (lambda d: (d / "key.pem").write_bytes(_x25519_pem()), True, False),  # not Ed25519
    ],
)
def test_identity_facts_report_damaged_files(
    tmp_path: Path, damage: Callable[[Path], object], key_broken: bool, cert_broken: bool
) -> None:
    load_or_create_identity(tmp_path)
    damage(tmp_path / "identity")
    key_error, cert = identity_facts(tmp_path / "identity")
    assert (key_error is not None) == key_broken
    assert (cert.error is not None) == cert_broken
    if key_broken:
        assert cert.for_key is None  # nothing to compare with


def _x25519_pem() -> bytes:
    return X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_identity_facts_without_files(tmp_path: Path) -> None:
    key_error, cert = identity_facts(tmp_path / "identity")
    assert key_error is None
    assert cert == CertFacts(str(tmp_path / "identity" / "cert.pem"), exists=False)


def test_a_store_the_daemon_no_longer_has_at_its_path_fails_with_the_daemons_advice() -> None:
    """Issue 26 case 5: the daemon's `status` says its store was replaced; doctor fails on it and
    gives the daemon's sentence as the fix (the way out it names works: tests/faults/test_store_file.py)."""
    said = f"peerd's store {HOME}/peerd.db was replaced by another file while the daemon ran ... `peerd restore X`"
    store = c.StoreState(state="replaced", path=f"{HOME}/peerd.db", message=said, saved_as="X")
    lost = up(status=status().model_copy(update={"store": store}))
    by_name = {ch.name: ch for ch in run_checks(facts(daemon=lost))}
    expect(by_name["database-file"], "fail", "not the file at /h/peerd.db any more (replaced)", said)
    assert not passed(list(by_name.values()))

    fine = up(status=status().model_copy(update={"store": c.StoreState(path=f"{HOME}/peerd.db")}))
    by_name = {ch.name: ch for ch in run_checks(facts(daemon=fine))}
    assert by_name["database-file"].status == "ok"

    # A removed store: the `database` check's fix is the daemon's sentence too, never "restart".
    gone = c.StoreState(state="removed", path=f"{HOME}/peerd.db", message=said)
    missing = up(status=status().model_copy(update={"store": gone}))
    by_name = {
        ch.name: ch
        for ch in run_checks(facts(daemon=missing, db_files=[ff(f"{HOME}/peerd.db", "missing", 0)]))
    }
    expect(by_name["database"], "fail", "missing although the daemon is running", said)


def test_a2a_pushes_given_up_lately_are_a_warning_with_the_latest_reason_and_what_to_do() -> None:
    """Issue 29: a push notification given up (its webhook never answered 2xx) is a warning: how
    many in the window, the latest reason and webhook, a line per recent one, and the fix."""
    latest = c.GivenUpPush(
        task_id="run_1",
        webhook="https://hooks.example:8443",
        state="completed",
        reason="HTTP 503",
        given_up_at=NOW,
    )
    given_up = c.PushHealth(given_up=3, window_s=7 * DAY, latest=[latest])
    daemon = up(status=status().model_copy(update={"a2a_pushes": given_up}))
    (check,) = [ch for ch in run_checks(facts(daemon=daemon)) if ch.name == "a2a-pushes"]
    expect(
        check,
        "warn",
        "3 push notification(s) given up in the last 7 days; the latest, to https://hooks.example:8443 for task "
        "run_1: HTTP 503",
        "[a2a] allow_private_push",
    )
    assert check.table == ("run_1  completed       https://hooks.example:8443  HTTP 503",)
    assert passed([check]), "a warning fails nothing"

    none = up(status=status().model_copy(update={"a2a_pushes": c.PushHealth(given_up=0, window_s=7 * DAY)}))
    (fine,) = [ch for ch in run_checks(facts(daemon=none)) if ch.name == "a2a-pushes"]
    expect(fine, "ok", "none given up in the last 7 days", None)
    assert "a2a-pushes" not in {ch.name for ch in run_checks(facts())}, "a daemon that does not say"
