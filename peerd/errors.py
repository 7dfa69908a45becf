"""The exception tree: every failure a user or a peer can see is a class with a stable code.

Each class says once what its failure is:

    code         the stable string on the wire (`{"code", "message"}`), the CLI's `code: message`
    http_status  what the API answers with it (inherited: a `NotFound` is 404 unless it says else)
    transient    retrying later can succeed with nothing changed here (the class's own, not inherited)
    ends_link    the link itself is unusable: a task through it cannot succeed (own, not inherited)
    exit_code    what the CLI exits with when it fails with it (inherited; 1 unless it says else)
    oauth_error  RFC 6749's `error` value an OAuth endpoint answers it with (inherited; `None`:
                 never answered there)
    wire_fields  typed extra fields the wire carries, in `details`, with the values they may take

and `PeerdError.__init_subclass__` registers it by its code (`REGISTRY`): a class without a code of
its own, or with another class's code, is refused when it is defined. Everything else is computed
from the registry: `HTTP_STATUS`, `from_wire` (every code comes back as its class), `is_transient`
and `classify` (how the follower, delegation and a thread's move treat a failure), the CLI's exit
code (`exit_code_of`), the OAuth endpoints' RFC 6749 answer (`oauth_error_of`), and the table of
error codes in docs/reference/api.md (`tools/gen_openapi.py`).

All the classes live here, whichever layer raises them: this module imports only the standard
library, so one cheap import (the CLI's start-up is benchmarked) gives every caller the whole
registry, and `from_wire` knows every code whatever was imported first. `tests/unit/test_errors.py`
holds that no other module defines one, and round-trips each class over the wire.

Handlers raise these; the HTTP layer answers `to_wire()` with `http_status(code)`, and the CLI
prints `code: message`. Anything else that escapes is a bug: it is logged with its traceback and
the client gets `internal_error` without details. Decide on the class or the code, never on the
message: the message is for a person and may change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from pathlib import PurePath

Failure = Literal["transient", "link", "task"]

# RFC 6749 §5.2's `error` values peerd's OAuth endpoints answer with, and their statuses (§5.2: 400;
# `slow_down`, RFC 8628's, with 429 as a rate limit is). A class says which it is (`oauth_error`).
OAuthErrorCode = Literal[
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "invalid_scope",
    "unsupported_grant_type",
    "slow_down",
]
OAUTH_STATUS: dict[OAuthErrorCode, int] = {
    "invalid_request": 400,
    "invalid_client": 401,
    "invalid_grant": 400,
    "invalid_scope": 400,
    "unsupported_grant_type": 400,
    "slow_down": 429,
}

# The values of `PairingRejected.reason`, `RefreshRejected.reason` and `AccessExceedsCode`'s access
# levels (`core/constants.py:RUNTIME_MODES`, not imported: this module stays the standard library's
# only, as cheap as it can be; tests/unit/test_errors.py compares).
PairingReason = Literal["unknown_code", "wrong_secret", "expired", "used", "burnt", "cancelled"]
PAIRING_REASONS: tuple[PairingReason, ...] = (
    "unknown_code",
    "wrong_secret",
    "expired",
    "used",
    "burnt",
    "cancelled",
)
# The values of `AuthCodeRejected.reason` (an agent's authorization code at the token endpoint).
AuthCodeReason = Literal["unknown", "reused", "expired", "pkce", "redirect_uri", "client", "resource"]
AUTH_CODE_REASONS: tuple[AuthCodeReason, ...] = (
    "unknown",
    "reused",
    "expired",
    "pkce",
    "redirect_uri",
    "client",
    "resource",
)
RefreshReason = Literal["unknown", "reused", "revoked", "expired"]
REFRESH_REASONS: tuple[RefreshReason, ...] = ("unknown", "reused", "revoked", "expired")
ACCESS_LEVELS: tuple[str, ...] = (
    "read-only",
    "approval-required",
    "auto-accept-edits",
    "auto",
    "full-access",
)

REGISTRY: dict[str, type[PeerdError]] = {}  # code -> its one class, in the order defined
HTTP_STATUS: dict[str, int] = {}  # code -> its class's status, kept with the registry


class PeerdError(Exception):
    """A bug in peerd: the daemon's log has the traceback.

    The root of the tree: raised as itself, `internal_error`; every other failure is a subclass
    with a code of its own."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    transient: ClassVar[bool] = False
    ends_link: ClassVar[bool] = False
    exit_code: ClassVar[int] = 1
    oauth_error: ClassVar[OAuthErrorCode | None] = None
    oauth_reason: ClassVar[bool] = False  # the OAuth answer names the code (or typed `reason`): peerd_reason
    wire_fields: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} declares no code of its own (peerd/errors.py)")
        taken = REGISTRY.get(cls.code)
        if taken is not None:
            raise TypeError(f"{cls.__qualname__}: code {cls.code!r} is {taken.__qualname__}'s already")
        for flag in ("transient", "ends_link"):  # a narrower failure says these itself
            if flag not in cls.__dict__:
                setattr(cls, flag, False)
        REGISTRY[cls.code] = cls
        HTTP_STATUS[cls.code] = cls.http_status

    def __init__(self, message: str, *, code: str | None = None) -> None:
        """`code`: only for a code this peerd does not know (a newer peer's, via `from_wire`);
        a known code is raised as its own class."""
        super().__init__(message)
        self.message = message
        if code is not None and code != self.code:
            if code in REGISTRY:
                raise TypeError(
                    f"raise {REGISTRY[code].__qualname__} for {code!r}, not {type(self).__name__}"
                )
            self.code = code  # type: ignore[misc]  # per-instance: a code from a newer peer

    def details(self) -> dict[str, str]:
        """The typed extra fields this error carries on the wire (`wire_fields`) that are set."""
        found = {name: getattr(self, name, None) for name in self.wire_fields}
        return {name: value for name, value in found.items() if isinstance(value, str)}

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"code": self.code, "message": self.message}
        details = self.details()
        if details:
            wire["details"] = details
        return wire


REGISTRY[PeerdError.code] = PeerdError
HTTP_STATUS[PeerdError.code] = PeerdError.http_status


# --- the request ----------------------------------------------------------------------------------


class InvalidRequest(PeerdError):
    """The request is malformed or impossible (the message names the field and what is wrong)."""

    code = "invalid_request"
    http_status = 400
    oauth_error: ClassVar[OAuthErrorCode | None] = "invalid_request"


class UsageError(InvalidRequest):
    """The command line is wrong: a flag, an argument, or a file it names (the CLI found it before
    asking the daemon)."""

    code = "usage_error"
    exit_code = 2


class BadPageToken(InvalidRequest):
    """A page token (A2A `ListTasks`' `pageToken`) that is not one peerd gave: list again without
    it to start from the newest."""

    code = "invalid_page_token"


class UnsupportedGrant(InvalidRequest):
    """`POST /oauth/token` with a `grant_type` peerd does not take."""

    code = "unsupported_grant_type"
    oauth_error = "unsupported_grant_type"


class ScopeInvalid(InvalidRequest):
    """`POST /oauth/token` asked for an access level that does not exist."""

    code = "invalid_scope"
    oauth_error = "invalid_scope"


class NotLinked(InvalidRequest):
    """This environment has no link to the one named (never linked, or forgotten here)."""

    code = "not_linked"
    ends_link = True


class ProviderUnavailable(InvalidRequest):
    """The provider's binary is not found on the daemon's PATH; nothing was made."""

    code = "provider_unavailable"


class MoveRefused(InvalidRequest):
    """The environment named cannot take the thread in a move (the message says why)."""

    code = "move_refused"


class TargetRequired(PeerdError):
    """A delegation to a linked machine needs more of its target (a model, or a project there)."""

    code = "target_required"
    http_status = 400


class ConfigInvalid(PeerdError):
    """A config file or a flag of `peerd serve` is wrong: the message names it and what is wrong."""

    code = "config_invalid"
    http_status = 400
    exit_code = 2


class PayloadTooLarge(PeerdError):
    """The request body is larger than the daemon takes."""

    code = "payload_too_large"
    http_status = 413


class MethodNotAllowed(PeerdError):
    """The endpoint exists but does not take that method."""

    code = "method_not_allowed"
    http_status = 405


# --- not found ------------------------------------------------------------------------------------


class NotFound(PeerdError):
    """No such endpoint, agent tool, pairing code or client."""

    code = "not_found"
    http_status = 404


class ProjectNotFound(NotFound):
    """No project with that id or name."""

    code = "project_not_found"


class ThreadNotFound(NotFound):
    """No thread with that id."""

    code = "thread_not_found"


class AmbiguousId(InvalidRequest):
    """A shortened id that more than one thread (or task) starts with; the message lists them."""

    code = "ambiguous_id"


class RunNotFound(NotFound):
    """No such run, or not in that thread."""

    code = "run_not_found"


class ItemNotFound(NotFound):
    """No such item in that thread."""

    code = "item_not_found"


class ApprovalNotFound(NotFound):
    """No approval with that id that this caller may see."""

    code = "approval_not_found"


class TaskNotFound(NotFound):
    """No delegated task with that id (for an agent: none of its own thread)."""

    code = "task_not_found"


class MoveNotFound(NotFound):
    """No move of a thread with that id here."""

    code = "move_not_found"


class OrchestrationNotFound(NotFound):
    """No orchestration with that id."""

    code = "orchestration_not_found"


class WaitNotFound(NotFound):
    """No wait on a pull request with that id (for an agent: none of its own thread)."""

    code = "wait_not_found"


# --- conflicts ------------------------------------------------------------------------------------


class Conflict(PeerdError):
    """The thread or project is in a state that forbids the request."""

    code = "conflict"
    http_status = 409


class IdempotencyKeyReused(Conflict):
    """The `clientRequestId` was used already, for a different request."""

    code = "idempotency_key_reused"


class ProjectExists(Conflict):
    """The checkout is registered already, or another project has that name."""

    code = "project_exists"


class BranchTaken(Conflict):
    """A launch named a branch that exists or belongs to another thread."""

    code = "branch_taken"


class WorktreeDirty(Conflict):
    """Archiving would delete uncommitted or untracked files (the message names them)."""

    code = "worktree_dirty"


class DirtyCheckout(Conflict):
    """`peerd orchestrate` would change a checkout that has changes of its owner's."""

    code = "checkout_dirty"


class ApprovalDecided(Conflict):
    """The approval was decided already: the first decision stands."""

    code = "approval_decided"


class ApprovalWithdrawn(ApprovalDecided):
    """The question was withdrawn before anyone decided: the run that asked is gone (it ended, or
    a restart of peerd cut it). A decision on it lands nowhere and is refused."""

    code = "approval_withdrawn"


class NoPlacement(Conflict):
    """`auto` found no environment that can take the work (the message gives each one's reason)."""

    code = "no_placement"


class ThreadMoving(Conflict):
    """The thread is being moved: it takes no new runs here (the message names the thread there)."""

    code = "thread_moving"


class ThreadMoved(Conflict):
    """The thread was moved: it lives on in the environment the message names."""

    code = "thread_moved"


class ThreadBusy(Conflict):
    """The thread has a live run: a move waits for none, so stop it first (`--interrupt`)."""

    code = "thread_busy"


class StateChanged(Conflict):
    """An orchestration's packet is not in the state a write was decided from any more (another
    writer moved it first): nothing was written, and the engine decides again from what is there."""

    code = "state_changed"

    def __init__(self, message: str, *, current: str | None = None) -> None:
        super().__init__(message)
        self.current = current  # the state found, for the engine; not on the wire


class AlreadyRunning(PeerdError):
    """`peerd serve`: another daemon holds the home's lock."""

    code = "already_running"
    http_status = 409


class ReceiptMissing(PeerdError):
    """`peerd orchestrate`: a hop was about to start without the previous hop's receipt (a bug)."""

    code = "receipt_missing"
    http_status = 409


# --- denied ---------------------------------------------------------------------------------------


class CapabilityDenied(PeerdError):
    """The caller may not do this (a web page, a refused token, a revoked, expired or read-only
    link, another's thread)."""

    code = "capability_denied"
    http_status = 403
    ends_link = True


class ParentNotActive(CapabilityDenied):
    """An agent tool call with the token of a run that has ended (or no run to wake)."""

    code = "parent_not_active"


class LinkRevoked(CapabilityDenied):
    """The link a run or request acts for was revoked or expired on this machine."""

    code = "link_revoked"
    ends_link = True


class ApprovalNotAllowed(CapabilityDenied):
    """This caller may see the approval but not decide it (a read-only link)."""

    code = "approval_not_allowed"


class NotYours(CapabilityDenied):
    """A ref, worktree or checkout that the ownership ledger (`store/ownership.py`) gives to
    someone else: the caller may not move, replace or remove it."""

    code = "not_yours"


class ConfinementUnavailable(CapabilityDenied):
    """A link's run that may run only confined, on a machine where peerd cannot confine it."""

    code = "confinement_unavailable"


class PushAddressRefused(CapabilityDenied):
    """An A2A push webhook whose address is not allowed: loopback, private, link-local, multicast
    or otherwise not public, named or resolved, unless the owner allows it (`[a2a]
    allow_private_push`)."""

    code = "push_address_refused"


class RuntimeModeEscalationDenied(PeerdError):
    """A runtime mode wider than the caller's cap (a link's level, an agent's own run)."""

    code = "runtime_mode_escalation_denied"
    http_status = 403


class InteractionModeEscalationDenied(PeerdError):
    """An interaction mode wider than the caller's cap."""

    code = "interaction_mode_escalation_denied"
    http_status = 403


# --- linking --------------------------------------------------------------------------------------


class SelfLink(PeerdError):
    """`peerd link`: the pairing code is this environment's own."""

    code = "self"
    http_status = 400


class AccessExceedsCode(PeerdError):
    """`peerd link` asked for more access than the pairing code allows."""

    code = "access_exceeds_code"
    http_status = 400
    oauth_error = "invalid_scope"
    oauth_reason = True
    wire_fields = {"requested": ACCESS_LEVELS, "ceiling": ACCESS_LEVELS}

    def __init__(
        self,
        message: str,
        *,
        requested: str | None = None,
        ceiling: str | None = None,  # access levels (ACCESS_LEVELS)
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.ceiling = ceiling


class PairingRejected(PeerdError):
    """The box refused the pairing code; `reason` says why (absent when the box did not say)."""

    code = "pairing_rejected"
    http_status = 400
    oauth_error = "invalid_grant"
    oauth_reason = True
    wire_fields = {"reason": PAIRING_REASONS}

    def __init__(self, message: str, *, reason: PairingReason | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class RefreshRejected(PeerdError):
    """The box refused a refresh token (OAuth's `invalid_grant`; `reason` says why)."""

    code = "invalid_grant"
    http_status = 400
    oauth_error = "invalid_grant"
    oauth_reason = True
    wire_fields = {"reason": REFRESH_REASONS}

    def __init__(
        self, message: str, *, reason: RefreshReason | None = None, client_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.client_id = client_id  # for the box's log; never a token, never on the wire


class AuthCodeRejected(PeerdError):
    """The box refused an agent's authorization code at the token endpoint (OAuth's
    `invalid_grant`; `reason` says why: unknown, reused, expired, pkce, redirect_uri, client,
    resource)."""

    code = "authorization_code_rejected"
    http_status = 400
    oauth_error = "invalid_grant"
    oauth_reason = True
    wire_fields = {"reason": AUTH_CODE_REASONS}

    def __init__(self, message: str, *, reason: AuthCodeReason | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidClient(PeerdError):
    """An agent's OAuth client is not one the box can use: an unknown client id, a client ID
    metadata document that could not be fetched or is refused, or a redirect URI it does not list."""

    code = "invalid_client"
    http_status = 400
    oauth_error = "invalid_client"
    oauth_reason = True


class RateLimited(PeerdError):
    """The box refuses pairing attempts for a while (too many failures); retry later."""

    code = "rate_limited"
    http_status = 429
    transient = True
    oauth_error = "slow_down"


# --- a linked environment -------------------------------------------------------------------------


class PeerUnreachable(PeerdError):
    """The linked machine did not answer at its addresses (asleep, network down, restarting), or
    answered 5xx."""

    code = "unreachable"
    http_status = 503
    transient = True


class PinMismatch(PeerdError):
    """Something answered with another certificate than the pinned one; nothing secret was sent."""

    code = "pin_mismatch"
    http_status = 502
    ends_link = True


class NotAPeerd(PeerdError):
    """What answered at the address is not a peerd."""

    code = "not_a_peerd"
    http_status = 502
    ends_link = True


class WrongEnvironment(PeerdError):
    """What answered at the address is another environment than the one linked."""

    code = "wrong_environment"
    http_status = 502
    ends_link = True


class Incompatible(PeerdError):
    """The linked peerd speaks a protocol version this one does not."""

    code = "incompatible"
    http_status = 502
    ends_link = True


class VersionSkew(PeerdError):
    """A linked environment answers, but runs a peerd without what this call needs (an older
    release): the message names the machine to update. Waited out until it is updated, never a
    reason to fail the link's tasks."""

    code = "version_skew"
    http_status = 502
    transient = True


# --- peerd's own work -----------------------------------------------------------------------------


class ProviderError(PeerdError):
    """A provider could not start (recorded as the failed run's reason)."""

    code = "provider_error"
    http_status = 502


class ProviderPathUnreachable(ProviderError):
    """A path the provider's CLI needs (its binary, what its config.toml entry names, its state
    dir) cannot be reached inside the run's sandbox: the run fails before the CLI starts, with the
    path, the setting that named it and the fix (`peerd.providers.reach`)."""

    code = "provider_path_unreachable"


class GitError(PeerdError):
    """A git command failed; the message carries git's own error (credentials removed)."""

    code = "git_error"


# --- this daemon and its home ---------------------------------------------------------------------


class HomeNewer(PeerdError):
    """The home was last used by a newer peerd (its `home-format`): `peerd serve` refuses it."""

    code = "home_newer"
    exit_code = 2


class HomeUnusable(PeerdError):
    """The home directory cannot be created, written or locked (a file in the way, no permission)."""

    code = "home_unusable"


class StoreRefused(PeerdError):
    """The daemon will not start over this store (the message names the file and the way out)."""

    code = "store_refused"
    exit_code = 2


class IdentityError(PeerdError):
    """The identity files exist but cannot be used; never overwritten, so the id is not lost."""

    code = "identity_unusable"


class Unavailable(PeerdError):
    """The daemon is starting, or a part of it is not there yet; retry shortly."""

    code = "unavailable"
    http_status = 503
    transient = True


class LinkClockSkew(Unavailable):
    """The box called the link expired while this machine's own record of it (the lifetime the box
    gave at its last refresh, counted on this machine's clock) says it is still valid: the box's
    clock is wrong (ahead). Nothing is marked expired, no new pairing is needed, and the link works
    again once that clock is right."""

    code = "clock_skew"
    transient = True


class StorageUnavailable(Unavailable):
    """The store cannot be written now (disk full, read-only, locked); nothing was changed."""

    code = "storage_unavailable"
    transient = True


class ShuttingDown(Unavailable):
    """The daemon is stopping (or was stopped while it started); the request was not carried out.
    Retry once it is back."""

    code = "shutting_down"
    transient = True


# --- the CLI and `peerd mcp` --------------------------------------------------------------------


class DaemonNotRunning(PeerdError):
    """No daemon answers at the home's socket (not started, or stopped), or, to `peerd mcp`, it
    dropped the call. The CLI and `peerd mcp` say so; a daemon never answers it."""

    code = "daemon_unavailable"
    http_status = 503
    exit_code = 3

    def __init__(self, message: str, *, socket_path: PurePath | None = None) -> None:
        super().__init__(message)
        self.socket_path = socket_path

    @classmethod
    def at(cls, socket_path: PurePath) -> DaemonNotRunning:
        return cls(
            f"peerd is not running (no daemon answers at {socket_path}). Start it with `peerd serve`.",
            socket_path=socket_path,
        )


class TimedOut(PeerdError):
    """A wait ended at its timeout with what it waited for still going (`peerd thread wait`, a
    move's `--wait`), or the daemon did not answer `peerd mcp` in time."""

    code = "timeout"
    http_status = 504
    exit_code = 4


class BadResponse(PeerdError):
    """What answered was not an answer this peerd can read (not JSON, or not of its shape): to a
    run's agent tools (the scripted coder), peerd's answer over the run's socket."""

    code = "bad_response"
    http_status = 502


# --- the codes of run items -----------------------------------------------------------------------

# A run's items carry a code in `data.code` where peerd decides on it later (never on the text):
# an error item the code of the error that ended the run (a registry code above), or one of these.
ItemCode = Literal["daemon_stopped", "confined", "budget_exceeded", "run_interrupted"]
DAEMON_STOPPED: ItemCode = "daemon_stopped"
CONFINED: ItemCode = "confined"
BUDGET_EXCEEDED: ItemCode = "budget_exceeded"
RUN_INTERRUPTED: ItemCode = "run_interrupted"
ITEM_CODES: dict[ItemCode, str] = {
    DAEMON_STOPPED: "The error item of a run a stop or crash of its daemon cut: the run was interrupted "
    "(and is continued where the run rules say so).",
    CONFINED: "The notice item of a run peerd confined (bubblewrap): it could write only its worktree.",
    BUDGET_EXCEEDED: "The error item of a run that failed because its work passed its budget: it is never "
    "continued.",
    RUN_INTERRUPTED: "The notice item an interrupt or Stop leaves as the run's last item, its text the reason "
    "(a person's, or a parent's when it stopped): the conversation shows where the run stopped.",
}


# --- computed from the registry -------------------------------------------------------------------


def http_status(code: str) -> int:
    """The HTTP status for an error code; unknown codes are server errors."""
    return HTTP_STATUS.get(code, 500)


def is_transient(code: str) -> bool:
    """Whether retrying later can succeed with nothing changed here (an unknown code: no)."""
    cls = REGISTRY.get(code)
    return cls is not None and cls.transient


def classify(code: str) -> Failure:
    """Transient (back off, retry without limit), the whole link (end its tasks), or one task."""
    cls = REGISTRY.get(code)
    if cls is not None and cls.transient:
        return "transient"
    if cls is not None and cls.ends_link:
        return "link"
    return "task"


def exit_code_of(error: BaseException) -> int:
    """What the CLI exits with when it fails with `error`: its class's `exit_code` (anything that
    is not a `PeerdError`: 1, as `internal_error`)."""
    return error.exit_code if isinstance(error, PeerdError) else PeerdError.exit_code


def oauth_error_of(error: PeerdError) -> tuple[OAuthErrorCode, int, str | None]:
    """How an OAuth endpoint answers `error` (RFC 6749 §5.2): its `error` value, the status, and
    peerd's stable `peerd_reason` (the class's typed `reason`, else its code, for a class that
    names one; `None` otherwise). A class with no `oauth_error` of its own is a bug there:
    `invalid_request` is what the client can act on least wrongly."""
    cls = type(error)
    value: OAuthErrorCode = cls.oauth_error or "invalid_request"
    reason: str | None = None
    if cls.oauth_reason:
        reason = error.details().get("reason") if "reason" in cls.wire_fields else cls.code
    return value, OAUTH_STATUS[value], reason


def from_wire(code: str, message: str, details: object = None) -> PeerdError:
    """Rebuild the typed error a daemon reported (the client side of `to_wire`): its class, with
    the typed fields `details` carries that the class knows (a value it does not know is left
    out). A code this peerd does not know (a newer peer's) is a `PeerdError` with that code."""
    cls = REGISTRY.get(code)
    if cls is None:
        return PeerdError(message, code=code)
    given = details if isinstance(details, Mapping) else {}
    kept = {name: given[name] for name, allowed in cls.wire_fields.items() if given.get(name) in allowed}
    return cls(message, **kept)


def from_body(body: Mapping[str, Any]) -> PeerdError:
    """`from_wire` of an answer's JSON body `{"code", "message", "details"?}`."""
    return from_wire(str(body["code"]), str(body.get("message", "")), body.get("details"))
