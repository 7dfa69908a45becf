"""A unique start of an id stands for the whole id, for the person at this machine's CLI (pure).

`thr_3264` for a thread, `tsk_9a1c` for a task, `ap_5f0e` for an approval: the type prefix and at
least four hex digits. Only the owner's requests resolve a start (a link's caller names ids in
full, so an ambiguity's list never shows it something outside its fence). `chosen` decides from
the ids that start so: the one, or the id as given (which then answers not found as before), or
`AmbiguousId` naming up to `AMBIGUOUS_SHOWN` of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from peerd.errors import AmbiguousId

__all__ = ["AMBIGUOUS_SHOWN", "chosen", "is_short"]

AMBIGUOUS_SHOWN = 5  # ids an ambiguity names
_HEX_DIGITS = {"thr": 20, "tsk": 20, "ap": 16}  # store/ids.py's new_id, approvals/service.py
_START = re.compile(r"(thr|tsk|ap)_([0-9a-f]{4,})")


def is_short(given: str, kind: str) -> bool:
    """Whether `given` is a start of a `kind` id (`thr`, `tsk`, `ap`) shorter than a whole one."""
    match = _START.fullmatch(given)
    return match is not None and match.group(1) == kind and len(match.group(2)) < _HEX_DIGITS[kind]


def chosen(given: str, found: Sequence[str], what: str) -> str:
    """The id `given` stands for among `found` (the ids starting with it, at most
    `AMBIGUOUS_SHOWN + 1`): itself when whole or when none starts so, the only one, else
    `AmbiguousId`. `what`: the kind in the message ("thread", "task", "approval")."""
    if given in found or not found:
        return given
    if len(found) == 1:
        return found[0]
    more = ", ..." if len(found) > AMBIGUOUS_SHOWN else ""
    raise AmbiguousId(
        f"{given} is the start of more than one {what} here: {', '.join(found[:AMBIGUOUS_SHOWN])}{more}. "
        "Give more of the id."
    )
