"""The orchestration front's light half: the request the owner sends (`OrchestrateRequest`, the
body of `POST /v1/orchestrations`) and what the engine and the service are built from
(`FrontParts`). The routes and the daemon import this, not the engine: the engine and the service
load on first need (`orchestrate/lazy.py`, issue 33)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from peerd import contracts as c
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.operations import Operations
from peerd.orchestrate.models import PacketSpec, Until
from peerd.runtime.feed import ChangeFeed
from peerd.store.db import Database
from peerd.waits.pace import GhPace


class OrchestrateRequest(c.Input):
    task: str = Field(default="", max_length=c.MAX_PROMPT_CHARS)
    project_id: str = Field(min_length=1)
    coders: list[str] = Field(default_factory=list, max_length=20)
    concurrency: int = Field(default=3, ge=1, le=16)
    packet_timeout_s: float | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    plan: list[PacketSpec] | None = Field(default=None, max_length=100)
    verify: str | None = Field(default=None, max_length=4000)
    reviewer: str | None = None
    on: list[str] = Field(default_factory=list, max_length=10)
    non_interactive: bool = False
    allow_commands: list[str] = Field(default_factory=list)
    dry_run: bool = False
    # The user's work: a packet whose files are dirty in the checkout is refused, unless the run
    # starts from the working state (`include_dirty`).
    include_dirty: bool = False
    # Changes a packet's commit makes outside its files may be integrated (else it is held).
    allow_out_of_scope: bool = False
    serialize_overlaps: bool = False  # packets sharing files run one after the other
    keep: bool = False  # leave the worktrees and thread branches for a look
    push: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
    )
    pr: bool = False  # open a pull request (pushes to `push`, default origin)
    ready: bool = False  # the pull request is not a draft
    # After the pull request: wait on it, and send a fix packet when a check fails or a review asks
    # for changes (`until.py`, `prwait.py`). Only with `pr`.
    until: Until | None = None
    # Stop rules: the whole orchestration's (every run, the planner's too) and each packet's.
    budget: c.Budget | None = None
    packet_budget: c.Budget | None = None
    # The implementers' access level (reviewers and the planner stay read-only): approval-required
    # makes a person approve each of their commands and edits (peerd/approvals/).
    access: Literal["approval-required", "auto-accept-edits", "auto", "full-access"] = "auto"


@dataclass(frozen=True)
class FrontParts:
    """What the daemon gives orchestration: the engine and the service are built from this when
    they load (`orchestrate/service.py:build`)."""

    db: Database
    feed: ChangeFeed
    ops: Operations
    worktrees_dir: Path
    available: Callable[[], Awaitable[dict[str, bool]]]  # which providers can run here now
    approved: Callable[[str, str], Awaitable[bool]]  # is this custom command approved
    models: Mapping[str, str | None] = field(default_factory=dict)  # each provider's configured model
    custom_commands: Mapping[str, str] = field(default_factory=dict)  # custom provider -> its command
    clock: Clock = SYSTEM_CLOCK
    # One gh login's pace for every poller of a pull request here (the waits and `--until`), and
    # how often a pull request is polled.
    gh_pace: GhPace | None = None
    pr_poll_s: float | None = None
