"""What the approval tests share: a person in a test (`Gate`), running a provider to its end, what
the model said and read, launching a run that asks (here, or on a linked box), and waiting for a
daemon's pending approvals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.providers.coders import CoderProvider
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk
from peerd.runtime.provider import ItemProduced, ProviderEvent, RunSpec
from tests.fakemodel import FakeModel
from tests.helpers import Pair, make_repo
from tests.support.eventually import eventually

Json = dict[str, Any]


class Gate:
    """A person in a test: answers each question with `allow` (and `reason`), after `delay`
    seconds and once `hold` is set (when given); remembers each question (`was_asked` is set at the
    first)."""

    def __init__(
        self, allow: bool, reason: str = "", *, hold: asyncio.Event | None = None, delay: float = 0.0
    ) -> None:
        self.allow, self.reason, self.hold, self.delay = allow, reason, hold, delay
        self.asked: list[ApprovalAsk] = []
        self.was_asked = asyncio.Event()  # set at the first question

    async def ask(self, ask: ApprovalAsk) -> ApprovalAnswer:
        self.asked.append(ask)
        self.was_asked.set()
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


async def pending_approvals(client: LocalClient, count: int = 1, *, seconds: float = 15) -> list[Json]:
    """Until `client`'s daemon lists at least `count` pending approvals: the list."""
    page = await eventually(
        lambda: client.call("GET", "/v1/approvals"),
        what=f"at least {count} pending approval(s)",
        until=lambda page: len(page["items"]) >= count,
        within=seconds,
    )
    return list(page["items"])


async def new_approval(client: LocalClient, known: set[str], *, seconds: float = 20) -> Json:
    """The first pending approval not in `known` (which it is added to)."""

    async def unknown() -> Json | None:
        page = await client.call("GET", "/v1/approvals")
        return next((dict(a) for a in page["items"] if a["id"] not in known), None)

    found = await eventually(unknown, what=f"a pending approval other than {sorted(known)}", within=seconds)
    known.add(found["id"])
    return found


async def set_up(tmp_path: Path, pair: Pair, access: str = "approval-required") -> Json:
    repo = make_repo(tmp_path / "box-repo")
    await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    await pair.link(access)
    projects = await pair.lc.call("GET", "/v1/projects", params={"environmentId": pair.box_id})
    return dict(projects["items"][0])


async def launch_on_box(pair: Pair, project: Json, prompt: str) -> Json:
    body = {"projectId": project["id"], "prompt": prompt, "environmentId": pair.box_id}
    launched: Json = await pair.lc.call("POST", "/v1/threads", body=body)
    return launched


async def launch(client: LocalClient, project: Json, prompt: str) -> Json:
    body = {"projectId": project["id"], "prompt": prompt, "runtimeMode": "approval-required", "inPlace": True}
    result: Json = await client.call("POST", "/v1/threads", body=body)
    return result
