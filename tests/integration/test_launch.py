"""Thread launches against a real daemon: worktrees, items, idempotency, paging."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, ProviderConfig
from peerd.errors import IdempotencyKeyReused, PeerdError
from tests.helpers import client_for, git, make_repo, running_daemon, script, wait_terminal


async def launch(client: LocalClient, project: dict[str, Any], prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"projectId": project["id"], "prompt": prompt, **extra}
    result: dict[str, Any] = await client.call("POST", "/v1/threads", body=body)
    return result


async def test_scripted_thread_edits_a_file_in_its_own_worktree(
    client: LocalClient, project: dict[str, Any], repo: Path
) -> None:
    prompt = script({"write": {"path": "notes.txt", "content": "hello\n"}}, {"reply": "wrote notes.txt"})
    launched = await launch(client, project, prompt)
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    assert done["status"] == "completed"

    worktree = Path(launched["worktreePath"])
    assert (worktree / "notes.txt").read_text() == "hello\n"
    assert not (repo / "notes.txt").exists(), "the project checkout itself stays untouched"
    assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"peerd/{launched['threadId']}"

    read = await client.call("GET", f"/v1/threads/{launched['threadId']}/items")
    kinds = [i["kind"] for i in read["items"]]
    assert kinds == ["user_message", "file_change", "assistant_message"]
    assert all(i["runId"] == launched["runId"] for i in read["items"])
    assert read["items"][-1]["text"] == "wrote notes.txt"


async def test_same_key_same_caller_returns_the_same_thread(
    client: LocalClient, project: dict[str, Any]
) -> None:
    prompt = script({"reply": "once"})
    first = await launch(client, project, prompt, clientRequestId="k-1")
    again = await launch(client, project, prompt, clientRequestId="k-1")
    assert again["threadId"] == first["threadId"]
    assert again["runId"] == first["runId"]
    assert again["replayed"] is True and first["replayed"] is False
    threads = await client.call("GET", "/v1/threads")
    assert [t["id"] for t in threads["items"]] == [first["threadId"]]


async def test_a_different_key_is_a_new_thread(client: LocalClient, project: dict[str, Any]) -> None:
    prompt = script({"reply": "x"})
    first = await launch(client, project, prompt, clientRequestId="k-1")
    second = await launch(client, project, prompt, clientRequestId="k-2")
    assert first["threadId"] != second["threadId"]


async def test_reused_key_with_another_body_is_refused_and_changes_nothing(
    client: LocalClient, project: dict[str, Any]
) -> None:
    await launch(client, project, script({"reply": "x"}), clientRequestId="k-1")
    with pytest.raises(IdempotencyKeyReused) as err:
        await launch(client, project, script({"reply": "something else"}), clientRequestId="k-1")
    assert "k-1" in err.value.message
    threads = await client.call("GET", "/v1/threads")
    assert len(threads["items"]) == 1


async def test_concurrent_retries_make_one_thread(client: LocalClient, project: dict[str, Any]) -> None:
    prompt = script({"reply": "x"})
    results = await asyncio.gather(
        *(launch(client, project, prompt, clientRequestId="storm") for _ in range(20))
    )
    assert len({r["threadId"] for r in results}) == 1
    assert sum(not r["replayed"] for r in results) == 1
    threads = await client.call("GET", "/v1/threads")
    assert len(threads["items"]) == 1


async def test_a_45000_character_reply_reads_whole_in_pages(
    client: LocalClient, project: dict[str, Any]
) -> None:
    launched = await launch(client, project, script({"reply_repeat": {"text": "abcde", "times": 9000}}))
    await wait_terminal(client, launched["threadId"], launched["runId"])
    thread_id = launched["threadId"]
    read = await client.call("GET", f"/v1/threads/{thread_id}/items")
    reply = read["items"][-1]
    assert reply["kind"] == "assistant_message"
    assert reply["textLength"] == 45_000
    assert reply["textTruncated"] is True and len(reply["text"]) == 20_000
    text, part = reply["text"], reply
    pages = 1
    while part.get("textTruncated", False):  # default-valued fields are left out of item pages
        more = await client.call(
            "GET",
            f"/v1/threads/{thread_id}/items",
            params={"itemId": reply["id"], "textOffset": part["nextTextOffset"]},
        )
        part = more["items"][0]
        text += part["text"]
        pages += 1
    assert text == "abcde" * 9000
    assert pages == 3


async def test_items_page_by_position(client: LocalClient, project: dict[str, Any]) -> None:
    steps = [{"reply": f"line {i}"} for i in range(5)]
    launched = await launch(client, project, script(*steps))
    await wait_terminal(client, launched["threadId"], launched["runId"])
    thread_id = launched["threadId"]
    seen: list[int] = []
    after = None
    while True:
        params = {"limit": 2, **({"afterPosition": after} if after is not None else {})}
        page = await client.call("GET", f"/v1/threads/{thread_id}/items", params=params)
        seen.extend(i["position"] for i in page["items"])
        if not page["hasMore"]:
            break
        after = page["nextPosition"]
    assert seen == list(range(6))


async def test_a_provider_that_is_not_installed_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    settings = Config(providers={"gemini": ProviderConfig(binary="no-such-gemini-binary")})
    async with running_daemon(tmp_path / "home", settings=settings) as d, client_for(d.paths.home) as client:
        repo = make_repo(tmp_path / "r")
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        with pytest.raises(PeerdError) as refused:
            await client.call(
                "POST", "/v1/threads", body={"projectId": project["id"], "prompt": "x", "provider": "gemini"}
            )
        assert refused.value.code == "provider_unavailable"
        assert "installed here: " in refused.value.message and "gemini," not in refused.value.message
        assert (await client.call("GET", "/v1/threads"))["items"] == []
        assert not (d.paths.worktrees).exists() or not any(d.paths.worktrees.rglob("*"))
