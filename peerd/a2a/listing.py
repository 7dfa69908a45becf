"""`ListTasks`: the tasks a caller may see (here, and followed on linked boxes), newest first by
(created_at, id), `pageSize` at a time after `pageToken`'s position (the token, the order and the
merge of the two lists are pure: mapping.py). A link lists only the tasks of threads it started,
and none of the owner's on boxes; the owner lists every one.
"""

from __future__ import annotations

from datetime import UTC

from a2a.types import ListTasksRequest, ListTasksResponse

from peerd import contracts as c
from peerd.a2a import mapping, store
from peerd.a2a.store import Remote
from peerd.a2a.view import remote_task, state_name, task_of
from peerd.operations import Caller, Operations


async def list_tasks(ops: Operations, caller: Caller, params: ListTasksRequest) -> ListTasksResponse:
    """`ListTasks`: the tasks this caller may see (here, and followed on boxes), newest first by
    (created_at, id), `pageSize` at a time after `pageToken`'s position (mapping.py)."""
    size = mapping.page_size(params.page_size if params.HasField("page_size") else None)
    before = mapping.read_page_token(params.page_token) if params.page_token else None
    wanted = state_name(params.status) if params.status else None
    after = None
    if params.HasField("status_timestamp_after"):
        after = params.status_timestamp_after.ToDatetime(tzinfo=UTC).timestamp()
    fence = store.Filter(
        link_origin=None if caller.link is None else caller.link.client_id,  # a link: its own threads
        context_id=params.context_id or None,
        statuses=None if wanted is None else mapping.RUN_STATUSES[wanted],
        changed_after=after,
    )
    namespace = None if caller.link is None else caller.namespace  # the owner sees every one
    states = None if wanted is None else [wanted]
    runs = await store.run_page(ops.db, fence, before=before, limit=size + 1)
    remotes = await store.remote_page(
        ops.db, namespace=namespace, context_id=fence.context_id, states=states, before=before, limit=size + 1
    )
    here: list[tuple[mapping.Position, c.Run | Remote]] = [
        (mapping.Position(run.created_at, run.id), run) for run in runs
    ]
    there: list[tuple[mapping.Position, c.Run | Remote]] = [(row.position, row) for row in remotes]
    page, last = mapping.merge_page([here, there], size)
    tasks = []
    for _, entry in page:
        if isinstance(entry, Remote):
            task = remote_task(entry)
        else:
            task = await task_of(ops, entry, answer_too=params.include_artifacts)
        if wanted is not None and state_name(task.status.state) != wanted:
            continue  # working and input-required share their runs' statuses
        if after is not None and task.status.timestamp.ToDatetime(tzinfo=UTC).timestamp() < after:
            continue
        if not params.include_artifacts:
            task.ClearField("artifacts")
        tasks.append(task)
    total = await store.run_count(ops.db, fence) + await store.remote_count(
        ops.db, namespace=namespace, context_id=fence.context_id, states=states
    )
    return ListTasksResponse(
        tasks=tasks,
        next_page_token="" if last is None else mapping.page_token(last),
        page_size=size,
        total_size=total,
    )
