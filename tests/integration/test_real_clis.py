"""The real Codex CLI, Claude Code and Gemini CLI run by peerd, offline against the fake model.

Each CLI is the pinned npm package; the fake model speaks its real wire dialect and follows a
script chosen by a marker in the conversation. These tests prove the provider contract end to
end: argv and sessions, stream parsing, the per-run MCP binding (`peerd mcp` started by the CLI
itself), wakes resuming the provider's own session, interrupts and the CLI's own errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from tests.fakemodel import FakeModel
from tests.helpers import (
    client_for,
    make_repo,
    processes_in,
    running_daemon,
    two_daemons,
    wait_terminal,
)
from tests.realcli import CLIS, CODEX_MODEL, fake_marker, offline_settings, secure_dir
from tests.support.realclis import (
    CHILD_VERDICT,
    cli_client,
    cli_daemon,
    cli_project,
    fake,
    launch,
)

__all__ = ["cli_client", "cli_daemon", "cli_project", "fake"]  # the fixtures (tests/support/realclis.py)


async def items_of(client: LocalClient, thread_id: str, run_id: str | None = None) -> list[dict[str, Any]]:
    data = await client.call("GET", f"/v1/threads/{thread_id}/items", params={"runId": run_id, "limit": 100})
    items: list[dict[str, Any]] = data["items"]
    return items


def replies(items: list[dict[str, Any]]) -> list[str]:
    return [i["text"] for i in items if i["kind"] == "assistant_message"]


@pytest.mark.parametrize("cli", CLIS)
async def test_a_run_replies(cli: str, cli_client: LocalClient, cli_project: dict[str, Any]) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('reply')} Say hello.")
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    items = await items_of(cli_client, launched["threadId"])
    assert done["status"] == "completed", items
    assert replies(items)[-1] == "Hello from the fake model."
    thread = await cli_client.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["providerSession"]  # the CLI's own session id, for later runs


# What peerd stores for one model request of the fake model (10 input tokens, 3 of them cached; 5
# output tokens, 2 of them reasoning), in each CLI's way of counting (peerd/core/usage.py): Claude
# counts cache reads apart from its input, Gemini its thoughts apart from its output, and only
# Claude Code reports a cost and its own duration.
EXPECTED_USAGE: dict[str, dict[str, Any]] = {
    "claude": {
        "inputTokens": 13,
        "cachedTokens": 3,
        "outputTokens": 5,
        "reasoningTokens": 0,
        "totalTokens": 18,
    },
    "codex": {
        "inputTokens": 10,
        "cachedTokens": 3,
        "outputTokens": 5,
        "reasoningTokens": 2,
        "totalTokens": 15,
    },
    "gemini": {
        "inputTokens": 10,
        "cachedTokens": 3,
        "outputTokens": 7,
        "reasoningTokens": 2,
        "totalTokens": 17,
    },
}


@pytest.mark.parametrize("cli", CLIS)
async def test_the_usage_the_cli_reports_is_stored_exactly(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('reply')} Say hello.")
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    assert done["status"] == "completed", await items_of(cli_client, launched["threadId"])
    thread = await cli_client.call("GET", f"/v1/threads/{launched['threadId']}")
    usage = thread["latestRun"]["usage"]
    assert {k: usage[k] for k in EXPECTED_USAGE[cli]} == EXPECTED_USAGE[cli]
    assert thread["usage"] == usage  # the thread's one run is its sum
    assert usage["wallMs"] > 0
    if cli == "claude":
        assert usage["costUsd"] > 0 and usage["providerMs"] > 0
    else:
        assert usage["costUsd"] is None
        assert (usage["providerMs"] is not None) == (cli == "gemini")


@pytest.mark.parametrize("cli", CLIS)
async def test_a_follow_up_runs_usage_is_its_own_not_the_sessions(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    """A resumed session's CLI may report the session's running total (Codex does): each run
    stores only what it spent, so the thread's sum counts every model request once."""
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('reply')} Say hello.")
    thread_id = launched["threadId"]
    assert (await wait_terminal(cli_client, thread_id, launched["runId"], total=90))["status"] == "completed"
    sent = await cli_client.call(
        "POST", f"/v1/threads/{thread_id}/runs", body={"text": f"{fake_marker('reply')} Again."}
    )
    done = await wait_terminal(cli_client, thread_id, sent["runId"], total=90)
    assert done["status"] == "completed", await items_of(cli_client, thread_id)
    thread = await cli_client.call("GET", f"/v1/threads/{thread_id}")
    usage = thread["latestRun"]["usage"]
    assert {k: usage[k] for k in EXPECTED_USAGE[cli]} == EXPECTED_USAGE[cli]
    assert thread["usage"]["totalTokens"] == 2 * EXPECTED_USAGE[cli]["totalTokens"]
    if cli == "claude":
        # Claude Code's `total_cost_usd` is the session's running total: each run stores its part
        # (the same one model request costs the same), and the thread's sum counts it twice, not thrice.
        first = thread["runUsage"][0]["usage"]
        assert usage["costUsd"] == pytest.approx(first["costUsd"]) and usage["costUsd"] > 0
        assert thread["usage"]["costUsd"] == pytest.approx(2 * first["costUsd"])


@pytest.mark.parametrize("cli", CLIS)
async def test_the_model_reads_peerds_tool_errors_and_hints(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    """Each CLI passes peerd's error sentence (code first) and a wait's hint on to its model: the
    fake model echoes what it received as the tool's result."""
    for marker, expected in (
        ("tool_error", "not_linked: This environment is not linked to no-such-box"),
        ("wait_hint", '"wait": true} to keep waiting, or end your turn'),
    ):
        launched = await launch(cli_client, cli_project, cli, f"{fake_marker(marker)} Try it.")
        done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
        items = await items_of(cli_client, launched["threadId"])
        assert done["status"] == "completed", items
        got = replies(items)[-1]
        assert got.startswith("Got: ") and "-32602" not in got, (marker, got)
        assert expected in got.replace('\\"', '"'), (marker, got)


@pytest.mark.parametrize("cli", CLIS)
async def test_an_agent_delegates_through_mcp_and_is_woken_in_the_same_session(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any], fake: FakeModel
) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('delegate')} Get this reviewed.")
    thread_id = launched["threadId"]
    first = await wait_terminal(cli_client, thread_id, launched["runId"], total=90)
    assert first["status"] == "completed", await items_of(cli_client, thread_id)
    first_items = await items_of(cli_client, thread_id, launched["runId"])
    calls = [i for i in first_items if i["kind"] == "tool_call" and "delegate_task" in i["text"]]
    assert calls, [(i["kind"], i["text"][:300]) for i in first_items]
    tasks = (await cli_client.call("GET", "/v1/tasks", params={"threadId": thread_id}))["items"]
    assert len(tasks) == 1 and tasks[0]["title"] == "review"
    assert tasks[0]["taskId"] in replies(first_items)[-1]  # the model saw the task id
    session = (await cli_client.call("GET", f"/v1/threads/{thread_id}"))["providerSession"]
    # The child finishes; the parent is woken with a new run of the same thread.
    wake_run = await next_run(cli_client, thread_id, after=launched["runId"])
    woken = await wait_terminal(cli_client, thread_id, wake_run, total=90)
    wake_items = await items_of(cli_client, thread_id, wake_run)
    assert woken["status"] == "completed", wake_items
    assert wake_items[0]["kind"] == "user_message" and "reached a terminal state" in wake_items[0]["text"]
    assert CHILD_VERDICT in replies(wake_items)[-1]
    after = (await cli_client.call("GET", f"/v1/threads/{thread_id}"))["providerSession"]
    assert after == session
    # The model's history on the wake held the first run's turns: the CLI resumed its session.
    wake_requests = [r for r in fake.requests if r["script"] == "delegate" and r["step"] >= 2]
    assert wake_requests, [(r["script"], r["step"]) for r in fake.requests]


async def next_run(client: LocalClient, thread_id: str, *, after: str, total: float = 120) -> str:
    """The id of the thread's run after `after` (a wake), once it exists."""
    cursor = 0
    deadline = asyncio.get_running_loop().time() + total
    while True:
        latest = (await client.call("GET", f"/v1/threads/{thread_id}"))["latestRun"]
        if latest and latest["id"] != after:
            run_id: str = latest["id"]
            return run_id
        assert asyncio.get_running_loop().time() < deadline, latest
        events = await client.call(
            "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 5}
        )
        cursor = events["nextCursor"]


@pytest.mark.parametrize("cli", CLIS)
async def test_an_interrupt_mid_run_stops_the_cli_and_its_group(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any], fake: FakeModel
) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('hang')} Think hard.")
    assert await asyncio.to_thread(fake.wait_held, 1, 60.0), "the CLI never reached the model"
    assert processes_in(launched["worktreePath"])  # the CLI is running there
    await cli_client.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=60)
    assert done["status"] == "interrupted"
    assert processes_in(launched["worktreePath"]) == []  # nothing of the run survived
    assert await asyncio.to_thread(fake.wait_released, 10.0)  # its model request was abandoned


@pytest.mark.parametrize("cli", CLIS)
async def test_a_cli_error_fails_the_run_with_its_message(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('error')} Do it.")
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    assert done["status"] == "failed"
    run = (await cli_client.call("GET", f"/v1/threads/{launched['threadId']}"))["latestRun"]
    assert "this request was rejected (xyz)" in (run["reason"] or ""), run


@pytest.mark.parametrize("cli", [c for c in CLIS if c != "codex"])
async def test_a_model_server_that_keeps_failing_fails_the_run_soon(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any], fake: FakeModel
) -> None:
    """`model_retries` (default 2) bounds the CLI's own retries: the run fails, with the server's
    reason, instead of staying "running" for minutes. (The bound here is liveness, not speed.)"""
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('server_down')} Do it.")
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=30)
    assert done["terminal"] and done["status"] == "failed", done
    attempts = [r for r in fake.requests if r["script"] == "server_down"]
    assert 1 <= len(attempts) <= 3 + 2, len(attempts)  # 3 attempts (a CLI may add a side request)


async def test_codex_retrying_a_failing_model_server_is_stopped_at_model_retries(
    tmp_path: Path, fake: FakeModel
) -> None:
    """Codex's own retries cannot be bounded per run for its built-in providers (request and stream
    retries multiply: 36 requests, ~45 s here with 5 of each); peerd counts its failed attempts and
    stops it after `model_retries` (2), with the reason."""
    settings = offline_settings(tmp_path / "clis", fake)
    codex = settings.providers["codex"]
    args = [
        a.replace(
            "request_max_retries=0, stream_max_retries=0", "request_max_retries=1, stream_max_retries=9"
        )
        for a in codex.args
    ]
    assert args != codex.args, "the harness's Codex provider line changed: update this test"
    settings.providers["codex"] = codex.model_copy(update={"args": args, "model_retries": 2})
    with secure_dir() as home:
        async with running_daemon(home, settings=settings) as daemon, client_for(daemon.paths.home) as client:
            project = await client.call(
                "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))}
            )
            launched = await launch(client, project, "codex", f"{fake_marker('server_down')} Do it.")
            done = await wait_terminal(client, launched["threadId"], launched["runId"], total=60)
            assert done["terminal"] and done["status"] == "failed", done
            run = (await client.call("GET", f"/v1/threads/{launched['threadId']}"))["latestRun"]
    assert "failed 3 attempts in a row (model_retries = 2)" in (run["reason"] or ""), run
    attempts = [r for r in fake.requests if r["script"] == "server_down"]
    # 3 stream attempts of at most 2 requests each; Codex would have gone on to 20.
    assert 3 <= len(attempts) <= 6 + 1, len(attempts)


async def test_claude_delegates_a_review_to_codex_on_a_linked_box(tmp_path: Path) -> None:
    reviewer_reply = "VERDICT from codex on the box: approve, no issues in README.md"
    scripts = {
        "lead": {
            "steps": [
                {
                    "tool_call": {
                        "server": "peerd",
                        "tool": "delegate_task",
                        "arguments": {
                            "task": f"{fake_marker('reviewer')} Review the README change.",
                            "role": "review",
                            "target": {
                                "environmentId": "{var:box}",
                                "provider": "codex",
                                "model": CODEX_MODEL,
                            },
                            "clientRequestId": "review-on-box",
                        },
                    }
                },
                {"text": "Sent the review to the box. {tool_result}"},
                {
                    "tool_call": {
                        "server": "peerd",
                        "tool": "task_status",
                        "arguments": {"taskId": "{tool_result.taskId}"},
                    }
                },
                {"text": "The box says: {tool_result}"},
            ],
            "fallback_text": "side request",
        },
        "reviewer": {"steps": [{"text": reviewer_reply}]},
    }
    with FakeModel(scripts, log_path=tmp_path / "model.jsonl") as fake:
        settings = offline_settings(tmp_path / "clis", fake)
        with secure_dir() as homes:
            async with two_daemons(homes, settings=settings, laptop_watch_chunk_s=2.0) as pair:
                await pair.link("auto")
                for client in (pair.lc, pair.bc):
                    repo = make_repo(tmp_path / f"repo-{id(client)}")
                    await client.call("POST", "/v1/projects", body={"path": str(repo)})
                fake.variables["box"] = pair.box_id
                projects = (await pair.lc.call("GET", "/v1/projects"))["items"]
                launched = await launch(
                    pair.lc, projects[0], "claude", f"{fake_marker('lead')} Get a review."
                )
                first = await wait_terminal(pair.lc, launched["threadId"], launched["runId"], total=90)
                assert first["status"] == "completed", await items_of(pair.lc, launched["threadId"])
                wake_run = await next_run(pair.lc, launched["threadId"], after=launched["runId"])
                woken = await wait_terminal(pair.lc, launched["threadId"], wake_run, total=90)
                wake_items = await items_of(pair.lc, launched["threadId"], wake_run)
                assert woken["status"] == "completed", wake_items
                assert reviewer_reply in replies(wake_items)[-1]
                # The review ran as a codex thread on the box, started through the link.
                box_threads = (await pair.bc.call("GET", "/v1/threads"))["items"]
                assert [t["provider"] for t in box_threads] == ["codex"]
                assert pair.laptop.identity is not None
                lineage = box_threads[0]["delegatedFrom"]
                assert lineage["environmentId"] == pair.laptop.identity.env_id
                assert lineage["threadId"] == launched["threadId"]


@pytest.mark.parametrize("cli", CLIS)
async def test_the_agent_edits_its_checkout_with_its_own_tools(
    cli: str, cli_client: LocalClient, cli_project: dict[str, Any], fake: FakeModel
) -> None:
    fake.variables["repo"] = cli_project["path"]
    body = {
        "projectId": cli_project["id"],
        "prompt": f"{fake_marker('edit')} Write the notes.",
        "provider": cli,
        "runtimeMode": "auto",
        "inPlace": True,
    }
    launched = await cli_client.call("POST", "/v1/threads", body=body)
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    items = await items_of(cli_client, launched["threadId"])
    assert done["status"] == "completed", [(i["kind"], i["text"][:300]) for i in items]
    assert (Path(cli_project["path"]) / "NOTES.md").read_text() == "edited by the agent\n"
    assert any(i["kind"] == "file_change" and "NOTES.md" in i["text"] for i in items), items
    assert replies(items)[-1] == "Wrote NOTES.md."


async def test_a_claude_run_whose_tools_were_denied_is_not_a_clean_success(
    cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    # auto-accept-edits: edits yes, shell commands no; Claude Code denies the Bash call itself.
    body = {
        "projectId": cli_project["id"],
        "prompt": f"{fake_marker('shell')} Run it.",
        "provider": "claude",
        "runtimeMode": "auto-accept-edits",
    }
    launched = await cli_client.call("POST", "/v1/threads", body=body)
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    run = (await cli_client.call("GET", f"/v1/threads/{launched['threadId']}"))["latestRun"]
    assert done["status"] == "failed"
    assert "denied" in run["reason"] and "Bash" in run["reason"], run
    assert not (Path(launched["worktreePath"]) / "shell-ran.txt").exists()
    items = await items_of(cli_client, launched["threadId"])
    assert replies(items)[-1] == "Tried the shell."  # the reply is kept for whoever reads it
