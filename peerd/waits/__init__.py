"""Waits on a pull request (issue 32): an agent ends its turn while the daemon watches its pull
request's checks or review through `gh`, and is woken once with what happened.

`machine.py` (pure: the rules, the backoff, the wake's text), `gh.py` (asking gh, classifying its
answers), `store.py` (the `waits` table, migration 23), `service.py` (the watchers), `wire.py`
(the tools' and the API's models). docs/internals/waits.md says how it holds.
"""
