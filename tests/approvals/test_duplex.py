"""The duplex shell around a CLI that asks its host: a real subprocess speaking JSON lines."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peerd.providers.cli import Launch
from peerd.providers.duplex import AskPerson, DuplexOutput, EndInput, Send, start_duplex
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk
from peerd.runtime.provider import ItemProduced, ProviderEvent, RunFinished
from tests.support.approvals import Gate

# A tiny "CLI": reads a prompt line, asks permission for a command, runs it only if allowed.
CLI = r"""
import json, sys
prompt = json.loads(sys.stdin.readline())
print(json.dumps({"ask": {"id": "q1", "command": prompt["text"]}}), flush=True)
answer = json.loads(sys.stdin.readline())
print(json.dumps({"said": "ran" if answer["allow"] else "refused: " + answer["why"]}), flush=True)
rest = sys.stdin.read()  # ends when the host closes stdin
print(json.dumps({"done": True, "rest": rest}), flush=True)
"""


class Driver:
    def __init__(self, prompt: str) -> None:
        self.prompt = prompt

    def opening(self) -> Sequence[DuplexOutput]:
        return [Send({"text": self.prompt})]

    def feed(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        if "ask" in line:
            ask = line["ask"]
            return [AskPerson(ApprovalAsk(key=ask["id"], kind="command", tool="sh", summary=ask["command"]))]
        if "said" in line:
            return [ItemProduced("assistant_message", line["said"]), EndInput()]
        return []

    def answered(self, key: str, answer: ApprovalAnswer) -> Sequence[DuplexOutput]:
        return [Send({"id": key, "allow": answer.allow, "why": answer.message})]

    def interrupting(self) -> Sequence[DuplexOutput]:
        return []

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        return RunFinished("completed" if exit_code == 0 else "failed", exit_code=exit_code)


async def _run(tmp_path: Path, gate: Gate) -> list[ProviderEvent]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    launch = Launch([sys.executable, "-c", CLI], {}, tmp_path, None, scratch)
    run = await start_duplex(launch, Driver("make test"), gate, cli="toy")
    return [event async for event in run.events()]


async def test_an_allowed_question_is_answered_and_the_cli_goes_on(tmp_path: Path) -> None:
    gate = Gate(allow=True, delay=0.2)
    events = await _run(tmp_path, gate)
    assert [a.summary for a in gate.asked] == ["make test"]
    assert ItemProduced("assistant_message", "ran") in events
    assert events[-1] == RunFinished("completed", exit_code=0)
    assert not (tmp_path / "scratch").exists()


async def test_a_denied_question_reaches_the_cli_with_its_reason(tmp_path: Path) -> None:
    events = await _run(tmp_path, Gate(allow=False, reason="not today"))
    assert ItemProduced("assistant_message", "refused: not today") in events
    assert isinstance(events[-1], RunFinished)


async def test_interrupt_while_a_person_decides_ends_the_run(tmp_path: Path) -> None:
    gate = Gate(allow=True, delay=60)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    launch = Launch([sys.executable, "-c", CLI], {}, tmp_path, None, scratch)
    run = await start_duplex(launch, Driver("sleep"), gate, cli="toy")
    seen: list[ProviderEvent] = []

    async def consume() -> None:
        async for event in run.events():
            seen.append(event)

    consumer = asyncio.create_task(consume())
    await asyncio.wait_for(gate.was_asked.wait(), 30)
    await run.interrupt()
    await asyncio.wait_for(consumer, 10)
    assert isinstance(seen[-1], RunFinished)
    assert not any(isinstance(e, ItemProduced) and e.text == "ran" for e in seen)
