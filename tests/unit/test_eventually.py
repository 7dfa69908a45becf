"""tests/support/eventually.py: what a test's wait returns, and what its failure says."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.eventually import eventually


async def test_it_returns_the_first_value_that_holds() -> None:
    seen = iter([0, 0, 3, 4])
    assert await eventually(lambda: next(seen), what="a count", every=0) == 3


async def test_an_async_probe_is_awaited_and_until_decides() -> None:
    calls: list[int] = []

    async def probe() -> dict[str, str]:
        calls.append(1)
        return {"status": "completed" if len(calls) == 3 else "running"}

    done = await eventually(probe, what="the run ended", until=lambda r: r["status"] == "completed", every=0)
    assert done == {"status": "completed"} and len(calls) == 3


async def test_a_failure_names_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as failed:
        await eventually(
            lambda: {"status": "running"},
            what="the task completed",
            until=lambda task: task["status"] == "completed",
            within=0.1,
            every=0.02,
        )
    message = str(failed.value)
    assert "not seen within 0.1 s: the task completed" in message
    assert "last seen: {'status': 'running'}" in message


async def test_ignored_errors_count_as_not_yet_and_are_quoted() -> None:
    def probe() -> int:
        raise FileNotFoundError("no socket yet")

    with pytest.raises(AssertionError) as failed:
        await eventually(probe, what="the socket", within=0.05, every=0.01, ignoring=(FileNotFoundError,))
    assert "FileNotFoundError('no socket yet')" in str(failed.value)
    with pytest.raises(KeyError):  # any other error is the test's
        await eventually(lambda: {}["x"], what="a key", within=1)


async def test_a_probe_still_running_at_the_deadline_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> bool:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return True

    with pytest.raises(AssertionError, match="the last check was still running"):
        await eventually(hangs, what="an answer", within=0.05)
    assert cancelled.is_set()
