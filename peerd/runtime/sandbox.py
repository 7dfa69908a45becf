"""peerd's own confinement of the runs it starts: a bubblewrap (`bwrap`) profile, and who gets it.

Who is confined (`decide`): every run except an owner-started run at `full-access` (the owner's
full-access run is the owner, by design). A link's `full-access` run is confined too. When bwrap is
missing or does not work here, the owner's runs go on with only the coder CLI's own sandbox, and a
link's run above `read-only` is refused at start (`ConfinementUnavailable`) unless the box owner set
`links.allow_unconfined = true` in config.toml. The outcome is a `notice` item of the run.

What a confined run sees (`Confinement`, turned into bwrap arguments by `bwrap_args`): deny by
default. The run's root is an empty tmpfs; only what is bound into it exists there:

- the system's programs and libraries, read-only: `/usr`, `/bin`, `/sbin`, `/lib*` (merged-usr
  symlinks kept as symlinks), `/sys`, and `/etc` filtered (`sandbox_profile.etc_plan`: no file or
  directory that is not world-readable, so no `shadow`, `gshadow`, `sudoers`, `ssl/private`, and
  none of `ETC_DENIED`: ssh host keys, keytabs, VPN and Wi-Fi secrets, ...); a fresh `/dev`, a fresh
  `/proc` in its own PID namespace (so `/proc/<daemon pid>/root` cannot reach the unconfined
  filesystem), its own IPC and UTS namespaces, no capabilities (also when peerd runs as root), and
  it dies with peerd;
- private, empty and writable: `/tmp`, `/var/tmp`, `/run/user/<uid>` (hiding the ssh-agent, D-Bus
  and other sockets kept there) and the run's `$HOME` (so no ssh keys, shell history, other
  tools' tokens);
- the run's own things: read-only the Python installation and the `peerd` package (for
  `python -m peerd mcp` and the scripted agent), the coder CLI's install directory and the files
  its config names, the project's git dir (so `git status` and `git diff` work; commits, config and
  hook writes do not), and the run's scratch dir (its token file and MCP config); writable the
  run's worktree (read-only at `read-only`, `approval-required` and in plan mode; for Codex also at
  `auto-accept-edits`, as its own mapping), the CLI's own state dirs (`~/.codex` or `CODEX_HOME`,
  `~/.claude` and `~/.claude.json`, `~/.gemini`, or the whole `HOME` a provider's `env` sets), and
  peerd's agent socket, the one peerd surface a run can reach. An in-place thread's checkout is
  its worktree: writable, with its `.git` read-only;
- nothing else: no `/home`, `/root`, `/srv`, `/opt`, `/mnt`, `/media`, no `/var` beyond its private
  tmp, no other checkout, no other run's files, not peerd's home. Should a bound directory contain
  one of those (peerd's home, the owner socket's directory, a registered checkout), an empty
  read-only tmpfs is laid over it (`hidden`).
- network: none for the scripted provider (`--unshare-net`: it needs only the agent socket, a Unix
  socket file); shared for the coder CLIs and custom commands, which must reach their model's API.
  A run with the network shared can reach what any local process can over TCP and abstract Unix
  sockets (but not peerd's owner socket, a hidden file).
- environment: `SSH_AUTH_SOCK`, `SSH_AGENT_PID`, `GPG_AGENT_INFO`, `DBUS_SESSION_BUS_ADDRESS`,
  `GIT_ASKPASS`, `SSH_ASKPASS`, systemd's notify variables and `PEERD_HOME` are dropped, and so is
  any inherited variable naming peerd's home or owner socket (the run's own bindings stay).

Not `--new-session`: peerd interrupts a run by signalling the process group the provider process
starts in (that `setsid` already leaves the run without a controlling terminal). So that the signal
reaches the run itself and not only bwrap, bwrap is started with SIGINT and SIGTERM ignored, and a
tiny shim inside restores them before it executes the provider; SIGKILL still ends bwrap, and with
it (`--die-with-parent`) everything inside.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from peerd.errors import ConfinementUnavailable
from peerd.runtime import runas, runas_grant
from peerd.runtime.runas import Grant, RunAs

PROBE_TIMEOUT_S = 10.0
DROPPED_ENV = frozenset(
    {
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "GPG_AGENT_INFO",
        "DBUS_SESSION_BUS_ADDRESS",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "NOTIFY_SOCKET",
        "WATCHDOG_PID",
        "WATCHDOG_USEC",
        "PEERD_HOME",
    }
)
INSTALL_HINT = "install bubblewrap (Debian and Ubuntu: `apt-get install bubblewrap`)"
# Outside: ignore SIGINT/SIGTERM so bwrap itself outlives the group signal; inside: restore them.
_SHIM = (
    "import os,signal as s,sys\nfor n in (s.SIGINT,s.SIGTERM): s.signal(n,s.{})\n"
    "os.execvp(sys.argv[1],sys.argv[1:])"
)
_OUTER, _INNER = _SHIM.format("SIG_IGN"), _SHIM.format("SIG_DFL")
# Inside, for a run with a uid of its own (`runas`): drop to it first, then the same.
_INNER_AS = _INNER.replace("\n", "\n" + runas.DROP, 1)
RUNAS_SCRIPT = Path(runas_grant.__file__).resolve()  # lean: every confined run starts it


# What a run finds at a path inside its sandbox (`Confinement.sees`).
Sight = Literal["hidden", "read", "write"]


@dataclass(frozen=True)
class Mount:
    """A path made visible again inside the sandbox (the same path as outside, or `source` shown
    at `path`)."""

    path: Path
    writable: bool = False
    optional: bool = False  # bound only when it exists (`--bind-try`)
    source: Path | None = None  # what is shown at `path`, when not `path` itself
    # The run's own (its scratch dir): readable by the run's uid when it has one (`runas`), as
    # what is bound writable is writable by it.
    own: bool = False


@dataclass(frozen=True)
class Confinement:
    """What one run may see and write. Paths are absolute and real (symlinks resolved)."""

    cwd: Path
    worktree: Path
    worktree_writable: bool
    # `approval-required` (not in plan mode): read-only, except the writes a person approves (the
    # coders that ask get it writable for them: providers/coders.py); the notice says so.
    worktree_asks: bool = False
    git_dir: Path | None = None
    tmp: tuple[Path, ...] = ()  # private, empty, writable (/tmp, /var/tmp, /run/user/<uid>, $HOME)
    hidden: tuple[Path, ...] = ()  # empty and read-only, where a bind would show them
    binds: tuple[Mount, ...] = ()
    # Paths whose names are dropped from the inherited environment (peerd's home, owner socket).
    private: tuple[Path, ...] = ()
    by_link: bool = False
    share_net: bool = False
    # The system's programs and libraries, read-only (`sandbox_profile.system_mounts`), and the
    # symlinks among them kept as symlinks (`/bin -> usr/bin`): the root itself is empty.
    system: tuple[Mount, ...] = ()
    symlinks: tuple[tuple[Path, str], ...] = ()
    # When peerd runs as root, the uid and gid the run runs as (`runas`); else peerd's own.
    run_as: RunAs | None = None
    note: str | None = None  # said in the run's notice (e.g. why it keeps peerd's uid)

    def grants(self) -> list[Grant]:
        """What the run's uid is given access to when it has one: its own paths only."""
        found = [Grant(self.worktree, self.worktree_writable, recursive=True)]
        for bind in self.binds:
            if bind.source is None and (bind.writable or bind.own):
                found.append(Grant(bind.path, bind.writable, recursive=True))
        return found

    # --- what a path is inside (`sees`; the provider's checks before its CLI starts) -------------
    # Never shown to a run because a provider's config names them (peerd's home, its sockets, the
    # registered checkouts, for a link's run the box user's home), however the profile hides them;
    # `hidden` counts too.
    guarded: tuple[Path, ...] = ()

    def plus(self, *binds: Mount, share_net: bool | None = None) -> Confinement:
        net = self.share_net if share_net is None else share_net
        return dataclasses.replace(self, binds=self.binds + binds, share_net=net)

    def mounts(self) -> list[tuple[str, Path]]:
        """(kind, path) in the order bwrap applies them: a parent before what lies below it, so
        the more specific path wins; on the same path a bind beats a hide and read-only beats
        writable."""
        wanted: list[tuple[str, Path]] = [("tmp", p) for p in self.tmp]
        shown = {b.path for b in (*self.system, *self.binds)} | {self.worktree}
        # A hidden path needs its tmpfs only where something bound would show it: elsewhere it is
        # absent from the empty root (an empty directory there would only tell that it exists).
        wanted += [("hide", p) for p in self.hidden if _below_any(p, shown)]
        for bind in (*self.system, *self.binds):
            kind = "write" if bind.writable else "read"
            if bind.source is not None:
                kind = "swap"  # another file shown in this one's place: beats any other rule for it
            wanted.append((kind + ("?" if bind.optional else ""), bind.path))
        wanted.append(("write" if self.worktree_writable else "read", self.worktree))
        if self.git_dir is not None:
            wanted.append(("read", self.git_dir))
        rank = {"tmp": 0, "hide": 1, "write?": 2, "write": 3, "read?": 4, "read": 5, "swap?": 6, "swap": 7}
        chosen: dict[Path, str] = {}
        for kind, path in wanted:
            if path not in chosen or rank[kind] > rank[chosen[path]]:
                chosen[path] = kind
        return sorted(((k, p) for p, k in chosen.items()), key=lambda kp: len(kp[1].parts))

    def describe(self) -> str:
        """The run's notice: what peerd's sandbox lets it see and write."""
        tree = "writable" if self.worktree_writable else "read-only"
        if not self.worktree_writable and self.worktree_asks:
            tree = "read-only, except the edits and commands a person approves: each waits for their yes"
        return (
            "peerd confines this run (bubblewrap): it sees the system's programs and libraries "
            "(read-only, /etc without its secrets), its worktree "
            f"({tree}), the project's git dir (read-only), its coder's own files, and a private, empty "
            "/tmp and home; nothing else of this machine (no other checkout, no home directory, not "  # noqa: S108  # words, not a path used
            "peerd's home). peerd's agent tools are reachable only through the agent socket."
            + (f" It runs as uid {self.run_as.uid}, not root, with no capabilities." if self.run_as else "")
            + (f" {self.note}" if self.note else "")
        )

    def sees(self, path: Path) -> Sight:
        """What a run confined by this profile finds at `path` (absolute, real), from the profile
        alone, applied as `bwrap_args` applies it: /dev, /proc, then `mounts()`
        parents first, so the deepest mount at or above `path` decides. An optional mount counts as
        bound (the caller asks about a path that exists). A private tmp dir is there and writable,
        but empty; a hidden path shows nothing, itself included."""
        sight: Sight = "hidden"  # deny by default: `/` itself is not bound
        for kind, mount in [("write", Path("/dev")), ("read", Path("/proc")), *self.mounts()]:
            if path == mount or mount in path.parents:
                bound = kind.rstrip("?")
                if bound == "tmp":
                    sight = "write" if path == mount else "hidden"
                elif bound == "hide":
                    sight = "hidden"
                else:
                    sight = "write" if bound == "write" else "read"  # read, or swap (read-only)
        return sight


@dataclass(frozen=True)
class Visible:
    """One row of what a confined run sees (docs/security.md and `peerd doctor` show the table)."""

    what: str
    paths: str
    access: str

    def markdown(self) -> str:
        return f"| {self.what} | {self.paths} | {self.access} |"


VISIBLE: tuple[Visible, ...] = (
    Visible("System programs and libraries", "`/usr`, `/bin`, `/sbin`, `/lib*`", "read-only"),
    Visible(
        "System settings",
        "`/etc`, without what is not world-readable (`shadow`, `gshadow`, `sudoers`, `ssl/private`, ...) "
        "and the listed secrets (ssh host keys, keytabs, VPN and Wi-Fi secrets, ...)",
        "read-only",
    ),
    Visible("Kernel views", "a fresh `/dev`, `/proc` (its own PID namespace), `/sys`", "read-only"),
    Visible("Temporary dirs", "`/tmp`, `/var/tmp`, `/run/user/<uid>`", "private, empty, writable"),
    Visible("Home", "`$HOME`", "private, empty, writable"),
    Visible(
        "The run's worktree",
        "the thread's worktree, read-only at `read-only`, `approval-required` and in plan mode (an "
        "in-place thread: its checkout, `.git` read-only)",
        "writable or read-only",
    ),
    Visible(
        "The project's git dir",
        "`<checkout>/.git` (a link's run: `.git/config` reduced to what git needs)",
        "read-only",
    ),
    Visible(
        "The coder CLI", "its install dir and interpreter, the files and dirs its config names", "read-only"
    ),
    Visible(
        "The coder CLI's state",
        "`~/.codex` or `CODEX_HOME`, `~/.claude` and `~/.claude.json`, `~/.gemini`, a provider's own `HOME`",
        "writable",
    ),
    Visible("Python and peerd", "the interpreter's prefixes, the `peerd` package", "read-only"),
    Visible("The run's scratch dir", "its token file and MCP settings", "read-only"),
    Visible("peerd's agent socket", "the one peerd surface a run can reach", "connect"),
    Visible("The owner's additions", "`PEERD_SANDBOX_READABLE` (paths separated by `:`)", "read-only"),
    Visible(
        "Everything else",
        "`/home`, `/root`, `/srv`, `/opt`, `/mnt`, `/media`, the rest of `/var` and `/run`, other checkouts, "
        "other runs' files, peerd's home and owner socket",
        "absent",
    ),
)


_FLAG = {
    "tmp": "--tmpfs",
    "hide": "--tmpfs",
    "read": "--ro-bind",
    "read?": "--ro-bind-try",
    "write": "--bind",
    "write?": "--bind-try",
    "swap": "--ro-bind",
    "swap?": "--ro-bind-try",
}


def _below_any(path: Path, tops: set[Path]) -> bool:
    """Whether `path` is one of `tops` or lies below one (`is_relative_to` for each, in the path's
    depth instead of the set's size: a profile has ~170 mounts)."""
    return path in tops or not tops.isdisjoint(path.parents)


def _parents(path: str) -> list[str]:
    """The directories above absolute `path`, "/" left out, the highest first: "/a/b/c" gives
    "/a", "/a/b" (`reversed(Path(path).parents[:-1])`, without making a Path of each)."""
    cut = [i for i, ch in enumerate(path) if ch == "/"][1:]
    return [path[:i] for i in cut]


def bwrap_args(conf: Confinement) -> list[str]:
    """bwrap's options for `conf` (pure: nothing is looked up or run)."""
    args = ["--dev", "/dev", "--proc", "/proc"]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--cap-drop", "ALL"]
    if conf.run_as is not None:  # only for the inner shim's drop to the run's uid, which clears them
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    if not conf.share_net:
        args.append("--unshare-net")
    mounts = conf.mounts()
    sources = {b.path: b.source for b in conf.binds if b.source is not None}
    # Kept as strings: paths are absolute and normal (`real`), and a profile has ~170 mounts.
    covered: set[str] = {"/dev", "/proc"}  # bound: what lies below exists as it is
    made: set[str] = set()
    for kind, path in mounts:
        if conf.run_as is not None:
            # bwrap makes a mount point's missing parents 0700 root, which the run's uid cannot
            # enter: make them 0755 first
            under = "/" in covered  # whether the parent, or one above it, is covered
            for parent in _parents(str(path)):
                under = under or parent in covered
                if not under and parent not in made:
                    args += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            if kind in ("tmp", "hide"):
                made.add(str(path))  # itself; what lies below it is still to make
            else:
                covered.add(str(path))
        if kind == "tmp" and conf.run_as is not None:
            args += ["--perms", "1777", "--tmpfs", str(path)]  # made by root, written by the run
        elif kind in ("tmp", "hide"):
            args += [_FLAG[kind], str(path)]
        else:
            args += [
                _FLAG[kind],
                str(sources.get(path, path) if kind.startswith("swap") else path),
                str(path),
            ]
    # The system's symlinks (`/bin -> usr/bin`), once the directories they lie in exist.
    for path, target in conf.symlinks:
        args += ["--symlink", target, str(path)]
    # Last, once every mount point below them exists: the empty root and each hidden path are
    # read-only (what is bound below them stays as bound), so a write outside the run's own
    # places fails instead of vanishing into the sandbox's memory.
    args += ["--remount-ro", "/"]
    for kind, path in mounts:
        if kind == "hide":
            args += ["--remount-ro", str(path)]
    return [*args, "--chdir", str(conf.cwd)]


def command(conf: Confinement, argv: list[str], *, bwrap: str, python: str = sys.executable) -> list[str]:
    """The full argv that runs `argv` confined by `conf` (see the module docstring for the shims)."""
    shim = [python, "-I", "-S", "-c"]
    if conf.run_as is not None:
        who = conf.run_as
        grants = [g.arg() for g in conf.grants()]
        outer = [python, "-I", "-S", str(RUNAS_SCRIPT), str(who.uid), *grants, "--"]
        inner = [*shim, _INNER_AS, str(who.uid), str(who.gid)]
        return [*outer, bwrap, *bwrap_args(conf), "--", *inner, *argv]
    return [*shim, _OUTER, bwrap, *bwrap_args(conf), "--", *shim, _INNER, *argv]


def clean_env(env: Mapping[str, str], conf: Confinement, *, inherited: Mapping[str, str]) -> dict[str, str]:
    """`env` without the dropped variables, and without any variable taken unchanged from
    `inherited` (the daemon's own environment) that names a private path."""
    names = [str(p) for p in conf.private]
    kept: dict[str, str] = {}
    for key, value in env.items():
        if key in DROPPED_ENV:
            continue
        if inherited.get(key) == value and any(name in value for name in names):
            continue
        kept[key] = value
    return kept


# --- is bwrap here and working --------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    ok: bool
    binary: str | None
    detail: str  # a sentence: what was found, or why it does not work


PROBE_ARGS = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-ipc"]
PROBE_ARGS += ["--unshare-uts", "--unshare-net", "--die-with-parent", "--cap-drop", "ALL", "--tmpfs", "/tmp"]  # noqa: S108


@functools.cache
def probe() -> Probe:
    """Whether bwrap is on PATH and can build peerd's sandbox here (run once, then cached)."""
    binary = shutil.which("bwrap")
    if binary is None:
        return Probe(False, None, f"bubblewrap (bwrap) is not on PATH: {INSTALL_HINT}.")
    try:
        done = subprocess.run(  # a fixed argv, no shell
            [binary, *PROBE_ARGS, "true"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, binary, f"{binary} could not be run: {exc}.")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
        return Probe(
            False,
            binary,
            f"{binary} cannot create a sandbox here ({why}); allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1, or the AppArmor bwrap profile) or run peerd "
            "where they are allowed.",
        )
    return Probe(True, binary, f"bubblewrap works ({binary}).")


def available() -> bool:
    """bwrap is on PATH and works here (cached)."""
    return probe().ok


# --- who is confined ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    confine: bool
    notice: str | None = None  # said in the run's items when not confined
    refusal: str | None = None  # the run must not start: why, and how to fix it


def decide(*, by_link: bool, runtime_mode: str, available: bool, allow_unconfined: bool) -> Decision:
    """Whether a run is confined, goes on unconfined (with a notice), or is refused."""
    if not by_link and runtime_mode == "full-access":
        return Decision(False)  # the owner's full-access run is the owner, by design
    if available:
        return Decision(True)
    missing = "peerd cannot confine this run here: bubblewrap (bwrap) is not available"
    if not by_link:
        return Decision(
            False,
            notice=f"{missing}, so it runs with the coder's own sandbox only. To confine it, {INSTALL_HINT}.",
        )
    if runtime_mode == "read-only":
        return Decision(
            False, notice=f"{missing}; this link's run is read-only and runs with the coder's own limits."
        )
    if allow_unconfined:
        return Decision(
            False,
            notice=f"{missing}; this link's run goes on unconfined because links.allow_unconfined = true.",
        )
    return Decision(
        False,
        refusal=(
            f"{missing}, and a linked machine's run above read-only runs only confined. On this machine, "
            f"{INSTALL_HINT}, or set `allow_unconfined = true` in the [links] table of config.toml to "
            "let such runs go on with the coder's own sandbox only."
        ),
    )


def wrap(conf: Confinement, argv: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run `argv` inside `conf`."""
    found = probe()
    if not found.ok or found.binary is None:
        raise ConfinementUnavailable(f"peerd cannot confine this run: {found.detail}")
    return command(conf, argv, bwrap=found.binary), clean_env(env, conf, inherited=os.environ)
