"""The typed receipts of `peerd orchestrate`: every hop (plan, implement, review, integrate) ends in one.

Planner -> implementer -> reviewer, each hop bounded: the planner's output is a `PlanReceipt` (the
dossier: packets with a goal, the files in scope, constraints and the exact verification command);
an implementer's is an `ImplementationReceipt` (branch, commit, diff stat and the orchestrator's own
verification run); a reviewer's is a `ReviewReceipt` whose verdict is only approve, reject or
request_changes, with evidence; the run ends in an `IntegrationReceipt`. The engine hands work on
only once it holds the previous hop's receipt.

Packet states and their transitions: `orchestrate/states.py` (the store writes a state only along them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from peerd.contracts import Budget, Input, Usage, Wire

Classification = Literal[
    "passed", "content", "environmental", "empty_diff", "coder_error", "timeout", "budget"
]
Verdict = Literal["approve", "reject", "request_changes"]
# Whose a change in the user's checkout during a run is (`attribution.attribute`): only `proven`
# is the coder's and moved into its worktree; every other is left exactly as it is.
CheckoutReason = Literal[
    "proven",  # the coder's own item names it in the checkout and the content is what it wrote
    "does_not_apply",  # proven, but it conflicts with the worktree's own work: left
    "yours_before",  # it was uncommitted when the run started: the user's
    "outside_files",  # outside the packet's files
    "confined",  # every run of the hop was confined: no coder could write the checkout
    "no_coder_write",  # no item of the coder names this path in the checkout
    "unverified",  # the coder's item names it but does not say what it wrote
    "content_differs",  # the content is not what the coder wrote: changed after it
]
# Why a reviewed packet was not integrated although the reviewer approved it.
HeldReason = Literal["out_of_scope"]
VERDICTS: tuple[Verdict, ...] = ("approve", "reject", "request_changes")
PACKET_ID_PATTERN = r"^[a-z0-9][a-z0-9-]*$"


class PacketSpec(Input):
    """One work packet: independently implementable and verifiable, roughly PR-sized or smaller."""

    id: str = Field(min_length=1, max_length=64, pattern=PACKET_ID_PATTERN)
    goal: str = Field(min_length=1)
    files: list[str] = Field(min_length=1)  # paths or directories in scope, relative to the repo root
    constraints: list[str] = Field(default_factory=list)
    verify: str = Field(min_length=1)  # the exact verification command, run in the packet's worktree
    depends_on: list[str] = Field(default_factory=list)
    coder: str | None = Field(default=None, min_length=1)  # a coder spec overriding the assignment
    # Changes outside `files` that may be integrated: true (any), or these paths or directories.
    # Only your own plan (--plan) may say so; a planner's plan may not (`verdicts.parse_plan_reply`).
    allow_out_of_scope: bool | list[str] = False


class CoderChoice(Wire):
    """Which coder a hop used and why (round-robin, packet override, nature hint, fallback...)."""

    spec: str
    backend: str
    model: str | None = None
    environment: str | None = None  # None: this machine
    reason: str


class BudgetState(Wire):
    """A budget as a hop ended: its limit, what was spent against it (this packet's runs, or every
    run of the orchestration), and whether that is past it (with the reason, as runs say it)."""

    scope: Literal["packet", "orchestration"]
    limit: Budget
    spent: Usage | None = None  # null: no run reported any usage
    seconds: float = 0.0  # the runs' time, what a `seconds` limit counts
    exceeded: bool = False
    reason: str | None = None  # "budget exceeded: 51,200 of 50,000 tokens"


class PlanReceipt(Wire):
    """The dossier: what the planner (or a plan directory) decided, validated."""

    run_id: str
    task: str
    packets: list[PacketSpec]
    source: Literal["planner", "plan_dir"]
    planner: CoderChoice | None = None
    notes: list[str] = Field(default_factory=list)
    usage: Usage | None = None  # the planner's runs; null: a plan directory, or none reported
    budgets: list[BudgetState] = Field(default_factory=list)


class VerificationResult(Wire):
    command: str
    exit_code: int | None  # None: it never exited on its own (timed out, killed, could not start)
    passed: bool
    timed_out: bool
    output_tail: str
    classification: Classification
    # Why this class, in a sentence a person can check: what peerd observed (its own re-run, the
    # coder's structured events), never words found in the output.
    evidence: str = ""
    seconds: float | None = None
    # When peerd re-ran a failed check: the first run, kept whole (its class and its output).
    first_run: VerificationResult | None = None


class CheckoutChange(Wire):
    """A path of the user's checkout that changed during the run, and what peerd did with it."""

    path: str
    moved: bool  # into the packet's worktree (only a `proven` change); otherwise left as it is
    reason: CheckoutReason


class ImplementationReceipt(Wire):
    packet_id: str
    attempt: int = Field(ge=1)
    hop: str | None = None  # implement, fix (a content failure went back), changes (the reviewer's)
    coder: CoderChoice
    environment: str | None = None
    branch: str
    base_commit: str
    commit: str | None = None
    files_changed: list[str] = Field(default_factory=list)
    diff_stat: str = ""
    verification: VerificationResult
    report: str = ""  # the coder's own final report, as it wrote it
    recovered_paths: list[str] = Field(default_factory=list)  # edits moved back from the main checkout
    # Escaped edits in scope that could not be moved (left in the checkout) and why.
    not_recovered: list[str] = Field(default_factory=list)
    recovery_problem: str | None = None
    # Paths that appeared in the user's checkout during the run outside this packet's files (left).
    stray_paths: list[str] = Field(default_factory=list)
    # The user's own paths (dirty before the run) in this packet's files that changed during the run:
    # never taken, left as they are.
    user_paths: list[str] = Field(default_factory=list)
    # Paths in this packet's files that changed in the user's checkout during the run and that
    # peerd cannot prove the coder wrote: the user's, left as they are (never moved or committed).
    left_paths: list[str] = Field(default_factory=list)
    # Every changed path of the checkout with its attribution (`attribution.attribute`).
    checkout_changes: list[CheckoutChange] = Field(default_factory=list)
    # Paths the packet's commit changes outside its files (content: the commit's tree against its
    # base): shown to the reviewer, and not integrated unless allowed (`scope.py`).
    out_of_scope: list[str] = Field(default_factory=list)
    # What the coder's run reported going wrong (error items, declined or failed steps), quoted.
    coder_errors: list[str] = Field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    usage: Usage | None = None  # the coder's runs of this hop (null: none reported)
    budgets: list[BudgetState] = Field(default_factory=list)  # the packet's and the run's, if given


class ReviewEvidence(Input):
    file: str = Field(min_length=1)
    line: int | None = Field(default=None, ge=1)
    reason: str = Field(min_length=1)


class ReviewVerdict(Input):
    """What a reviewer must answer (JSON); `verdicts.parse_review_reply` checks it."""

    verdict: Verdict
    evidence: list[ReviewEvidence] = Field(default_factory=list)
    summary: str = Field(min_length=1)


class ReviewReceipt(Wire):
    packet_id: str
    attempt: int = Field(ge=1)
    reviewer: CoderChoice
    verdict: Verdict
    evidence: list[ReviewEvidence] = Field(default_factory=list)
    summary: str
    round: int = 1
    # The commit's changes outside the packet's files, as the reviewer was shown them.
    out_of_scope: list[str] = Field(default_factory=list)
    # Set when peerd holds an approved packet back from integration (its changes outside its files
    # are not allowed): the packet is parked and the integration branch never gets them.
    held: HeldReason | None = None
    started_at: float | None = None
    ended_at: float | None = None
    usage: Usage | None = None  # the reviewer's runs of this round (null: none reported)
    budgets: list[BudgetState] = Field(default_factory=list)


class IntegrationReceipt(Wire):
    branch: str
    base_commit: str
    merged: list[str] = Field(default_factory=list)  # packet ids, in merge order
    conflicts: dict[str, list[str]] = Field(default_factory=dict)  # packet id -> conflicting paths
    verification: VerificationResult | None = None
    commit: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # Always null: peerd merges and checks with its own git, no model spends anything here.
    usage: Usage | None = None
    budgets: list[BudgetState] = Field(default_factory=list)  # the run's, as it ended


class DeliveryReceipt(Wire):
    """`--push REMOTE` / `--pr`: what left this machine, or exactly what was missing."""

    branch: str
    remote: str | None = None
    pushed: bool = False
    push_problem: str | None = None
    pr_url: str | None = None
    pr_draft: bool = True
    pr_problem: str | None = None
    # The integration branch's tip this delivery pushed (null: nothing, or a release before it):
    # with --until, a fix integrated since is delivered again, to the same branch and pull request.
    commit: str | None = None


# --- --until: the wait on the pull request, and its fix attempts (`until.py`, `prwait.py`) ---------

Until = Literal["checks", "review", "merged"]
UNTILS: tuple[Until, ...] = ("checks", "review", "merged")


class PrCheck(Wire):
    name: str
    state: str
    bucket: str  # pass | fail | pending | skipping | cancel
    link: str | None = None


class PrWaitReceipt(Wire):
    """The orchestration's wait on its pull request, as one poll left it: written when the wait
    opens (each round: after the first delivery, and after each fix is delivered), after every poll
    that saw something new or failed (with the backoff), and when it ends."""

    round: int = Field(ge=1)
    until: Until
    pr: str  # what gh is asked for: the number (or the branch)
    url: str | None = None
    head: str | None = None  # the commit delivered: checks of another head are not this round's
    status: Literal["watching", "delivered", "cancelled"] = "watching"
    outcome: str | None = None  # machine.Outcome once delivered
    detail: str | None = None
    polls: int = 0
    failures: int = 0  # gh's transient failures in a row
    rate_limited: int = 0  # rate-limit answers in a row
    baseline: str | None = None  # the review decision the round's first poll saw
    delay_s: float | None = None  # the backoff the next poll waits (a restart waits at most this)
    next_at: float | None = None  # wall time of the next poll
    last_error: str | None = None
    pr_state: str | None = None  # OPEN | CLOSED | MERGED
    review_decision: str | None = None
    checks: list[PrCheck] = Field(default_factory=list)
    deadline_at: float
    summary: str = ""  # the integration's summary line, the run's reason when the wait ends well
    at: float


class PrFixReceipt(Wire):
    """One fix attempt: what the pull request said, and the packet sent to fix it."""

    attempt: int = Field(ge=1)
    round: int = Field(ge=1)
    reason: Literal["checks_failed", "changes_requested"]
    packet_id: str
    base: str  # the delivered commit the fix starts from
    coder: CoderChoice
    failing_checks: list[PrCheck] = Field(default_factory=list)
    log_tail: str = ""
    remarks: list[str] = Field(default_factory=list)  # the review's words and comments, one each
    # The newest review when the fix was sent (GitHub's time): a review asking for changes after
    # it is a new request (the next round's baseline, `waits/machine.py:review_mark`).
    answered_review_at: str = ""
    at: float


# --- coders and the project's config (parsed and resolved in `coders`) -----------------------------


class CoderSpec(Wire):
    """A parsed `[<environment>/]<backend>[:<model>]`; `text` is its canonical spelling."""

    backend: str
    model: str | None = None
    environment: str | None = None  # None: this machine

    @property
    def text(self) -> str:
        place = f"{self.environment}/" if self.environment else ""
        return f"{place}{self.backend}" + (f":{self.model}" if self.model else "")

    def choice(self, reason: str) -> CoderChoice:
        return CoderChoice(
            spec=self.text,
            backend=self.backend,
            model=self.model,
            environment=self.environment,
            reason=reason,
        )

    def placed(self, environment: str) -> CoderSpec:
        return self.model_copy(update={"environment": environment})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CustomCoder(_Strict):
    name: str
    command: str = Field(min_length=1)


class OrchestrateConfig(_Strict):
    default_coder: str | None = None
    coders: list[str | CustomCoder] = Field(default_factory=list)
    reviewer: str | None = None
    sandbox_workarounds: list[str] = Field(default_factory=list)
    verify: str | None = Field(default=None, min_length=1)
    source: str | None = Field(default=None, exclude=True)

    @property
    def custom(self) -> dict[str, str]:
        """The custom commands this file defines: name -> exact command."""
        return {c.name: c.command for c in self.coders if isinstance(c, CustomCoder)}


class Resolution(Wire):
    coders: list[CoderChoice]  # in order, each with why it is in the run; round-robin runs over this list
    commands: dict[str, str] = Field(default_factory=dict)  # custom coder name -> the exact command
    log: list[str] = Field(default_factory=list)  # every automatic choice, for the report
    needs_confirmation: list[tuple[str, str]] = Field(default_factory=list)  # (name, command), interactive
    skipped: list[str] = Field(default_factory=list)  # "<spec>: <reason>"
    default_options: list[str] = Field(default_factory=list)  # when non-empty, offer these as the default


# --- plan validation ----------------------------------------------------------------------------


def path_problem(path: str) -> str | None:
    """Why a packet file path is not a plain repo-relative path, or None when it is."""
    if not path.strip():
        return "is empty"
    if path.startswith("~") or PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        return "is absolute; give it relative to the repository root"
    if PureWindowsPath(path).drive:
        return "names a drive; give it relative to the repository root"
    if ".." in PurePosixPath(path.replace("\\", "/")).parts:
        return "contains '..'; packets stay inside the repository"
    return None


def find_cycle(packets: Sequence[PacketSpec]) -> list[str] | None:
    """A dependency cycle as a closed path (`[a, b, a]`), or None. Unknown ids are ignored here."""
    deps = {p.id: list(p.depends_on) for p in packets}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in deps.get(node, []):
            if dep not in deps or dep == node:  # unknown ids and self-dependencies are reported apart
                continue
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for packet in packets:
        if packet.id not in state and (cycle := visit(packet.id)):
            return cycle
    return None


def validate_plan(packets: Sequence[PacketSpec]) -> list[str]:
    """Every problem of a plan, one human-readable line each (empty: the plan is sound)."""
    errors: list[str] = []
    if not packets:
        return ["The plan has no packets; give at least one."]
    seen: set[str] = set()
    for packet in packets:
        if packet.id in seen:
            errors.append(f"Packet id {packet.id!r} is used twice; ids must be unique.")
        seen.add(packet.id)
    for packet in packets:
        where = f"Packet {packet.id!r}"
        if not packet.goal.strip():
            errors.append(f"{where}: the goal is empty.")
        if not packet.verify.strip():
            errors.append(f"{where}: the verification command is empty.")
        if not packet.files:
            errors.append(f"{where}: list at least one file or directory in scope.")
        for path in packet.files:
            if problem := path_problem(path):
                errors.append(f"{where}: file {path!r} {problem}.")
        if isinstance(packet.allow_out_of_scope, list):
            if not packet.allow_out_of_scope:
                errors.append(
                    f"{where}: allow_out_of_scope is an empty list; give paths, true, or leave it out."
                )
            for path in packet.allow_out_of_scope:
                if problem := path_problem(path):
                    errors.append(f"{where}: allow_out_of_scope path {path!r} {problem}.")
        for dep in packet.depends_on:
            if dep == packet.id:
                errors.append(f"{where} depends on itself.")
            elif dep not in seen:
                errors.append(f"{where} depends on {dep!r}, which is not a packet of this plan.")
    if cycle := find_cycle(packets):
        errors.append(f"Dependency cycle: {' -> '.join(cycle)}.")
    return errors


def dependency_order(packets: Sequence[PacketSpec]) -> list[str]:
    """Packet ids so that each comes after its dependencies, plan order kept otherwise (valid plans)."""
    done: list[str] = []
    remaining = list(packets)
    while remaining:
        ready = [p for p in remaining if all(d in done for d in p.depends_on)]
        if not ready:  # a cycle or an unknown dependency: validate_plan reports it
            done.extend(p.id for p in remaining)
            break
        done.append(ready[0].id)
        remaining.remove(ready[0])
    return done
