"""What MCP Tasks' handlers act through (`peerd.api.mcp_server.add_task_methods`): peerd's own
delegated tasks, seen as one caller, and its approvals. The mapping to the extension's shapes is
`peerd.api.mcp_tasks` (pure); this is the I/O around it, and it raises peerd's typed errors.

The fence is peerd's own (`Delegation.status`/`cancel`: a run sees the tasks its thread delegated,
the owner sees all) and `visible_parent` for the list, so `tasks/*` show a caller exactly what
`task_status` shows it.
"""

from __future__ import annotations

from typing import Any

from peerd import contracts as c
from peerd.api import mcp_tasks as mt
from peerd.api.tools import ToolServices
from peerd.approvals import store as approvals_store
from peerd.approvals.wire import ApprovalDecisionBody
from peerd.errors import ApprovalNotAllowed, CapabilityDenied, ParentNotActive, TaskNotFound
from peerd.operations import Caller
from peerd.tasks import store as tasks_store

LIST_LIMIT = 50


def visible_parent(caller: Caller) -> str | None:
    """Whose tasks `tasks/list` shows: the caller's thread's (a run); None: all (the owner only).
    Anyone else (a link calling without a run) has delegated nothing it could list here."""
    if caller.thread_id is not None:
        return caller.thread_id
    if caller.link is None:
        return None
    raise CapabilityDenied("Only a run's own tasks can be listed here, and this caller is no run.")


def may_answer(caller: Caller) -> str | None:
    """None when the caller may answer an approval through `tasks/update`; else why not. An agent
    (a run) never decides an approval of the work it delegated: a person does."""
    if caller.run_id is not None or (caller.link is not None and caller.link.own_threads_only):
        # A run, or an outside agent signed in to /mcp (its threads are the work it would approve).
        return (
            "An agent cannot approve the work it delegated: the person who owns it decides, with "
            "`peerd approval` or in the console, or through a client acting as them."
        )
    return None


class TaskPort:
    """peerd's delegated tasks for MCP Tasks (module docstring)."""

    def __init__(self, services: ToolServices) -> None:
        self.services = services

    async def create(self, caller: Caller, arguments: dict[str, Any]) -> c.TaskInfo:
        req = c.DelegateTask.model_validate(arguments)
        if caller.run_id is None:
            raise ParentNotActive(
                "delegate_task needs a run of the calling agent to own the task, and this agent was not "
                "started by peerd. Use thread_launch to start the work and thread_wait to collect its result."
            )
        return await self.services.delegation.delegate(caller, req, polled=True)

    async def info(self, caller: Caller, task_id: str) -> c.TaskInfo:
        return await self.services.delegation.status(caller, c.TaskStatusRead(task_id=task_id))

    async def cancel(self, caller: Caller, task_id: str) -> c.TaskInfo:
        return await self.services.delegation.cancel(
            caller, c.TaskCancel(task_id=task_id, reason="Cancelled by the MCP client (tasks/cancel).")
        )

    async def page(self, caller: Caller, cursor: str | None) -> c.Page[c.TaskInfo]:
        if cursor is not None and not cursor.isdigit():
            raise TaskNotFound("That cursor is not one tasks/list gave.")
        f = tasks_store.TaskFilter(parent_thread_id=visible_parent(caller))
        return await tasks_store.page(self.services.ops.db, f, cursor=cursor, limit=LIST_LIMIT)

    async def update(self, caller: Caller, task_id: str, responses: dict[str, Any]) -> None:
        """Decide the approval the task waits for, when `responses` answers it; else nothing."""
        info = await self.info(caller, task_id)  # the fence first: an unseen task is not found
        answered = mt.answers(
            info.awaiting_approval if mt.mcp_status(info) == "input_required" else None, responses
        )
        if answered is None:
            return
        await self.decide(caller, *answered, decision_id=f"mcp-{task_id}-{answered[0]}"[:64])

    async def waiting(self, caller: Caller, thread_id: str) -> c.TaskApproval | None:
        """The approval a thread here waits for, when this caller is one who may answer it."""
        if may_answer(caller) is not None or caller.link is not None:
            return None
        found = await approvals_store.waiting_on_thread(self.services.ops.db, thread_id)
        return None if found is None else c.TaskApproval(approval_id=found.id, summary=found.summary)

    async def decide(
        self, caller: Caller, approval_id: str, verdict: mt.Verdict, *, decision_id: str
    ) -> None:
        if (why := may_answer(caller)) is not None:
            raise ApprovalNotAllowed(why)
        desk = self.services.desk
        if desk is None:
            raise ApprovalNotAllowed("Approvals cannot be decided here.")
        body = ApprovalDecisionBody(decision=verdict, reason="Answered through MCP.", decision_id=decision_id)
        await desk.decide(approval_id, body, link=caller.link)
