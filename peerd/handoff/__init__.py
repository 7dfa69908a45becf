"""Thread handoff: `peerd thread move` and the `thread_move` tool (issue 19, docs/user/handoff.md).

- `machine.py`: the rules, pure (states, the commit point, what a message does, the steps, the
  branch landing, the transcript);
- `store.py`: the `moves` table (migration 16) and the thread's pointers;
- `gitwork.py`: the snapshot commit here and the branch landing there;
- `service.py`: `HandoffService`, the mover's side (request, driver, resume, the send guard);
- `boxside.py`: the side a link calls where the thread arrives, and the dry run's candidates;
- `wire.py`: wire models and typed errors. Routes: `peerd/api/handoff.py`.
"""
