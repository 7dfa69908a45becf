"""The fleet as the board and the needs-you queue read it, through the owner's API: every
environment's threads (this one and each linked one, through its link, each within
`FLEET_TIMEOUT_S`), the pending approvals (here and on the boxes for the work this machine started
there) and this machine's failed tasks; each thread a `board.Card` with what needs the person.
The rules are `peerd.console.board`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog

from peerd import contracts as c
from peerd.console.board import Card, last_change, needs_of
from peerd.console.owner import FLEET_TIMEOUT_S, Env, Owner
from peerd.errors import PeerdError

log = structlog.get_logger(__name__)

APPROVALS_READ = 500


@dataclass(frozen=True)
class Fleet:
    envs: list[Env]
    cards: list[Card]
    problems: list[tuple[Env, str]] = field(default_factory=list)  # environments not shown, and why
    pending_hash: str = ""  # the pending approvals' hash: the needs-you watcher long-polls on it

    @property
    def projects(self) -> list[str]:
        return sorted({card.project for card in self.cards})

    @property
    def providers(self) -> list[str]:
        return sorted({card.thread.provider for card in self.cards})

    @property
    def needs(self) -> list[Card]:
        """The cards with something waiting for the person, oldest wait first."""
        return sorted((x for x in self.cards if x.needs), key=lambda x: last_change(x.thread))

    @property
    def needs_count(self) -> int:
        return sum(len(card.needs) for card in self.cards)


async def _env_threads(api: Owner, env: Env) -> tuple[list[c.Project], list[c.Thread]]:
    projects, threads = await asyncio.wait_for(
        asyncio.gather(api.projects(env), api.all_threads(env)), FLEET_TIMEOUT_S
    )
    return projects, threads


async def pending_approvals(api: Owner) -> tuple[list[dict[str, object]], str]:
    data = await api.call("GET", "/v1/approvals", params={"limit": APPROVALS_READ})
    return list(data.get("items") or []), str(data.get("pendingHash") or "")


async def read_fleet(api: Owner) -> Fleet:
    envs = await api.envs()
    read = await asyncio.gather(*(_env_threads(api, env) for env in envs), return_exceptions=True)
    try:
        approvals, pending_hash = await pending_approvals(api)
    except PeerdError as exc:  # the board goes on without them, and says so
        approvals, pending_hash = [], ""
        problems_first = [(api.here, f"The pending approvals could not be read: {exc.code}: {exc.message}")]
    else:
        problems_first = []
    try:
        failed = (await api.tasks({"status": "failed", "limit": c.PAGE_LIMIT})).items
    except PeerdError:
        failed = []
    asked: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for view in approvals:
        if view.get("status") != "pending":
            continue
        where = str(view.get("environmentId") or api.here.env_id)
        asked.setdefault((where, str(view.get("threadId"))), []).append(
            (str(view.get("id")), str(view.get("summary") or view.get("tool") or ""))
        )
    try:  # waits on pull requests a review asked changes of (peerd/waits/)
        ended = (await api.call("GET", "/v1/waits", params={"status": "delivered", "limit": c.PAGE_LIMIT}))[
            "items"
        ]
    except PeerdError:
        ended = []
    reviews: dict[str, list[dict[str, Any]]] = {}
    for wait in ended:
        if wait.get("outcome") == "changes_requested":
            reviews.setdefault(str(wait.get("threadId")), []).append(wait)
    by_parent: dict[str, list[c.TaskInfo]] = {}
    for task in failed:
        by_parent.setdefault(task.parent_thread_id, []).append(task)
    cards: list[Card] = []
    problems: list[tuple[Env, str]] = list(problems_first)
    for env, answer in zip(envs, read, strict=True):
        if isinstance(answer, TimeoutError):
            problems.append((env, f"{env.label} did not answer within {FLEET_TIMEOUT_S:g} s."))
            continue
        if isinstance(answer, PeerdError):
            problems.append((env, f"{answer.code}: {answer.message}"))
            continue
        if isinstance(answer, Exception):  # an answer this console cannot read (a newer box?)
            log.warning("console.fleet_unreadable", env=env.env_id, error=type(answer).__name__)
            problems.append((env, f"{env.label}'s threads could not be read ({type(answer).__name__})."))
            continue
        if isinstance(answer, BaseException):
            raise answer
        projects, threads = answer
        names = {p.id: p.name for p in projects}
        for thread in threads:
            if thread.status == "archived":
                continue
            needs = needs_of(
                thread,
                approvals=asked.get((env.env_id, thread.id), ()),
                failed_tasks=by_parent.get(thread.id, ()) if env.local else (),
                reviews=reviews.get(thread.id, ()) if env.local else (),
            )
            cards.append(
                Card(
                    env.key,
                    env.env_id,
                    env.label,
                    names.get(thread.project_id, thread.project_id),
                    thread,
                    needs,
                )
            )
    return Fleet(envs, cards, problems, pending_hash)
