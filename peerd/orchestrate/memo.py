"""A packet's memo, typed: the column `orchestration_packets.retries`, a JSON object that holds the
per-class retry counters and everything a hop needs to pick up where it stopped after a restart.

Every key any hop reads or writes is a field here, so a misspelt key is a type error and a value
of the wrong kind is refused when it is set. `orchestrate/store.py` is the only reader and writer
of the column (`parse` when a packet is read, `PacketMemo.stored` when it is written).

Tolerant of what an older release stored: a missing key takes its default; a key this release does
not know is kept as it is and written back unchanged (`model_extra`); a known key whose stored value
is not of its type is dropped, and `parse` says which and why (the store logs it), so one damaged
value costs that value and never the packet. Written without the entries that hold their default
(`stored`), which an older release reads as it read its own (it asked `.get(key, default)`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from peerd.orchestrate.models import CheckoutChange

# The counters the API shows as a packet's `retries` (when above zero): the retry classes
# (`context.RETRY_LIMIT` each), peerd's re-runs of a check, the follow-ups sent, and review rounds.
COUNTERS = ("content", "environmental", "redispatch", "changes", "reruns", "sends", "resumes", "review_round")


class PacketMemo(BaseModel):
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    # Where the packet starts (`start_packet`; kept across a re-dispatch).
    base: str | None = None

    # Retries used, one class each (`verifying`, `redispatch_or_park`, `reviewing`), and peerd's
    # own re-runs of a failed check.
    content: int = Field(default=0, ge=0)
    environmental: int = Field(default=0, ge=0)
    redispatch: int = Field(default=0, ge=0)
    changes: int = Field(default=0, ge=0)
    reruns: int = Field(default=0, ge=0)

    # The coder's current turn (`implementing`).
    prompt: str | None = None  # the first prompt, given again on a resume
    sends: int = Field(default=0, ge=0)  # follow-ups sent; numbers the next send's key
    resumes: int = Field(default=0, ge=0)  # follow-ups after a restart cut the coder off
    pending_send: str | None = None  # a follow-up still to send (a fix, or the reviewer's changes)
    pending_after: str | None = None  # ... once the packet's current run is this run
    deadline: float | None = None  # --packet-timeout: when the current turn must end (epoch s)
    hop_started: float | None = None  # when the current turn began: the receipt's startedAt
    hop_runs: list[str] = Field(default_factory=list)  # runs of the current attempt (its usage)
    previous_failure: str | None = None  # why the first coder failed; the next one is told

    # What the coder's run said (`implementing`), copied into the implementation receipt.
    report: str | None = None
    coder_errors: list[str] = Field(default_factory=list)

    # What containment found in the user's checkout (`collect`, `escapes.Collected.memo`).
    recovered: list[str] = Field(default_factory=list)
    not_recovered: list[str] = Field(default_factory=list)
    recovery_problem: str | None = None
    stray: list[str] = Field(default_factory=list)
    user_paths: list[str] = Field(default_factory=list)
    left: list[str] = Field(default_factory=list)
    checkout: list[CheckoutChange] = Field(default_factory=list)

    # The review round in progress (`reviewing`), so a resumed review waits on the same thread.
    review_started: float | None = None
    review_thread: str | None = None
    review_run: str | None = None
    review_round: int = Field(default=0, ge=0)
    review_env: str | None = None
    review_runs: list[str] = Field(default_factory=list)

    # After a cancel: the (thread id, environment) pairs whose stop has not reached their box yet.
    stop_owed: list[tuple[str, str | None]] = Field(default_factory=list)

    def stored(self) -> dict[str, Any]:
        """The JSON object the column holds: the fields not at their default, and every key this
        release does not know, as it was read."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)

    def counters(self) -> dict[str, int]:
        """The API's `retries`: each counter above zero."""
        return {name: value for name in COUNTERS if (value := getattr(self, name))}

    def copy_for_update(self) -> PacketMemo:
        """A copy a hop changes and then records (the packet it read keeps the memo it read)."""
        return self.model_copy(deep=True)


def parse(raw: Any) -> tuple[PacketMemo, dict[str, str]]:
    """The memo a stored JSON value holds, and the keys dropped from it (key -> why)."""
    if not isinstance(raw, dict):
        return PacketMemo(), ({"": f"the memo is not a JSON object ({type(raw).__name__})"} if raw else {})
    data = {str(k): v for k, v in raw.items()}
    dropped: dict[str, str] = {}
    while True:
        try:
            return PacketMemo.model_validate(data), dropped
        except ValidationError as exc:
            bad = {str(e["loc"][0]): e["msg"] for e in exc.errors() if e["loc"] and e["loc"][0] in data}
            if not bad:  # pragma: no cover  # every error of a field names it
                raise
            for key, why in bad.items():
                dropped[key] = f"{why} (stored: {str(data.pop(key))[:80]!r})"
