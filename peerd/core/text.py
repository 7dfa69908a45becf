"""Paging long item text by character offset, pure."""

from __future__ import annotations

from dataclasses import dataclass


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
