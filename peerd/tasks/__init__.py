"""Delegated tasks end to end: one place for "a task is recorded, launched, followed, ends once and
wakes its parent once".

    rules.py        pure: statuses, first result wins, the wake condition, settlement, the result
                    text, backoff, failures sorted by typed code
    subscription.py pure: the change feed's rules (set hash, the laptop's subscription and cursor,
                    the box's per-link feed)
    machine.py      pure: the follower's state machine (events in, actions out, time injected)
    actions.py      pure data: what the follower knows and the actions the machine asks for
    store.py        the `tasks` and `link_backoff` tables
    feedstore.py    the change feed's queries: the box's subscriptions, the laptop's lean reads
    delegation.py   delegate_task, task_status, task_cancel, launches and stops (the I/O shell)
    ending.py       how a task ends and wakes its parent; local children settled
    feed.py         the box's side of the change feed (`POST /v1/feed/...`; wire: feedwire.py)
    watch.py        settlement of a watched run; the batched `/v1/watch` older laptops send
    follower.py     the follower's I/O shell: one per link, running the machine
    feedclient.py   the follower's request bodies and the settled run's reply, read whole
    timing.py       work retried while the store fails (on the daemon's clock)
"""
