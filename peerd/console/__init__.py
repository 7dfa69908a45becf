"""The console: the whole fleet from one browser, served by the daemon on its own HTTP listener.

A client of the owner's API, not a second implementation of operations: every page reads and every
button acts through the owner socket (`peerd.api.localclient.LocalClient`), and what happens on a
linked machine goes through the API's `environmentId` forwarding, as `peerd --env` does.

    rules.py      pure: where it may listen (loopback, or TLS), which Host and Origin it answers
    auth.py       sans-IO: one-time login tokens, sessions, CSRF tokens
    server.py     the listener: start/stop with the daemon, the guard middleware, login, static files
    owner.py      the owner's API as the pages need it (environments here and through the links)
    render.py     Jinja2 templates (autoescaped), filters, page and fragment answers
    pages.py      Environment and Connections (pair with QR, link, revoke)
    threads.py    Threads across the fleet, a thread page, send / interrupt / stop / launch
    stream.py     a thread's items as server-sent events (Last-Event-ID resume)
    work.py       Tasks, Orchestrations
    approvals.py  Approvals here and on linked boxes: approve / deny (a reason), who decided, live
    graph.py      pure: an orchestration's packets laid out as an SVG dependency graph
    templates/    the pages; static/ htmx (vendored), console.css, console.js

Nothing here is imported by `peerd.cli` at load, and Jinja2 is imported on the first page only.
Security model: docs/security.md, "The console".
"""
