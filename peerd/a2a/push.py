"""A2A push notifications: webhooks per task, and each state change owed to each until done.

- **Registered** (`create`): the URL's scheme and literal address are checked (`mapping.push_url`),
  a name is resolved and every address it gives is checked (`mapping.check_resolved`); refused with
  `push_address_refused` unless public unicast or in the owner's `[a2a] allow_private_push`.
- **Owed** (`observe`): when a task's state differs from the last one recorded for a webhook, the
  new state is recorded as owed to it in the same transaction (`a2a_push_owed`), so a change is
  never lost to a crash; at start every webhook of a task not yet ended is looked at again.
- **Delivered** (`deliver_due`): the name is resolved again and checked again at each attempt (a
  name that now resolves to 127.0.0.1 is refused: DNS rebinding), and the connection goes to the
  addresses just checked (`PinnedResolver`), never to a second lookup. The body is the SDK's
  `StreamResponse` JSON (a status update; the whole task once it ended), with the webhook's token
  in `X-A2A-Notification-Token`. A 2xx answer delivers it; else it is retried with exponential
  backoff and jitter (1 s doubling to 5 min) up to `MAX_ATTEMPTS`, then given up with the reason;
  a refused address is given up at once. Nothing here logs a URL's path or query, or a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from a2a.types import StreamResponse, Task, TaskPushNotificationConfig, TaskStatus, TaskStatusUpdateEvent
from google.protobuf.json_format import MessageToDict

from peerd import contracts as c
from peerd.a2a import mapping, store
from peerd.a2a.view import STATES, state_name
from peerd.errors import PushAddressRefused
from peerd.operations import Caller, Operations
from peerd.store import clients

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 12
LINK_NAMESPACE = "link:"  # `Caller.for_link`'s namespace
MAX_DELAY_S = 300.0
SEND_TIMEOUT_S = 10.0
IDLE_S = 30.0
MAX_CONFIGS_PER_TASK = 10

Resolve = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to now (TCP)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def backoff_s(attempts: int) -> float:
    """The wait before the next attempt after `attempts` failed ones: 1 s doubling to 5 min, with jitter."""
    base = min(MAX_DELAY_S, 2.0 ** max(0, attempts - 1))
    return base * random.uniform(0.5, 1.0)  # noqa: S311  # jitter, not a secret


class PinnedResolver(aiohttp.abc.AbstractResolver):
    """Answers only the addresses already checked: the connection cannot go where a second lookup says."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        found: list[aiohttp.abc.ResolveResult] = []
        for address in self.addresses:
            fam = socket.AF_INET6 if ":" in address else socket.AF_INET
            found.append(
                {"hostname": host, "host": address, "port": port, "family": fam, "proto": 0, "flags": 0}
            )
        return found

    async def close(self) -> None:
        return None


class PushService:
    def __init__(
        self,
        ops: Operations,
        *,
        allowed: mapping.Networks,
        task_of: Callable[[str], Awaitable[Task | None]],
        resolver: Resolve = resolve,
    ) -> None:
        self.ops = ops
        self.db = ops.db
        self.allowed = allowed
        self._task_of = task_of
        self._resolve = resolver
        self._poke = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._watched: set[str] = set()

    # --- the configs ----------------------------------------------------------------------------

    async def check(self, url: str) -> list[str]:
        """The addresses a webhook URL may be reached at now; `push_address_refused` if any is not allowed."""
        return await self._check(url)

    async def _check(self, url: str) -> list[str]:
        host, port = mapping.push_url(url, self.allowed)
        try:
            addresses = await self._resolve(host, port)
        except OSError:
            addresses = []
        mapping.check_resolved(host, addresses, self.allowed)
        return addresses

    async def create(
        self, caller: Caller, task_id: str, thread_id: str, config: TaskPushNotificationConfig
    ) -> TaskPushNotificationConfig:
        """A webhook for a task (here, or followed on a box: `thread_id` is the key the change
        feed is poked under when it changes)."""
        await self._check(config.url)
        config_id = config.id or uuid.uuid4().hex
        auth = config.authentication if config.HasField("authentication") else None
        async with self.db.write() as tx:
            count = await tx.execute("SELECT COUNT(*) FROM a2a_push_configs WHERE task_id = ?", (task_id,))
            row = await count.fetchone()
            if row is not None and row[0] >= MAX_CONFIGS_PER_TASK:
                raise PushAddressRefused(f"Task {task_id} has {MAX_CONFIGS_PER_TASK} webhooks already.")
            await tx.execute(
                "INSERT OR REPLACE INTO a2a_push_configs (task_id, id, thread_id, namespace, url, token, "
                "auth_scheme, auth_credentials, last_state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                (
                    task_id,
                    config_id,
                    thread_id,
                    caller.namespace,
                    config.url,
                    config.token or None,
                    auth.scheme if auth else None,
                    auth.credentials if auth else None,
                    self.ops.clock(),
                ),
            )
        self._poke.set()
        return _config(task_id, config_id, config.url, config.token)

    async def get(self, task_id: str, config_id: str) -> TaskPushNotificationConfig | None:
        row = await self.db.fetchone(
            "SELECT task_id, id, url, token FROM a2a_push_configs WHERE task_id = ? AND id = ?",
            (task_id, config_id),
        )
        return None if row is None else _config(row["task_id"], row["id"], row["url"], row["token"])

    async def list_configs(self, task_id: str) -> list[TaskPushNotificationConfig]:
        rows = await self.db.fetchall(
            "SELECT task_id, id, url, token FROM a2a_push_configs WHERE task_id = ? ORDER BY created_at",
            (task_id,),
        )
        return [_config(r["task_id"], r["id"], r["url"], r["token"]) for r in rows]

    async def delete(self, task_id: str, config_id: str) -> None:
        async with self.db.write() as tx:
            await tx.execute(
                "DELETE FROM a2a_push_configs WHERE task_id = ? AND id = ?", (task_id, config_id)
            )
            await tx.execute(
                "DELETE FROM a2a_push_owed WHERE task_id = ? AND config_id = ? AND delivered_at IS NULL",
                (task_id, config_id),
            )

    # --- what is owed ---------------------------------------------------------------------------

    async def observe(self) -> None:
        """Record as owed each state change of a watched task not yet recorded."""
        rows = await self.db.fetchall(
            "SELECT task_id, id, thread_id, last_state FROM a2a_push_configs "
            "WHERE last_state IS NULL OR last_state NOT IN ('completed', 'failed', 'canceled')"
        )
        self._set_watched({r["thread_id"] for r in rows})
        for row in rows:
            task = await self._task_of(row["task_id"])
            if task is None:
                continue
            state = state_name(task.status.state)
            if state == row["last_state"]:
                continue
            now = self.ops.clock()
            async with self.db.write() as tx:
                cur = await tx.execute(
                    "UPDATE a2a_push_configs SET last_state = ? WHERE task_id = ? AND id = ? "
                    "AND last_state IS ?",
                    (state, row["task_id"], row["id"], row["last_state"]),
                )
                if cur.rowcount == 1:
                    await tx.execute(
                        "INSERT OR IGNORE INTO a2a_push_owed (task_id, config_id, state, next_at, created_at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (row["task_id"], row["id"], state, now, now),
                    )

    def _set_watched(self, thread_ids: set[str]) -> None:
        self._watched = thread_ids

    async def owed(self) -> list[dict[str, Any]]:
        """Every delivery, for `peerd` tests and diagnostics (no token, no URL)."""
        rows = await self.db.fetchall(
            "SELECT task_id, config_id, state, attempts, delivered_at, given_up FROM a2a_push_owed "
            "ORDER BY created_at"
        )
        return [dict(r) for r in rows]

    async def given_up(self, *, window_s: float = store.GIVEN_UP_WINDOW_S, latest: int = 5) -> c.PushHealth:
        return await store.pushes_given_up(self.db, now=self.ops.clock(), window_s=window_s, latest=latest)

    async def given_up_for(self, task_id: str) -> list[dict[str, Any]]:
        """A task's pushes given up (its GetTask shows them): webhook, state, reason, when."""
        rows = await self.db.fetchall(
            "SELECT o.config_id, o.state, o.given_up, o.given_up_at FROM a2a_push_owed o "
            "WHERE o.task_id = ? AND o.given_up IS NOT NULL ORDER BY o.created_at",
            (task_id,),
        )
        return [
            {
                "configId": r["config_id"],
                "state": r["state"],
                "reason": r["given_up"],
                "givenUpAt": r["given_up_at"],
            }
            for r in rows
        ]

    async def deliver_due(self) -> float | None:
        """Attempt every owed delivery that is due; when the next one is due (None: none owed)."""
        now = self.ops.clock()
        rows = await self.db.fetchall(
            "SELECT o.task_id, o.config_id, o.state, o.attempts, p.url, p.token, p.auth_scheme, p.namespace, "
            "p.auth_credentials FROM a2a_push_owed o JOIN a2a_push_configs p "
            "ON p.task_id = o.task_id AND p.id = o.config_id "
            "WHERE o.delivered_at IS NULL AND o.given_up IS NULL AND o.next_at <= ? ORDER BY o.created_at",
            (now,),
        )
        for row in rows:
            await self._attempt(row)
        nxt = await self.db.fetchone(
            "SELECT MIN(next_at) FROM a2a_push_owed WHERE delivered_at IS NULL AND given_up IS NULL"
        )
        return None if nxt is None or nxt[0] is None else float(nxt[0])

    async def _attempt(self, row: Any) -> None:
        key = (row["task_id"], row["config_id"], row["state"])
        namespace: str = row["namespace"]
        if namespace.startswith(LINK_NAMESPACE):  # a revoked or expired link is told nothing more
            client_id = namespace.removeprefix(LINK_NAMESPACE)
            if await clients.active_client(self.db, client_id, now=self.ops.clock()) is None:
                await self._settle(
                    key, given_up="the link that registered this webhook was revoked or expired"
                )
                return
        try:
            task = await self._task_of(row["task_id"])
            if task is None:
                raise LookupError(row["task_id"])
            body = StreamResponse()
            if row["state"] in mapping.TERMINAL_STATES:
                body.task.CopyFrom(task)
            else:
                status = TaskStatus(state=STATES[row["state"]], timestamp=task.status.timestamp)
                body.status_update.CopyFrom(
                    TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=status)
                )
            addresses = await self._check(row["url"])
            await self._send(row, addresses, MessageToDict(body))
        except PushAddressRefused as refused:
            await self._settle(key, given_up=refused.message)
            log.info(
                "a2a.push_given_up", task_id=row["task_id"], config_id=row["config_id"], code=refused.code
            )
            return
        except (LookupError, aiohttp.ClientError, TimeoutError, OSError, SendFailed) as failed:
            attempts = row["attempts"] + 1
            reason = (
                f"{type(failed).__name__}: {failed}"
                if isinstance(failed, SendFailed)
                else type(failed).__name__
            )
            if attempts >= MAX_ATTEMPTS or isinstance(failed, LookupError):
                await self._settle(key, given_up=f"not delivered after {attempts} attempts ({reason})")
                return
            async with self.db.write() as tx:
                await tx.execute(
                    "UPDATE a2a_push_owed SET attempts = ?, next_at = ? WHERE task_id = ? AND config_id = ? "
                    "AND state = ?",
                    (attempts, self.ops.clock() + backoff_s(attempts), *key),
                )
            log.info("a2a.push_retry", task_id=row["task_id"], config_id=row["config_id"], attempts=attempts)
            return
        await self._settle(key, delivered=True)

    async def _send(self, row: Any, addresses: list[str], body: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        if row["token"]:
            headers["X-A2A-Notification-Token"] = row["token"]
        if row["auth_scheme"] and row["auth_credentials"]:
            headers["Authorization"] = f"{row['auth_scheme']} {row['auth_credentials']}"
        connector = aiohttp.TCPConnector(resolver=PinnedResolver(addresses), use_dns_cache=False)
        timeout = aiohttp.ClientTimeout(total=SEND_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session,
            session.post(row["url"], json=body, headers=headers, allow_redirects=False) as resp,
        ):
            if not 200 <= resp.status < 300:
                raise SendFailed(f"HTTP {resp.status}")

    async def _settle(
        self, key: tuple[str, str, str], *, delivered: bool = False, given_up: str | None = None
    ) -> None:
        now = self.ops.clock()
        async with self.db.write() as tx:
            await tx.execute(
                "UPDATE a2a_push_owed SET delivered_at = ?, given_up = ?, given_up_at = ? WHERE task_id = ? "
                "AND config_id = ? AND state = ?",
                (now if delivered else None, given_up, None if given_up is None else now, *key),
            )

    # --- the loop -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="peerd.a2a.push")

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None

    async def _loop(self) -> None:
        feed = self.ops.feed
        while not feed.closed:
            events = [feed.watch(thread_id) for thread_id in self._watched]  # before reading the store
            self._poke.clear()
            try:
                await self.observe()
                events += [feed.watch(thread_id) for thread_id in self._watched]
                next_at = await self.deliver_due()
            except Exception:  # a store fault or a bug: logged, and the next round tries again
                log.exception("a2a.push_round_failed")
                next_at = None
            wait = IDLE_S if next_at is None else max(0.05, min(IDLE_S, next_at - self.ops.clock()))
            await feed.wait_any([*events, self._poke], wait)


class SendFailed(Exception):
    """A webhook answered, but not 2xx."""


def _config(task_id: str, config_id: str, url: str, token: str | None) -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(id=config_id, task_id=task_id, url=url, token=token or "")
