"""Forwarding: the same operations, run in a linked environment instead of here.

An operation that names another environment's id goes through that link. Before anything is
sent, this side checks what it can (the link exists and is usable, the link's access allows the
call), so a refused call sends nothing. The box then decides for itself from the link.

Launches and sends carry an idempotency key scoped to the caller: every caller here shares one
link, so the key sent is `"fwd:" + hex(sha256(namespace + "\\n" + clientRequestId))`. A retry by
the same caller reaches the same thread there; the same key from another caller is another one.
"""

from __future__ import annotations

import uuid
from typing import Any

from peerd import contracts as c
from peerd.core.envid import normalize_env_id
from peerd.core.idempotency import scoped_request_id
from peerd.errors import CapabilityDenied, InvalidRequest, NotLinked
from peerd.peer.client import PeerClient, not_linked_message
from peerd.store import links


def _mode_limit(caller_modes: tuple[str, str] | None) -> str | None:
    return None if caller_modes is None else f"{caller_modes[0]}/{caller_modes[1]}"


class Forwarder:
    def __init__(self, peers: PeerClient, *, own_env_id: str) -> None:
        self.peers = peers
        self.own_env_id = own_env_id

    async def target(self, environment_id: str | None, *, via_link: bool) -> str | None:
        """The linked environment to forward to, or None for here. Accepts an id or a link label."""
        if environment_id is None:
            return None
        try:
            env_id: str | None = normalize_env_id(environment_id)
        except InvalidRequest:  # not an id: a link's label
            env_id = None
        if env_id == self.own_env_id:
            return None
        if via_link:
            # The box would see this environment's link, not the original caller: refuse.
            raise CapabilityDenied("Work that came in through a link cannot use this environment's links.")
        return env_id or await self._by_label(environment_id)

    async def _by_label(self, label: str) -> str:
        matches = [row.env_id for row in await links.all_links(self.peers.db) if row.label == label]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise InvalidRequest(
                f"Several linked environments are labelled {label!r}; pass the environment id."
            )
        raise NotLinked(not_linked_message(label))

    async def call(
        self,
        env_id: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        caller_modes: tuple[str, str] | None = None,
    ) -> Any:
        return await self.peers.call(
            env_id, method, path, body=body, params=params, mode_limit=_mode_limit(caller_modes)
        )

    @staticmethod
    def launch_body(req: c.ThreadLaunch, *, namespace: str) -> dict[str, Any]:
        """The launch as the box sees it: no environment id, the key scoped to this caller."""
        body = req.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"environment_id"})
        key = req.client_request_id or uuid.uuid4().hex
        body["clientRequestId"] = scoped_request_id(namespace, key)
        return body

    @staticmethod
    def send_body(req: c.ThreadSend, *, namespace: str) -> dict[str, Any]:
        body = req.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"environment_id"})
        if req.client_request_id:
            body["clientRequestId"] = scoped_request_id(namespace, req.client_request_id)
        return body

    @staticmethod
    def body(req: c.Input) -> dict[str, Any]:
        """A request's JSON body as sent on to the linked environment (without `environmentId`)."""
        return req.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"environment_id"})

    @staticmethod
    def query(req: c.Input, *, rename: dict[str, str] | None = None) -> dict[str, Any]:
        """A request's query parameters as sent on (without `environmentId`)."""
        data = req.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"environment_id"})
        for key, value in data.items():  # a list in a query is one comma-separated value (`_comma_list`)
            if isinstance(value, list):
                data[key] = ",".join(map(str, value))
        for old, new in (rename or {}).items():
            if old in data:
                data[new] = data.pop(old)
        return data
