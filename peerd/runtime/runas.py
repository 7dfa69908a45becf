"""A confined run never runs as root: when peerd runs as root, the run gets an unprivileged uid.

Root without capabilities (bwrap's `--cap-drop ALL`) still owns every root-owned file, so it could
read a root-only (0600) file in a path the sandbox maps. So when peerd runs as root, a confined
run runs as `RunAs` (default `nobody`, 65534; `PEERD_SANDBOX_RUN_AS=uid:gid` picks another):

1. outside, as root, `runas_grant.py` runs as a script (`python -I -S runas_grant.py UID GRANTS --
   bwrap ...`, so the work happens in the child process, never on the daemon's event loop): it grants the run's
   uid access, with POSIX ACLs, to the run's own paths only (`grants`: its worktree, its coder's
   state dirs, its scratch dir, the agent socket), ignores SIGINT and SIGTERM (see `sandbox`) and
   executes bwrap as root, so bwrap can reach every path it binds;
2. bwrap keeps only CAP_SETUID and CAP_SETGID;
3. inside, the first thing the inner shim does is `setgroups([])`, `setresgid`, `setresuid`:
   leaving uid 0 clears every capability, and the run's own program starts as the unprivileged
   uid with none (the shim checks `CapEff` is zero, or refuses to go on).

The ACL entries themselves are `runas_grant.py`'s (re-exported here).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from peerd.runtime import runas_grant
from peerd.runtime.runas_grant import allows, decode, encode, from_mode, grant_one, wanted, with_user

__all__ = [
    "DROP",
    "Grant",
    "RunAs",
    "allows",
    "apply",
    "decide",
    "decide_here",
    "decode",
    "encode",
    "from_mode",
    "grant_one",
    "supports_acls",
    "wanted",
    "with_user",
]

RUN_AS_ENV = "PEERD_SANDBOX_RUN_AS"
NOBODY = 65534


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int


def decide(
    euid: int, env: Mapping[str, str], *, uid_map: str | None = None, gid_map: str | None = None
) -> RunAs | None:
    """Who a confined run runs as: `None` (peerd's own uid) unless peerd runs as root. Root in a
    user namespace that does not map the run's uid (a rootless container, `unshare -r`) is an
    ordinary user outside: it cannot hand a file to that uid, so the run keeps peerd's uid there.
    `uid_map` and `gid_map`: the text of /proc/self/uid_map and gid_map (None: not looked at)."""
    if euid != 0:
        return None
    value = env.get(RUN_AS_ENV, "")
    uid, _, gid = value.partition(":")
    who = (
        RunAs(int(uid), int(gid))
        if uid.isdigit() and gid.isdigit() and int(uid) != 0
        else RunAs(NOBODY, NOBODY)
    )
    if uid_map is not None and not mapped(uid_map, who.uid):
        return None
    if gid_map is not None and not mapped(gid_map, who.gid):
        return None
    return who


def mapped(id_map: str, inside: int) -> bool:
    """Whether `inside` is an id of this user namespace (a line of uid_map: inside, outside, count)."""
    for line in id_map.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            first, _, count = (int(p) for p in parts)
            if first <= inside < first + count:
                return True
    return False


def decide_here(env: Mapping[str, str]) -> RunAs | None:
    """`decide` for this process."""
    maps: list[str | None] = []
    for name in ("uid_map", "gid_map"):
        try:
            maps.append(Path(f"/proc/self/{name}").read_text(encoding="ascii"))
        except OSError:
            maps.append(None)
    return decide(os.geteuid(), env, uid_map=maps[0], gid_map=maps[1])


def supports_acls(path: Path, who: RunAs, *, write: bool) -> bool:
    """Whether the filesystem of `path` takes the run's ACL entry: it is granted there (the top
    only; the rest when the run starts). False where the filesystem has no POSIX ACLs."""
    try:
        grant_one(str(path), who.uid, write)
    except OSError as exc:
        # no ACLs (ENOTSUP), or an id this namespace cannot name (EINVAL); anything else (a
        # worktree not there) the run meets as it would anyway
        return exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM)
    return True


@dataclass(frozen=True)
class Grant:
    """Access the run's uid gets to `path` (and, when `recursive`, to what lies below it)."""

    path: Path
    write: bool
    recursive: bool

    def arg(self) -> str:
        """This grant as `runas_grant.py` takes it: one argument."""
        return runas_grant.grant_arg(str(self.path), self.write, self.recursive)

    @classmethod
    def from_arg(cls, arg: str) -> Grant:
        path, write, recursive = runas_grant.parse_grant(arg)
        return cls(Path(path), write, recursive)


def apply(grants: Iterable[Grant], uid: int) -> list[str]:
    """`runas_grant.apply` for `Grant`s: what cannot be granted is returned."""
    return runas_grant.apply([(str(g.path), g.write, g.recursive) for g in grants], uid)


# --- the inner drop -------------------------------------------------------------------------------

# The inner shim's first lines when the run has a uid of its own (bwrap left it CAP_SETUID and
# CAP_SETGID only): drop to it, and refuse to go on with any capability left.
DROP = (
    "u,g=int(sys.argv[1]),int(sys.argv[2]);del sys.argv[1:3];os.setgroups([]);"
    "os.setresgid(g,g,g);os.setresuid(u,u,u)\n"
    "if os.getuid()!=u or [l for l in open('/proc/self/status') if l.startswith('CapEff:') and "
    "int(l.split()[1],16)]: sys.exit('peerd: the run could not drop its privileges')\n"
)
