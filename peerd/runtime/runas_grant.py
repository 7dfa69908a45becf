"""The outside half of a run with a uid of its own (`runas`): grant, then execute bwrap as root.

`python -I -S runas_grant.py UID GRANT... -- BWRAP ARGS...` runs once per confined run, before
bwrap: it grants the run's uid access to the run's own paths with POSIX ACLs, ignores SIGINT and
SIGTERM (see `sandbox`) and executes bwrap. It is its own file, with the standard library's
lightest modules only, because every run pays its start-up: the whole of `runas` (dataclasses,
pathlib, json) took 87 ms a run here against 22 ms for the bare interpreter.

An ACL entry (`user:<uid>:rwx`) is added beside the file's owner, group and other bits, which stay
as they were (`ls -l` shows the ACL's mask in the group bits and a `+`). Directories also get it as a
default entry, so what root's git writes there later is reachable too. Symlinks are not followed.
"""

from __future__ import annotations

import os
import stat
import struct
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this start-up is per run)
if TYPE_CHECKING:
    from collections.abc import Iterable

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
R, W, X = 4, 2, 1


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


def apply(grants: Iterable[tuple[str, bool, bool]], uid: int) -> list[str]:
    """Grant `uid` what `grants` say (path, write, recursive); what cannot be granted is returned
    (said, never fatal: the run then meets the file's own permissions)."""
    failed: list[str] = []
    for top, write, recursive in grants:
        if not os.path.lexists(top):
            continue
        todo = [top]
        # os.path, not pathlib: this script's start-up is paid by every run (see above)
        if recursive and os.path.isdir(top) and not os.path.islink(top):  # noqa: PTH112, PTH114
            for root, dirs, files in os.walk(top):
                todo += [f"{root}/{name}" for name in (*dirs, *files)]
        for path in todo:
            try:
                grant_one(path, uid, write)
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror}")
    return failed


def grant_arg(path: str, write: bool, recursive: bool) -> str:
    """One grant as one argument: two flags, then the path (absolute: never "--")."""
    return f"{int(write)}{int(recursive)}{path}"


def parse_grant(arg: str) -> tuple[str, bool, bool]:
    if len(arg) < 3 or arg[0] not in "01" or arg[1] not in "01" or arg[2] != "/":
        raise ValueError(f"not a grant: {arg!r}")
    return arg[2:], arg[0] == "1", arg[1] == "1"


def main(argv: list[str]) -> None:
    """`runas_grant.py UID GRANT... -- BWRAP ARGS...`: grant, then execute bwrap (as root). Each
    GRANT is `grant_arg`'s (no json: its decoder alone imports re and enum, 20 ms a run)."""
    import signal  # noqa: PLC0415  # only the script needs it

    if "--" not in argv or len(argv) < 3:
        sys.exit("usage: runas_grant.py UID GRANT... -- COMMAND...")
    cut = argv.index("--")
    uid, grants, rest = argv[0], argv[1:cut], argv[cut + 1 :]
    if not rest:
        sys.exit("usage: runas_grant.py UID GRANT... -- COMMAND...")
    failed = apply([parse_grant(g) for g in grants], int(uid))
    for line in failed[:5]:  # the run's stderr tail: what it may then fail on
        sys.stderr.write(f"peerd: could not give the run access to {line}\n")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    os.execvp(rest[0], rest)  # noqa: S606  # an argument list peerd built, no shell


if __name__ == "__main__":
    main(sys.argv[1:])
