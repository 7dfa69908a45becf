"""A link's status on the laptop, pure: what the box's answer (or its silence) makes of it.

    reachable <──> unreachable, version_skew     any answer, or none
    any of these ── refresh refused "expired" ──> expired   (final)
    any of these ── refused otherwise ──────────> revoked   (final)

`revoked` and `expired` are final: a call that started before the link was revoked and is answered
after it (a late 200, a late timeout) must not make it `reachable` again, nor may an `expired` be
turned `revoked` (the first reason stays). Only a new link (`peerd link`) replaces a final one.
The store applies the same rule in its one UPDATE of the status (`store/links.py:record_outcome`,
`WHERE status NOT IN FINAL`), so two writers racing each other cannot break it either.
"""

from __future__ import annotations

from typing import Literal

# version_skew: the box answers, but runs a peerd too old for what this one needs (update it there).
LinkStatus = Literal["reachable", "unreachable", "expired", "revoked", "version_skew"]

LinkEvent = Literal[
    "answered",  # the box answered as the linked environment (a call, a probe, a clock_skew refusal)
    "answered_older",  # ... at a protocol revision older than this peerd needs (peer/skew.py)
    "no_answer",  # no address answered as the box (connection error, timeout, 5xx, wrong pin)
    "refused_expired",  # the box refused the refresh: expired, and this machine's clock agrees
    "refused",  # the box refused the link otherwise: revoked, reused or unknown; 401 after a refresh
]

# Ordered: the store names them in this order (`store/sqltext.py:sql_list`).
FINAL: tuple[LinkStatus, ...] = ("expired", "revoked")

LEADS_TO: dict[LinkEvent, LinkStatus] = {
    "answered": "reachable",
    "answered_older": "version_skew",
    "no_answer": "unreachable",
    "refused_expired": "expired",
    "refused": "revoked",
}


def is_final(status: LinkStatus) -> bool:
    return status in FINAL


def next_status(current: LinkStatus, event: LinkEvent) -> LinkStatus:
    """The status after `event`: where the event leads, unless the link already ended."""
    return current if is_final(current) else LEADS_TO[event]
