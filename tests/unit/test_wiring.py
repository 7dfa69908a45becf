"""The composition root is the only place that wires, and it wires through constructors.

No module of peerd sets an attribute of an object it did not make itself after that object
exists: a hook (`ops.on_stop = ...`, `followers.on_capacity = ...`), a collaborator
(`ops.delegation = ...`) or a patch through a chain (`self.runs.on_run_end = ...`,
`followers.delegation.ender.watcher.hub.capacity = ...`). What a part uses is given to its
constructor; what forms a cycle is an event (`peerd/events.py`), subscribed in
`peerd/daemon.py:Daemon._subscribe`.

The check is syntactic (`ast`): an assignment to `<name>.<attr>` whose receiver is not `self` or
`cls`, to `self.<part>.<attr>`, or `setattr(<name>, ...)` on anything but `self`/`cls`. The few
legitimate cases (records and library objects being filled in, an object's own sub-state) are
listed in `ALLOWED` with the reason; an entry no longer found fails too, so the list stays true.
"""

from __future__ import annotations

import ast
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

from peerd import events
from peerd.contracts import Capacity
from peerd.daemon import Daemon
from peerd.events import Event, Events

PEERD = Path(__file__).resolve().parents[2] / "peerd"

# (module, target) -> why it is not wiring. `target` is the assignment's target as written;
# `<receiver>.*` allows every attribute of that receiver in that module.
ALLOWED: dict[tuple[str, str], str] = {
    ("boot.py", "early.config"): "the early socket's own record of the config, once validated",
    ("runtime/process.py", "process._stdin_task"): "a factory classmethod finishing its new instance",
    ("providers/cli.py", "launch.*"): "a `Launch` record being filled in before the process starts",
    ("providers/coders.py", "launch.*"): "a `Launch` record being filled in before the process starts",
    ("providers/gemini_acp.py", "launch.skip_sigint"): "a `Launch` record being filled in",
    ("tasks/feed.py", "link.*"): "`_Link`, the feed's own per-link record (a dataclass it keeps)",
    (
        "tasks/feed.py",
        "state.dirty",
    ): "`LinkFeed`, the feed's own per-link rules state, given back what a look lost",
    ("runtime/runner.py", "entry.users"): "`_KickLock`, the run manager's own count of a lock's users",
    (
        "console/render.py",
        "session.notices",
    ): "a console session record (a dataclass) whose notices are shown once",
    ("orchestrate/review.py", "memo.*"): "a packet memo record being updated",
    ("tasks/machine.py", "self.sub.cursor"): "the machine's own subscription record",
    ("tasks/follower.py", "self.machine.*"): "the follower's own pure machine (its state, not a hook)",
    ("api/listener.py", "record.msg"): "a logging record being reworded by a log filter",
    ("api/listener.py", "self._guard.server"): "the site hands its guard the server it serves",
    ("peer/links.py", "ctx.*"): "an `ssl.SSLContext` being configured",
    ("peer/identity.py", "ctx.minimum_version"): "an `ssl.SSLContext` being configured",
    ("console/server.py", "ctx.minimum_version"): "an `ssl.SSLContext` being configured",
    ("peer/webcert.py", "ctx.minimum_version"): "an `ssl.SSLContext` being configured",
    ("console/guard.py", "response.content_type"): "an aiohttp response being built",
    ("console/auth.py", "session.last_seen_at"): "a console session record (a dataclass) touched",
    ("cli/common.py", "ctx.obj"): "click's context object, click's own way to pass the home down",
    ("cli/main.py", "ctx.obj"): "click's context object, click's own way to pass the home down",
    ("cli/threads.py", "client.environment_id"): "the CLI's request client following `--env auto`",
    ("cli/tasks.py", "client.environment_id"): "the CLI's request client visiting each machine (`--env all`)",
    ("store/db.py", "conn.row_factory"): "a sqlite connection being configured",
    ("orchestrate/cleanup.py", "memo.stop_owed"): "a packet memo record being updated",
    ("orchestrate/escapes.py", "memo.*"): "a packet memo record being filled in",
    ("orchestrate/implement.py", "packet.memo"): "a packet record being updated from an effect",
    ("orchestrate/implement.py", "setattr(packet)"): "a packet record being updated from an effect",
    ("orchestrate/steps.py", "setattr(updated)"): "a copy of a record being updated",
}

OWN = ("self", "cls")


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None (a call, a subscript...)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
        return found
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def wiring_after_construction(source: str) -> list[tuple[int, str]]:
    """Each assignment in `source` that sets an attribute of an object the code did not make
    itself: (line, the target as written, or `setattr(<receiver>)`)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if not isinstance(target, ast.Attribute):
                continue
            name = _dotted(target)
            if name is None:
                continue
            parts = name.split(".")
            if parts[0] not in OWN or len(parts) > 2:
                found.append((target.lineno, name))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and (receiver := _dotted(node.args[0])) is not None
            and receiver not in OWN
        ):
            found.append((node.lineno, f"setattr({receiver})"))
    return found


def _allowed(module: str, target: str) -> tuple[str, str] | None:
    receiver = target.rsplit(".", 1)[0]
    for key in ((module, target), (module, f"{receiver}.*")):
        if key in ALLOWED:
            return key
    return None


def test_nothing_is_wired_after_it_is_built() -> None:
    wired: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(PEERD.rglob("*.py")):
        module = path.relative_to(PEERD).as_posix()
        for line, target in wiring_after_construction(path.read_text()):
            key = _allowed(module, target)
            if key is None:
                wired.append(f"peerd/{module}:{line}: {target} = ...")
            else:
                used.add(key)
    assert not wired, (
        "Set after the object exists (give it to the constructor; a cycle is an event of "
        "peerd/events.py, subscribed in Daemon._subscribe):\n" + "\n".join(wired)
    )
    assert set(ALLOWED) <= used, f"ALLOWED entries no longer found: {sorted(set(ALLOWED) - used)}"


def test_the_check_sees_hooks_chains_and_setattr() -> None:
    source = """
class Pool:
    def __init__(self, delegation, peers):
        self.delegation = delegation
        self.count: int = 0
        delegation.followers = self
        self.peers.on_answer = self.answered
        self.a, ops.placement = 1, 2
        setattr(peers, "on_answer", None)
        setattr(self, "fine", 1)
        self.items[0] = 1
"""
    assert wiring_after_construction(source) == [
        (6, "delegation.followers"),
        (7, "self.peers.on_answer"),
        (8, "ops.placement"),
        (9, "setattr(peers)"),
    ]


async def test_the_daemon_subscribes_each_event_to_the_part_that_acts_on_it() -> None:
    """`Daemon._subscribe`, the one place events are subscribed: each event reaches its part, once."""
    heard: list[tuple[str, tuple[object, ...]]] = []

    def part(**names: str) -> SimpleNamespace:
        def recorder(name: str) -> Callable[..., Awaitable[None]]:
            async def record(*args: object) -> None:
                heard.append((name, args))

            return record

        return SimpleNamespace(**{attr: recorder(name) for attr, name in names.items()})

    hub = Events()
    delegation = part(on_run_end="settle", stop_children="stop children")
    delegation.hub = part(client_revoked="end the client's polls")
    parts = SimpleNamespace(
        events=hub,
        delegation=delegation,
        runs=part(kick="kick"),
        followers=part(task_changed="follow task", link_forgotten="fail link", peer_answered="end backoff"),
        placement=part(link_answered="keep link report", keep_from_feed="keep feed report"),
        waits=part(cancel_for_thread="end waits"),
        mcp=part(warm="load the MCP SDK"),
    )
    Daemon._subscribe(parts)  # type: ignore[arg-type]  # the parts it subscribes, as fakes
    capacity = Capacity(live_runs=0, max_runs=1, providers=[], projects=[])
    published = [
        events.RunEnded("thr_1"),
        events.RunQueued("thr_2"),
        events.ThreadStopped("thr_3", "why"),
        events.RemoteTaskChanged("box", "tsk_1"),
        events.LinkForgotten("box"),
        events.ClientRevoked("cli_1"),
        events.PeerAnswered("box"),
        events.LinkChecked("box", {"capacity": None}),
        events.CapacityReported("box", capacity),
        events.RunStarting("thr_4"),
        events.ThreadArchived("thr_5"),
    ]
    kinds = {kind for kind in vars(events).values() if isinstance(kind, type) and issubclass(kind, Event)}
    assert {type(event) for event in published} == kinds - {Event}, "a new event: publish it here too"
    assert all(hub.subscribers(type(event)) == 1 for event in published)
    for event in published:
        await hub.publish(event)
    assert heard == [
        ("settle", ("thr_1",)),
        ("kick", ("thr_2",)),
        ("stop children", ("thr_3", "why")),
        ("end waits", ("thr_3", "why")),
        ("follow task", (published[3],)),
        ("fail link", (published[4],)),
        ("end the client's polls", (published[5],)),
        ("end backoff", (published[6],)),
        ("keep link report", ("box", {"capacity": None})),
        ("keep feed report", ("box", capacity)),
        ("load the MCP SDK", ()),
        ("end waits", ("thr_5", "it was archived")),
    ]
