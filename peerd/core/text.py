"""Text rules, pure: paging long item text by character offset, and making peer-given text safe to
store and print.

Labels and titles come from peers (a client label at redemption, a box's label in its descriptor,
a thread title on a link launch) and end up in a person's terminal. `strip_controls` removes what a
terminal would act on: C0 and C1 control characters (ESC starts colour, cursor and title escape
sequences; CR and BS rewrite what is already shown), DEL, and the Unicode bidi embedding, override
and isolate marks that make text read differently from what it holds. Whole ANSI escape sequences
(CSI and OSC) go, not just their ESC, so `\\x1b[2J` does not leave `[2J` behind. Line breaks and
tabs become spaces in one-line text (labels, titles); multi-line text keeps `\\n` and `\\t`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["TextSlice", "clean_label", "has_controls", "path_segment", "slice_text", "strip_controls"]


@dataclass(frozen=True)
class TextSlice:
    text: str
    offset: int
    truncated: bool
    next_offset: int | None


def slice_text(text: str, *, offset: int, max_chars: int) -> TextSlice:
    """`max_chars` characters of `text` from `offset`; says where the next read starts."""
    offset = min(max(offset, 0), len(text))
    end = min(offset + max_chars, len(text))
    truncated = end < len(text)
    return TextSlice(text[offset:end], offset, truncated, end if truncated else None)


# ESC [ params final (CSI), ESC ] ... BEL or ESC \ (OSC), the 8-bit CSI/OSC introducers, and any
# other two-character ESC sequence. An unterminated OSC runs to the end of the text.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-_]?"
)
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_SPACES = "\t\n\r\v\f\x85\u2028\u2029"
_C0_C1_DEL = "".join(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)))
_CONTROLS = re.compile("[" + re.escape(_C0_C1_DEL + _BIDI + "\u2028\u2029") + "]")


def _replace(match: re.Match[str], multiline: bool) -> str:
    ch = match.group()
    if multiline and ch in "\n\t":
        return ch
    return " " if ch in _SPACES else ""


def strip_controls(text: str, *, multiline: bool = False) -> str:
    """`text` without escape sequences, control characters or bidi marks (see the module doc).

    One-line text (the default) gets a space for each line break or tab; `multiline=True` keeps
    `\\n` and `\\t` (a `\\r\\n` becomes `\\n`). Printable text, any script, is left as it is.
    """
    if multiline:
        text = text.replace("\r\n", "\n")
    text = _ESCAPES.sub("", text)
    return _CONTROLS.sub(lambda m: _replace(m, multiline), text)


def clean_label(text: str) -> str:
    """A peer-given label or title for storing and showing: one line, no controls, trimmed."""
    return strip_controls(text).strip()


def has_controls(text: str) -> bool:
    """Whether `strip_controls` would change one-line `text`."""
    return _CONTROLS.search(text) is not None


def path_segment(value: str) -> str:
    """`value` as one URL path segment: every reserved character escaped (`/`, `?`, `#`, `%`, ...),
    and a segment of dots too, which URL normalisation would otherwise resolve (`..` goes up)."""
    if value and set(value) <= {"."}:
        return "%2E" * len(value)
    return quote(value, safe="")
