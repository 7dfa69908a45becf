"""Approvals that reach a person: a run at access level `approval-required` asks before each
guarded action, and a person decides, on this machine or on the linked machine that started it.

- `gate`: what a provider sees (`ApprovalGate.ask`), the one interface every CLI driver uses.
- `rules`: the pure decisions (first decision wins, deadlines, "always" scopes, who may decide).
- `store`: the durable records (committed before the CLI's request is answered).
- `service`: the gate's implementation per run, the deadline timer, watchers and notifications.
"""
