"""Routes that move commits for orchestration packets (see `peerd/orchestrate/transport.py`).

    POST /v1/threads/{id}/commit {message}   commit a thread's worktree (only it) on its branch
    GET  /v1/threads/{id}/bundle             the branch's commits past its base, as a git bundle
    GET  /v1/projects/{id}/tips              the project's ref tips (what not to send)
    POST /v1/projects/{id}/bundle {bundle, tip}   receive missing base commits (quota per link)

A `scope` in a commit is `capability_denied`; a bad bundle is `invalid_request` and stores nothing.

Served on the local socket and, behind the link's authentication, on the network listener.
"""

from __future__ import annotations

from aiohttp import web

from peerd.api import examples as ex
from peerd.api.app import OPERATIONS, json_body, ok
from peerd.api.context import caller_of
from peerd.api.routes import Example, Route, add_routes
from peerd.orchestrate.transport import (
    BundleData,
    BundleReceived,
    BundleUpload,
    GitTransport,
    ProjectTips,
    ThreadCommit,
    ThreadCommitResult,
)


def _transport(request: web.Request) -> GitTransport:
    return GitTransport(request.app[OPERATIONS])


async def thread_commit(request: web.Request) -> web.Response:
    req = await json_body(request, ThreadCommit)
    return ok(await _transport(request).commit(caller_of(request), request.match_info["id"], req))


async def thread_bundle(request: web.Request) -> web.Response:
    return ok(await _transport(request).bundle(caller_of(request), request.match_info["id"]))


async def project_tips(request: web.Request) -> web.Response:
    return ok(await _transport(request).tips(caller_of(request), request.match_info["id"]))


async def project_bundle(request: web.Request) -> web.Response:
    req = await json_body(request, BundleUpload)
    return ok(await _transport(request).receive(caller_of(request), request.match_info["id"], req))


_THREAD = ("thread_not_found", "capability_denied", "not_yours", "git_error")
_PROJECT = ("project_not_found", "capability_denied", "git_error")
_SHA = "4f0e2c9a7b1d3e5f6a8c0b2d4e6f8a1c3e5b7d9f"
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/threads/{id}/commit", thread_commit, "thread_commit",
          "Commit a thread's worktree on its branch.", "git", body=ThreadCommit, answer=ThreadCommitResult,
          errors=(*_THREAD, "conflict"), params={"id": "a thread id"},
          example=Example({"threadId": ex.THR, "branch": f"peerd/{ex.THR}", "baseCommit": _SHA, "commit": _SHA,
                           "created": True}, path={"id": ex.THR}, body={"message": "Extract the refund code"})),
    Route("GET", "/v1/threads/{id}/bundle", thread_bundle, "thread_bundle",
          "The branch's commits past its base, as a base64 git bundle.", "git", answer=BundleData,
          errors=_THREAD, params={"id": "a thread id"},
          example=Example({"tip": _SHA, "bundle": "IyB2MiBnaXQgYnVuZGxlCg=="}, path={"id": ex.THR})),
    Route("GET", "/v1/projects/{id}/tips", project_tips, "project_tips", "The project's ref tips.", "git",
          answer=ProjectTips, errors=_PROJECT, params={"id": "a project id"},
          example=Example({"tips": [_SHA]}, path={"id": ex.PRJ})),
    Route("POST", "/v1/projects/{id}/bundle", project_bundle, "project_bundle",
          "Receive missing base commits (a quota per link).", "git", body=BundleUpload, answer=BundleReceived,
          errors=(*_PROJECT, "payload_too_large"), params={"id": "a project id"},
          example=Example({"commit": _SHA}, path={"id": ex.PRJ},
                          body={"bundle": "IyB2MiBnaXQgYnVuZGxlCg==", "tip": _SHA})),
)  # fmt: skip


def add_git_routes(app: web.Application) -> None:
    add_routes(app, ROUTES)
