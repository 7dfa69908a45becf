"""peerd's own confinement of the runs it starts: a bubblewrap (`bwrap`) profile, and who gets it.

Who is confined (`decide`): every run except an owner-started run at `full-access` (the owner's
full-access run is the owner, by design). A link's `full-access` run is confined too. When bwrap is
missing or does not work here, the owner's runs go on with only the coder CLI's own sandbox, and a
link's run above `read-only` is refused at start (`ConfinementUnavailable`) unless the box owner set
`links.allow_unconfined = true` in config.toml. The outcome is a `notice` item of the run.

What a confined run sees (`Confinement`, turned into bwrap arguments by `bwrap_args`):

- the whole filesystem read-only (`--ro-bind / /`; a link's full-access run gets it writable), a
  fresh `/dev`, and a fresh `/proc` in its own PID namespace (so `/proc/<daemon pid>/root` cannot
  reach the unconfined filesystem), its own IPC and UTS namespaces, no capabilities (also when
  peerd runs as root), and it dies with peerd;
- private, empty `/tmp`, `/var/tmp` and `/run/user/<uid>` (hiding the ssh-agent, D-Bus and other
  sockets kept there);
- hidden (an empty tmpfs over each): peerd's home (database, keys, tokens, other runs' files), the
  owner socket's directory when it lies outside the home, every registered project's checkout,
  and for a run a link started also the box user's `$HOME`;
- visible again, the more specific path winning: read-only the Python installation and the `peerd`
  package (for `python -m peerd mcp` and the scripted agent), the coder CLI's install directory,
  the project's git dir (so `git status` and `git diff` work; commits, config and hook writes do
  not), and the run's scratch dir (its token file and MCP config); writable the run's worktree
  (read-only at `read-only`, `approval-required` and in plan mode; for Codex also at
  `auto-accept-edits`, as its own mapping), the CLI's own state dirs (`~/.codex` or `CODEX_HOME`,
  `~/.claude` and `~/.claude.json`, `~/.gemini`, or the whole `HOME` a provider's `env` sets), and
  peerd's agent socket, the one peerd surface a run can reach. An in-place thread's checkout is
  its worktree: writable, with its `.git` read-only.
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

from peerd.errors import ConfinementUnavailable

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


@dataclass(frozen=True)
class Mount:
    """A path made visible again inside the sandbox (the same path as outside, or `source` shown
    at `path`)."""

    path: Path
    writable: bool = False
    optional: bool = False  # bound only when it exists (`--bind-try`)
    source: Path | None = None  # what is shown at `path`, when not `path` itself


@dataclass(frozen=True)
class Confinement:
    """What one run may see and write. Paths are absolute and real (symlinks resolved)."""

    cwd: Path
    worktree: Path
    worktree_writable: bool
    git_dir: Path | None = None
    tmp: tuple[Path, ...] = ()  # private, empty, writable (/tmp, /var/tmp, /run/user/<uid>)
    hidden: tuple[Path, ...] = ()  # empty and read-only
    binds: tuple[Mount, ...] = ()
    # Paths whose names are dropped from the inherited environment (peerd's home, owner socket).
    private: tuple[Path, ...] = ()
    by_link: bool = False
    root_writable: bool = False  # a link's full-access run: all writable but the hidden paths
    share_net: bool = False

    def plus(self, *binds: Mount, share_net: bool | None = None) -> Confinement:
        net = self.share_net if share_net is None else share_net
        return dataclasses.replace(self, binds=self.binds + binds, share_net=net)

    def mounts(self) -> list[tuple[str, Path]]:
        """(kind, path) in the order bwrap applies them: a parent before what lies below it, so
        the more specific path wins; on the same path a bind beats a hide and read-only beats
        writable."""
        wanted: list[tuple[str, Path]] = [("tmp", p) for p in self.tmp]
        wanted += [("hide", p) for p in self.hidden]
        for bind in self.binds:
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
        hidden = "peerd's home and sockets and the registered checkouts"
        if self.by_link:
            hidden = "peerd's home and sockets, the registered checkouts and the box user's home"
        root = "writable" if self.root_writable else "read-only"
        tree = "writable" if self.worktree_writable else "read-only"
        return (
            f"peerd confines this run (bubblewrap): the filesystem is {root}, {hidden} are hidden, "
            f"the worktree is {tree}, the project's git dir is read-only, and peerd's agent tools are "
            "reachable only through the agent socket."
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


def bwrap_args(conf: Confinement) -> list[str]:
    """bwrap's options for `conf` (pure: nothing is looked up or run)."""
    args = ["--bind" if conf.root_writable else "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--cap-drop", "ALL"]
    if not conf.share_net:
        args.append("--unshare-net")
    mounts = conf.mounts()
    sources = {b.path: b.source for b in conf.binds if b.source is not None}
    for kind, path in mounts:
        if kind in ("tmp", "hide"):
            args += [_FLAG[kind], str(path)]
        else:
            args += [
                _FLAG[kind],
                str(sources.get(path, path) if kind.startswith("swap") else path),
                str(path),
            ]
    # Last, once every mount point below them exists: a hidden path is empty and read-only (what is
    # bound below it stays as bound).
    for kind, path in mounts:
        if kind == "hide":
            args += ["--remount-ro", str(path)]
    return [*args, "--chdir", str(conf.cwd)]


def command(conf: Confinement, argv: list[str], *, bwrap: str, python: str = sys.executable) -> list[str]:
    """The full argv that runs `argv` confined by `conf` (see the module docstring for the shims)."""
    shim = [python, "-I", "-S", "-c"]
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
