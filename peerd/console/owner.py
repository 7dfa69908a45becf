"""The owner's API as the console's pages need it: this environment and each linked one.

Every call goes over the owner socket (`LocalClient`); a call about a linked environment names it
(`environmentId`), so the daemon forwards it through the link with the owner's own cap, exactly as
`peerd --env` does. Answers are read into the contract's models. The console's URLs name an
environment by `HERE` or by the linked environment's id (`Env.key`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from peerd import contracts as c
from peerd.api.localclient import LocalClient
from peerd.console.board import last_change
from peerd.core.text import path_segment
from peerd.errors import NotFound, PeerdError

HERE = "here"
FLEET_TIMEOUT_S = 5.0  # one linked environment's threads: past this it is shown as not answering
RUN_STATES = ("queued", "starting", "running", "completed", "failed", "cancelled", "interrupted")
LIVE = ("queued", "starting", "running")
MAX_FLEET_THREADS = 5000  # one environment's threads the board reads at most
THREADS_SHOWN = 200  # one environment's threads the Threads page lists at most (newest change first)


@dataclass(frozen=True)
class Env:
    """An environment the console shows: this one, or a linked one."""

    key: str  # in the console's URLs: HERE or the linked environment's id
    env_id: str
    label: str
    link: c.LinkInfo | None = None

    @property
    def local(self) -> bool:
        return self.link is None

    @property
    def forward(self) -> str | None:
        """What the API calls are given as `environmentId` (None: here)."""
        return None if self.link is None else self.env_id


@dataclass(frozen=True)
class ProjectThreads:
    name: str
    project_id: str
    threads: list[c.Thread]


@dataclass(frozen=True)
class EnvThreads:
    env: Env
    projects: list[ProjectThreads] = field(default_factory=list)
    error: str | None = None
    all_projects: list[c.Project] = field(default_factory=list)  # with threads or not (launch form)
    more: int = 0  # threads that matched past THREADS_SHOWN


def thread_state(thread: c.Thread) -> str:
    """The one word the thread list filters on: archived, moved, or its latest run's status."""
    if thread.status in ("archived", "moved"):
        return thread.status
    return thread.latest_run.status if thread.latest_run is not None else "queued"


class Owner:
    def __init__(self, client: LocalClient, *, env_id: str, label: str) -> None:
        self.client = client
        self.here = Env(HERE, env_id, label)

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        return await self.client.call(method, path, body=body, params=params)

    # --- environments -----------------------------------------------------------------------

    async def status(self) -> c.Status:
        return c.Status.model_validate(await self.call("GET", "/v1/status"))

    async def links(self, *, probe: bool) -> list[c.LinkInfo]:
        data = await self.call("GET", "/v1/environments", params={"probe": probe})
        return [c.LinkInfo.model_validate(x) for x in data["items"]]

    async def envs(self, *, probe: bool = False) -> list[Env]:
        links = await self.links(probe=probe)
        return [
            self.here,
            *(Env(link.environment_id, link.environment_id, link.label, link) for link in links),
        ]

    async def env(self, key: str) -> Env:
        if key in (HERE, self.here.env_id):
            return self.here
        for env in await self.envs():
            if env.key == key:
                return env
        raise NotFound(f"No linked environment {key!r} here; the Connections page lists the links.")

    def env_of(self, envs: list[Env], env_id: str | None) -> Env | None:
        """The environment `env_id` names among `envs` (this one included), if it is one of them."""
        for env in envs:
            if env.env_id == env_id:
                return env
        return None

    def env_named(self, envs: list[Env], name: str | None) -> Env | None:
        """The environment a packet or task names by id or label (None: here)."""
        if name is None:
            return self.here
        return self.env_of(envs, name) or next((e for e in envs if e.label == name), None)

    # --- connections ------------------------------------------------------------------------

    async def clients(self) -> list[c.ClientInfo]:
        data = await self.call("GET", "/v1/clients")
        return [c.ClientInfo.model_validate(x) for x in data["items"]]

    async def agent_signins(self) -> list[c.SigninRequestInfo]:
        """Outside agents' sign-ins waiting for the owner (issue 29)."""
        data = await self.call("GET", "/v1/agent-signins")
        return [c.SigninRequestInfo.model_validate(x) for x in data["items"]]

    async def decide_signin(self, request_id: str, access: str | None) -> c.SigninRequestInfo:
        body = {} if access is None else {"access": access}
        data = await self.call("POST", f"/v1/agent-signins/{path_segment(request_id)}/decision", body=body)
        return c.SigninRequestInfo.model_validate(data)

    async def pairing_codes(self) -> list[c.PairingCodeInfo]:
        data = await self.call("GET", "/v1/pair")
        return [c.PairingCodeInfo.model_validate(x) for x in data["items"]]

    async def pair(
        self, access: str, ttl_s: float, label_hint: str | None, purpose: str = "link"
    ) -> c.PairCreateResult:
        body = {"access": access, "ttlS": ttl_s, "labelHint": label_hint or None, "purpose": purpose}
        return c.PairCreateResult.model_validate(await self.call("POST", "/v1/pair", body=body))

    async def link(self, code: str, access: str, label: str | None) -> c.LinkInfo:
        body = {"code": code, "access": access, "label": label or None}
        return c.LinkInfo.model_validate(await self.call("POST", "/v1/links", body=body))

    async def revoke_client(self, client_id: str) -> c.ClientRevokeResult:
        data = await self.call("POST", f"/v1/clients/{path_segment(client_id)}/revoke", body={})
        return c.ClientRevokeResult.model_validate(data)

    async def unlink(self, env_id: str) -> c.UnlinkResult:
        data = await self.call("DELETE", f"/v1/environments/{path_segment(env_id)}")
        return c.UnlinkResult.model_validate(data)

    async def cancel_pairing(self, code_id: str) -> None:
        await self.call("POST", f"/v1/pair/{path_segment(code_id)}/cancel", body={})

    # --- threads ----------------------------------------------------------------------------

    async def projects(self, env: Env) -> list[c.Project]:
        found: list[c.Project] = []
        cursor = None
        while True:
            params = {"environmentId": env.forward, "cursor": cursor, "limit": c.PAGE_LIMIT}
            data = await self.call("GET", "/v1/projects", params=params)
            found += [c.Project.model_validate(x) for x in data["items"]]
            cursor = data.get("nextCursor")
            if not cursor:
                return found

    async def threads(self, env: Env, *, include_archived: bool) -> list[c.Thread]:
        params = {"environmentId": env.forward, "includeArchived": include_archived, "limit": c.PAGE_LIMIT}
        data = await self.call("GET", "/v1/threads", params=params)
        return [c.Thread.model_validate(x) for x in data["items"]]

    async def all_threads(
        self, env: Env, *, most: int = MAX_FLEET_THREADS, include_archived: bool = False
    ) -> list[c.Thread]:
        """Every thread of `env` (up to `most`; the archived ones only if asked), a page at a time."""
        found: list[c.Thread] = []
        cursor = None
        while len(found) < most:
            params = {
                "environmentId": env.forward,
                "cursor": cursor,
                "limit": c.PAGE_LIMIT,
                "includeArchived": include_archived,
            }
            data = await self.call("GET", "/v1/threads", params=params)
            found += [c.Thread.model_validate(x) for x in data["items"]]
            cursor = data.get("nextCursor")
            if not cursor:
                break
        return found

    async def env_threads(
        self, env: Env, *, states: tuple[str, ...], search: str = "", project: str = ""
    ) -> EnvThreads:
        """`env`'s threads with one of `states` (any: none given) whose title or id has every word
        of `search` and whose project is named `project` (any: ''), newest change first, at most
        `THREADS_SHOWN` (`more` says how many others matched), grouped by project."""
        try:
            projects, threads = await asyncio.wait_for(
                asyncio.gather(
                    self.projects(env), self.all_threads(env, include_archived="archived" in states)
                ),
                FLEET_TIMEOUT_S,
            )
        except TimeoutError:
            return EnvThreads(env, error=f"{env.label} did not answer within {FLEET_TIMEOUT_S:g} s.")
        except PeerdError as exc:
            return EnvThreads(env, error=f"{exc.code}: {exc.message}")
        names = {p.id: p.name for p in projects}
        words = search.casefold().split()
        kept = [
            t
            for t in threads
            if (not states or thread_state(t) in states)
            and (not project or names.get(t.project_id) == project)
            and all(w in f"{t.title}\n{t.id}".casefold() for w in words)
        ]
        kept.sort(key=lambda t: -last_change(t))
        grouped: dict[str, list[c.Thread]] = {}
        for thread in kept[:THREADS_SHOWN]:
            grouped.setdefault(thread.project_id, []).append(thread)
        groups = [
            ProjectThreads(names.get(pid, pid), pid, items)
            for pid, items in sorted(grouped.items(), key=lambda kv: names.get(kv[0], kv[0]))
        ]
        return EnvThreads(env, groups, all_projects=projects, more=max(0, len(kept) - THREADS_SHOWN))

    async def fleet_threads(
        self, envs: list[Env], *, states: tuple[str, ...], search: str = "", project: str = ""
    ) -> list[EnvThreads]:
        found = (self.env_threads(env, states=states, search=search, project=project) for env in envs)
        return list(await asyncio.gather(*found))

    async def thread(self, env: Env, thread_id: str) -> c.Thread:
        data = await self.call(
            "GET", f"/v1/threads/{path_segment(thread_id)}", params={"environmentId": env.forward}
        )
        return c.Thread.model_validate(data)

    async def diff(self, env: Env, thread_id: str) -> c.ThreadDiff:
        params = {"environmentId": env.forward}
        data = await self.call("GET", f"/v1/threads/{path_segment(thread_id)}/diff", params=params)
        return c.ThreadDiff.model_validate(data)

    async def items(self, env: Env, thread_id: str, after: int | None) -> c.ThreadReadResult:
        params = {"environmentId": env.forward, "afterPosition": after, "limit": c.PAGE_LIMIT}
        data = await self.call("GET", f"/v1/threads/{path_segment(thread_id)}/items", params=params)
        return c.ThreadReadResult.model_validate(data)

    async def events(self, env: Env, thread_id: str, after: int, wait_s: float) -> c.EventsResult:
        params = {"environmentId": env.forward, "after": after, "timeout": wait_s, "limit": c.PAGE_LIMIT}
        data = await self.call("GET", f"/v1/threads/{path_segment(thread_id)}/events", params=params)
        return c.EventsResult.model_validate(data)

    async def send(self, env: Env, thread_id: str, text: str, request_id: str) -> c.ThreadSendResult:
        body = {"text": text, "clientRequestId": request_id, "environmentId": env.forward}
        data = await self.call("POST", f"/v1/threads/{path_segment(thread_id)}/runs", body=body)
        return c.ThreadSendResult.model_validate(data)

    async def interrupt(self, env: Env, thread_id: str, *, stop: bool) -> c.ThreadInterruptResult:
        body = {"stop": stop, "reason": "from the console", "environmentId": env.forward}
        data = await self.call("POST", f"/v1/threads/{path_segment(thread_id)}/interrupt", body=body)
        return c.ThreadInterruptResult.model_validate(data)

    async def launch(self, env: Env, body: dict[str, Any]) -> c.ThreadLaunchResult:
        data = await self.call("POST", "/v1/threads", body={**body, "environmentId": env.forward})
        return c.ThreadLaunchResult.model_validate(data)

    async def providers(self) -> list[c.ProviderInfo]:
        data = await self.call("GET", "/v1/providers")
        return [c.ProviderInfo.model_validate(x) for x in data["items"]]

    # --- tasks and orchestrations -----------------------------------------------------------

    async def tasks(self, params: dict[str, Any]) -> c.Page[c.TaskInfo]:
        data = await self.call("GET", "/v1/tasks", params=params)
        return c.Page[c.TaskInfo].model_validate(data)

    async def task(self, task_id: str) -> c.TaskInfo:
        return c.TaskInfo.model_validate(await self.call("GET", f"/v1/tasks/{path_segment(task_id)}"))

    async def cancel_task(self, task_id: str) -> c.TaskInfo:
        data = await self.call(
            "POST", f"/v1/tasks/{path_segment(task_id)}/cancel", body={"reason": "cancelled in the console"}
        )
        return c.TaskInfo.model_validate(data)

    async def orchestrations(self) -> list[dict[str, Any]]:
        data = await self.call("GET", "/v1/orchestrations")
        items: list[dict[str, Any]] = data["items"]
        return items

    async def orchestration(self, run_id: str, *, after: float = 0.0, wait_s: float = 0.0) -> dict[str, Any]:
        data: dict[str, Any] = await self.call(
            "GET", f"/v1/orchestrations/{path_segment(run_id)}", params={"after": after, "timeout": wait_s}
        )
        return data

    async def cancel_orchestration(self, run_id: str) -> dict[str, Any]:
        data: dict[str, Any] = await self.call(
            "POST",
            f"/v1/orchestrations/{path_segment(run_id)}/cancel",
            body={"reason": "cancelled in the console"},
        )
        return data
