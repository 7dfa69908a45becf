"""Threads across this environment and every linked one; a thread page; send, interrupt, stop, launch.

A thread page shows its items (then streams the new ones: `peerd.console.stream`), its latest
run, and its lineage both ways: "subagent of ... on laptop" from `delegatedFrom`, and "delegated
to ... on box" from the tasks it delegated (each a link that opens the other side's thread, through
the link when it is on another machine).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from peerd import contracts as c
from peerd.console.owner import HERE, LIVE, RUN_STATES, Env, Owner, thread_state
from peerd.console.pages import back, form, owner
from peerd.console.render import fragment, notice, page, shown_error
from peerd.core.constants import RUNTIME_MODES
from peerd.core.text import path_segment
from peerd.errors import PeerdError

AUTO = "auto"  # the launch form's target for `auto` placement
ITEMS_ON_PAGE = 500  # the rest arrive over the stream
STATE_FILTERS = (("", "any"), ("live", "live (queued or running)"), *((s, s) for s in RUN_STATES[3:]))
FILTER_STATES = {
    "live": LIVE,
    **{s: (s,) for s in RUN_STATES},
    "archived": ("archived",),
    "moved": ("moved",),
}


@dataclass(frozen=True)
class Lineage:
    """One end of a delegation, as the page shows it: words, and where it opens (None: not here)."""

    text: str
    where: str
    href: str | None
    status: str | None = None


def thread_href(env: Env, thread_id: str) -> str:
    return f"/threads/{path_segment(env.key)}/{path_segment(thread_id)}"


def moved_link(api: Owner, envs: list[Env], thread: c.Thread) -> dict[str, Any]:
    """Where a moved thread's copy is, for the page: its href (None: not reachable from here) and
    the machine's name."""
    to = thread.moved_to
    if thread.status != "moved" or to is None:
        return {"moved_href": None, "moved_where": None}
    there = api.env_of(envs, to.environment_id)
    if there is None:
        return {"moved_href": None, "moved_where": to.environment_id}
    return {"moved_href": thread_href(there, to.thread_id), "moved_where": there.label}


async def thread_list(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    wanted = request.query.get("status", "")
    env_filter = request.query.get("env", "")
    states = FILTER_STATES.get(wanted, ())
    envs = await api.envs()
    shown = [e for e in envs if not env_filter or e.key == env_filter]
    search = request.query.get("q", "").strip()[:200]
    project = request.query.get("project", "").strip()[:200]
    fleet = await api.fleet_threads(shown, states=states, search=search, project=project)
    providers, models = await launch_choices(api)
    return page(
        request,
        "threads.html",
        title="Threads",
        fleet=fleet,
        envs=envs,
        wanted=wanted,
        env_filter=env_filter,
        search=search,
        project=project,
        project_names=sorted({p.name for group in fleet for p in group.all_projects}),
        filters=[*STATE_FILTERS, ("archived", "archived"), ("moved", "moved")],
        providers=providers,
        models=models,
        modes=RUNTIME_MODES,
        request_id=uuid.uuid4().hex,
        thread_href=thread_href,
        thread_state=thread_state,
    )


async def launch_choices(api: Owner) -> tuple[list[tuple[str, str]], list[str]]:
    """The providers a launch may name, each with the machines that have it installed (this one's
    `provider list`, each box's last capacity report, not asked again here), and the models this
    machine's providers default to (a model is free text: each CLI has its own names)."""
    found = [p for p in await api.providers() if p.found]
    where: dict[str, list[str]] = {p.name: [api.here.label] for p in found}
    try:
        fleet = c.Fleet.model_validate(await api.call("GET", "/v1/fleet", params={"offline": True}))
    except PeerdError:
        fleet = c.Fleet(environments=[])
    for env in fleet.environments:
        if not env.here and env.capacity is not None:
            for name in env.capacity.providers:
                where.setdefault(name, []).append(env.label)
    providers = [(name, f"{name} ({', '.join(labels)})") for name, labels in sorted(where.items())]
    models = sorted({p.model for p in found if p.model})
    return providers or [("script", "script")], models


def budget_of(data: dict[str, str]) -> dict[str, float] | None:
    """The launch form's budget (tokens, dollars), None when neither is given; a bad number is
    refused by the API with its sentence."""
    budget: dict[str, float] = {}
    for field, kind in (("budget_tokens", "tokens"), ("budget_usd", "usd")):
        text = data.get(field, "").strip().replace(",", "")
        if text:
            try:
                budget[kind] = int(text) if kind == "tokens" else float(text)
            except ValueError:
                budget[kind] = -1  # refused by the API as out of range
    return budget or None


async def parent_of(api: Owner, envs: list[Env], thread: c.Thread) -> Lineage | None:
    parent = thread.delegated_from
    if parent is None:
        return None
    env = api.env_of(envs, parent.environment_id)
    where = env.label if env is not None else (thread.link_label or parent.environment_id)
    href = thread_href(env, parent.thread_id) if env is not None else None
    return Lineage(parent.title or parent.thread_id, where, href)


async def children_of(api: Owner, envs: list[Env], env: Env, thread: c.Thread) -> list[Lineage]:
    """The tasks this thread delegated (kept where the thread is: here only)."""
    if not env.local:
        return []
    found = await api.tasks({"threadId": thread.id, "limit": c.PAGE_LIMIT})
    children = []
    for task in found.items:
        remote = task.remote_child
        if remote is not None:
            child_env = api.env_of(envs, remote.environment_id)
            href = None
            if child_env is not None and remote.thread_id:
                href = thread_href(child_env, remote.thread_id)
            children.append(Lineage(task.title, remote.label, href, task.status))
        else:
            href = thread_href(api.here, task.child_thread_id) if task.child_thread_id else None
            children.append(Lineage(task.title, api.here.label, href, task.status))
    return children


async def thread_page(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    env = await api.env(request.match_info["env"])
    thread_id = request.match_info["id"]
    thread = await api.thread(env, thread_id)
    items: list[c.Item] = []
    after: int | None = None
    while len(items) < ITEMS_ON_PAGE:
        read = await api.items(env, thread_id, after)
        items += read.items
        if not read.has_more or read.next_position is None:
            break
        after = read.next_position
    envs = await api.envs()
    last = items[-1].position if items else -1
    return page(
        request,
        "thread.html",
        title=thread.title,
        env=env,
        thread=thread,
        items=items,
        last_position=last,
        parent=await parent_of(api, envs, thread),
        children=await children_of(api, envs, env, thread),
        href=thread_href(env, thread_id),
        request_id=uuid.uuid4().hex,
        said="",
        level="info",
        live=LIVE,
        runs={r.id: r for r in thread.run_usage or []},
        **moved_link(api, envs, thread),
    )


def diff_lines(patch: str) -> list[tuple[str, str]]:
    """A file's patch as (kind, line): add, del, hunk, meta or ctx, for the diff view's colours
    (and its symbols: the +/- stay in the text)."""
    out = []
    in_hunks = False
    for line in patch.splitlines():
        if line.startswith("@@"):
            in_hunks, kind = True, "hunk"
        elif not in_hunks:
            kind = "meta"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


async def thread_diff(request: web.Request) -> web.StreamResponse:
    """The thread's changes against its base, file by file (the owner API's thread diff; a box's
    thread through the link, which shows only the threads it started)."""
    api = owner(request)
    env = await api.env(request.match_info["env"])
    thread_id = request.match_info["id"]
    thread = await api.thread(env, thread_id)
    found = await api.diff(env, thread_id)
    return page(
        request,
        "diff.html",
        title=f"Changes: {thread.title}",
        env=env,
        thread=thread,
        diff=found,
        href=thread_href(env, thread_id),
        lines=diff_lines,
    )


async def send(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    env = await api.env(request.match_info["env"])
    thread_id = request.match_info["id"]
    data = await form(request)
    text = data.get("text", "").strip()
    href = thread_href(env, thread_id)
    said, level = "", "info"
    if not text:
        said, level = "Write a message first.", "error"
    else:
        try:
            sent = await api.send(env, thread_id, text, data.get("request_id") or uuid.uuid4().hex)
            said = "Sent" + (" (queued: the thread's queue is held)" if sent.queue_held else "") + "."
        except PeerdError as exc:
            said, level = shown_error(exc), "error"
    if request.headers.get("HX-Request"):
        return fragment(
            request, "_send.html", href=href, request_id=uuid.uuid4().hex, said=said, level=level, env=env
        )
    notice(request, said, level=level)
    raise back(request, href)


async def interrupt(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    env = await api.env(request.match_info["env"])
    thread_id = request.match_info["id"]
    stop = (await form(request)).get("stop") == "1"
    try:
        done = await api.interrupt(env, thread_id, stop=stop)
        if done.status == "no_active_run":
            notice(request, "Nothing to interrupt: no run is live." + (" The queue is held." if stop else ""))
        else:
            notice(
                request,
                "Stopped: the live run was interrupted and the queue is held." if stop else "Interrupted.",
            )
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
    raise back(request, thread_href(env, thread_id))


async def launch(request: web.Request) -> web.StreamResponse:
    """A launch from the Threads page: a project on a machine (or `auto`: peerd places it among
    the machines with the same repository), a provider, a model, an access level, a budget."""
    api = owner(request)
    data = await form(request)
    env_key, _, project_id = data.get("target", "").partition("|")
    prompt = data.get("prompt", "").strip()
    if not project_id or not prompt:
        notice(request, "Pick a project and write a first prompt.", level="error")
        raise back(request, "/threads")
    auto = env_key == AUTO
    env = api.here if auto else await api.env(env_key or HERE)
    body = {
        "projectId": project_id,
        "prompt": prompt,
        "provider": data.get("provider") or "script",
        "title": data.get("title") or None,
        "model": data.get("model", "").strip() or None,
        "runtimeMode": data.get("mode") if data.get("mode") in RUNTIME_MODES else None,
        "budget": budget_of(data),
        "clientRequestId": data.get("request_id") or None,
    }
    try:
        if auto:
            launched = c.ThreadLaunchResult.model_validate(
                await api.call("POST", "/v1/threads", body={**body, "environmentId": AUTO})
            )
            placed = launched.placement
            if placed is not None and placed.environment_id is not None:
                env = api.env_of(await api.envs(), placed.environment_id) or env
            if placed is not None:
                notice(request, f"Placed on {placed.label}: {placed.reason}")
        else:
            launched = await api.launch(env, body)
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/threads") from None
    raise back(request, thread_href(env, launched.thread_id))


ROUTES = (
    ("GET", "/threads", thread_list),
    ("POST", "/threads/launch", launch),
    ("GET", "/threads/{env}/{id}", thread_page),
    ("GET", "/threads/{env}/{id}/diff", thread_diff),
    ("POST", "/threads/{env}/{id}/send", send),
    ("POST", "/threads/{env}/{id}/interrupt", interrupt),
)
