"""A confined run never runs as root: when peerd runs as root, the run gets an unprivileged uid.

Root without capabilities (bwrap's `--cap-drop ALL`) still owns every root-owned file, so it could
read a root-only (0600) file in a path the sandbox maps. So when peerd runs as root, a confined
run runs as `RunAs` (default `nobody`, 65534; `PEERD_SANDBOX_RUN_AS=uid:gid` picks another):

1. outside, as root, this module runs as a script (`python -I -S runas.py GRANTS -- bwrap ...`, so
   the work happens in the child process, never on the daemon's event loop): it grants the run's
   uid access, with POSIX ACLs, to the run's own paths only (`grants`: its worktree, its coder's
   state dirs, its scratch dir, the agent socket), ignores SIGINT and SIGTERM (see `sandbox`) and
   executes bwrap as root, so bwrap can reach every path it binds;
2. bwrap keeps only CAP_SETUID and CAP_SETGID;
3. inside, the first thing the inner shim does is `setgroups([])`, `setresgid`, `setresuid`:
   leaving uid 0 clears every capability, and the run's own program starts as the unprivileged
   uid with none (the shim checks `CapEff` is zero, or refuses to go on).

An ACL entry (`user:<uid>:rwx`) is added beside the file's owner, group and other bits, which stay
as they were (`ls -l` shows the ACL's mask in the group bits and a `+`). Directories also get it as a
default entry, so what root's git writes there later is reachable too. Symlinks are not followed.

This file uses the standard library only (it runs under `python -I -S`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_AS_ENV = "PEERD_SANDBOX_RUN_AS"
NOBODY = 65534

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
R, W, X = 4, 2, 1


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

    def wire(self) -> list[object]:
        return [str(self.path), self.write, self.recursive]

    @classmethod
    def from_wire(cls, raw: Sequence[object]) -> Grant:
        return cls(Path(str(raw[0])), bool(raw[1]), bool(raw[2]))


# --- ACL entries: pure ----------------------------------------------------------------------------

Entry = tuple[int, int, int]  # (tag, perm, id)


def encode(entries: Iterable[Entry]) -> bytes:
    ordered = sorted(entries, key=lambda e: (e[0], e[2]))
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *e) for e in ordered)


def decode(blob: bytes) -> list[Entry]:
    if len(blob) < 4 or struct.unpack_from("<I", blob)[0] != _VERSION or (len(blob) - 4) % 8:
        raise ValueError("not a POSIX ACL")
    return [struct.unpack_from("<HHI", blob, at) for at in range(4, len(blob), 8)]


def from_mode(mode: int) -> list[Entry]:
    """The minimal ACL a file's permission bits stand for."""
    return [
        (_USER_OBJ, (mode >> 6) & 7, _UNDEFINED),
        (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED),
        (_OTHER, mode & 7, _UNDEFINED),
    ]


def with_user(entries: Iterable[Entry], uid: int, perm: int) -> list[Entry]:
    """`entries` with `user:<uid>` given at least `perm`, and the mask widened to let it through
    (the mask is the union of the group class: named users, the owning group, named groups)."""
    kept = [e for e in entries if e[0] != _MASK]
    found = [e for e in kept if e[0] == _USER and e[2] == uid]
    kept = [e for e in kept if not (e[0] == _USER and e[2] == uid)]
    kept.append((_USER, perm | (found[0][1] if found else 0), uid))
    mask = 0
    for tag, bits, _ in kept:
        if tag in (_USER, _GROUP_OBJ, _GROUP):
            mask |= bits
    kept.append((_MASK, mask, _UNDEFINED))
    return sorted(kept, key=lambda e: (e[0], e[2]))


def allows(entries: Iterable[Entry], uid: int, perm: int) -> bool:
    """Whether `user:<uid>` already has `perm` through the mask."""
    listed = list(entries)
    mask = next((e[1] for e in listed if e[0] == _MASK), 7)
    return any(t == _USER and i == uid and (b & mask & perm) == perm for t, b, i in listed)


def wanted(st: os.stat_result, write: bool) -> int:
    """What the run's uid needs of a file: read (and write); search for directories and exec for
    files that someone may execute."""
    perm = R | (W if write else 0)
    if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111:
        perm |= X
    return perm


# --- applying them --------------------------------------------------------------------------------


def _entries(path: str, name: str, st: os.stat_result | None) -> list[Entry] | None:
    try:
        return decode(os.getxattr(path, name, follow_symlinks=False))
    except OSError:
        return None if st is None else from_mode(st.st_mode)


def grant_one(path: str, uid: int, write: bool) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
        return  # a symlink has no ACL of its own; what the run made is already its own
    if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
        return  # a file that also lives elsewhere (a hard link) is not handed out from here
    perm = wanted(st, write)
    current = _entries(path, ACCESS, st)
    if current is None or not allows(current, uid, perm):
        os.setxattr(path, ACCESS, encode(with_user(current or [], uid, perm)), follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        default = _entries(path, DEFAULT, None) or from_mode(st.st_mode)
        if not allows(default, uid, perm):
            os.setxattr(path, DEFAULT, encode(with_user(default, uid, perm)), follow_symlinks=False)


def apply(grants: Iterable[Grant], uid: int) -> list[str]:
    """Grant `uid` what `grants` say; what cannot be granted is returned (said, never fatal: the
    run then meets the file's own permissions)."""
    failed: list[str] = []
    for item in grants:
        top = item.path
        if not (top.exists() or top.is_symlink()):
            continue
        todo = [str(top)]
        if item.recursive and top.is_dir() and not top.is_symlink():
            for root, dirs, files in os.walk(top):
                todo += [f"{root}/{name}" for name in (*dirs, *files)]
        for path in todo:
            try:
                grant_one(path, uid, item.write)
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror}")
    return failed


# --- the inner drop -------------------------------------------------------------------------------

# The inner shim's first lines when the run has a uid of its own (bwrap left it CAP_SETUID and
# CAP_SETGID only): drop to it, and refuse to go on with any capability left.
DROP = (
    "u,g=int(sys.argv[1]),int(sys.argv[2]);del sys.argv[1:3];os.setgroups([]);"
    "os.setresgid(g,g,g);os.setresuid(u,u,u)\n"
    "if os.getuid()!=u or [l for l in open('/proc/self/status') if l.startswith('CapEff:') and "
    "int(l.split()[1],16)]: sys.exit('peerd: the run could not drop its privileges')\n"
)


def main(argv: list[str]) -> None:
    """`runas.py UID GRANTS_JSON -- BWRAP ARGS...`: grant, then execute bwrap (as root)."""
    import signal  # noqa: PLC0415  # only the script needs it

    uid, grants_json, sep, *rest = argv
    if sep != "--" or not rest:
        sys.exit("usage: runas.py UID GRANTS_JSON -- COMMAND...")
    failed = apply((Grant.from_wire(g) for g in json.loads(grants_json)), int(uid))
    for line in failed[:5]:  # the run's stderr tail: what it may then fail on
        sys.stderr.write(f"peerd: could not give the run access to {line}\n")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    os.execvp(rest[0], rest)  # noqa: S606  # an argument list peerd built, no shell


if __name__ == "__main__":
    main(sys.argv[1:])
