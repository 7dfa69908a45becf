"""The fault suite prints its table at the end of the session (also under `make test`'s subset)."""

from __future__ import annotations

import pytest

from tests.faults.harness import FULL, REPORT, SEED, TRIALS, table


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    mode = f"full matrix, {TRIALS} random kills, seed {SEED}" if FULL else "the short subset"
    terminalreporter.section(f"peerd fault suite ({mode})")
    for line in table(REPORT):
        terminalreporter.write_line(line)
