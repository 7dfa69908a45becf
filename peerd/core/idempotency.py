"""Idempotency keys, pure: how a retried command finds its first result.

A command that can be retried carries an id (`clientRequestId`). Its receipt is stored under
(caller namespace, operation, id) together with a hash of the request body, in the same
transaction as the command's effect. A retry with the same body returns the stored result; the
same id with another body is refused, because silently returning a different command's result
would be a lie.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from peerd.errors import IdempotencyKeyReused

RECEIPT_RETENTION_S = 7 * 24 * 3600  # keys are honoured for at least 7 days


def request_hash(op: str, body: dict[str, Any]) -> str:
    """A stable digest of what was asked: canonical JSON, so key order never matters."""
    canonical = json.dumps({"op": op, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Receipt:
    namespace: str
    op: str
    command_id: str
    request_hash: str
    result: dict[str, Any]


def replay(existing: Receipt | None, *, request_hash: str) -> dict[str, Any] | None:
    """The first result if this is a retry; None if the command is new; an error if reused."""
    if existing is None:
        return None
    if existing.request_hash != request_hash:
        raise IdempotencyKeyReused(
            f"clientRequestId {existing.command_id!r} was already used for a different "
            f"{existing.op} request. Use a new clientRequestId for a new request, or repeat the "
            "original request exactly to get its result."
        )
    return existing.result


def scoped_request_id(namespace: str, client_request_id: str) -> str:
    """The key a forwarded launch carries: one caller's retries match, two callers never collide."""
    digest = hashlib.sha256(f"{namespace}\n{client_request_id}".encode()).hexdigest()
    return f"fwd:{digest}"
