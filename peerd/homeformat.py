"""The home's format outside the store, in `<home>/home-format`, stdlib only (read before
anything else at start-up, `boot.py`): a peerd refuses a home a newer release used, in one
sentence, and records the format once the store is open and migrated.
"""

from __future__ import annotations

from pathlib import Path

from peerd.errors import HomeNewer

# The home's layout outside the store (provider state, files beside it), in `<home>/home-format`.
# 1: the releases before the file (ee09e6e and earlier: scripted sessions at
# providers/script/<session>.json); 2: this one (also providers/script/threads/<thread>/, moved
# lazily: providers/script.py:adopt_session). Bump it when a release changes the home in a way an
# older peerd would misread; every release from 2 on refuses a home newer than itself, in one
# sentence, before it opens anything (the store's own schema version is checked as well:
# store/health.py, state "newer").
HOME_FORMAT = 2
HOME_FORMAT_FILE = "home-format"


def home_format(home: Path) -> int:
    """The home's recorded format: 1 without the file (a home of an older release, or a new one)."""
    try:
        raw = (home / HOME_FORMAT_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return 1
    return int(raw) if raw.isdigit() else HOME_FORMAT + 1  # unreadable: written by someone newer


def check_home_format(home: Path) -> None:
    """Refuse a home a newer peerd has used, before anything in it is opened."""
    found = home_format(home)
    if found > HOME_FORMAT:
        raise HomeNewer(
            f"{home} was last used by a newer peerd (home format {found}; this one knows "
            f"{HOME_FORMAT}): upgrade peerd, or start this one with another --home."
        )


def record_home_format(home: Path) -> None:
    """Say which format the home now has (after its store was opened and migrated here)."""
    if home_format(home) == HOME_FORMAT:
        return
    tmp = home / f".{HOME_FORMAT_FILE}.tmp"
    tmp.write_text(f"{HOME_FORMAT}\n", encoding="ascii")
    tmp.replace(home / HOME_FORMAT_FILE)
