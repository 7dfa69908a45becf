"""The owner socket's route table and its app (`local_app`, below, registers it; `peerd.api.openapi` describes it).

Each entry is one route: method, path, handler, and what the API reference says of it (the models
of its body, query and answer, its success status, the error codes it can return besides the
generic ones, an example). The handlers live in `peerd.api.local` and beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from pydantic import Field

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import DELEGATION, DESCRIPTOR, LINKS, OPERATIONS, STATUS_FN, StatusFn, base_app
from peerd.api.console_login import LoginToken
from peerd.api.local import (
    ADMIN,
    Admin,
    client_list,
    client_revoke,
    config_show,
    console_login_token,
    environment_list,
    environment_show,
    environment_unlink,
    link_create,
    owner_only,
    pair_cancel,
    pair_create,
    pair_list,
    project_add,
    project_list,
    project_remove,
    project_show,
    provider_approve,
    provider_list,
    provider_revoke,
    status,
    task_cancel,
    task_list,
    task_show,
    thread_archive,
    thread_diff,
    thread_events,
    thread_interrupt,
    thread_items,
    thread_launch,
    thread_list,
    thread_send,
    thread_show,
    thread_wait,
    thread_where,
    watch_runs,
)
from peerd.api.routes import (
    DESCRIPTOR_ROUTE,
    FORWARDING,
    OPENAPI_ROUTE,
    Example,
    Items,
    Route,
    add_routes,
    without,
)
from peerd.api.tools import TOOL_SERVICES, TOOLS_ROUTE, ToolServices


class ThreadShowQuery(c.Input):
    environment_id: str | None = c.EnvironmentId


class PairListQuery(c.Input):
    all: bool = Field(default=False, description="true: also used, burnt, cancelled and expired codes")


class ProbeQuery(c.Input):
    probe: bool = Field(default=True, description="false: the last known status, without asking each box")


TaskCancelBody = without(c.TaskCancel, "task_id", name="TaskCancelBody")
_THREAD = ("thread_not_found", *FORWARDING)
_CHANGE = (
    "thread_not_found",
    "capability_denied",
    "runtime_mode_escalation_denied",
    "interaction_mode_escalation_denied",
)
_LAUNCH = (
    "project_not_found",
    "provider_unavailable",
    "capability_denied",
    "runtime_mode_escalation_denied",
    "interaction_mode_escalation_denied",
    "idempotency_key_reused",
    "branch_taken",
    "git_error",
    *FORWARDING,
)
_LINKING = ("self", "access_exceeds_code", "pairing_rejected", "rate_limited", "conflict", *FORWARDING)
_NO_DELEGATION = "not_found"  # a daemon built without delegation (tests)
_TID = {"id": "a thread id (thr_...)"}

ROUTES: tuple[Route, ...] = (
    DESCRIPTOR_ROUTE,
    OPENAPI_ROUTE,
    Route("GET", "/v1/status", status, "status", "This daemon's identity, listeners and counts.", "daemon",
          answer=c.Status, example=Example(ex.STATUS)),
    Route("GET", "/v1/projects", project_list, "project_list", "The projects, a page at a time.", "projects",
          query=c.ProjectList, answer=c.Page[c.Project], errors=FORWARDING,
          example=Example({"items": [ex.PROJECT], "nextCursor": None}, query={"limit": "20"})),
    Route("POST", "/v1/projects", project_add, "project_add", "Add a git checkout as a project.", "projects",
          body=c.ProjectAdd, answer=c.Project, status=201, errors=("project_exists", "git_error"),
          example=Example(ex.PROJECT, body={"path": "/home/ana/src/shop"})),
    Route("GET", "/v1/projects/{id}", project_show, "project_show", "One project.", "projects",
          answer=c.Project, errors=("project_not_found",), params={"id": "a project id or name"},
          example=Example(ex.PROJECT, path={"id": ex.PRJ})),
    Route("DELETE", "/v1/projects/{id}", project_remove, "project_remove",
          "Forget a project and its threads (the checkout is not touched).", "projects",
          answer=c.Project, errors=("project_not_found", "conflict"), params={"id": "a project id or name"},
          example=Example(ex.PROJECT, path={"id": ex.PRJ})),
    Route("GET", "/v1/threads", thread_list, "thread_list", "The threads, newest first, a page at a time.",
          "threads", query=c.ThreadList, answer=c.Page[c.Thread], errors=("project_not_found", *FORWARDING),
          example=Example({"items": [ex.THREAD], "nextCursor": None}, query={"projectId": ex.PRJ})),
    Route("POST", "/v1/threads", thread_launch, "thread_launch",
          "Start a thread (its own worktree and branch) with a first prompt.", "threads",
          body=c.ThreadLaunch, answer=c.ThreadLaunchResult, status=201, also=(200,), errors=_LAUNCH,
          description="The same `clientRequestId` answers the first launch again (200, `replayed`).",
          example=Example(ex.LAUNCHED, body=ex.LAUNCH)),
    Route("GET", "/v1/threads/{id}", thread_show, "thread_show", "One thread with its latest run.", "threads",
          query=ThreadShowQuery, answer=c.Thread, errors=_THREAD, params=_TID,
          example=Example(ex.THREAD, path={"id": ex.THR})),
    Route("GET", "/v1/threads/{id}/where", thread_where, "thread_where",
          "Where a thread lives: here, or the linked machine it was launched, placed, delegated or moved to.",
          "threads", answer=c.ThreadWhere, errors=("thread_not_found", "ambiguous_id", "capability_denied"),
          params={"id": "a thread id, or a unique start of one (thr_ and at least 4 hex digits)"},
          description="Looks here and in this machine's record of threads elsewhere; a whole id "
          "found in neither is asked of every linked machine at once (5 s each) and recorded.",
          example=Example({"threadId": ex.THR, "environmentId": ex.ENV, "label": "box", "via": "launched"},
                          path={"id": ex.THR})),
    Route("GET", "/v1/threads/{id}/items", thread_items, "thread_read", "A thread's items, in order.", "threads",
          query=c.ThreadRead, answer=c.ThreadReadResult, errors=("item_not_found", "run_not_found", *_THREAD),
          params=_TID, example=Example(ex.READ, path={"id": ex.THR}, query={"afterPosition": "2"})),
    Route("GET", "/v1/threads/{id}/diff", thread_diff, "thread_diff",
          "What a thread changed against its base, committed and not, file by file.", "threads",
          query=c.ThreadDiffRead, answer=c.ThreadDiff,
          errors=("conflict", "git_error", "project_not_found", *_THREAD), params=_TID,
          description="Unified patches with added and removed line counts; untracked files count as added. "
          "A link may ask only for the threads it started.",
          example=Example(ex.DIFF, path={"id": ex.THR})),
    Route("POST", "/v1/threads/{id}/runs", thread_send, "thread_send", "Send a message: the thread's next run.",
          "threads", body=c.ThreadSend, answer=c.ThreadSendResult, status=201, also=(200,),
          errors=(*_CHANGE, "conflict", "idempotency_key_reused", *FORWARDING), params=_TID,
          example=Example(ex.SENT, path={"id": ex.THR}, body={"text": "Also run the linter."})),
    Route("GET", "/v1/threads/{id}/wait", thread_wait, "thread_wait",
          "Long-poll until the run ends (at most `timeout` s).", "threads",
          query=c.ThreadWait, renames={"run": "runId"}, answer=c.ThreadWaitResult,
          errors=("run_not_found", *_THREAD), params=_TID,
          example=Example(ex.WAITED, path={"id": ex.THR}, query={"run": ex.RUN, "timeout": "30"})),
    Route("POST", "/v1/threads/{id}/interrupt", thread_interrupt, "thread_interrupt",
          "Interrupt the live run; `stop` also holds the queue.", "threads",
          body=c.ThreadInterrupt, answer=c.ThreadInterruptResult, errors=(*_CHANGE, "run_not_found", *FORWARDING),
          params=_TID,
          example=Example(ex.INTERRUPTED, path={"id": ex.THR}, body={"stop": True, "reason": "wrong branch"})),
    Route("POST", "/v1/threads/{id}/archive", thread_archive, "thread_archive",
          "Archive a thread and remove its worktree (its branch stays).", "threads",
          body=c.ThreadArchive, answer=c.ThreadArchiveResult,
          errors=(*_CHANGE, "conflict", "worktree_dirty", "not_yours", "project_not_found", "git_error", *FORWARDING),
          params=_TID,
          example=Example(ex.ARCHIVED, path={"id": ex.THR}, body={})),
    Route("GET", "/v1/threads/{id}/events", thread_events, "thread_events",
          "Events after a cursor; with `timeout`, a long-poll for the next.", "threads",
          query=c.EventsRead, answer=c.EventsResult, errors=_THREAD, params=_TID,
          example=Example(ex.EVENTS, path={"id": ex.THR}, query={"after": "7", "timeout": "30"})),
    TOOLS_ROUTE,
    Route("POST", "/v1/watch", watch_runs, "run_watch",
          "Long-poll until any of the named runs settles (followers before the change feed).", "tasks",
          body=c.RunWatch, answer=c.RunWatchResult, errors=(_NO_DELEGATION,),
          example=Example(ex.WATCHED, body={"runs": [{"threadId": ex.THR, "runId": ex.RUN}], "timeout": 30})),
    Route("GET", "/v1/tasks", task_list, "task_list",
          "This machine's delegated tasks (a linked one's: environmentId), newest first.", "tasks",
          query=c.TaskList, answer=c.Page[c.TaskInfo], errors=("thread_not_found", *FORWARDING),
          example=Example({"items": [ex.TASK], "nextCursor": None}, query={"status": "running,pending"})),
    Route("GET", "/v1/tasks/{id}", task_show, "task_show", "One delegated task.", "tasks",
          query=c.TaskShow, answer=c.TaskInfo, errors=("task_not_found", _NO_DELEGATION),
          params={"id": "a task id (tsk_...)"},
          example=Example(ex.TASK, path={"id": ex.TSK})),
    Route("POST", "/v1/tasks/{id}/cancel", task_cancel, "task_cancel", "Cancel a delegated task.", "tasks",
          body=TaskCancelBody, answer=c.TaskInfo, errors=("task_not_found", "idempotency_key_reused", _NO_DELEGATION),
          params={"id": "a task id (tsk_...)"}, example=Example(ex.TASK, path={"id": ex.TSK}, body={})),
    Route("POST", "/v1/pair", pair_create, "pair_create", "A pairing code for another machine to link with.",
          "links", body=c.PairCreate, answer=c.PairCreateResult, status=201,
          example=Example({"code": ex.PAIR_CODE, "info": ex.PAIRING, "urls": ["https://box.lan:7433"]},
                          body={"access": "approval-required", "ttlS": 600})),
    Route("GET", "/v1/pair", pair_list, "pair_list", "The pairing codes (open ones unless `all`).", "links",
          query=PairListQuery, answer=Items[c.PairingCodeInfo], example=Example({"items": [ex.PAIRING]})),
    Route("POST", "/v1/pair/{id}/cancel", pair_cancel, "pair_cancel", "Cancel an open pairing code.", "links",
          answer=c.PairingCodeInfo, errors=("not_found", "conflict"), params={"id": "a pairing code id"},
          example=Example({**ex.PAIRING, "state": "cancelled"}, path={"id": ex.PCD})),
    Route("GET", "/v1/clients", client_list, "client_list", "The machines linked to this one.", "links",
          answer=Items[c.ClientInfo], example=Example({"items": [ex.CLIENT]})),
    Route("POST", "/v1/clients/{id}/revoke", client_revoke, "client_revoke",
          "Revoke a linked machine; its work here stops unless `keepRuns`.", "links",
          body=c.ClientRevoke, answer=c.ClientRevokeResult, errors=("not_found",),
          params={"id": "a client id (cli_...)"},
          example=Example({**ex.CLIENT, "status": "revoked", "revokedAt": ex.T0 + 900, "stoppedThreads": []},
                          path={"id": ex.CLI}, body={})),
    Route("POST", "/v1/links", link_create, "link_create", "Link to another machine with its pairing code.",
          "links", body=c.LinkCreate, answer=c.LinkInfo, status=201, errors=_LINKING,
          example=Example(ex.LINK, body={"code": ex.PAIR_CODE, "access": "approval-required"})),
    Route("GET", "/v1/environments", environment_list, "environment_list", "The machines this one links to.",
          "links", query=ProbeQuery, answer=Items[c.LinkInfo], example=Example({"items": [ex.LINK]})),
    Route("GET", "/v1/environments/{id}", environment_show, "environment_show", "One linked machine.", "links",
          query=ProbeQuery, answer=c.LinkInfo, errors=("not_linked",),
          params={"id": "an environment id or a link's label"}, example=Example(ex.LINK, path={"id": "box"})),
    Route("DELETE", "/v1/environments/{id}", environment_unlink, "environment_unlink",
          "Unlink a machine (and revoke the link there when it answers).", "links",
          answer=c.UnlinkResult, errors=("not_linked",), params={"id": "an environment id or a link's label"},
          example=Example({"environmentId": ex.BOX, "label": "box", "revokedThere": True, "message": "Unlinked box."},
                          path={"id": "box"})),
    Route("GET", "/v1/providers", provider_list, "provider_list", "The agent providers and what was found.",
          "providers", answer=Items[c.ProviderInfo], example=Example({"items": [ex.PROVIDER]})),
    Route("POST", "/v1/providers/{name}/approve", provider_approve, "provider_approve",
          "Approve a custom provider's exact command.", "providers", body=c.ProviderApprove,
          answer=c.ProviderApproveResult, errors=("not_found", "conflict"), params={"name": "a custom provider"},
          example=Example({"name": "mycoder", "command": "mycoder --json", "approved": True},
                          path={"name": "mycoder"}, body={"command": "mycoder --json"})),
    Route("DELETE", "/v1/providers/{name}/approval", provider_revoke, "provider_revoke",
          "Withdraw a custom provider's approval.", "providers", answer=c.ProviderApproveResult,
          errors=("not_found",), params={"name": "a custom provider"},
          example=Example({"name": "mycoder", "command": "mycoder --json", "approved": False},
                          path={"name": "mycoder"})),
    Route("GET", "/v1/config", config_show, "config_show", "The effective configuration.", "daemon",
          example=Example(ex.CONFIG)),
    Route("POST", "/v1/console/login-token", console_login_token, "console_login_token",
          "The browser console's URL with a one-time login token (`peerd console`).", "daemon",
          answer=LoginToken, status=201, errors=("not_found",),
          description="The token works once, within five minutes; `not_found` when the console is off "
          "or could not listen (the message says why).",
          example=Example({"url": "http://127.0.0.1:7434/login?token=Yk3...", "expiresAt": ex.T0 + 300})),
)  # fmt: skip


def local_app(
    services: ToolServices,
    desc: c.Descriptor,
    status_fn: StatusFn,
    admin: Admin,
    *,
    any_descendant: Callable[[], bool] = lambda: False,
) -> web.Application:
    """The owner socket's app: the whole local API, the agent tools without a token too."""
    app = base_app()
    app.middlewares.append(owner_only(services.ops.runs, any_descendant=any_descendant))
    app[ADMIN] = admin
    app[OPERATIONS] = services.ops
    app[LINKS] = services.links
    app[DELEGATION] = services.delegation
    app[TOOL_SERVICES] = services
    app[DESCRIPTOR] = desc
    app[STATUS_FN] = status_fn
    add_routes(app, ROUTES)
    return app
