"""Threads, runs, items and the per-thread event log.

Every change writes its rows and one event in the same transaction, so the event cursor and the
state can never disagree. By concern:

- `rows.py`: rows to contract models, the shared statements (a thread with its latest run);
- `writes.py`: launch, send, run transitions, items, session, queue, archive;
- `recovery.py`: runs a daemon stop cut, recovered in one transaction;
- `reads.py`: reads, each in a bounded number of statements (a page of threads is one).

`peerd.store.threads` re-exports them all, so callers import the package as before.
"""

from __future__ import annotations

from peerd.store.threads.reads import (
    busy_threads_of_link,
    counts,
    events_after,
    get_item,
    get_run,
    get_thread,
    last_reply,
    latest_run,
    page,
    queued_threads,
    read_items,
    run_by_token_hash,
    run_facts,
    run_prompt,
    run_views,
)
from peerd.store.threads.recovery import live_run_groups, recover
from peerd.store.threads.rows import Idempotency, NewThread, item_from_row
from peerd.store.threads.writes import (
    Admit,
    add_item,
    archive,
    event,
    insert_run,
    launch,
    send,
    set_provider_session,
    set_queue_held,
    start_next,
    transition_run,
)

__all__ = [
    "Admit",
    "Idempotency",
    "NewThread",
    "add_item",
    "archive",
    "busy_threads_of_link",
    "counts",
    "event",
    "events_after",
    "get_item",
    "get_run",
    "get_thread",
    "insert_run",
    "item_from_row",
    "last_reply",
    "latest_run",
    "launch",
    "live_run_groups",
    "page",
    "queued_threads",
    "read_items",
    "recover",
    "run_by_token_hash",
    "run_facts",
    "run_prompt",
    "run_views",
    "send",
    "set_provider_session",
    "set_queue_held",
    "start_next",
    "transition_run",
]
