"""The wire models of waits on a pull request: the agent tools' inputs (`wait_for_github`,
`list_waits`, `cancel_wait`), the owner API's queries and bodies, and `WaitInfo`, the one answer."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from peerd import contracts as c
from peerd.waits.machine import Outcome, Until, WaitStatus

MAX_PR_CHARS = 300
MAX_DAYS = 14.0
DEFAULT_HOURS = 24.0


def _pr_ref(value: str) -> str:
    """A pull request as gh takes it: a number, its URL, or its head branch (never an option)."""
    text = value.strip().removeprefix("#")
    if not text or text.startswith("-") or any(ch.isspace() or ord(ch) < 32 for ch in text):
        raise ValueError(
            f"pr {value!r} must be a pull request's number, URL or head branch (no spaces, not starting with '-')"
        )
    return text


class WaitFor(c.Input):
    """`wait_for_github`: wait for a pull request, then be woken in a new turn."""

    pr: str = Field(min_length=1, max_length=MAX_PR_CHARS)
    until: Until
    timeout_hours: float = Field(default=DEFAULT_HOURS, gt=0, le=MAX_DAYS * 24)
    client_request_id: str | None = c.ClientRequestId

    _check_pr = field_validator("pr")(classmethod(lambda cls, v: _pr_ref(v)))


class WaitCheck(c.Wire):
    name: str
    state: str
    bucket: str
    link: str | None = None


class WaitInfo(c.Wire):
    wait_id: str
    status: WaitStatus
    thread_id: str
    pr: str
    until: Until
    outcome: Outcome | None = None
    detail: str | None = None
    pr_url: str | None = None
    pr_state: str | None = None
    review_decision: str | None = None
    checks: list[WaitCheck] = Field(default_factory=list)
    polls: int = 0
    last_error: str | None = None
    next_poll_at: float | None = None
    woken_run_id: str | None = None
    deadline_at: float
    created_at: float
    ended_at: float | None = None


def _comma_list(value: Any) -> Any:
    """A query string's `a,b` (or a list of such) as a list of non-empty parts."""
    parts = value if isinstance(value, list) else [value]
    if not all(isinstance(p, str) for p in parts):
        return value
    return [x.strip() for p in parts for x in p.split(",") if x.strip()]


class WaitList(c.Input):
    """`list_waits` and `GET /v1/waits`: newest first; an agent sees its own thread's only."""

    thread_id: str | None = Field(default=None, min_length=1, max_length=64)
    status: Annotated[list[WaitStatus], BeforeValidator(_comma_list)] = Field(
        default_factory=list, max_length=3
    )
    limit: int = Field(default=c.PAGE_LIMIT, ge=1, le=c.PAGE_LIMIT)


class WaitCancel(c.Input):
    """`cancel_wait`: the wait ends `cancelled`; nobody is woken."""

    wait_id: str = Field(min_length=1, max_length=64)
    reason: str | None = Field(default=None, max_length=2000)


class WaitCancelBody(c.Input):
    reason: str | None = Field(default=None, max_length=2000)


class WaitPage(c.Wire):
    items: list[WaitInfo]
