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

from peerd.api.app import OPERATIONS, json_body, ok
from peerd.api.local import caller_of
from peerd.orchestrate.transport import BundleUpload, GitTransport, ThreadCommit


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


def add_git_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/threads/{id}/commit", thread_commit)
    r.add_get("/v1/threads/{id}/bundle", thread_bundle)
    r.add_get("/v1/projects/{id}/tips", project_tips)
    r.add_post("/v1/projects/{id}/bundle", project_bundle)
