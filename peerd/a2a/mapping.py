"""peerd <-> A2A 1.0, pure: no I/O, no clock, no store.

The shape of the face (docs/user/a2a.md):

| A2A | peerd |
| --- | --- |
| `contextId` | a thread |
| a task (`id`) | one run of that thread: `SendMessage` without a `contextId` launches the thread |
|  | (its first run); with one, it is `thread send` (its next run) |
| `messageId` | the idempotency key (`clientRequestId` `a2a:<messageId>` in the caller's namespace) |
| task state | the run's status, `input-required` while an approval of that run waits for a person |
| `CancelTask` | `thread interrupt` of that run (live: interrupted; queued: cancelled, never started) |
| `ListTasks` | the runs this caller may see, newest first by (`created_at`, id), a page at a time |

Push webhooks: `allowed_push_address` decides one resolved address (public unicast only, unless
the owner's `[a2a] allow_private_push` networks hold it); the shell asks it for the URL's literal
host when registered and for every resolved address again at each delivery (DNS rebinding).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from peerd import contracts as c
from peerd.core.runs import RunStatus
from peerd.errors import BadPageToken, InvalidRequest, PushAddressRefused

A2AState = Literal["submitted", "working", "input-required", "completed", "failed", "canceled"]
TERMINAL_STATES: frozenset[A2AState] = frozenset({"completed", "failed", "canceled"})

REQUEST_ID_PREFIX = "a2a:"
MAX_MESSAGE_ID_CHARS = 120  # `a2a:` + this fits peerd's clientRequestId


def task_state(status: RunStatus, *, approval_waiting: bool) -> A2AState:
    """A run's status as an A2A task state; a live run whose approval waits is `input-required`."""
    if status == "queued":
        return "submitted"
    if status in ("starting", "running"):
        return "input-required" if approval_waiting else "working"
    if status == "completed":
        return "completed"
    if status == "failed":
        return "failed"
    return "canceled"  # cancelled, and interrupted (a stop cut it; it will not go on by itself)


def client_request_id(message_id: str) -> str:
    """The idempotency key a message's id becomes (in the caller's namespace, as every key)."""
    if not message_id:
        raise InvalidRequest("message.messageId is required: it is the idempotency key of the send.")
    if len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise InvalidRequest(f"message.messageId is longer than {MAX_MESSAGE_ID_CHARS} characters.")
    return REQUEST_ID_PREFIX + message_id


def prompt_of(texts: Sequence[str]) -> str:
    """The prompt a message's text parts make (other parts are refused by the shell)."""
    prompt = "\n\n".join(text for text in texts if text.strip())
    if not prompt:
        raise InvalidRequest("The message has no text part: peerd's agents take text.")
    return prompt


# --- ListTasks: newest first by (created_at, id), a page at a time ---------------------------------

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100  # the A2A SDK's own bound

RUN_STATUSES: dict[A2AState, tuple[RunStatus, ...]] = {
    "submitted": ("queued",),
    "working": ("starting", "running"),
    "input-required": ("starting", "running"),  # and an approval waits: known only per task
    "completed": ("completed",),
    "failed": ("failed",),
    "canceled": ("cancelled", "interrupted"),
}


@dataclass(frozen=True, order=True)
class Position:
    """Where a task is in `ListTasks`' order (newest first): when it was recorded, then its id, so
    the order never changes as tasks progress and a page token stays good."""

    created_at: float
    id: str


def page_size(asked: int | None) -> int:
    if asked is None:
        return DEFAULT_PAGE_SIZE
    if not 1 <= asked <= MAX_PAGE_SIZE:
        raise InvalidRequest(f"pageSize must be from 1 to {MAX_PAGE_SIZE}.")
    return asked


def page_token(last: Position) -> str:
    """The opaque token of the page after `last` (the last task of this page)."""
    raw = json.dumps([last.created_at, last.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_page_token(token: str) -> Position:
    """The position a token names; `invalid_page_token` for anything `page_token` did not make."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created, task_id = json.loads(raw)
        if isinstance(created, bool) or not isinstance(created, int | float) or not isinstance(task_id, str):
            raise ValueError(token)
        if not task_id:
            raise ValueError(token)
        return Position(float(created), task_id)
    except (ValueError, TypeError, binascii.Error, RecursionError):
        raise BadPageToken(
            "pageToken is not one ListTasks gave here; list again without it to start from the newest task."
        ) from None


T = TypeVar("T")


def merge_page(
    sources: Iterable[Sequence[tuple[Position, T]]], size: int
) -> tuple[list[tuple[Position, T]], Position | None]:
    """One page from several lists, each newest first and each read `size + 1` past the token: the
    newest `size` of them all, and the position the next page starts after (None: no more)."""
    merged = sorted((entry for source in sources for entry in source), key=lambda e: e[0], reverse=True)
    page = merged[:size]
    return page, (page[-1][0] if len(merged) > size and page else None)


@dataclass(frozen=True)
class Target:
    """What a message's metadata asks: where and with what (all optional; the card's skills name them)."""

    project_id: str | None
    provider: str
    environment_id: str | None  # "auto": a placed launch (peerd/placement/)


def skills(projects: Iterable[c.Project], providers: Iterable[str]) -> list[dict[str, object]]:
    """The card's skills: one per provider and one per project (ids `provider:NAME`, `project:ID`)."""
    found: list[dict[str, object]] = []
    for name in sorted(set(providers)):
        found.append(
            {
                "id": f"provider:{name}",
                "name": f"{name} agent",
                "description": f"Runs the {name} coding agent in a thread of its own (metadata provider={name!r}).",
                "tags": ["coding", "provider"],
            }
        )
    for project in projects:
        found.append(
            {
                "id": f"project:{project.id}",
                "name": project.name,
                "description": f"Works in project {project.name} (metadata projectId={project.id!r}).",
                "tags": ["coding", "project"],
            }
        )
    return found


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def networks(entries: Iterable[str]) -> Networks:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


# IPv6 ranges that carry an IPv4 address a gateway may translate to (64:ff9b::7f00:1 is 127.0.0.1
# through NAT64): Python calls several of them global, so they are refused unless allowed.
TRANSITION: Networks = networks(["::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32"])


def allowed_push_address(address: str, allowed: Networks) -> bool:
    """Whether a push may go to this IP address: a public unicast one, or one the owner allowed."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if any(ip.version == net.version and ip in net for net in allowed):
        return True
    if any(ip.version == net.version and ip in net for net in TRANSITION):
        return False  # an IPv4 address inside IPv6 (NAT64, 6to4, Teredo, compatible): judged unreachable
    return ip.is_global and not ip.is_multicast


def push_url(url: str, allowed: Networks) -> tuple[str, int]:
    """A webhook URL's host and port, checked as far as the URL alone tells (scheme; a literal
    address); a name is checked on what it resolves to, at registration and at every delivery."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidRequest("A push notification URL must be an http(s) URL with a host.")
    if parts.username or parts.password:
        raise InvalidRequest("A push notification URL may not carry credentials; pass a token.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidRequest("The push notification URL's port is not a number.") from None
    host = parts.hostname
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host, port  # a name: judged on what it resolves to
    check_resolved(host, [host], allowed)
    return host, port


def check_resolved(host: str, addresses: Sequence[str], allowed: Networks) -> None:
    """Refuse the push when the name resolved to nothing or to any address that is not allowed."""
    if not addresses:
        raise PushAddressRefused(f"The push notification host {host} resolves to no address.")
    for address in addresses:
        if not allowed_push_address(address, allowed):
            raise PushAddressRefused(
                f"The push notification host {host} is at {address}, which is loopback, private, link-local, "
                "multicast or reserved: refused (the owner may allow a network in [a2a] allow_private_push)."
            )
