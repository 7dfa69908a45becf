"""The daemon's in-process events: the notifications between parts that would otherwise need each
other before they exist (pure: no I/O, no clock, no task of its own).

Each event is a frozen dataclass that says what happened, in the past tense. The composition root
(`peerd/daemon.py`) makes one `Events` hub, hands it to the constructors of the parts that publish,
and subscribes the parts that listen, all in one place (`Daemon._subscribe`). A publisher knows
nothing of who listens.

`publish` awaits every handler of the event's type, in the order they subscribed, in the
publisher's task: the publisher goes on only once they are done, exactly as when it awaited a
hook of its own, and a handler's exception reaches the publisher (the handlers after it are not
called). A handler may be a plain function (called) or an async one (awaited). So an event is not
fire-and-forget: a publisher that must not wait publishes from a task of its own (the run
manager's `RunEnded`, the follower's `CapacityReported`), and one that must not fail catches
(the peer client's `PeerAnswered`).

What is *asked* (a value returned, a refusal raised that the caller depends on) is not an event:
such a collaborator is given to the constructor (e.g. `Operations(before_send=...)`, the run
manager's `RunApprovals`, `FeedHub(capacity=...)`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from peerd.contracts import Capacity


@dataclass(frozen=True)
class Event:
    """The base of every event (`Events.publish` takes only these)."""


@dataclass(frozen=True)
class RunEnded(Event):
    """A run here ended (its end is recorded): local tasks whose child this thread is may settle.
    Published by `RunManager` from a task of its own; `Delegation.on_run_end` listens."""

    thread_id: str


@dataclass(frozen=True)
class RunStarting(Event):
    """A run here is about to start its agent: the agent will soon ask for the MCP tools.
    Published by `RunManager`; the daemon's `McpService.warm` listens (the SDK loads on first need,
    not at start: an idle daemon stays lean)."""

    thread_id: str


@dataclass(frozen=True)
class RunQueued(Event):
    """A run was queued outside the run manager (an owed approval's continuation): start it if
    the thread's queue flows. Published by the approvals; `RunManager.kick` listens."""

    thread_id: str


@dataclass(frozen=True)
class ThreadStopped(Event):
    """A person's (or a revoked link's) Stop of a thread: the tasks it delegated stop with it.
    Published by `Operations`; `Delegation.stop_children` listens."""

    thread_id: str
    reason: str | None


@dataclass(frozen=True)
class ThreadArchived(Event):
    """A thread was archived here: its waits on pull requests end (nobody is left to wake).
    Published by `Operations.thread_archive`; `Waits.cancel_for_thread` listens."""

    thread_id: str


@dataclass(frozen=True)
class RemoteTaskChanged(Event):
    """A remote task was recorded or changed here (`task_id`), or, without one, the link's work as
    a whole: its follower starts or re-reads it. Published by `Delegation`; `FollowerPool.notify`
    listens."""

    env_id: str
    task_id: str | None = None


@dataclass(frozen=True)
class LinkForgotten(Event):
    """A link was forgotten here (`peerd environment unlink`): its follower ends the link's open
    tasks now. Published by `LinkService`; `FollowerPool.notify` listens."""

    env_id: str


@dataclass(frozen=True)
class ClientRevoked(Event):
    """Box side: a link client was revoked here: its open long-polls end now, not at their
    timeout. Published by `LinkService`; `FeedHub.client_revoked` listens."""

    client_id: str


@dataclass(frozen=True)
class PeerAnswered(Event):
    """A linked box answered a call (a call, a token refresh, a probe): its follower's backoff is
    over. Published by `PeerClient` (a handler's failure is logged, never the call's);
    `FollowerPool.answered` listens."""

    env_id: str


@dataclass(frozen=True)
class LinkChecked(Event):
    """A live check of a link was answered (`GET /v1/link`, its body as sent): the box's capacity
    report. Published by `LinkService`; `Placement.link_answered` listens."""

    env_id: str
    answer: object


@dataclass(frozen=True)
class CapacityReported(Event):
    """A change-feed answer brought the box's capacity report. Published by the follower from a
    task of its own; `Placement.keep_from_feed` listens."""

    env_id: str
    capacity: Capacity


E = TypeVar("E", bound=Event)
Handler = Callable[[E], Awaitable[None] | None]


class Events:
    """The hub: handlers by event type, called in the order they subscribed."""

    def __init__(self) -> None:
        self._handlers: dict[type[Event], list[Callable[[Any], Awaitable[None] | None]]] = {}

    def subscribe(self, kind: type[E], handler: Handler[E]) -> None:
        self._handlers.setdefault(kind, []).append(handler)

    def subscribers(self, kind: type[Event]) -> int:
        return len(self._handlers.get(kind, ()))

    async def publish(self, event: Event) -> None:
        """Call every handler of exactly this event's type, in order, awaiting each."""
        for handler in tuple(self._handlers.get(type(event), ())):
            result = handler(event)
            if inspect.isawaitable(result):
                await result


__all__ = [
    "CapacityReported",
    "ClientRevoked",
    "Event",
    "Events",
    "LinkChecked",
    "LinkForgotten",
    "PeerAnswered",
    "RemoteTaskChanged",
    "RunEnded",
    "RunQueued",
    "RunStarting",
    "ThreadArchived",
    "ThreadStopped",
]
