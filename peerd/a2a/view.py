"""An A2A `Task` from what peerd knows of a run: here (`task_of`, read from the store) or on a
linked box (`a2a/remote.py`, from the box's answers); the same builder (`build_task`) for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from a2a.types import Artifact, Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToJson, Parse

from peerd import contracts as c
from peerd.a2a import mapping
from peerd.a2a import store as a2a_store
from peerd.approvals import store as approvals_store
from peerd.core.runs import RunStatus, is_terminal
from peerd.errors import NotFound
from peerd.operations import Operations
from peerd.store import threads

STATES: dict[mapping.A2AState, TaskState] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}
NAMES: dict[int, mapping.A2AState] = {value: name for name, value in STATES.items()}
# A blocking SendMessage answers once its task is in one of these.
SETTLED = frozenset({STATES["completed"], STATES["failed"], STATES["canceled"], STATES["input-required"]})
ENDED = frozenset({STATES["completed"], STATES["failed"], STATES["canceled"]})
ANSWER_CHARS = 20_000


def state_name(value: int) -> mapping.A2AState:
    return NAMES.get(value, "working")


@dataclass(frozen=True)
class Asking:
    """A question of the run's thread waiting for a person (`where`: the box's label, or None here)."""

    approval_id: str
    summary: str
    where: str | None = None


@dataclass(frozen=True)
class Facts:
    """What a task is made of: its run, its state, and once it ended its answer and why."""

    run_id: str
    thread_id: str
    status: RunStatus
    stamp: float | None  # when its state last changed
    asking: Asking | None = None
    answer: str = ""
    reason: str | None = None


def build_task(facts: Facts) -> Task:
    """The A2A task: its state (`input-required` while a question waits), the question or the
    reason as the status message, and the answer as an artifact once it ended."""
    ended = is_terminal(facts.status)
    asking = None if ended else facts.asking
    state = mapping.task_state(facts.status, approval_waiting=asking is not None)
    status = TaskStatus(state=STATES[state])
    if asking is not None and state == "input-required":
        on = "" if asking.where is None else f" (on {asking.where})"
        text = f"Waiting for a person to approve {asking.approval_id}{on}: {asking.summary}"
        status.message.CopyFrom(
            Message(
                message_id=f"{facts.run_id}-{asking.approval_id}",
                role=Role.ROLE_AGENT,
                parts=[Part(text=text)],
            )
        )
    if facts.stamp is not None:
        status.timestamp.FromDatetime(datetime.fromtimestamp(facts.stamp, tz=UTC))
    task = Task(id=facts.run_id, context_id=facts.thread_id, status=status)
    if ended:
        if facts.answer:
            task.artifacts.append(
                Artifact(artifact_id=f"{facts.run_id}-answer", name="answer", parts=[Part(text=facts.answer)])
            )
        if facts.reason and state != "completed":
            status.message.CopyFrom(
                Message(
                    message_id=f"{facts.run_id}-status", role=Role.ROLE_AGENT, parts=[Part(text=facts.reason)]
                )
            )
    return task


def last_answer(items: list[c.Item]) -> str:
    """The run's last assistant message."""
    text = ""
    for item in items:
        if item.kind == "assistant_message":
            text = item.text
    return text


async def task_of(ops: Operations, run: c.Run, *, answer_too: bool = True) -> Task:
    """The A2A task a run here is (also what a push carries); `answer_too`: with its answer."""
    asking = None
    if not is_terminal(run.status):
        approval = await approvals_store.waiting_on_thread(ops.db, run.thread_id)
        if approval is not None:
            asking = Asking(approval.id, approval.summary)
    answer = ""
    if is_terminal(run.status) and answer_too:
        rows = await threads.read_items(ops.db, run.thread_id, after_position=None, limit=200, run_id=run.id)
        answer = last_answer([threads.item_from_row(row, max_chars=ANSWER_CHARS) for row in rows])
    stamp = run.ended_at or run.started_at or run.created_at
    return build_task(
        Facts(run.id, run.thread_id, run.status, stamp, asking=asking, answer=answer, reason=run.reason)
    )


def as_json(task: Task) -> str:
    """A task as kept in the store (the A2A JSON)."""
    return str(MessageToJson(task, indent=None))


def from_json(text: str) -> Task:
    task = Task()
    Parse(text, task)
    return task


def remote_task(row: a2a_store.Remote) -> Task:
    """A task on a linked box as last seen there (`submitted` until the box was first asked)."""
    if row.task is not None:
        return from_json(row.task)
    return build_task(Facts(row.task_id or "", row.thread_id or "", "queued", row.created_at))


async def task_by_id(ops: Operations, task_id: str) -> Task | None:
    """Any task this machine serves (here, or followed on a box), unfenced: for the push loop."""
    try:
        run = await threads.get_run(ops.db, task_id)
    except NotFound:
        row = await a2a_store.remote_by_task(ops.db, task_id)
        return None if row is None else remote_task(row)
    return await task_of(ops, run)
