"""A daemon whose providers are the real coder CLIs, run offline against the scripted fake model
(the fixtures `fake`, `cli_daemon`, `cli_client`, `cli_project`), the scripts that model answers,
and launching a run of one CLI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from tests.fakemodel import FakeModel
from tests.helpers import client_for, make_repo, running_daemon, script
from tests.realcli import offline_settings, secure_dir

ADD_NOTES_PATCH = "*** Begin Patch\n*** Add File: NOTES.md\n+edited by the agent\n*** End Patch\n"
CHILD_VERDICT = "VERDICT: approve (checked by the child)"
SCRIPTS: dict[str, dict[str, Any]] = {
    "reply": {"steps": [{"text": "Hello from the fake model."}]},
    "delegate": {
        "steps": [
            {
                "tool_call": {
                    "server": "peerd",
                    "tool": "delegate_task",
                    "arguments": {
                        "task": script({"reply": CHILD_VERDICT}),
                        "title": "review",
                        "role": "review",
                        "target": {"provider": "script"},
                        "clientRequestId": "review-1",
                    },
                }
            },
            {"text": "Delegated; waiting to be woken. {tool_result}"},
            # Woken: read the result, as the wake message says, then answer with it.
            {
                "tool_call": {
                    "server": "peerd",
                    "tool": "task_status",
                    "arguments": {"taskId": "{tool_result.taskId}"},
                }
            },
            {"text": "Woken with: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "hang": {"steps": [{"hang": True}]},
    # What each CLI hands its model from peerd: a tool error, and a wait that ended first.
    "tool_error": {
        "steps": [
            {
                "tool_call": {
                    "server": "peerd",
                    "tool": "delegate_task",
                    "arguments": {"task": "x", "target": {"environmentId": "no-such-box"}},
                }
            },
            {"text": "Got: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "wait_hint": {
        "steps": [
            {
                "tool_call": {
                    "server": "peerd",
                    "tool": "delegate_task",
                    "arguments": {
                        "task": script({"wait": 20}),
                        "target": {"provider": "script"},
                        "mode": "wait",
                        "timeoutMs": 200,
                    },
                }
            },
            {"text": "Got: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    # Each CLI's own file-writing tool, on a checkout whose path the test sets as {var:repo}.
    "edit": {
        "steps": [
            {
                "per_dialect": {
                    "anthropic": {
                        "tool_call": {
                            "name": "Write",
                            "arguments": {
                                "file_path": "{var:repo}/NOTES.md",
                                "content": "edited by the agent\n",
                            },
                        }
                    },
                    "responses": {
                        "tool_call": {
                            "name": "apply_patch",
                            "arguments": {"input": ADD_NOTES_PATCH},
                        }
                    },
                    "gemini": {
                        "tool_call": {
                            "name": "write_file",
                            "arguments": {
                                "file_path": "{var:repo}/NOTES.md",
                                "content": "edited by the agent\n",
                            },
                        }
                    },
                }
            },
            {"text": "Wrote NOTES.md."},
        ],
        "fallback_text": "side request",
    },
    "shell": {
        "steps": [
            {
                "tool_call": {
                    "name": "Bash",
                    "arguments": {
                        "command": "python3 -c \"open('shell-ran.txt', 'w')\"",
                        "description": "run",
                    },
                }
            },
            {"text": "Tried the shell."},
        ],
        "fallback_text": "side request",
    },
    "error": {
        "steps": [{"error": {"status": 400, "message": "FAKE-MODEL: this request was rejected (xyz)"}}]
    },
    # A model server that keeps failing: every attempt gets a 500.
    "server_down": {"steps": [{"error": {"status": 500, "message": "FAKE-MODEL: internal error (down)"}}]},
}


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    with FakeModel(SCRIPTS, log_path=tmp_path / "model-requests.jsonl") as model:
        yield model


@pytest.fixture
async def cli_daemon(tmp_path: Path, fake: FakeModel) -> AsyncIterator[Daemon]:
    settings = offline_settings(tmp_path / "clis", fake)
    with secure_dir() as home:
        async with running_daemon(home, settings=settings) as daemon:
            yield daemon


@pytest.fixture
async def cli_client(cli_daemon: Daemon) -> AsyncIterator[LocalClient]:
    async with client_for(cli_daemon.paths.home) as client:
        yield client


@pytest.fixture
async def cli_project(cli_client: LocalClient, tmp_path: Path) -> dict[str, Any]:
    repo = make_repo(tmp_path / "repo")
    data: dict[str, Any] = await cli_client.call("POST", "/v1/projects", body={"path": str(repo)})
    return data


async def launch(client: LocalClient, project: dict[str, Any], provider: str, prompt: str) -> dict[str, Any]:
    body = {"projectId": project["id"], "prompt": prompt, "provider": provider, "runtimeMode": "auto"}
    result: dict[str, Any] = await client.call("POST", "/v1/threads", body=body)
    return result
