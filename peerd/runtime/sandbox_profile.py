"""Building a run's sandbox profile (`peerd.runtime.sandbox.Confinement`) from where things are.

The runner calls `profile` with peerd's home, sockets, the registered checkouts and the thread's
worktree; a provider then adds its CLI's own directories (`install_dirs`, its state dirs). These
functions look at the filesystem (what exists, where a binary really lives); turning the profile
into bwrap's arguments is pure and lives in `sandbox`.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import site
import stat
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import peerd
from peerd.runtime import runas
from peerd.runtime.sandbox import Confinement, Mount


def private_tmp_dirs(uid: int | None = None) -> list[Path]:
    uid = os.getuid() if uid is None else uid
    candidates = (Path("/tmp"), Path("/var/tmp"), Path(f"/run/user/{uid}"))  # noqa: S108  # hidden, not used
    return [p for p in candidates if p.is_dir()]


# --- the system: what every confined run sees of this machine, read-only -------------------------

# Programs, libraries and kernel views a toolchain needs. `/etc` is added entry by entry
# (`etc_plan`); everything else (/home, /root, /srv, /opt, /mnt, /media, /var, /run, ...) is absent.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")

# Below /etc, never shown even when world-readable (fnmatch patterns, relative to /etc). What is not
# world-readable (shadow, gshadow, sudoers, ssl/private, ...) is never shown either.
ETC_DENIED = (
    "shadow*",
    "gshadow*",
    ".pwd.lock",
    "sudoers",
    "sudoers.d",
    "security/opasswd",
    "ssh/ssh_host_*",
    "ssl/private",
    "pki/*/private",
    "krb5.keytab",
    "*.keytab",
    "ipsec.secrets",
    "ipsec.d",
    "wireguard",
    "openvpn",
    "NetworkManager/system-connections",
    "wpa_supplicant",
    "ppp/*secrets",
    "credstore",
    "credstore.encrypted",
    "letsencrypt",
    "mysql/debian.cnf",
    "postfix/sasl*",
    "exim4/passwd*",
    "docker/key.json",
    "libvirt/secrets",
    "peerd",
)
ETC_PLAN_TTL_S = 10.0
KERNEL_VIEWS = (Path("/proc"), Path("/dev"), Path("/sys"))  # made fresh in the sandbox


@dataclass(frozen=True)
class EtcPlan:
    """What of `/etc` a run sees: directories and files bound read-only, symlinks kept, and the
    world-readable files outside the system that a kept symlink points to (`/etc/resolv.conf` ->
    `/run/systemd/resolve/stub-resolv.conf`)."""

    binds: tuple[Path, ...]
    symlinks: tuple[tuple[Path, str], ...]
    denied: tuple[Path, ...]  # what exists and is left out (said by `peerd doctor`)


def _world_readable(st: os.stat_result) -> bool:
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & (stat.S_IROTH | stat.S_IXOTH) == (stat.S_IROTH | stat.S_IXOTH)
    return bool(st.st_mode & stat.S_IROTH) and stat.S_ISREG(st.st_mode)


def etc_plan(root: Path = Path("/etc"), denied: Iterable[str] = ETC_DENIED) -> EtcPlan:
    """`root` filtered: a directory with nothing denied below it is bound whole, one with something
    denied is entered and its entries decided one by one; a denied entry (a pattern of `denied`,
    not world-readable, or not a regular file, directory or symlink) is left out."""
    # one regex for all the patterns (fnmatchcase's own translation): /etc is walked every
    # `ETC_PLAN_TTL_S`, ~1,200 entries here
    matches = re.compile("|".join(fnmatch.translate(pat) for pat in denied) or "(?!)").match
    skip = len(str(root)) + 1  # an entry's path relative to root, as a string

    binds: list[Path] = []
    links: list[tuple[Path, str]] = []
    left_out: list[Path] = []

    def is_denied(entry: os.DirEntry[str], st: os.stat_result) -> bool:
        if matches(entry.path[skip:]):
            return True
        return not stat.S_ISLNK(st.st_mode) and not _world_readable(st)

    def clean(path: str) -> bool:
        """Nothing below `path` (a directory) is denied."""
        try:
            entries = list(os.scandir(path))
        except OSError:
            return False
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                return False
            if is_denied(entry, st) or (stat.S_ISDIR(st.st_mode) and not clean(entry.path)):
                return False
        return True

    def visit(path: Path) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            child = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if is_denied(entry, st):
                left_out.append(child)
            elif stat.S_ISLNK(st.st_mode):
                links.append((child, str(child.readlink())))
            elif stat.S_ISDIR(st.st_mode):
                if clean(entry.path):
                    binds.append(child)
                else:
                    visit(child)
            else:
                binds.append(child)

    visit(root)
    return EtcPlan(tuple(binds), tuple(links), tuple(left_out))


def _link_targets(links: Iterable[tuple[Path, str]], shown: Iterable[Path]) -> list[Path]:
    """World-readable regular files that kept symlinks point to outside what is shown."""
    visible = tuple(shown)
    found: list[Path] = []
    for path, _ in links:
        target = real(path)
        if any(target.is_relative_to(v) for v in (*visible, *KERNEL_VIEWS)):
            continue
        try:
            st = target.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and _world_readable(st) and not target.is_relative_to("/etc"):
            found.append(target)
    return found


@dataclass(frozen=True)
class System:
    mounts: tuple[Mount, ...]
    symlinks: tuple[tuple[Path, str], ...]
    etc_denied: tuple[Path, ...]


_system_lock = threading.Lock()
_system_cache: tuple[float, System] | None = None


def system_mounts(*, now: float | None = None) -> System:
    """The system part of every run's profile (cached for `ETC_PLAN_TTL_S`: walking /etc takes
    5-15 ms). One walk at a time: runs that start together while it is stale wait for the one
    walk instead of each making its own."""
    with _system_lock:
        return _system_mounts(time.monotonic() if now is None else now)


def _system_mounts(at: float) -> System:
    global _system_cache  # noqa: PLW0603  # one small cache per process
    if _system_cache is not None and at - _system_cache[0] < ETC_PLAN_TTL_S:
        return _system_cache[1]
    mounts: list[Mount] = []
    links: list[tuple[Path, str]] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            links.append((path, str(path.readlink())))
        elif path.is_dir():
            mounts.append(Mount(path, optional=True))
    etc = etc_plan()
    mounts += [Mount(p, optional=True) for p in etc.binds]
    links += etc.symlinks
    shown = [m.path for m in mounts]
    mounts += [Mount(p, optional=True) for p in _link_targets(etc.symlinks, shown)]
    found = System(tuple(mounts), tuple(links), etc.denied)
    _system_cache = (at, found)
    return found


def real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def python_dirs() -> list[Path]:
    """What `python -m peerd ...` needs: the interpreter's prefixes, the user's site-packages when
    Python uses it (`pip install --user`), and the peerd package."""
    dirs = {real(sys.prefix), real(sys.base_prefix), real(Path(peerd.__file__).parent)}
    user_site = site.getusersitepackages()
    if user_site in sys.path and Path(user_site).is_dir():
        dirs.add(real(user_site))
    return sorted(dirs)


READABLE_ENV = "PEERD_SANDBOX_READABLE"


def extra_readable(env: Mapping[str, str] | None = None) -> list[Path]:
    """Directories the daemon's owner makes visible (read-only) in every sandbox, e.g. tools kept
    in /tmp: `PEERD_SANDBOX_READABLE`, absolute paths separated by `:`, in the daemon's own
    environment (what peerd's home, sockets and the checkouts hide stays hidden)."""
    value = (os.environ if env is None else env).get(READABLE_ENV, "")
    return [real(part) for part in value.split(":") if part.startswith("/")]


def git_dir_of(checkout: Path) -> Path | None:
    """The repository's own git dir (shared by its worktrees), read without running git."""
    dot = checkout / ".git"
    if dot.is_dir():
        return real(dot)
    try:
        text = dot.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = (checkout / text.removeprefix("gitdir:").strip()).resolve()
    try:
        common = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except OSError:
        return gitdir
    return (gitdir / common).resolve()


# What a link's run sees of the repository's `.git/config`: the settings git needs to read the
# repository, nothing else (remote URLs may carry credentials; helpers and aliases are the owner's).
SAFE_GIT_CONFIG: dict[str, frozenset[str] | None] = {
    "core": frozenset(
        {
            "repositoryformatversion",
            "bare",
            "filemode",
            "symlinks",
            "ignorecase",
            "precomposeunicode",
            "logallrefupdates",
            "autocrlf",
            "eol",
            "safecrlf",
            "checkstat",
            "trustctime",
        }
    ),
    "extensions": None,  # all of them: how the repository is stored (objectformat, refstorage, ...)
}


def sanitized_git_config(text: str) -> str:
    """`text` (a git config file) reduced to `SAFE_GIT_CONFIG`: sections with subsections
    (`[remote "origin"]`), includes and every other key are dropped. A line that cannot be read is
    dropped too; git then uses its defaults."""
    kept: list[str] = []
    section: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            name = line[1 : line.find("]")].strip().lower() if "]" in line else ""
            section = name if name in SAFE_GIT_CONFIG and " " not in name and "." not in name else None
            if section is not None:
                kept.append(f"[{section}]")
            continue
        if section is None:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip().lower(), value.strip()
        allowed = SAFE_GIT_CONFIG[section]
        if (
            (allowed is None or key in allowed)
            and key.replace("-", "").isalnum()
            and not value.endswith("\\")
        ):
            kept.append(f"\t{key} = {value}" if value else f"\t{key}")
    return "\n".join(kept) + "\n"


def git_config_swap(git_dir: Path, scratch: Path) -> Mount | None:
    """A sanitized copy of the repository's config, written into the run's scratch dir (0600), to
    be shown at `<git dir>/config` inside a link's sandbox."""
    try:
        text = (git_dir / "config").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    copy = scratch / "git-config"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(sanitized_git_config(text))
    return Mount(git_dir / "config", source=copy)


def trust_config(scratch: Path) -> Path:
    """A git config (in the run's scratch dir) that trusts every repository: given to a run with a
    uid of its own as its `~/.gitconfig`, where git would refuse peerd's worktree as root's."""
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = scratch / "gitconfig"
    path.write_text("[safe]\n\tdirectory = *\n", encoding="utf-8")
    path.chmod(0o644)
    return path


def install_dirs(binary: str, env: Mapping[str, str]) -> list[Path]:
    """Where an installed CLI lives, as far as running it needs: an npm package's whole
    `node_modules` tree, else the binary's directory (a `bin/` with a `lib/` beside it: its
    prefix); and the same for the interpreter its `#!` line names."""
    found: list[Path] = []
    for path in (binary, _interpreter(binary, env)):
        if path is None:
            continue
        resolved = real(path)
        named = Path(path).parent.absolute()
        if named == real(named):  # a directory reached through a symlink is bound as its target
            found.append(named)
        parts = resolved.parts
        if "node_modules" in parts:
            found.append(Path(*parts[: parts.index("node_modules") + 1]))
            continue
        parent = resolved.parent
        home = real(Path.home())
        if (
            parent.name == "bin"
            and (parent.parent / "lib").is_dir()
            and parent.parent not in (home, home / ".local")
        ):
            parent = parent.parent
        found.append(parent)
    return sorted({p for p in found if p.is_dir() and p != Path("/")})


def _interpreter(binary: str, env: Mapping[str, str]) -> str | None:
    try:
        with open(binary, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(names[0], path=env.get("PATH")) if names else None
    return words[0]


def existing(paths: Iterable[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(p for p in paths if p.exists()))


def writes_worktree(runtime_mode: str, interaction_mode: str) -> bool:
    """Whether a confined run may write its worktree: from auto-accept-edits up, never in plan."""
    return interaction_mode != "plan" and runtime_mode in ("auto-accept-edits", "auto", "full-access")


def profile(
    *,
    home: Path,
    owner_socket: Path,
    agent_socket: Path | None,
    checkouts: Iterable[Path],
    checkout: Path,
    worktree: Path,
    scratch: Path,
    by_link: bool,
    runtime_mode: str,
    interaction_mode: str,
    user_home: Path | None = None,
) -> Confinement:
    """A run's base profile, before its provider adds the CLI's own directories and network. Deny
    by default: the system (read-only), the run's own paths, private tmp dirs and a private home."""
    home, owner_socket = real(home), real(owner_socket)
    hidden = [home, *(real(p) for p in checkouts)]
    if owner_socket.parent != home:
        hidden.append(owner_socket.parent)
    user = real(user_home or Path.home())
    system = system_mounts()
    binds = [Mount(p) for p in python_dirs()]
    # the owner's additions, never inside what is hidden (a deeper bind would beat the hide)
    hidden_real = [h for h in existing(hidden) if h != Path("/")]
    binds += [
        Mount(p, optional=True) for p in extra_readable() if not any(p.is_relative_to(h) for h in hidden_real)
    ]
    binds.append(Mount(real(scratch), optional=True, own=True))
    run_as = runas.decide_here(os.environ)
    note = None
    writable = writes_worktree(runtime_mode, interaction_mode)
    if run_as is not None and not runas.supports_acls(real(worktree), run_as, write=writable):
        run_as = None  # the run's uid could not be given its worktree: it keeps peerd's, as before
        note = (
            "It runs as root without capabilities: the filesystem of its worktree has no POSIX ACLs, "
            "so peerd cannot give an unprivileged uid access to it."
        )
    if run_as is not None and user != Path("/"):
        # git refuses a repository another uid owns ("dubious ownership"): the run's own git, as
        # its uid, trusts the worktree and git dir peerd shows it (a global config in its home)
        binds.append(Mount(user / ".gitconfig", source=trust_config(real(scratch))))
    if agent_socket is not None and real(agent_socket) != owner_socket:
        binds.append(Mount(real(agent_socket), writable=True, optional=True))
    worktree = real(worktree)
    git_dir = git_dir_of(real(checkout))
    if by_link and git_dir is not None and (swap := git_config_swap(git_dir, real(scratch))) is not None:
        binds.append(swap)
    return Confinement(
        cwd=worktree,
        worktree=worktree,
        worktree_writable=writes_worktree(runtime_mode, interaction_mode),
        worktree_asks=runtime_mode == "approval-required" and interaction_mode != "plan",
        git_dir=git_dir,
        tmp=tuple(dict.fromkeys([*private_tmp_dirs(), *([user] if user != Path("/") else [])])),
        hidden=(never := tuple(p for p in existing(hidden) if p != Path("/"))),
        # what a provider's config names there is not mapped (providers/reach.py); for a link's
        # run the box user's home too, a private tmpfs here but never the owner's to show
        guarded=(*never, *([user] if by_link and user != Path("/") else [])),
        binds=tuple(binds),
        private=tuple(dict.fromkeys((home, owner_socket.parent))),
        by_link=by_link,
        system=system.mounts,
        symlinks=system.symlinks,
        run_as=run_as,
        note=note,
    )
