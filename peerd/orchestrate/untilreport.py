"""`--until` in the report and the progress lines: the wait on the pull request while it is open,
and at the end the pull request's final state (URL, checks, review decision, merged or not) with
every fix attempt. Pure functions of the run as the API shows it (its `pr_wait` and `pr_fix`
receipts), called by `report.py`; the outcomes' words are the waits' own (`waits/machine.py`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from peerd.waits.machine import OUTCOME_WORDS

Info = Mapping[str, Any]


def _bodies(info: Info, kind: str) -> list[Mapping[str, Any]]:
    return [r["body"] for r in info.get("receipts") or [] if r["kind"] == kind]


def _at(ts: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(ts))) if isinstance(ts, int | float) else "--:--:--"


def _checks(checks: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{c['name']} {c['bucket']}" for c in checks) or "none reported"


def _packet_state(info: Info, packet_id: str) -> str:
    return next((p["state"] for p in info.get("packets") or [] if p["id"] == packet_id), "not started")


def section(info: Info) -> list[str]:
    """The report's last lines: the wait on the pull request (open), or its final state."""
    waits = _bodies(info, "pr_wait")
    if not waits:
        return []
    wait = waits[-1]
    url = wait.get("url") or wait.get("pr")
    merged = (wait.get("prState") or "").upper() == "MERGED"
    lines = [""]
    if wait.get("status") == "watching":
        polls = wait.get("polls", 0)
        head = f"pull request {url}: waiting until {wait['until']} (round {wait['round']}, {polls} poll(s)"
        if isinstance(wait.get("nextAt"), int | float) and wait.get("lastError"):
            head += f", next poll at {_at(wait['nextAt'])} after: {wait['lastError']}"
        lines.append(head + ")")
    else:
        ended = (
            "cancelled"
            if wait.get("status") == "cancelled"
            else OUTCOME_WORDS.get(wait.get("outcome") or "", "?")
        )
        lines.append(f"pull request {url}: waited until {wait['until']}: {ended}")
        if wait.get("detail"):
            lines.append(f"  {wait['detail']}")
    lines.append(f"  state: {wait.get('prState') or 'not read yet'}, merged: {'yes' if merged else 'no'}")
    lines.append(f"  checks: {_checks(wait.get('checks') or [])}")
    lines.append(f"  review decision: {wait.get('reviewDecision') or 'none'}")
    fixes = _bodies(info, "pr_fix")
    lines.append(f"  fix attempts: {len(fixes)}")
    for fix in fixes:
        why = (
            "checks failed: " + ", ".join(c["name"] for c in fix.get("failingChecks") or [])
            if fix["reason"] == "checks_failed"
            else "a review asked for changes"
        )
        packet = fix["packetId"]
        lines.append(
            f"    {fix['attempt']}. {why} -> packet {packet} ({_packet_state(info, packet)}), at {_at(fix.get('at'))}"
        )
    return lines


def progress(info: Info, seen: dict[str, Any]) -> list[str]:
    """A line each time the wait on the pull request says something new (updates `seen`)."""
    waits = _bodies(info, "pr_wait")
    if not waits:
        return []
    wait = waits[-1]
    key = (wait.get("round"), wait.get("status"), tuple(_checks(wait.get("checks") or []).split(", ")),
           wait.get("reviewDecision"), wait.get("lastError"))  # fmt: skip
    if seen.get("pr_wait") == key:
        return []
    seen["pr_wait"] = key
    what = (
        f"waiting until {wait['until']} (round {wait['round']})"
        if wait.get("status") == "watching"
        else (
            "cancelled"
            if wait.get("status") == "cancelled"
            else OUTCOME_WORDS.get(wait.get("outcome") or "", "ended")
        )
    )
    line = f"{_at(wait.get('at'))}  pull request {what}: checks {_checks(wait.get('checks') or [])}"
    if wait.get("reviewDecision"):
        line += f", review {wait['reviewDecision']}"
    if wait.get("lastError"):
        line += f" - {wait['lastError']}"
    return [line]


__all__ = ["progress", "section"]
