"""The local API, served on the Unix socket (0600: only this user reaches it).

Routes (all JSON; errors are `{code, message}`):

    GET    /v1/status
    GET    /v1/projects?cursor=&limit=          POST /v1/projects {path, name?}
    GET    /v1/projects/{id}                    DELETE /v1/projects/{id}
    GET    /v1/threads?projectId=&includeArchived=&cursor=&limit=
    POST   /v1/threads                          (launch: ThreadLaunch)
    GET    /v1/threads/{id}
    GET    /v1/threads/{id}/items?afterPosition=&limit=&runId=&itemId=&textOffset=&maxCharsPerItem=
    POST   /v1/threads/{id}/runs {text, clientRequestId?}          (send)
    GET    /v1/threads/{id}/wait?run=&timeout=  (long-poll, timeout <= 50 s)
    POST   /v1/threads/{id}/interrupt {stop?, reason?}
    POST   /v1/threads/{id}/archive
    GET    /v1/threads/{id}/events?after=&timeout=&limit=            (event cursor, long-poll)
    GET    /v1/tasks?threadId=&status=&targetEnvironment=&cursor=&limit=   (newest first)
    GET    /v1/tasks/{id}                       POST /v1/tasks/{id}/cancel {reason?}
    POST   /v1/tools/{name}                     (agent tools, `Authorization: Bearer <run token>`)
    POST   /mcp                                 (the same tools over MCP: peerd/api/mcp_http.py)
    POST   /v1/pair {access?, ttlS?, labelHint?, maxAgeS?, urls?}   GET /v1/pair?all=
    POST   /v1/pair/{id}/cancel
    GET    /v1/clients                          POST /v1/clients/{id}/revoke
    POST   /v1/links {code, access?, label?, urls?, maxAgeS?}
    GET    /v1/environments?probe=              GET/DELETE /v1/environments/{id}?probe=
    GET    /v1/providers                        POST /v1/providers/{name}/approve {command}
    DELETE /v1/providers/{name}/approval        GET /v1/config
    POST   /v1/console/login-token              (`peerd console`: the console's URL with a one-time token)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from peerd import contracts as c
from peerd.api import peercred
from peerd.api.app import (
    DELEGATION,
    DESCRIPTOR,
    LINKS,
    OPERATIONS,
    STATUS_FN,
    Handler,
    caller_protocol,
    error_response,
    json_body,
    json_object,
    ok,
    query_model,
)
from peerd.api.console_login import CONSOLE
from peerd.api.context import CALLER_KEY as CALLER_KEY  # noqa: PLC0414  # api/mcp_http.py reads local.CALLER_KEY
from peerd.api.context import LOCAL, caller_of
from peerd.api.routes import VIEW
from peerd.errors import CapabilityDenied, InvalidRequest, NotFound
from peerd.operations import Operations
from peerd.peer.links import LinkService
from peerd.runtime.runner import RunManager
from peerd.store import threads
from peerd.tasks import store as tasks

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)


def _ops(request: web.Request) -> Operations:
    return request.app[OPERATIONS]


async def status(request: web.Request) -> web.Response:
    return ok(await request.app[STATUS_FN]())


async def project_list(request: web.Request) -> web.Response:
    return ok(await _ops(request).project_list(caller_of(request), query_model(request, c.ProjectList)))


async def project_add(request: web.Request) -> web.Response:
    return ok(
        await _ops(request).project_add(caller_of(request), await json_body(request, c.ProjectAdd)),
        status=201,
    )


async def project_show(request: web.Request) -> web.Response:
    return ok(await _ops(request).project_show(caller_of(request), request.match_info["id"]))


async def project_remove(request: web.Request) -> web.Response:
    return ok(await _ops(request).project_remove(caller_of(request), request.match_info["id"]))


async def thread_list(request: web.Request) -> web.Response:
    return ok(await _ops(request).thread_list(caller_of(request), query_model(request, c.ThreadList)))


async def thread_launch(request: web.Request) -> web.Response:
    result = await _ops(request).thread_launch(caller_of(request), await json_body(request, c.ThreadLaunch))
    return ok(result, status=200 if result.replayed else 201)


async def thread_show(request: web.Request) -> web.Response:
    env = request.query.get("environmentId")
    return ok(await _ops(request).thread_show(caller_of(request), request.match_info["id"], env))


async def thread_diff(request: web.Request) -> web.Response:
    req = query_model(request, c.ThreadDiffRead)
    return ok(
        await _ops(request).thread_diff(caller_of(request), request.match_info["id"], req.environment_id)
    )


async def thread_where(request: web.Request) -> web.Response:
    return ok(await _ops(request).thread_where(caller_of(request), request.match_info["id"]))


def omits_defaults(request: web.Request) -> bool:
    """Whether the caller takes an item's missing default-valued fields as their defaults: the
    owner's socket (its clients are this release), or a peer whose `Peerd-Protocol` says so. A
    peerd of revision 1 (before the header) reads `textTruncated` and the rest as always there."""
    if request.app.get(VIEW, "owner") != "network":
        return True
    return caller_protocol(request) >= c.OMITS_DEFAULTS_PROTOCOL


async def thread_items(request: web.Request) -> web.Response:
    """A page of items. For a caller that can take it (`omits_defaults`), an item's fields that
    hold their default (`textOffset` 0, `textTruncated` false, `nextTextOffset` null, `data` {})
    are left out: readers take a missing one as its default (`c.Item` does), and a page of short
    items is a third smaller. Every other caller gets every field."""
    req = query_model(request, c.ThreadRead)
    result = await _ops(request).thread_read(caller_of(request), request.match_info["id"], req)
    if not omits_defaults(request):
        return ok(result)
    body = result.model_dump(mode="json", by_alias=True, exclude={"items"})
    body["items"] = [
        item.model_dump(mode="json", by_alias=True, exclude_defaults=True) for item in result.items
    ]
    return ok(body)


async def thread_send(request: web.Request) -> web.Response:
    req = await json_body(request, c.ThreadSend)
    result = await _ops(request).thread_send(caller_of(request), request.match_info["id"], req)
    return ok(result, status=200 if result.replayed else 201)


async def thread_wait(request: web.Request) -> web.Response:
    req = query_model(request, c.ThreadWait, renames={"run": "runId"})
    return ok(await _ops(request).thread_wait(caller_of(request), request.match_info["id"], req))


async def thread_interrupt(request: web.Request) -> web.Response:
    req = await json_body(request, c.ThreadInterrupt)
    return ok(await _ops(request).thread_interrupt(caller_of(request), request.match_info["id"], req))


async def thread_archive(request: web.Request) -> web.Response:
    req = await json_body(request, c.ThreadArchive)
    return ok(await _ops(request).thread_archive(caller_of(request), request.match_info["id"], req))


async def thread_events(request: web.Request) -> web.Response:
    req = query_model(request, c.EventsRead)
    return ok(await _ops(request).thread_events(caller_of(request), request.match_info["id"], req))


# --- delegated tasks ----------------------------------------------------------------------------


async def watch_runs(request: web.Request) -> web.Response:
    req = await json_body(request, c.RunWatch)
    return ok(await request.app[DELEGATION].watch(caller_of(request), req))


async def task_list(request: web.Request) -> web.Response:
    """This machine's tasks, newest first, a page at a time (`peerd task list`)."""
    ops = _ops(request)
    req = query_model(request, c.TaskList)
    if (there := await ops.task_list_elsewhere(caller_of(request), req)) is not None:
        return ok(there)
    if req.thread_id is not None:
        await threads.get_thread(ops.db, req.thread_id)  # a typed not_found for a wrong id
    target, local = req.target_environment, False
    if target is not None:
        here = request.app[DESCRIPTOR]
        if target in (here.environment_id, here.label):
            target, local = None, True
        elif ops.forwarder is None:
            raise InvalidRequest("This daemon has no links: filter by this environment's id or label.")
        else:  # a link's id or label (an id also matches a link since forgotten)
            target = await ops.forwarder.target(target, via_link=False)
            local = target is None
    found = tasks.TaskFilter(
        parent_thread_id=req.thread_id, statuses=tuple(req.status), target_env=target, local=local
    )
    return ok(await tasks.page(ops.db, found, cursor=req.cursor, limit=req.limit))


async def task_show(request: web.Request) -> web.Response:
    delegation = request.app[DELEGATION]
    query = query_model(request, c.TaskShow)
    read = c.TaskStatusRead(
        task_id=request.match_info["id"],
        wait=query.wait is not None,
        timeout_ms=None if query.wait is None else round(query.wait * 1000),
    )
    return ok(await delegation.status(LOCAL, read))


async def task_cancel(request: web.Request) -> web.Response:
    body = await json_object(request)
    req = c.TaskCancel.model_validate({**body, "taskId": request.match_info["id"]})
    return ok(await request.app[DELEGATION].cancel(LOCAL, req))


# --- pairing, clients and links: local only -----------------------------------------------------


def _links(request: web.Request) -> LinkService:
    return request.app[LINKS]


async def pair_create(request: web.Request) -> web.Response:
    return ok(await _links(request).pair_create(await json_body(request, c.PairCreate)), status=201)


async def pair_list(request: web.Request) -> web.Response:
    include_done = request.query.get("all", "false").lower() == "true"
    codes = await _links(request).pair_list(include_done=include_done)
    return ok({"items": [x.wire() for x in codes]})


async def pair_cancel(request: web.Request) -> web.Response:
    return ok(await _links(request).pair_cancel(request.match_info["id"]))


async def client_list(request: web.Request) -> web.Response:
    return ok({"items": [x.wire() for x in await _links(request).client_list()]})


async def client_revoke(request: web.Request) -> web.Response:
    req = await json_body(request, c.ClientRevoke)
    revoked = await _links(request).client_revoke(request.match_info["id"])
    stopped = [] if req.keep_runs else await _ops(request).stop_link_work(revoked.id, revoked.label)
    log.warning(
        "link.client_revoked",
        client_id=revoked.id,
        label=revoked.label,
        kept_runs=req.keep_runs,
        stopped=stopped,
    )
    return ok(c.ClientRevokeResult(**revoked.model_dump(), stopped_threads=stopped))


async def link_create(request: web.Request) -> web.Response:
    return ok(await _links(request).link(await json_body(request, c.LinkCreate)), status=201)


async def environment_list(request: web.Request) -> web.Response:
    probe = request.query.get("probe", "true").lower() != "false"
    return ok({"items": [x.wire() for x in await _links(request).environment_list(probe=probe)]})


async def environment_show(request: web.Request) -> web.Response:
    probe = request.query.get("probe", "true").lower() != "false"
    return ok(await _links(request).environment_show(request.match_info["id"], probe=probe))


async def environment_unlink(request: web.Request) -> web.Response:
    return ok(await _links(request).unlink(request.match_info["id"]))


async def console_login_token(request: web.Request) -> web.Response:
    """A one-time login token for the browser console, in its URL (peerd/console/auth.py)."""
    console = request.app.get(CONSOLE)
    if console is None:
        raise NotFound("This daemon has no console.")
    return ok(console.login_token(), status=201)


class Admin(Protocol):
    """What only the owner manages: providers and their approvals, the effective config."""

    async def provider_list(self) -> list[c.ProviderInfo]: ...

    async def provider_approve(self, name: str, req: c.ProviderApprove) -> c.ProviderApproveResult: ...

    async def provider_revoke(self, name: str) -> c.ProviderApproveResult: ...

    def config_shown(self) -> dict[str, Any]: ...


ADMIN: web.AppKey[Admin] = web.AppKey("admin")


async def provider_list(request: web.Request) -> web.Response:
    return ok({"items": [x.wire() for x in await request.app[ADMIN].provider_list()]})


async def provider_approve(request: web.Request) -> web.Response:
    req = await json_body(request, c.ProviderApprove)
    return ok(await request.app[ADMIN].provider_approve(request.match_info["name"], req))


async def provider_revoke(request: web.Request) -> web.Response:
    return ok(await request.app[ADMIN].provider_revoke(request.match_info["name"]))


async def config_show(request: web.Request) -> web.Response:
    return web.json_response(request.app[ADMIN].config_shown())


def owner_only(runs: RunManager, *, any_descendant: Callable[[], bool]) -> Middleware:
    """The owner socket refuses processes peerd started for runs (see `peerd.api.peercred`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if peercred.from_a_run(sock, run_groups=runs.live_groups(), any_descendant=any_descendant()):
            log.warning("socket.run_refused", method=request.method, path=request.path)
            return error_response(
                CapabilityDenied(
                    "This is the owner's socket; processes peerd started for a run cannot use it. "
                    "Agents use peerd's tools (peerd mcp), which reach the agent socket in PEERD_SOCKET."
                )
            )
        return await handler(request)

    return middleware
