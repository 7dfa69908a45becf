"""How the checks say things: quoting, dates, who may read a file, lists."""

from __future__ import annotations

import shlex
import stat
from collections.abc import Sequence
from datetime import UTC, datetime

from peerd.doctor.facts import (
    DAY_S,
    FileKind,
)

# --- helpers ----------------------------------------------------------------------------------


def quoted(text: str) -> str:
    return shlex.quote(text)


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def days_text(seconds: float) -> str:
    days = seconds / DAY_S
    if days < 1:
        hours = max(1, round(seconds / 3600))
        return f"{hours} hour{'s' if hours != 1 else ''}"
    n = int(days)
    return f"{n} day{'s' if n != 1 else ''}"


KIND_WORDS: dict[FileKind, str] = {
    "dir": "directory",
    "file": "regular file",
    "socket": "socket",
    "other": "special file",
    "missing": "missing path",
}


def who_can(bits: int, *, is_dir: bool) -> str:
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
