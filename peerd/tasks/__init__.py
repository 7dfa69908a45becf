"""Delegated tasks end to end: one place for "a task is recorded, launched, followed, ends once and
wakes its parent once".

    rules.py      pure: statuses, first result wins, the wake condition, settlement, the result
                  text, backoff, failures sorted by typed code
    machine.py    pure: the follower's state machine (events in, actions out, time injected)
    store.py      the `tasks` and `link_backoff` tables
    delegation.py delegate_task, task_status, task_cancel, launches and stops (the I/O shell)
    ending.py     how a task ends and wakes its parent; local children settled
    watch.py      the box's side of the follower's batched long-poll
    follower.py   the follower's I/O shell: one per link, running the machine
    timing.py     the one clock/sleep seam; work retried while the store fails
"""
