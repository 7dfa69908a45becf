"""What the real-CLI approval tests share: a person in a test (`Gate`), running a provider to its
end, what the model said and read, and waiting for a daemon's pending approvals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.approvals.gate import ApprovalAnswer, ApprovalAsk
from peerd.providers.base import ItemProduced, ProviderEvent, RunSpec
from peerd.providers.coders import CoderProvider
from tests.fakemodel import FakeModel


class Gate:
    """A person in a test: answers each question with `allow` (and `reason`), after `delay`
    seconds and once `hold` is set (when given); remembers each question."""

    def __init__(
        self, allow: bool, reason: str = "", *, hold: asyncio.Event | None = None, delay: float = 0.0
    ) -> None:
        self.allow, self.reason, self.hold, self.delay = allow, reason, hold, delay
        self.asked: list[ApprovalAsk] = []

    async def ask(self, ask: ApprovalAsk) -> ApprovalAnswer:
        self.asked.append(ask)
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(self.delay)
        return ApprovalAnswer(self.allow, self.reason)


async def run_to_end(provider: CoderProvider, spec: RunSpec, *, seconds: float = 60) -> list[ProviderEvent]:
    run = await provider.start(spec)
    async with asyncio.timeout(seconds):
        return [event async for event in run.events()]


def replies(events: list[ProviderEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, ItemProduced) and e.kind == "assistant_message"]


def model_saw(fake: FakeModel, text: str) -> bool:
    """Whether a request to the model after the first carried `text` (a tool result it read)."""
    return any(text in json.dumps(r["body"]) for r in fake.requests[1:])


async def pending_approvals(client: LocalClient, *, seconds: float = 30) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        page = await client.call("GET", "/v1/approvals")
        if page["items"]:
            return list(page["items"])
        await asyncio.sleep(0.1)
    raise AssertionError(f"no pending approval after {seconds} s")
