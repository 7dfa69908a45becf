"""`peerd doctor`: what is wrong with this machine's peerd, and how to fix each thing.

The checks here are pure (one module per area: `files`, `network`, `system`; what they look at
is `facts`; how they say it, `text`): each takes facts gathered beforehand (file modes and owners, the
daemon's answers or why there were none, the certificate, `git --version`, read by
`peerd.runtime.git.parse_version`) and returns a `Check`
with a status, a one-line detail and, for a problem, the fix. `gather.py` gathers the facts and
`peerd/cli/doctor.py` prints the checks. Statuses: `ok`; `warn`, a problem that breaks nothing by itself;
`fail`, a problem to fix (the command exits 1); `skip`, not checked, the detail says why.
"""

from __future__ import annotations

from collections.abc import Sequence

from peerd.doctor.facts import (
    LABELS,
    CertFacts,
    Check,
    CheckStatus,
    ConfinementFacts,
    DaemonFacts,
    Facts,
    FileFacts,
    FileKind,
)
from peerd.doctor.files import (
    check_daemon,
    check_db_file,
    check_home,
    check_identity_dir,
    check_identity_key,
    check_socket,
    check_socket_dir,
    check_store,
    check_store_file,
)
from peerd.doctor.network import (
    check_certificate,
    check_console,
    check_link,
    check_links,
    check_listeners,
    check_provider,
    check_providers,
    check_pushes,
)
from peerd.doctor.system import check_confinement, check_git
from peerd.doctor.text import kind_of

__all__ = [
    "CertFacts",
    "Check",
    "CheckStatus",
    "ConfinementFacts",
    "DaemonFacts",
    "Facts",
    "FileFacts",
    "FileKind",
    "check_certificate",
    "check_confinement",
    "check_console",
    "check_daemon",
    "check_git",
    "check_link",
    "check_links",
    "check_listeners",
    "check_provider",
    "check_providers",
    "check_pushes",
    "kind_of",
    "passed",
    "render",
    "run_checks",
    "summary",
]

# --- all of them -------------------------------------------------------------------------------


def run_checks(facts: Facts) -> list[Check]:
    checks = [check_daemon(facts), check_home(facts)]
    socket_dir = check_socket_dir(facts)
    if socket_dir is not None:
        checks.append(socket_dir)
    checks.append(check_socket(facts))
    checks += [check_db_file(facts, f) for f in facts.db_files]
    store_file = check_store_file(facts)
    if store_file is not None:
        checks.append(store_file)
    store = check_store(facts)
    if store is not None:
        checks.append(store)
    checks += [
        check_identity_dir(facts),
        check_identity_key(facts),
        check_certificate(facts),
        check_listeners(facts),
    ]
    console = check_console(facts)
    if console is not None:
        checks.append(console)
    pushes = check_pushes(facts)
    if pushes is not None:
        checks.append(pushes)
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


COLOURS: dict[CheckStatus, str] = {"ok": "32", "warn": "33", "fail": "1;31", "skip": "2"}  # SGR codes


def render(checks: Sequence[Check], *, colour: bool = False) -> list[str]:
    """One line per check (`STATUS  name  detail`), an indented `fix:` line under each problem,
    then the summary. `colour`: the status in green, yellow, bold red or dim (a person's terminal)."""
    width = max((len(ch.name) for ch in checks), default=0)
    lines = []
    for ch in checks:
        label = f"{LABELS[ch.status]:<4}"
        if colour:
            label = f"\x1b[{COLOURS[ch.status]}m{label}\x1b[0m"
        lines.append(f"{label}  {ch.name.ljust(width)}  {ch.detail}".rstrip())
        if ch.fix and ch.status in ("warn", "fail"):
            lines.append(f"      fix: {ch.fix}")
        lines += [f"      {row}" for row in ch.table]
    lines.append("")
    lines.append(summary(checks))
    return lines
