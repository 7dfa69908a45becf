"""A provider's own files are part of its run: mapped into peerd's sandbox, and checked there first.

What a coder CLI needs besides its worktree: its binary (the install dir), the files and
directories its config.toml entry names (in `command`, `args` and `env` values: a bare `/x`,
`--flag=/x`, `key=/x`, `-c key="/x"`, `PATH`-like lists, inline tables), its state dirs (HOME,
`CODEX_HOME`, `~/.claude`, ...: writable) and the private files peerd writes for the run (the scratch
dir). `peerd.providers.cli.confine` maps each into the run's sandbox wherever it lives, /tmp and
/var/tmp included (read-only unless it is the CLI's state); before the CLI starts, `check` proves each
is reachable there, and a run where one is not fails at once with one sentence naming the path, the
setting that named it and the fix (`ProviderPathUnreachable`), never with the CLI's own "No such file
or directory".

A path peerd hides on purpose (`Confinement.guarded`: peerd's home and sockets, the registered
checkouts, for a linked machine's run the box user's home) is never mapped because a config names
it: that is reported instead. The CLI's own files (its binary and state dirs, e.g. `~/.codex`) may
lie below the box user's home, as they always could.

A path reached through a symlink the sandbox does not show (one below /tmp, say) is mapped at the
place the config names, from what the symlink leads to; it must not lead to a guarded path, nor to
a directory holding one (that would show it under another name).

Pure: `named_paths`, `reaches`, `mount_for`, `problem`, `check`. `route` and `needs` look at the
filesystem (what exists, where symlinks lead).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from peerd.config import ProviderConfig
from peerd.runtime import sandbox_profile
from peerd.runtime.sandbox import DROPPED_ENV, Confinement, Mount, Sight

# An absolute path inside a setting's value: at its start or after a separator (`=`, `:`, a quote,
# a comma, a bracket, a space), up to the next; `//` (a URL's authority) is not one.
_PATH = re.compile(r"(?:^|(?<=[\s=,;:\"'(\[{]))(/(?!/)[^\s\"',;:=()\[\]{}]*)")
_MAX_SYMLINKS = 40  # as the kernel's limit


@dataclass(frozen=True)
class Need:
    """One path the CLI must reach inside its sandbox."""

    path: Path  # as named (absolute, normalized)
    setting: str  # what named it, for the sentence: `providers.codex.args`
    writable: bool = False
    own: bool = False  # the CLI's own file (binary, state dir): may lie below the box user's home
    # An entry of a search path (`PATH`, `NODE_PATH`, ...): mapped when it may be, never reported (a
    # search skips a directory that is not there).
    search: bool = False
    real: Path | None = None  # where `path` leads, symlinks resolved (None: `path` itself)
    # Each symlink on the way (where it lies, parents resolved) with `path` continued from it: the
    # place the CLI reaches when the sandbox does not show that symlink.
    hops: tuple[tuple[Path, Path], ...] = ()

    @property
    def target(self) -> Path:
        return self.real or self.path


@dataclass(frozen=True)
class Reach:
    """What `check` needs: the paths, whose provider, and the box user's home when it is guarded."""

    provider: str
    needs: tuple[Need, ...]
    user_home: Path | None = None  # a linked machine's run: the box user's home (hidden from it)


# --- pure -----------------------------------------------------------------------------------------


def named_paths(config: ProviderConfig, name: str) -> list[tuple[str, Path]]:
    """(setting, path) for each absolute path a provider's config entry names in `command`, `args`
    and `env` values, in order, each path once. Whether it exists is for the caller."""
    found: dict[Path, str] = {}

    def scan(setting: str, text: str) -> None:
        for match in _PATH.finditer(text):
            path = Path(os.path.normpath(match.group(1)))
            if path != Path("/"):
                found.setdefault(path, setting)

    if config.command:
        try:
            words = shlex.split(config.command)
        except ValueError:
            words = config.command.split()
        for word in words:
            scan(f"providers.{name}.command", word)
    for arg in config.args:
        scan(f"providers.{name}.args", arg)
    for key, value in config.env.items():
        if key not in DROPPED_ENV:  # never reaches the run (`sandbox.clean_env`)
            scan(f"providers.{name}.env.{key}", value)
    return [(setting, path) for path, setting in found.items()]


def guarded(conf: Confinement) -> tuple[Path, ...]:
    """The paths a run never sees because a config names them (see `Confinement.guarded`)."""
    return tuple(dict.fromkeys((*conf.guarded, *conf.hidden)))


def enough(sight: Sight, writable: bool) -> bool:
    return sight == "write" or (sight == "read" and not writable)


def _unshown_hop(conf: Confinement, need: Need) -> tuple[Path, Path] | None:
    """The first symlink on the way that the sandbox does not show as itself (hidden there, or a
    mount point, which shows the mount instead), with the place the CLI then reaches."""
    mounted = {path for _, path in conf.mounts()}
    for hop, via in need.hops:
        if hop in mounted or conf.sees(hop) == "hidden":
            return hop, via
    return None


def reaches(conf: Confinement, need: Need) -> Sight:
    """What the CLI finds when it opens `need.path` inside `conf`: the symlinks on the way are
    followed while the sandbox shows them; past one it does not, the path continues from there."""
    unshown = _unshown_hop(conf, need)
    return conf.sees(unshown[1] if unshown else need.target)


def place(conf: Confinement, need: Need) -> Path:
    """Where a bind makes `need` reachable: its real path, or past a symlink the sandbox does not
    show, the named path continued from that symlink (bwrap binds what it leads to there)."""
    unshown = _unshown_hop(conf, need)
    return unshown[1] if unshown else need.target


def conflict(conf: Confinement, need: Need, at: Path, user_home: Path | None) -> Path | None:
    """The guarded path a bind at `at` (showing `need.target`) would show, if any: one equal to or
    above either of them, or (the bind showing it under another name, or the profile not hiding it
    below the bind) one below the target. The CLI's own files may lie below the box user's home."""
    shown = need.target
    for area in guarded(conf):
        inside_ok = need.own and area == user_home
        for path in (at, shown):
            if path == area or (area in path.parents and not inside_ok):
                return area
        if shown in area.parents and (at != shown or area not in conf.hidden):
            return area
    return None


def mount_for(conf: Confinement, need: Need, user_home: Path | None) -> Mount | None:
    """The bind that makes `need` reachable in `conf`, or None: it is already, or peerd hides it
    on purpose (then `problem` says so)."""
    if enough(reaches(conf, need), need.writable):
        return None
    at = place(conf, need)
    if conflict(conf, need, at, user_home) is not None:
        return None
    return Mount(at, writable=need.writable)


def _area_name(conf: Confinement, area: Path, user_home: Path | None) -> str:
    if conf.private and area == conf.private[0]:
        return f"peerd's home ({area})"
    if area in conf.private:
        return f"the directory of peerd's owner socket ({area})"
    if area == user_home:
        return f"your home directory ({area}), which a linked machine's run never sees"
    return f"the registered checkout {area}"


def problem(conf: Confinement, need: Need, provider: str, user_home: Path | None) -> str | None:
    """None when the CLI reaches `need` in `conf`; else one sentence: the path, the setting that
    named it, why it is not there, and the fix."""
    sight = reaches(conf, need)
    if enough(sight, need.writable):
        return None
    named = str(need.path) if need.target == need.path else f"{need.path} (which leads to {need.target})"
    start = f"Provider {provider!r} cannot start: {named}, named by {need.setting},"
    area = conflict(conf, need, place(conf, need), user_home)
    if area is not None:
        elsewhere = "peerd's home, its sockets and the registered checkouts"
        if user_home is not None:
            elsewhere = "peerd's home, its sockets, the registered checkouts and your home"
        relation = "holds" if need.target in area.parents else "lies in"
        return (
            f"{start} {relation} {_area_name(conf, area, user_home)}, which peerd hides from this run "
            f"on purpose; move it out of {elsewhere}, and name its new place in config.toml."
        )
    if sight == "read":
        return (
            f"{start} is read-only inside peerd's sandbox, and the CLI writes there; name a directory "
            "outside peerd's home and the registered checkouts in config.toml."
        )
    return (
        f"{start} is not visible inside peerd's sandbox; name a path outside peerd's home and the "
        "registered checkouts in config.toml, or make its directory readable in every sandbox with "
        "PEERD_SANDBOX_READABLE."
    )


def check(conf: Confinement, reach: Reach) -> str | None:
    """The first path the CLI would not reach inside `conf`, as `problem`'s sentence."""
    for need in reach.needs:
        if need.search:
            continue
        if (why := problem(conf, need, reach.provider, reach.user_home)) is not None:
            return why
    return None


# --- what exists ----------------------------------------------------------------------------------


def route(path: Path) -> tuple[Path, tuple[tuple[Path, Path], ...]]:
    """Where `path` leads (symlinks resolved, as far as it exists) and the symlinks on the way:
    each where it lies, with `path` continued from it."""
    rest = list(Path(os.path.normpath(path)).parts[1:])
    current = Path("/")
    hops: list[tuple[Path, Path]] = []
    while rest:
        name = rest.pop(0)
        if name == "..":
            current = current.parent
            continue
        candidate = current / name
        if len(hops) < _MAX_SYMLINKS and candidate.is_symlink():
            try:
                target = candidate.readlink()
            except OSError:
                current = candidate
                continue
            hops.append((candidate, candidate.joinpath(*rest)))
            if target.is_absolute():
                current = Path("/")
            rest = [*target.parts[1:], *rest] if target.is_absolute() else [*target.parts, *rest]
            continue
        current = candidate
    return current, tuple(hops)


def need(
    path: Path, setting: str, *, writable: bool = False, own: bool = False, search: bool = False
) -> Need:
    named = Path(os.path.normpath(path))
    real, hops = route(named)
    found = None if real == named else real
    return Need(named, setting, writable=writable, own=own, search=search, real=found, hops=hops)


def install_units(binary: str) -> list[Path]:
    """The directories a binary's install needs, as its path names them (through any symlinks): an
    npm package's whole `node_modules`, else the binary's directory (`sandbox_profile.install_dirs`
    binds the same by their real paths)."""
    named = Path(os.path.normpath(Path(binary).absolute()))
    parts = named.parts
    if "node_modules" in parts[:-1]:
        return [Path(*parts[: parts.index("node_modules") + 1])]
    return [named.parent] if named.parent != Path("/") else []


def needs(
    *,
    provider: str,
    config: ProviderConfig | None,
    binary: str,
    env: Mapping[str, str],
    state: Iterable[Mount],
    scratch: Path,
) -> list[Need]:
    """Every path the provider's CLI needs inside its sandbox: the binary (through its install
    dir) and the interpreter its `#!` line names, its state dirs, what its config entry names (those
    that exist), peerd's files for the run."""
    named_binary = f"providers.{provider}.binary" if config is not None and config.binary else "its binary"
    found = [need(unit, named_binary, own=True) for unit in install_units(binary)]
    found.append(need(Path(binary), named_binary, own=True))
    if (interpreter := sandbox_profile._interpreter(binary, env)) is not None:
        found.append(need(Path(interpreter), f"the #! line of {binary}", own=True))
    for mount in state:
        if mount.optional and not mount.path.exists():
            continue
        found.append(need(mount.path, state_setting(provider, config, mount.path), writable=True, own=True))
    if config is not None:
        for setting, path in named_paths(config, provider):
            if path.exists():
                search = ".env." in setting and setting.endswith("PATH")  # PATH, NODE_PATH, ...
                found.append(need(path, setting, search=search))
    found.append(need(scratch, "peerd's own files for this run"))
    return found


def state_setting(provider: str, config: ProviderConfig | None, path: Path) -> str:
    """Which setting gave a state dir: an `env` entry naming it (or the HOME it lies in), else the
    CLI's default."""
    env = {} if config is None else config.env
    for key, value in env.items():
        if value.startswith("/") and sandbox_profile.real(value) == path:
            return f"providers.{provider}.env.{key}"
    home = env.get("HOME")
    if home and sandbox_profile.real(home) in path.parents:
        return f"providers.{provider}.env.HOME"
    return "its state directory"


def plan(
    conf: Confinement, wanted: Sequence[Need], user_home: Path | None
) -> tuple[Confinement, tuple[Need, ...]]:
    """`conf` with a bind for each need not reachable yet (in order; each bind counts for the next),
    and the needs, for `check` before the CLI starts."""
    for item in wanted:
        if (mount := mount_for(conf, item, user_home)) is not None:
            conf = conf.plus(mount)
    return conf, tuple(wanted)
