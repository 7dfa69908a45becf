"""The exception tree: every failure a user or a peer can see carries a stable code.

    PeerdError(code, message)              -> {"code", "message"} on the wire
    ├── InvalidRequest        invalid_request          400
    │   ├── ProviderUnavailable  provider_unavailable  400  (operations.py)
    │   └── NotLinked         not_linked               400  (no link here to that environment)
    ├── NotFound              not_found                404
    │   ├── ProjectNotFound   project_not_found        404
    │   ├── ThreadNotFound    thread_not_found         404
    │   ├── RunNotFound       run_not_found            404
    │   ├── ItemNotFound      item_not_found           404
    │   └── ApprovalNotFound  approval_not_found       404
    ├── Conflict              conflict                 409
    │   ├── IdempotencyKeyReused  idempotency_key_reused  409
    │   ├── ProjectExists     project_exists           409
    │   ├── BranchTaken       branch_taken             409  (store/threads.py)
    │   ├── WorktreeDirty     worktree_dirty           409  (operations.py)
    │   ├── DirtyCheckout     checkout_dirty           409  (orchestrate/userwork.py)
    │   ├── ApprovalDecided   approval_decided         409  (the first decision stands)
    │   └── ApprovalWithdrawn approval_withdrawn       409  (its run ended before a decision)
    ├── CapabilityDenied      capability_denied        403
    │   ├── ParentNotActive   parent_not_active        403
    │   ├── LinkRevoked       link_revoked             403
    │   ├── ApprovalNotAllowed  approval_not_allowed   403  (a read-only link cannot decide)
    │   ├── NotYours          not_yours                403  (the ownership ledger gives it to another)
    │   └── ConfinementUnavailable  confinement_unavailable  403  (runtime/sandbox.py)
    ├── PayloadTooLarge       payload_too_large        413
    ├── ProviderError         provider_error           502
    │   └── ProviderPathUnreachable  provider_path_unreachable  502  (providers/reach.py)
    ├── GitError              git_error                500
    ├── VersionSkew           version_skew             502  (a linked peerd too old for a call: update it)
    ├── HomeNewer             home_newer               (serve exits 2; homeformat.py: a newer peerd's home)
    └── Unavailable           unavailable              503  (retry later)
        ├── StorageUnavailable  storage_unavailable    503  (disk full, read-only, locked)
        └── ShuttingDown      shutting_down            503

Handlers raise these; the HTTP layer maps `code` to a status in one place (`HTTP_STATUS`), and the
CLI prints `code: message`. Anything else that escapes is a bug: it is logged with its traceback and
the client gets `internal_error` without details.
"""

from __future__ import annotations

from typing import ClassVar


class PeerdError(Exception):
    """A failure with a stable code and a message a person can act on."""

    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]  # per-instance override of the class code

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidRequest(PeerdError):
    code = "invalid_request"


class NotLinked(InvalidRequest):
    """This environment has no link to the one named (never linked, or forgotten here)."""

    code = "not_linked"


class NotFound(PeerdError):
    code = "not_found"


class ProjectNotFound(NotFound):
    code = "project_not_found"


class ThreadNotFound(NotFound):
    code = "thread_not_found"


class RunNotFound(NotFound):
    code = "run_not_found"


class ItemNotFound(NotFound):
    code = "item_not_found"


class Conflict(PeerdError):
    code = "conflict"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class ProjectExists(Conflict):
    code = "project_exists"


class CapabilityDenied(PeerdError):
    code = "capability_denied"


class ParentNotActive(CapabilityDenied):
    code = "parent_not_active"


class LinkRevoked(CapabilityDenied):
    """The link a run or request acts for was revoked or expired on this machine."""

    code = "link_revoked"


class ApprovalNotFound(NotFound):
    code = "approval_not_found"


class ApprovalDecided(Conflict):
    """The approval was decided already: the first decision stands."""

    code = "approval_decided"


class ApprovalWithdrawn(ApprovalDecided):
    """The question was withdrawn before anyone decided: the run that asked is gone (it ended, or
    a restart of peerd cut it). A decision on it lands nowhere and is refused."""

    code = "approval_withdrawn"


class ApprovalNotAllowed(CapabilityDenied):
    """This caller may see the approval but not decide it (a read-only link)."""

    code = "approval_not_allowed"


class NotYours(CapabilityDenied):
    """A ref, worktree or checkout that the ownership ledger (`store/ownership.py`) gives to
    someone else: the caller may not move, replace or remove it."""

    code = "not_yours"


class PayloadTooLarge(PeerdError):
    code = "payload_too_large"


class ProviderError(PeerdError):
    code = "provider_error"


class ProviderPathUnreachable(ProviderError):
    """A path the provider's CLI needs (its binary, what its config.toml entry names, its state
    dir) cannot be reached inside the run's sandbox: the run fails before the CLI starts, with the
    path, the setting that named it and the fix (`peerd.providers.reach`)."""

    code = "provider_path_unreachable"


class GitError(PeerdError):
    code = "git_error"


class VersionSkew(PeerdError):
    """A linked environment answers, but runs a peerd without what this call needs (an older
    release): the message names the machine to update. Transient for the follower (it backs off and
    retries until the machine is updated), never a reason to fail the link's tasks."""

    code = "version_skew"


class HomeNewer(PeerdError):
    """The home was last used by a newer peerd (its `home-format`): `peerd serve` refuses it."""

    code = "home_newer"


class Unavailable(PeerdError):
    code = "unavailable"


class LinkClockSkew(Unavailable):
    """The box called the link expired while this machine's own record of it (the lifetime the box
    gave at its last refresh, counted on this machine's clock) says it is still valid: the box's
    clock is wrong (ahead). Transient: nothing is marked expired, no new pairing is needed, and
    the link works again once that clock is right (issue 26, case 9)."""

    code = "clock_skew"


class StorageUnavailable(Unavailable):
    """The store cannot be written now (disk full, read-only, locked); nothing was changed."""

    code = "storage_unavailable"


class ShuttingDown(Unavailable):
    """The daemon is stopping; the request was not carried out. Retry once it is back."""

    code = "shutting_down"


HTTP_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "provider_unavailable": 400,
    "not_linked": 400,
    "not_found": 404,
    "project_not_found": 404,
    "thread_not_found": 404,
    "run_not_found": 404,
    "item_not_found": 404,
    "approval_not_found": 404,
    "approval_decided": 409,
    "approval_withdrawn": 409,
    "approval_not_allowed": 403,
    "conflict": 409,
    "idempotency_key_reused": 409,
    "branch_taken": 409,
    "worktree_dirty": 409,
    "checkout_dirty": 409,
    "project_exists": 409,
    "no_placement": 409,
    "capability_denied": 403,
    "parent_not_active": 403,
    "link_revoked": 403,
    "confinement_unavailable": 403,
    "not_yours": 403,
    "runtime_mode_escalation_denied": 403,
    "interaction_mode_escalation_denied": 403,
    "payload_too_large": 413,
    "method_not_allowed": 405,
    "already_running": 409,
    "self": 400,
    "access_exceeds_code": 400,
    "pairing_rejected": 400,
    "rate_limited": 429,
    "unreachable": 503,
    "pin_mismatch": 502,
    "not_a_peerd": 502,
    "wrong_environment": 502,
    "incompatible": 502,
    "version_skew": 502,
    "task_not_found": 404,
    "thread_moving": 409,
    "thread_moved": 409,
    "thread_busy": 409,
    "move_refused": 400,
    "move_not_found": 404,
    "orchestration_not_found": 404,
    "receipt_missing": 409,
    "config_invalid": 400,
    "target_required": 400,
    "provider_error": 502,
    "provider_path_unreachable": 502,
    "git_error": 500,
    "unavailable": 503,
    "storage_unavailable": 503,
    "shutting_down": 503,
    "internal_error": 500,
}


def http_status(code: str) -> int:
    """The HTTP status for an error code; unknown codes are server errors."""
    return HTTP_STATUS.get(code, 500)


_BY_CODE: dict[str, type[PeerdError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        NotLinked,
        NotFound,
        ProjectNotFound,
        ThreadNotFound,
        RunNotFound,
        ItemNotFound,
        ApprovalNotFound,
        Conflict,
        ApprovalDecided,
        ApprovalWithdrawn,
        IdempotencyKeyReused,
        ProjectExists,
        CapabilityDenied,
        ParentNotActive,
        ApprovalNotAllowed,
        NotYours,
        PayloadTooLarge,
        ProviderError,
        ProviderPathUnreachable,
        GitError,
        VersionSkew,
        Unavailable,
    )
}


def from_wire(code: str, message: str) -> PeerdError:
    """Rebuild the typed error a daemon reported (the client side of `to_wire`)."""
    cls = _BY_CODE.get(code, PeerdError)
    return cls(message, code=code)
