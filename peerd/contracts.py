"""One contract: the wire models of every operation, shared by the HTTP API, the CLI and agent tools.

Field names are snake_case in Python and camelCase on the wire (`project_id` <-> `projectId`).
Inputs forbid unknown fields, so a misspelt option is a typed `invalid_request`, not a silent no-op.
Errors are `ErrorBody {code, message}`; the codes live in `peerd.errors`.

Bad input is refused here, before any handler or transaction sees it (issue 11): no float field
takes NaN or +-Infinity (`allow_inf_nan=False` once, in the base config), every integer that
reaches SQLite is bounded to its 64-bit range (`MAX_SQL_INT`), a cursor is a bounded non-negative
integer, and peer-given titles lose their control characters (`peerd.core.text`).
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# Defined in the light `core.constants` (the CLI imports them without pydantic), re-exported here.
from peerd.core.constants import INTERACTION_MODES as INTERACTION_MODES  # noqa: PLC0414
from peerd.core.constants import LONG_POLL_MAX_S as LONG_POLL_MAX_S  # noqa: PLC0414
from peerd.core.constants import RUNTIME_MODES as RUNTIME_MODES  # noqa: PLC0414
from peerd.core.constants import InteractionMode as InteractionMode  # noqa: PLC0414
from peerd.core.constants import RuntimeMode as RuntimeMode  # noqa: PLC0414
from peerd.core.links import LinkStatus
from peerd.core.runs import RunStatus
from peerd.core.text import clean_label
from peerd.core.usage import Budget as BudgetRule

PROTOCOL_VERSION = 1
# The wire's revision within PROTOCOL_VERSION, sent in every answer of both listeners (and in every
# request of the peer client) as the `Peerd-Protocol` header, beside `Peerd-Version` (the package
# version). A peer that sends no header is revision 1: the releases before the header (ee09e6e and
# earlier). What each revision added, and what a peer of an older one is spared, is in
# docs/internals/links.md#protocol-revisions; bump it when the wire gains something an older peer
# lacks, and keep serving what the previous revision's peers send.
WIRE_PROTOCOL = 2
PROTOCOL_HEADER = "Peerd-Protocol"
VERSION_HEADER = "Peerd-Version"
# Revision 2 added the change feed (`/v1/feed/*`), and readers that take an item's missing
# default-valued fields as their defaults (so item pages may leave them out for such readers).
FEED_PROTOCOL = 2
OMITS_DEFAULTS_PROTOCOL = 2

ItemKind = Literal[
    "user_message", "assistant_message", "command", "file_change", "tool_call", "error", "notice"
]
# "moved": the thread moved to a linked environment (`movedTo` names the copy there; peerd/handoff/).
ThreadStatus = Literal["active", "archived", "moved"]

MAX_PROMPT_CHARS = 120_000
MAX_TITLE_CHARS = 512
MAX_REQUEST_ID_CHARS = 256
DEFAULT_ITEM_CHARS = 20_000
MAX_ITEM_CHARS = 100_000
PAGE_LIMIT = 100
MAX_SQL_INT = 2**63 - 1  # SQLite's INTEGER range; Python ints beyond it overflow in the driver
MAX_LINK_AGE_S = 10 * 365 * 24 * 3600.0  # --max-age: ten years is "no limit" for every purpose

T = TypeVar("T")


class Wire(BaseModel):
    """Base of every wire model: camelCase aliases, accepts either name when parsing; no float is
    NaN or infinite (JSON has neither, and a stored Infinity breaks every later computation)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# --- one name for an environment's id ----------------------------------------------------------
# Every answer names an environment `environmentId` (issue 30: one naming of fields; the rule is in
# docs/reference/api.md "Names"). Answers that said `envId` before still send it beside, deprecated,
# until protocol 2 (a peer or script of an older release reads it), and read it from an older peer.
ENV_ID_DEPRECATED: Any = Field(
    default=None,
    alias="envId",
    description="The older name of `environmentId` (the same value), sent until protocol 2.",
    deprecated="`envId` is the older name of `environmentId`, sent until protocol 2; read `environmentId`.",
)


class EnvironmentNamed(Wire):
    """An answer that names an environment `environmentId`, and `envId` (deprecated) beside it."""

    @model_validator(mode="before")
    @classmethod
    def _both_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = next(
            (data[k] for k in ("environmentId", "environment_id", "envId", "env_id") if k in data), None
        )
        if given is None:
            return data
        data = {k: v for k, v in data.items() if k not in ("env_id", "environment_id", "deprecated_env_id")}
        return {**data, "environmentId": given, "envId": given}


class Input(Wire):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid", allow_inf_nan=False
    )


def _check_cursor(value: str | None) -> str | None:
    if not value:  # `?cursor=` is the first page, like no cursor
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 19 and int(value) <= MAX_SQL_INT):
        raise ValueError(
            f"cursor {value!r} is not one this API returned (a whole number from 0 to {MAX_SQL_INT}); "
            "pass back its nextCursor"
        )
    return value


# A page cursor: the decimal rowid this API returned, so a bounded non-negative integer.
Cursor = Annotated[str | None, Field(default=None, max_length=64), AfterValidator(_check_cursor)]
# A title a peer may have written: one line, no control characters (`core.text.clean_label`).
Title = Annotated[str, Field(min_length=1, max_length=MAX_TITLE_CHARS), AfterValidator(clean_label)]


ClientRequestId = Field(default=None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)
# Names a linked environment to act in; omitted (or this environment's own id) means here.
EnvironmentId = Field(default=None, min_length=1, max_length=64)


class ErrorBody(Wire):
    code: str
    message: str
    # The error's typed extra fields, for the few codes that have them (`peerd.errors`: a class's
    # `wire_fields`, listed per code in the reference's table of error codes); absent otherwise.
    details: dict[str, str] | None = Field(
        default=None, description="Typed extra fields of a few codes (e.g. `pairing_rejected`'s `reason`)."
    )


class Page(Wire, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


# --- status -------------------------------------------------------------------------------------


class Listener(Wire):
    kind: Literal["unix", "tcp"]
    address: str
    tls: bool


class StatusCounts(Wire):
    projects: int
    threads: int
    live_runs: int


class StoreState(Wire):
    """Is the file at the store's path still the store the daemon writes (store/fileguard.py)?
    `ok`; `replaced`, `removed` or `truncated`: writes are refused, `message` says what to do."""

    state: Literal["ok", "replaced", "removed", "truncated"] = "ok"
    path: str = ""
    message: str | None = None
    saved_as: str | None = None  # the daemon's copy of the store it had open


class ConsoleStatus(Wire):
    """The browser console's listener: where it is (`peerd console` prints a login link), or why not."""

    # listening; moved: its port was taken, it listens on a free one; off: console.enabled = false;
    # not_listening: it could not listen (the note says why)
    state: Literal["listening", "moved", "off", "not_listening"]
    url: str | None  # e.g. http://127.0.0.1:7434; None when it is off or could not listen
    note: str | None = None  # why not, or where it moved from


class GivenUpPush(Wire):
    """An A2A push notification given up (peerd/a2a/push.py): to which webhook (its scheme, host
    and port only: never its path, query or token), for which task and state, and why."""

    task_id: str
    webhook: str
    state: str
    reason: str
    given_up_at: float


class PushHealth(Wire):
    """A2A push notifications given up in the last `window_s` seconds: how many, the latest first."""

    given_up: int
    window_s: float
    latest: list[GivenUpPush] = Field(default_factory=list)


class Status(EnvironmentNamed):
    environment_id: str
    label: str
    version: str
    protocol_version: int = PROTOCOL_VERSION
    fingerprint: str
    # The TLS listener's certificate for browsers (peer/webcert.py); None without a TLS listener.
    web_fingerprint: str | None = None
    listeners: list[Listener]
    counts: StatusCounts
    home: str
    store: StoreState | None = None  # None: a daemon that does not say (older, or still starting)
    console: ConsoleStatus | None = None  # None: a daemon that does not say (older, or still starting)
    # None: a daemon that does not say (older, or still starting)
    a2a_pushes: PushHealth | None = Field(default=None, alias="a2aPushes")
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


class Descriptor(EnvironmentNamed):
    """What `/.well-known/peerd` tells anyone, without credentials."""

    service: Literal["peerd"] = "peerd"
    environment_id: str
    label: str
    protocol_version: int = PROTOCOL_VERSION
    version: str
    capabilities: list[str]
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


# --- projects -----------------------------------------------------------------------------------


class Project(Wire):
    id: str
    name: str
    path: str
    repository_key: str | None
    created_at: float


class ProjectAdd(Input):
    path: str = Field(min_length=1, max_length=4096)
    name: str | None = Field(default=None, min_length=1, max_length=200)


class ProjectList(Input):
    cursor: Cursor = None
    limit: int = Field(default=PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
    environment_id: str | None = EnvironmentId


# --- threads, runs, items -----------------------------------------------------------------------


class Usage(Wire):
    """What a run (or a sum of runs) spent; see peerd/core/usage.py for what each count means."""

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    reasoning_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    cost_usd: float | None = Field(default=None, ge=0)  # the CLI's own figure, null when it gives none
    provider_ms: int | None = Field(default=None, ge=0)  # the CLI's own duration
    wall_ms: int | None = Field(default=None, ge=0)  # started -> last report (or end), by peerd
    # costUsd is peerd's estimate from the owner's price table ([prices]), not the CLI's own figure.
    cost_estimated: bool = False
    # The figures are the run's own say (the scripted coder's script), not parsed from a CLI's stream:
    # a link's per-day dollar ceiling does not count them.
    claimed: bool = False


class Budget(Input):
    """A stop rule: a run that passes any of these is stopped and fails with the reason."""

    tokens: int | None = Field(default=None, ge=1)
    usd: float | None = Field(default=None, gt=0)
    seconds: float | None = Field(default=None, gt=0)

    def rule(self) -> BudgetRule:
        return BudgetRule(tokens=self.tokens, usd=self.usd, seconds=self.seconds)


class Run(Wire):
    id: str
    thread_id: str
    number: int
    status: RunStatus
    reason: str | None = None
    exit_code: int | None = None
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    usage: Usage | None = None  # null: unknown (the provider reported none)


class RunUsage(Wire):
    """One run's usage as `thread show` lists them (its newest `RUN_USAGE_SHOWN`)."""

    id: str
    number: int
    status: RunStatus
    usage: Usage | None = None  # null: unknown (the provider reported none)
    reason: str | None = None  # why it ended so (an interrupt's, a stop's, a failure's reason)


RUN_USAGE_SHOWN = 50


class Thread(Wire):
    id: str
    project_id: str
    title: str
    provider: str
    model: str | None
    runtime_mode: RuntimeMode
    interaction_mode: InteractionMode
    status: ThreadStatus
    queue_held: bool
    in_place: bool
    worktree_path: str
    branch: str | None
    provider_session: str | None
    created_at: float
    updated_at: float
    latest_run: Run | None = None
    base_commit: str | None = None
    link_origin: str | None = None
    link_label: str | None = None
    delegated_from: DelegatedFrom | None = None
    # Who started it: owner, link:<client id>, run:<run id> (an agent's tool call), task:<parent
    # thread> (a delegation), orchestrate:<orchestration id>; None for threads older than this.
    started_by: str | None = None
    # The sum of its runs' usage, in `thread show` only (null there when no run reported any).
    usage: Usage | None = None
    # Each run's usage, oldest first (its newest RUN_USAGE_SHOWN runs), in `thread show` only.
    run_usage: list[RunUsage] | None = None
    # A move (peerd/handoff/): the copy this thread became there (status "moved"), and on that copy
    # where it came from (what the moving machine's link said, like delegatedFrom).
    moved_to: MovedRef | None = None
    moved_from: MovedRef | None = None
    # Why `auto` placed it where it runs (peerd/placement/), as the machine that chose recorded it.
    placement: str | None = None


class MovedRef(Wire):
    """One copy of a moved thread: the environment and the thread there."""

    environment_id: str = Field(max_length=64)
    thread_id: str = Field(max_length=64)


class DelegatedFrom(Wire):
    """Where a delegated thread came from; kept by the box only on link-authenticated launches."""

    environment_id: str = Field(max_length=64)
    thread_id: str = Field(max_length=64)
    title: Annotated[str, Field(max_length=MAX_TITLE_CHARS), AfterValidator(clean_label)] = ""


class ThreadLaunch(Input):
    project_id: str = Field(min_length=1)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    provider: str = Field(default="script", min_length=1, max_length=64)
    title: Title | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    runtime_mode: RuntimeMode | None = None
    interaction_mode: InteractionMode | None = None
    in_place: bool = False
    client_request_id: str | None = ClientRequestId
    delegated_from: DelegatedFrom | None = None
    environment_id: str | None = EnvironmentId
    # The worktree's branch and the exact commit it starts from (orchestration packets). A branch
    # must live under orchestrate/ or peerd/: a launch never works on the project's own branches.
    branch: str | None = Field(default=None, pattern=r"^(orchestrate|peerd)/[A-Za-z0-9._/-]{1,200}$")
    base_commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,64}$")
    # The first run's stop rule (peerd/core/usage.py): past any limit it is stopped and fails.
    budget: Budget | None = None


class ThreadLaunchResult(Wire):
    thread_id: str
    project_id: str
    run_id: str
    status: RunStatus
    provider: str
    model: str | None
    runtime_mode: RuntimeMode
    interaction_mode: InteractionMode
    worktree_path: str
    replayed: bool = False
    # environmentId "auto": where peerd placed it and why (peerd/placement/); null otherwise.
    placement: Placed | None = None


class ThreadList(Input):
    project_id: str | None = None
    include_archived: bool = False
    cursor: Cursor = None
    limit: int = Field(default=PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
    environment_id: str | None = EnvironmentId
    # oldest (or absent): creation order, for paging through all; newest: latest first (`thread list`).
    # None rather than a default, so a forwarded list that does not ask stays readable by older boxes.
    order: Literal["oldest", "newest"] | None = None


class Item(Wire):
    id: str
    thread_id: str
    run_id: str
    position: int
    kind: ItemKind
    text: str
    text_length: int
    text_offset: int = 0
    text_truncated: bool = False
    next_text_offset: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: float


class ThreadRead(Input):
    after_position: int | None = Field(default=None, ge=-1, le=MAX_SQL_INT)
    limit: int = Field(default=PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
    item_id: str | None = None
    text_offset: int = Field(default=0, ge=0, le=MAX_SQL_INT)
    max_chars_per_item: int = Field(default=DEFAULT_ITEM_CHARS, ge=1, le=MAX_ITEM_CHARS)
    run_id: str | None = None
    environment_id: str | None = EnvironmentId


class ThreadReadResult(Wire):
    thread: Thread
    items: list[Item]
    has_more: bool
    next_position: int | None


class ThreadDiffRead(Input):
    environment_id: str | None = EnvironmentId


class DiffFile(Wire):
    """One file of a thread's diff: its unified patch (capped) and its added and removed lines."""

    path: str
    old_path: str | None = None  # a rename's old path
    change: Literal["added", "deleted", "modified", "renamed"]
    added: int = Field(ge=0)
    removed: int = Field(ge=0)
    binary: bool = False
    patch: str
    truncated: bool = False  # the patch was cut (it is longer than the diff shows)


class ThreadDiff(Wire):
    """What a thread changed, committed and not (untracked files included), against its base:
    the commit its worktree started from (or, unrecorded, where its branch left the checkout's),
    `HEAD` for an in-place thread (its uncommitted changes)."""

    thread_id: str
    base: str
    head: str | None
    files: list[DiffFile]
    added: int = Field(ge=0)
    removed: int = Field(ge=0)
    truncated: bool = False  # more files changed than the diff lists


class ThreadSend(Input):
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    client_request_id: str | None = ClientRequestId
    environment_id: str | None = EnvironmentId
    # This run's stop rule, like a launch's (orchestration hops get what is left of their budget).
    budget: Budget | None = None


class ThreadSendResult(Wire):
    thread_id: str
    run_id: str
    status: RunStatus
    queue_held: bool
    replayed: bool = False


class ThreadWait(Input):
    run_id: str | None = None
    timeout: float = Field(default=30.0, ge=0, le=LONG_POLL_MAX_S)
    environment_id: str | None = EnvironmentId


class ThreadWaitResult(Wire):
    thread_id: str
    run_id: str | None
    status: RunStatus | None
    terminal: bool
    timed_out: bool
    hint: str | None = None  # agent tools: what to do when the wait ended first
    # Still live because a question waits for a person (here, or on the box the thread lives on).
    awaiting_approval: TaskApproval | None = None


class ThreadWhere(Wire):
    """Where a thread a person names lives (`GET /v1/threads/{id}/where`, the owner's): here, or
    a linked machine, and how this machine knows (store/thread_homes.py)."""

    thread_id: str  # the whole id (the request may give a unique start of one)
    environment_id: str | None  # None: here
    label: str | None = None  # the link's label, when elsewhere
    via: Literal["here", "launched", "placed", "delegated", "moved", "found"]


class ThreadInterrupt(Input):
    stop: bool = False
    reason: str | None = Field(default=None, max_length=2000)
    environment_id: str | None = EnvironmentId
    # Only this run of the thread: live, it is interrupted; queued, it is cancelled and never
    # starts; ended, nothing changes (the answer's status is its own). Not with `stop`.
    run_id: str | None = Field(default=None, min_length=1, max_length=100)


class ThreadInterruptResult(Wire):
    thread_id: str
    run_id: str | None
    status: Literal["interrupt_requested", "no_active_run"] | RunStatus
    queue_held: bool


class ThreadArchive(Input):
    # Archiving removes the worktree: uncommitted and untracked files in it are refused unless forced.
    force: bool = False
    # Delete the thread's own branch too (kept by default: it may hold commits someone wants).
    # Also on an archived thread, so a clean-up can be retried.
    delete_branch: bool = False
    environment_id: str | None = EnvironmentId


class ThreadArchiveResult(Wire):
    thread_id: str
    status: ThreadStatus
    worktree_removed: bool
    branch_deleted: bool = False
    discarded: list[str] = Field(default_factory=list)  # what a forced archive threw away


class Event(Wire):
    seq: int
    thread_id: str
    type: str
    data: dict[str, Any]
    created_at: float


class EventsRead(Input):
    after: int = Field(default=0, ge=0, le=MAX_SQL_INT)
    timeout: float = Field(default=0.0, ge=0, le=LONG_POLL_MAX_S)
    limit: int = Field(default=PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
    environment_id: str | None = EnvironmentId


class EventsResult(Wire):
    events: list[Event]
    next_cursor: int


# --- pairing and links --------------------------------------------------------------------------

PairingState = Literal["open", "used", "burnt", "cancelled", "expired"]
ClientStatus = Literal["active", "revoked", "expired"]
PairingPurpose = Literal["link", "agent"]
ClientKind = Literal["link", "agent"]


class PairCreate(Input):
    access: RuntimeMode = "approval-required"
    # `agent`: a code a person types into an outside agent's OAuth sign-in page (issue 29), never
    # redeemable as a link; `link` (default): for `peerd link` on another machine.
    purpose: PairingPurpose = "link"
    ttl_s: float = Field(default=600.0, gt=0, le=24 * 3600)
    label_hint: str | None = Field(default=None, max_length=200)
    max_age_s: float | None = Field(default=None, gt=0, le=MAX_LINK_AGE_S)
    urls: list[str] = Field(default_factory=list, max_length=16)


class PairingCodeInfo(Wire):
    id: str
    access: RuntimeMode
    label_hint: str | None
    created_at: float
    expires_at: float
    state: PairingState
    failed_attempts: int
    client_id: str | None = None
    purpose: PairingPurpose = "link"


SigninRequestState = Literal["pending", "approved", "denied", "done", "expired"]


class SigninRequestInfo(Wire):
    """An outside agent's sign-in waiting for the owner's approval in the console (issue 29)."""

    id: str
    client_id: str  # the agent's OAuth client id (a URL for a client ID metadata document)
    client_name: str | None
    redirect_uri: str
    state: SigninRequestState
    access: RuntimeMode | None  # what the owner approved it at
    created_at: float
    expires_at: float


class SigninDecide(Input):
    """Approve a waiting sign-in at an access level, or deny it (`access` absent)."""

    access: RuntimeMode | None = None


class PairCreateResult(Wire):
    code: str
    info: PairingCodeInfo
    urls: list[str]


class ClientInfo(EnvironmentNamed):
    id: str
    label: str
    environment_id: str | None
    access: RuntimeMode
    created_at: float
    last_seen_at: float | None
    last_address: str | None
    expires_at: float | None
    revoked_at: float | None
    revoked_reason: str | None
    status: ClientStatus
    kind: ClientKind = "link"  # `agent`: an outside agent signed in over OAuth (issue 29)
    agent_name: str | None = None  # an agent's OAuth client name (or client id)
    # When it lapses unless it is used again: the sooner of `expiresAt` (its hard max age) and its
    # newest refresh token's expiry. The linking machine's link says the same (its `expiresAt`).
    lapses_at: float | None = None
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


class ClientRevoke(Input):
    # By default a revoked link's work stops with it; keep_runs leaves its runs to finish.
    keep_runs: bool = False


class ClientRevokeResult(ClientInfo):
    stopped_threads: list[str] = Field(default_factory=list)  # threads whose runs were stopped


class LinkCreate(Input):
    code: str = Field(min_length=1, max_length=8192)
    access: RuntimeMode = "approval-required"
    label: str | None = Field(default=None, max_length=200)
    urls: list[str] = Field(default_factory=list, max_length=16)
    max_age_s: float | None = Field(default=None, gt=0, le=MAX_LINK_AGE_S)


class LinkInfo(EnvironmentNamed):
    environment_id: str
    label: str
    urls: list[str]
    access: RuntimeMode
    fingerprint: str
    status: LinkStatus
    linked_at: float
    last_reached_at: float | None
    last_error: str | None
    expires_at: float | None
    # True when the box answered as the link just now (`environment list` without --offline).
    live: bool = False
    # `POST /v1/links` only: the access level of the link to that machine this one replaced (its
    # session there is revoked); None when there was none.
    replaced_access: RuntimeMode | None = None
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


class LinkSelf(EnvironmentNamed):
    """`GET /v1/link` on a box: the link as the box sees it (the laptop's live check)."""

    environment_id: str
    client_id: str
    label: str
    access: RuntimeMode
    capacity: Capacity | None = None  # what the box has room for (an older box: absent)
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


class UnlinkResult(EnvironmentNamed):
    environment_id: str
    label: str
    revoked_there: bool
    message: str
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


# --- delegated tasks ----------------------------------------------------------------------------

TaskStatus = Literal["pending", "running", "completed", "failed", "cancelled", "interrupted"]
TaskRole = Literal["implementation", "research", "review", "design", "test", "general"]


class DelegateTarget(Input):
    environment_id: str | None = EnvironmentId
    project_id: str | None = Field(default=None, min_length=1)
    provider: str | None = Field(default=None, min_length=1, max_length=64)
    model: str | None = Field(default=None, min_length=1, max_length=200)


class DelegateTask(Input):
    task: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    title: Title | None = None
    role: TaskRole | None = None
    target: DelegateTarget | None = None
    runtime_mode: RuntimeMode | None = None
    interaction_mode: InteractionMode | None = None
    mode: Literal["async", "wait"] = "async"
    timeout_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    client_request_id: str | None = ClientRequestId
    budget: Budget | None = None


class RemoteChild(Wire):
    environment_id: str
    thread_id: str | None
    run_id: str | None
    label: str


class TaskApproval(Wire):
    approval_id: str
    summary: str
    environment_id: str | None = None  # null: on this machine; else the box it waits on


class TaskInfo(Wire):
    task_id: str
    status: TaskStatus
    title: str
    parent_thread_id: str
    child_thread_id: str | None = None
    child_run_id: str | None = None
    remote_child: RemoteChild | None = None
    result: str | None = None
    stop_owed: bool = False
    last_error: str | None = None
    wait_timed_out: bool | None = None
    # What the task spent: its child's runs and, recursively, the tasks they delegated (not the
    # parent's own runs); in task show and task_status. Null: unknown (none reported, or on a box).
    usage: Usage | None = None
    # The child waits for a person to approve an action (peerd/approvals/): its parent agent is
    # never asked; the person who owns the work is. Null: nothing waits.
    awaiting_approval: TaskApproval | None = None
    # target.environmentId "auto": where peerd placed the task and why (peerd/placement/).
    placement: str | None = None
    created_at: float
    ended_at: float | None = None
    hint: str | None = None  # agent tools: what to do when the wait ended first


class TaskShow(Input):
    """`GET /v1/tasks/{id}?wait=SECONDS`: a long-poll until the task ends (`peerd task show --wait`)."""

    wait: float | None = Field(default=None, ge=0, le=LONG_POLL_MAX_S)


class TaskStatusRead(Input):
    task_id: str = Field(min_length=1)
    wait: bool = False
    timeout_ms: int | None = Field(default=None, ge=0, le=3_600_000)


class TaskCancel(Input):
    task_id: str = Field(min_length=1)
    reason: str | None = Field(default=None, max_length=2000)
    client_request_id: str | None = ClientRequestId


def _comma_list(value: Any) -> Any:
    """A query string's `a,b` (or a list of such) as a list of non-empty parts."""
    parts = value if isinstance(value, list) else [value]
    if not all(isinstance(p, str) for p in parts):
        return value
    return [x.strip() for p in parts for x in p.split(",") if x.strip()]


class TaskList(Input):
    """`GET /v1/tasks`: this machine's tasks (or a linked one's), newest first, paged; every filter
    is optional."""

    thread_id: str | None = Field(default=None, min_length=1, max_length=64)  # the parent thread
    status: Annotated[list[TaskStatus], BeforeValidator(_comma_list)] = Field(
        default_factory=list, max_length=6
    )
    # Where the child runs: a linked environment's id or label, or this environment's own id or
    # label for the tasks run here.
    target_environment: str | None = Field(default=None, min_length=1, max_length=200)
    cursor: Cursor = None
    limit: int = Field(default=PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
    # The tasks of a linked environment (its id or label), as it shows them to this machine's link.
    environment_id: str | None = EnvironmentId


class RunRef(Wire):
    thread_id: str
    run_id: str


class RunWatch(Input):
    """The follower's batched long-poll: returns when any named run is settled, or at the timeout."""

    runs: list[RunRef] = Field(min_length=1, max_length=1000)
    timeout: float = Field(default=30.0, ge=0, le=LONG_POLL_MAX_S)


class WatchedRun(Wire):
    thread_id: str
    run_id: str
    status: RunStatus | None
    settled: bool
    found: bool
    result_run_id: str | None = None
    reason: str | None = None


class RunWatchResult(Wire):
    runs: list[WatchedRun]
    timed_out: bool


# --- providers ----------------------------------------------------------------------------------


class ProviderInfo(Wire):
    name: str
    kind: Literal["script", "codex", "claude", "gemini", "command"]
    binary: str | None
    path: str | None  # where the binary was found; None when it was not
    found: bool
    version: str | None
    model: str | None
    command: str | None = None  # custom commands: the exact text that runs
    approved: bool | None = None  # custom commands only
    problem: str | None = None


class ProviderApprove(Input):
    # The exact command the owner was shown: approval binds to it, never to a later edit.
    command: str = Field(min_length=1)


class ProviderApproveResult(Wire):
    name: str
    command: str
    approved: bool


# --- placement (peerd/placement/) ----------------------------------------------------------------

Preference = Literal["prefer", "normal", "less", "manual-only"]
# A box's report is its claim: names and ids are bounded and plain, so a reason built from them
# is one clean line wherever it is shown.
PROVIDER_NAME = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
MAX_REPORTED_PROJECTS = 500


class ProjectKey(Wire):
    """A project as a capacity report names it: enough to match a repository there."""

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    name: Annotated[str, Field(max_length=200), AfterValidator(clean_label)] = ""
    repository_key: str | None = Field(default=None, max_length=1000)


class Capacity(Wire):
    """What an environment has room for, as it reports it to its links (`[placement]`)."""

    live_runs: int = Field(ge=0, le=MAX_SQL_INT)  # starting or running
    max_runs: int = Field(ge=0, le=100_000)
    queued_runs: int = Field(default=0, ge=0, le=MAX_SQL_INT)  # waiting to start (an older box: 0)
    load: float | None = Field(default=None, ge=0, le=1e6)  # the 1-minute load average
    cpus: int = Field(default=1, ge=1, le=100_000)
    mem_available: int | None = Field(default=None, ge=0, le=MAX_SQL_INT)  # bytes (MemAvailable)
    mem_total: int | None = Field(default=None, ge=0, le=MAX_SQL_INT)
    providers: list[PROVIDER_NAME] = Field(default_factory=list, max_length=64)  # installed ones
    projects: list[ProjectKey] = Field(default_factory=list, max_length=MAX_REPORTED_PROJECTS)
    preference: Preference = "normal"


class Placed(Wire):
    """Where `auto` put a launch or task, and why (each candidate with its reason)."""

    environment_id: str | None  # null: here
    label: str
    project_id: str
    reason: str


class FleetRead(Input):
    offline: bool = False  # true: what is cached, without asking any box


class FleetEnvironment(EnvironmentNamed):
    environment_id: str
    label: str
    here: bool
    status: Literal["here", "reachable", "unreachable", "expired", "revoked", "version_skew"]
    access: RuntimeMode | None = None  # the link's level (null: this environment)
    capacity: Capacity | None = None
    age_s: float | None = None  # how old `capacity` is, in seconds
    error: str | None = None  # why it could not be read (then `capacity` is the last one, if any)
    deprecated_env_id: str | None = ENV_ID_DEPRECATED


class Fleet(Wire):
    environments: list[FleetEnvironment]
