"""Placement: each environment's capacity report, and `auto` choosing where work runs.

`capacity` (this environment's report), `rules` (pure: who qualifies, who wins, the reasons),
`store` (a laptop's cache of its boxes' reports; the choices kept), `service` (the I/O shell).
Docs: docs/user/fleet.md.
"""
