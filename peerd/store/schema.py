"""Schema migrations, append-only: entry i moves `PRAGMA user_version` from i to i + 1.

Each migration is a list of statements (no naive splitting on ';'). Never edit a shipped entry;
add a new one.
"""

from __future__ import annotations

MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE projects (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            path TEXT NOT NULL UNIQUE,
            repository_key TEXT,
            created_at REAL NOT NULL
        )""",
        """CREATE TABLE threads (
            id TEXT PRIMARY KEY,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            title TEXT NOT NULL,
            provider TEXT NOT NULL,
            model TEXT,
            runtime_mode TEXT NOT NULL,
            interaction_mode TEXT NOT NULL,
            in_place INTEGER NOT NULL,
            worktree_path TEXT NOT NULL,
            branch TEXT,
            status TEXT NOT NULL DEFAULT 'active',
            queue_held INTEGER NOT NULL DEFAULT 0,
            provider_session TEXT,
            next_position INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX threads_project ON threads(project_id)",
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            status TEXT NOT NULL,
            prompt TEXT NOT NULL,
            reason TEXT,
            exit_code INTEGER,
            pgid INTEGER,
            token_hash TEXT,
            created_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL,
            UNIQUE (thread_id, number)
        )""",
        "CREATE INDEX runs_status ON runs(status)",
        """CREATE TABLE items (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            kind TEXT NOT NULL,
            text TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (thread_id, position)
        )""",
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX events_thread ON events(thread_id, seq)",
        """CREATE TABLE receipts (
            namespace TEXT NOT NULL,
            op TEXT NOT NULL,
            command_id TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            result TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (namespace, op, command_id)
        )""",
        "CREATE INDEX receipts_created ON receipts(created_at)",
    ],
    # 2: links. Box side: pairing codes (secret hashed), clients (linked laptops) and their
    # refresh tokens (hashed; rotated on use). Laptop side: links to boxes. Threads record the
    # link that started them (the fence) and where a delegation came from.
    [
        """CREATE TABLE pairing_codes (
            id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            access TEXT NOT NULL,
            label_hint TEXT,
            max_age_s REAL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            failed_attempts INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'open',
            client_id TEXT
        )""",
        """CREATE TABLE clients (
            id TEXT PRIMARY KEY,
            label TEXT NOT NULL,
            env_id TEXT,
            access TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_seen_at REAL,
            last_address TEXT,
            expires_at REAL,
            revoked_at REAL,
            revoked_reason TEXT
        )""",
        """CREATE TABLE refresh_tokens (
            token_hash TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            rotated_at REAL
        )""",
        "CREATE INDEX refresh_tokens_client ON refresh_tokens(client_id)",
        """CREATE TABLE links (
            env_id TEXT PRIMARY KEY,
            label TEXT NOT NULL,
            urls TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            access TEXT NOT NULL,
            client_id TEXT NOT NULL,
            refresh_token TEXT NOT NULL,
            refresh_expires_at REAL,
            access_token TEXT,
            access_expires_at REAL,
            linked_at REAL NOT NULL,
            last_reached_at REAL,
            last_error TEXT,
            status TEXT NOT NULL DEFAULT 'reachable'
        )""",
        "ALTER TABLE threads ADD COLUMN link_origin TEXT",
        "ALTER TABLE threads ADD COLUMN link_label TEXT",
        "ALTER TABLE threads ADD COLUMN delegated_from TEXT",
    ],
    # 3: delegated tasks. A task is recorded (pending, with the key its launch carries) before
    # the launch leaves; the child's ids are attached when the launch is answered. `stop_owed`
    # marks a stop that must still reach the box. `link_backoff` keeps a link's retry state
    # across restarts. `runs.origin` tells a wake run from a user's.
    [
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            parent_thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            parent_run_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            request_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            title TEXT NOT NULL,
            prompt TEXT NOT NULL,
            target_env TEXT,
            target_label TEXT,
            project_id TEXT,
            provider TEXT NOT NULL,
            model TEXT,
            runtime_mode TEXT,
            interaction_mode TEXT,
            launch_key TEXT NOT NULL,
            child_thread_id TEXT,
            child_run_id TEXT,
            status TEXT NOT NULL,
            result TEXT,
            wake TEXT NOT NULL DEFAULT 'always',
            woken_run_id TEXT,
            stop_owed INTEGER NOT NULL DEFAULT 0,
            stop_reason TEXT,
            last_error TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL,
            UNIQUE (namespace, request_key)
        )""",
        "CREATE INDEX tasks_parent ON tasks(parent_thread_id)",
        "CREATE INDEX tasks_open ON tasks(target_env, status)",
        "CREATE INDEX tasks_child_run ON tasks(child_run_id)",
        """CREATE TABLE link_backoff (
            env_id TEXT PRIMARY KEY,
            attempts INTEGER NOT NULL,
            next_at REAL NOT NULL,
            last_error TEXT
        )""",
        "ALTER TABLE runs ADD COLUMN origin TEXT NOT NULL DEFAULT 'user'",
    ],
    [
        # The owner's approval of one custom command, bound to its exact text by hash: editing
        # the command in the config file withdraws the approval.
        """CREATE TABLE provider_approvals (
            name TEXT PRIMARY KEY,
            command_sha256 TEXT NOT NULL,
            command TEXT NOT NULL,
            approved_at REAL NOT NULL
        )""",
    ],
    [
        # Orchestration: a thread may start from an exact commit on a named branch.
        "ALTER TABLE threads ADD COLUMN base_commit TEXT",
        # One orchestration run, its packets, and the receipts each hop ended with.
        """CREATE TABLE orchestrations (
            id TEXT PRIMARY KEY,
            project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
            task TEXT NOT NULL,
            request TEXT NOT NULL,
            status TEXT NOT NULL,
            base_commit TEXT NOT NULL,
            branch TEXT NOT NULL,
            reason TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL
        )""",
        """CREATE TABLE orchestration_packets (
            orchestration_id TEXT NOT NULL REFERENCES orchestrations(id) ON DELETE CASCADE,
            packet_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            hop TEXT,
            attempt INTEGER NOT NULL DEFAULT 0,
            retries TEXT NOT NULL DEFAULT '{}',
            coder TEXT,
            environment TEXT,
            thread_id TEXT,
            run_id TEXT,
            branch TEXT,
            commit_sha TEXT,
            failure TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (orchestration_id, packet_id)
        )""",
        """CREATE TABLE orchestration_receipts (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            orchestration_id TEXT NOT NULL REFERENCES orchestrations(id) ON DELETE CASCADE,
            packet_id TEXT,
            kind TEXT NOT NULL,
            body TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX orchestration_receipts_run ON orchestration_receipts(orchestration_id, seq)",
    ],
    # 6: who started each thread (owner, link:<client>, run:<run> for an agent's tool call,
    # task:<parent thread> for a delegation, orchestrate:<run>); older threads are unknown (NULL).
    [
        "ALTER TABLE threads ADD COLUMN started_by TEXT",
        "CREATE INDEX threads_link_origin ON threads(link_origin)",
    ],
    # 7: a run that continues one a daemon stop cut (origin 'continue') names that run, so each
    # cut is continued once and a chain of cuts is bounded (core/runs.py).
    [
        "ALTER TABLE runs ADD COLUMN continues TEXT",
    ],
    # 8: `task list` by status without a parent or a target (tasks_parent and tasks_open serve
    # the other filters; peerd/tasks/store.py listing_queries).
    [
        "CREATE INDEX tasks_status ON tasks(status)",
    ],
    # 9: the change feed. On the box, each link's durable subscription: the runs its follower
    # follows, with their threads (NULL: not a run of a thread the link started). On the laptop, a
    # link's open tasks (the follower's reads) indexed apart from the history: only open tasks are
    # in the partial index (peerd/tasks/feedstore.py).
    [
        """CREATE TABLE feed_runs (
            client_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            thread_id TEXT,
            PRIMARY KEY (client_id, run_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX tasks_followed ON tasks(target_env, created_at)"
        " WHERE (status IN ('pending', 'running') OR stop_owed = 1)",
    ],
    # 10: what each run spent (peerd/core/usage.py `Usage.to_json`, NULL: unknown) and the budget
    # that stops it (`Budget.to_json`, NULL: none); peerd/store/threads/usage.py.
    [
        "ALTER TABLE runs ADD COLUMN usage TEXT",
        "ALTER TABLE runs ADD COLUMN budget TEXT",
    ],
    # 11: a delegated task's budget (`Budget.to_json`, NULL: none), given to its child's run.
    [
        "ALTER TABLE tasks ADD COLUMN budget TEXT",
    ],
    # 12: on a laptop, what a task on a linked box spent, as the box sent it with the result (JSON,
    # `Usage.to_json`; NULL: unknown, or a local task, whose usage is summed from its runs).
    [
        "ALTER TABLE tasks ADD COLUMN usage TEXT",
    ],
    # 13: a run's items by position (`threads.last_reply`, a local task's result at its end; and
    # ON DELETE CASCADE from runs), without reading every item of every thread.
    [
        "CREATE INDEX items_run ON items(run_id, position)",
    ],
    # 14: approvals that reach a person (peerd/approvals/): each guarded action a run asks about,
    # committed before the CLI is answered; `delivered_at` NULL while the decision is owed to the
    # CLI (a restart cut its run). On a laptop, `remote_approvals` mirrors a linked box's pending
    # approvals for the work this machine started there (the follower's feed brings them).
    [
        """CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            ask_key TEXT NOT NULL,
            kind TEXT NOT NULL,
            tool TEXT NOT NULL,
            summary TEXT NOT NULL,
            detail TEXT NOT NULL,
            digest TEXT NOT NULL,
            status TEXT NOT NULL,
            link_origin TEXT,
            link_label TEXT,
            parent_task_id TEXT,
            parent_thread_id TEXT,
            scope TEXT,
            reason TEXT,
            decided_by TEXT,
            decision_id TEXT,
            created_at REAL NOT NULL,
            deadline_at REAL NOT NULL,
            decided_at REAL,
            delivered_at REAL
        )""",
        "CREATE INDEX approvals_pending ON approvals(deadline_at) WHERE status = 'pending'",
        "CREATE INDEX approvals_run ON approvals(run_id)",
        "CREATE INDEX approvals_thread ON approvals(thread_id, digest)",
        "CREATE INDEX approvals_link ON approvals(link_origin, created_at)",
        "CREATE INDEX approvals_created ON approvals(created_at)",
        """CREATE TABLE remote_approvals (
            environment_id TEXT NOT NULL,
            id TEXT NOT NULL,
            body TEXT NOT NULL,
            seen_at REAL NOT NULL,
            PRIMARY KEY (environment_id, id)
        ) WITHOUT ROWID""",
    ],
    # 15: placement (peerd/placement/): on a laptop, each linked box's last capacity report (its
    # JSON `Capacity`, as `GET /v1/link` or the change feed brought it, and when) or why it could
    # not be read; and each `auto` choice (a task's or a launch's, keyed by its request so a retry
    # reuses it) with the environment chosen and the reason, shown by task show and thread show.
    [
        """CREATE TABLE link_capacity (
            environment_id TEXT PRIMARY KEY,
            body TEXT,
            seen_at REAL,
            error TEXT,
            error_at REAL
        ) WITHOUT ROWID""",
        """CREATE TABLE placements (
            key TEXT PRIMARY KEY,
            environment_id TEXT,
            project_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            task_id TEXT,
            thread_id TEXT,
            created_at REAL NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX placements_task ON placements(task_id) WHERE task_id IS NOT NULL",
        "CREATE INDEX placements_thread ON placements(thread_id) WHERE thread_id IS NOT NULL",
    ],
    # 16: thread handoff (peerd/handoff/): on the machine a thread moves from, each move with its
    # state (waiting -> moving -> moved, or cancelled / failed), recorded before anything leaves, and
    # what each step settled (the snapshot commit, the branch there, the thread there) so a resume
    # after a crash repeats the same steps; on both machines the pointers between the two copies.
    [
        """CREATE TABLE moves (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            environment_id TEXT NOT NULL,
            state TEXT NOT NULL,
            message TEXT,
            interrupt INTEGER NOT NULL DEFAULT 0,
            started_by TEXT NOT NULL,
            request_key TEXT,
            held_before INTEGER NOT NULL DEFAULT 0,
            remote_project TEXT,
            base_commit TEXT,
            snapshot TEXT,
            there_branch TEXT,
            kept_ref TEXT,
            prompt TEXT,
            there_thread_id TEXT,
            there_run_id TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE UNIQUE INDEX moves_open ON moves(thread_id) WHERE state IN ('waiting', 'moving', 'moved')",
        "CREATE UNIQUE INDEX moves_request ON moves(request_key) WHERE request_key IS NOT NULL",
        "CREATE INDEX moves_unfinished ON moves(state) WHERE state IN ('waiting', 'moving')",
        "ALTER TABLE threads ADD COLUMN moved_to TEXT",
        "ALTER TABLE threads ADD COLUMN moved_from TEXT",
    ],
    # 17: the ownership ledger (core/ownership.py, store/ownership.py): every ref, worktree and
    # checkout peerd makes or lands, with its owner (person, link:<client>, orchestration:<run>,
    # move:<id>), recorded before git makes it. Filled from what the store already knows: threads'
    # branches and worktrees (a link's, an orchestration's or the person's), orchestrations'
    # integration branches, open moves' snapshot refs, projects' checkouts. A ref with no record is
    # the person's.
    [
        """CREATE TABLE git_owners (
            project_id TEXT NOT NULL,
            holding TEXT NOT NULL CHECK (holding IN ('ref', 'worktree', 'checkout')),
            name TEXT NOT NULL,
            owner TEXT NOT NULL,
            purpose TEXT NOT NULL,
            thread_id TEXT,
            created_at REAL NOT NULL,
            PRIMARY KEY (project_id, holding, name)
        ) WITHOUT ROWID""",
        "CREATE INDEX git_owners_owner ON git_owners(owner)",
        """INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)
           SELECT project_id, 'ref', 'refs/heads/' || branch,
                  CASE WHEN link_origin IS NOT NULL AND link_origin <> '' THEN 'link:' || link_origin
                       WHEN started_by LIKE 'orchestrate:_%' THEN 'orchestration:' || substr(started_by, 13)
                       ELSE 'person' END,
                  'thread-branch', id, created_at
           FROM threads WHERE in_place = 0 AND branch IS NOT NULL AND branch <> ''""",
        """INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)
           SELECT project_id, 'worktree', worktree_path,
                  CASE WHEN link_origin IS NOT NULL AND link_origin <> '' THEN 'link:' || link_origin
                       WHEN started_by LIKE 'orchestrate:_%' THEN 'orchestration:' || substr(started_by, 13)
                       ELSE 'person' END,
                  'thread-worktree', id, created_at
           FROM threads WHERE in_place = 0""",
        """INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)
           SELECT project_id, 'ref', 'refs/heads/' || branch, 'orchestration:' || id, 'integration', NULL,
                  created_at
           FROM orchestrations WHERE branch IS NOT NULL AND branch <> ''""",
        """INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)
           SELECT t.project_id, 'ref', 'refs/peerd/moving/' || m.id, 'move:' || m.id, 'move-snapshot',
                  m.thread_id, m.created_at
           FROM moves m JOIN threads t ON t.id = m.thread_id WHERE m.state IN ('waiting', 'moving')""",
        """INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)
           SELECT id, 'checkout', path, 'person', 'checkout', NULL, created_at FROM projects""",
    ],
    # 18: a link's backoff keeps its delay (a relative duration) beside the wall time of the next
    # try, so a restart waits at most the delay whatever the wall clock did (`rules.backoff_wait`;
    # issue 26, case 9). NULL: a row of an older release (bounded by its attempts).
    [
        "ALTER TABLE link_backoff ADD COLUMN delay_s REAL",
    ],
    # 19: the A2A face's push notifications (peerd/a2a/push.py): a webhook per task (its token is
    # the client's secret for its own webhook, sent back as X-A2A-Notification-Token, so kept as
    # given in the 0600 store and never logged), and each state change owed to each webhook until
    # it is delivered or given up with a reason.
    [
        """CREATE TABLE a2a_push_configs (
            task_id TEXT NOT NULL,
            id TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            url TEXT NOT NULL,
            token TEXT,
            auth_scheme TEXT,
            auth_credentials TEXT,
            last_state TEXT,
            created_at REAL NOT NULL,
            PRIMARY KEY (task_id, id)
        ) WITHOUT ROWID""",
        "CREATE INDEX a2a_push_configs_thread ON a2a_push_configs(thread_id)",
        """CREATE TABLE a2a_push_owed (
            task_id TEXT NOT NULL,
            config_id TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at REAL NOT NULL,
            delivered_at REAL,
            given_up TEXT,
            created_at REAL NOT NULL,
            PRIMARY KEY (task_id, config_id, state)
        ) WITHOUT ROWID""",
    ],
    # 20: agents peerd did not start sign in over OAuth (issue 29; api/agent_signin.py). A pairing
    # code is for a link or for an agent (`purpose`; one never redeems as the other); a client is a
    # link or a signed-in agent (`kind`) with the OAuth client it signed in as (`agent`, JSON:
    # client_id, name, redirect_uri). Agents' OAuth clients registered dynamically (RFC 7591), and
    # authorization codes (hashed; single use, bound to client, redirect URI, PKCE challenge and
    # resource; `client_id` names the peerd client the exchange made, revoked if the code comes back).
    [
        "ALTER TABLE pairing_codes ADD COLUMN purpose TEXT NOT NULL DEFAULT 'link'",
        "ALTER TABLE clients ADD COLUMN kind TEXT NOT NULL DEFAULT 'link'",
        "ALTER TABLE clients ADD COLUMN agent TEXT",
        """CREATE TABLE oauth_clients (
            client_id TEXT PRIMARY KEY,
            metadata TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        """CREATE TABLE auth_codes (
            code_hash TEXT PRIMARY KEY,
            oauth_client_id TEXT NOT NULL,
            client_name TEXT,
            redirect_uri TEXT NOT NULL,
            code_challenge TEXT NOT NULL,
            resource TEXT NOT NULL,
            access TEXT NOT NULL,
            max_age_s REAL,
            pairing_code_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            used_at REAL,
            client_id TEXT
        )""",
        # An authorization request the person asked the owner to approve in the console instead of
        # typing a code (store/signin_requests.py): pending -> approved or denied -> done.
        """CREATE TABLE signin_requests (
            id TEXT PRIMARY KEY,
            poll_hash TEXT NOT NULL,
            oauth_client_id TEXT NOT NULL,
            client_name TEXT,
            redirect_uri TEXT NOT NULL,
            code_challenge TEXT NOT NULL,
            resource TEXT NOT NULL,
            oauth_state TEXT,
            state TEXT NOT NULL DEFAULT 'pending',
            access TEXT,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            decided_at REAL
        )""",
    ],
    # 21: where threads this machine started elsewhere live (store/thread_homes.py): a launch
    # forwarded to a linked machine, and a thread found there by its id. Placed, delegated and
    # moved threads are already in placements, tasks and moves; the lookup reads all four.
    [
        """CREATE TABLE thread_homes (
            thread_id TEXT PRIMARY KEY,
            environment_id TEXT NOT NULL,
            via TEXT NOT NULL,
            created_at REAL NOT NULL
        ) WITHOUT ROWID""",
    ],
    # 22: the A2A face (peerd/a2a/). `ListTasks` pages runs newest first by (created_at, id). On a
    # laptop, each A2A task placed on a linked box (a2a/remote.py): the launch or send recorded
    # before it leaves (keyed by the caller's namespace and its message's key, with the body it
    # sends again until the box answers), the box's thread and run once it did, the task as last
    # seen there (A2A JSON; with its answer once it ended), and a cancel owed to it. When a push
    # was given up (`peerd status`, `peerd doctor` and the task's GetTask show the recent ones).
    [
        "CREATE INDEX runs_created ON runs(created_at, id)",
        "ALTER TABLE a2a_push_owed ADD COLUMN given_up_at REAL",
        "CREATE INDEX a2a_push_given_up ON a2a_push_owed(given_up_at) WHERE given_up IS NOT NULL",
        """CREATE TABLE a2a_remote_tasks (
            namespace TEXT NOT NULL,
            request_key TEXT NOT NULL,
            env_id TEXT NOT NULL,
            method TEXT NOT NULL,
            body TEXT NOT NULL,
            task_id TEXT UNIQUE,
            thread_id TEXT,
            state TEXT,
            task TEXT,
            cancel_owed INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL,
            PRIMARY KEY (namespace, request_key)
        )""",
        "CREATE INDEX a2a_remote_open ON a2a_remote_tasks(created_at) WHERE ended_at IS NULL",
        "CREATE INDEX a2a_remote_listed ON a2a_remote_tasks(created_at, task_id)",
        "CREATE INDEX a2a_remote_thread ON a2a_remote_tasks(thread_id)",
    ],
    # 23: waits on a pull request (peerd/waits/): recorded before the asking run's turn ends,
    # watched through `gh` with its backoff stored as a delay (a restart waits at most that), ended
    # once (`delivered` with its outcome and the wake run made in the same transaction, or
    # `cancelled`). `claim` is the fencing token of the watcher that may deliver it.
    [
        """CREATE TABLE waits (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            run_id TEXT,
            project_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            request_key TEXT,
            request_hash TEXT NOT NULL,
            pr TEXT NOT NULL,
            until TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'watching',
            outcome TEXT,
            detail TEXT,
            seen TEXT,
            polls INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            rate_limited INTEGER NOT NULL DEFAULT 0,
            baseline TEXT,
            next_at REAL,
            delay_s REAL,
            last_error TEXT,
            claim TEXT,
            woken_run_id TEXT,
            deadline_at REAL NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL
        )""",
        "CREATE UNIQUE INDEX waits_request ON waits(namespace, request_key) WHERE request_key IS NOT NULL",
        "CREATE INDEX waits_open ON waits(created_at) WHERE status = 'watching'",
        "CREATE INDEX waits_thread ON waits(thread_id, created_at)",
    ],
]
