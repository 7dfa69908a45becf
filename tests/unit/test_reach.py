"""A provider's own files inside peerd's sandbox (issue 27, case 3): what a path is there
(`Confinement.sees`), which paths a provider's config names, what is mapped, and the one sentence
a run fails with when a path cannot be reached. Pure rules; the filesystem only for symlinks."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from peerd.config import ProviderConfig
from peerd.errors import ProviderPathUnreachable
from peerd.providers import reach
from peerd.providers.cli import Launch, confine, sandboxed
from peerd.providers.reach import Need, Reach, check, mount_for, named_paths, plan, problem, reaches, route
from peerd.runtime.sandbox import Confinement, Mount, bwrap_args
from peerd.runtime.sandbox_profile import profile

HOME = Path("/srv/peerd")  # peerd's home
WT = HOME / "worktrees" / "thr_1"
CHECKOUT = Path("/srv/repo")
OTHER = Path("/srv/other-repo")
USER = Path("/home/me")  # the box user's home


def conf(**kw: object) -> Confinement:
    base: dict[str, object] = {
        "cwd": WT,
        "worktree": WT,
        "worktree_writable": True,
        "git_dir": CHECKOUT / ".git",
        "tmp": (Path("/tmp"), Path("/var/tmp")),
        "hidden": (HOME, CHECKOUT, OTHER),
        "guarded": (HOME, CHECKOUT, OTHER),
        "binds": (Mount(Path("/usr/lib/python3")), Mount(HOME / "runs" / "r", optional=True)),
        "private": (HOME,),
        "system": (Mount(Path("/usr"), optional=True),),
    }
    base.update(kw)
    return Confinement(**base)  # type: ignore[arg-type]


def link_conf(**kw: object) -> Confinement:
    areas = (HOME, CHECKOUT, OTHER, USER)
    return conf(**{"hidden": areas, "guarded": areas, "by_link": True, **kw})


# --- Confinement.sees ------------------------------------------------------------------------------


def test_sees_applies_the_profile_as_bwrap_does() -> None:
    c = conf()
    assert c.sees(Path("/usr/bin/git")) == "read"  # the system, read-only
    assert c.sees(Path("/srv/x")) == "hidden" and c.sees(Path("/")) == "hidden"  # nothing else
    assert c.sees(Path("/dev/null")) == "write" and c.sees(Path("/proc/self/status")) == "read"
    assert c.sees(Path("/tmp")) == "write" and c.sees(Path("/tmp/x")) == "hidden"  # private, empty
    assert c.sees(HOME) == "hidden" and c.sees(HOME / "peerd.db") == "hidden"
    assert c.sees(WT / "a.py") == "write" and c.sees(HOME / "runs" / "r" / "mcp.json") == "read"
    assert c.sees(CHECKOUT / ".git" / "HEAD") == "read"  # the git dir, inside a hidden checkout
    assert dataclasses.replace(c, worktree_writable=False).sees(WT) == "read"


def test_sees_the_deepest_mount_and_on_one_path_what_mounts_picks() -> None:
    c = conf(binds=(Mount(Path("/tmp/a")), Mount(Path("/tmp/a/b"), writable=True), Mount(Path("/tmp/a/b/c"))))
    assert c.sees(Path("/tmp/a/x")) == "read"
    assert c.sees(Path("/tmp/a/b/x")) == "write"
    assert c.sees(Path("/tmp/a/b/c/d")) == "read"
    same = conf(binds=(Mount(Path("/tmp/s"), writable=True), Mount(Path("/tmp/s"))))
    assert same.sees(Path("/tmp/s/f")) == "read"  # read-only beats writable on one path
    swap = conf(binds=(Mount(CHECKOUT / ".git" / "config", source=Path("/x")),))
    assert swap.sees(CHECKOUT / ".git" / "config") == "read"
    bound_on_tmp = conf(binds=(Mount(Path("/tmp")),))
    assert bound_on_tmp.sees(Path("/tmp/x")) == "read"  # a bind beats the tmpfs on its path


def test_without_the_system_only_the_runs_own_mounts_are_seen() -> None:
    c = conf(system=())
    assert c.sees(Path("/usr/bin/git")) == "hidden"
    assert c.sees(Path("/usr/lib/python3/os.py")) == "read" and c.sees(WT / "a") == "write"


def test_sees_trusts_no_root_and_bwrap_binds_none(tmp_path: Path) -> None:
    """`sees` starts from nothing, as bwrap does for the profile a run gets (were `/` bound again,
    providers would map paths needlessly; were `sees` to trust `/`, they would trust paths bwrap
    never shows)."""
    (tmp_path / "home").mkdir()
    built = profile(
        home=tmp_path / "home",
        owner_socket=tmp_path / "home" / "peerd.sock",
        agent_socket=None,
        checkouts=[],
        checkout=tmp_path,
        worktree=tmp_path,
        scratch=tmp_path / "home" / "runs" / "r",
        by_link=False,
        runtime_mode="auto",
        interaction_mode="default",
    )
    args = bwrap_args(built)
    binds_root = any(
        args[i : i + 3] in (["--ro-bind", "/", "/"], ["--bind", "/", "/"]) for i in range(len(args))
    )
    assert not binds_root and built.sees(Path("/srv/elsewhere")) == "hidden"
    assert set(built.hidden) <= set(built.guarded)


# --- what a config names ---------------------------------------------------------------------------


def test_named_paths_finds_absolute_paths_in_every_form() -> None:
    config = ProviderConfig(
        args=[
            "-c",
            'model_catalog_json="/tmp/c/catalog.json"',
            "--settings=/var/tmp/s.json",
            "/opt/x/plain",
            'model_providers.m={name="m", base_url="http://127.0.0.1:9/v1", cert="/etc/ssl/m.pem"}',
            "--flag",
            "relative/path",
            "/",
            "/tmp/c/../c/catalog.json",  # the same file again
        ],
        env={"PATH": "/tmp/tools/bin:/usr/bin", "KEY": "sk-secret", "HOME": "/tmp/h/"},
        command="/tmp/tools/coder --config /tmp/tools/c.toml {SPEC}",
    )
    assert named_paths(config, "p") == [
        ("providers.p.command", Path("/tmp/tools/coder")),
        ("providers.p.command", Path("/tmp/tools/c.toml")),
        ("providers.p.args", Path("/tmp/c/catalog.json")),
        ("providers.p.args", Path("/var/tmp/s.json")),
        ("providers.p.args", Path("/opt/x/plain")),
        ("providers.p.args", Path("/etc/ssl/m.pem")),
        ("providers.p.env.PATH", Path("/tmp/tools/bin")),
        ("providers.p.env.PATH", Path("/usr/bin")),
        ("providers.p.env.HOME", Path("/tmp/h")),
    ]


def test_route_follows_symlinks_and_says_where_each_lies(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "f").write_text("x")
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("real/sub")
    (real / "up").symlink_to("../abs")  # a chain: up -> ../abs -> real
    assert route(real / "sub" / "f") == (real / "sub" / "f", ())
    assert route(tmp_path / "abs" / "sub" / "f") == (
        real / "sub" / "f",
        ((tmp_path / "abs", tmp_path / "abs" / "sub" / "f"),),
    )
    assert route(tmp_path / "rel" / "f")[0] == real / "sub" / "f"
    found, hops = route(real / "up" / "sub" / "missing")
    assert found == real / "sub" / "missing"  # as far as it exists, then as named
    assert hops == (
        (real / "up", real / "up" / "sub" / "missing"),
        (tmp_path / "abs", tmp_path / "abs" / "sub" / "missing"),
    )


# --- what is mapped, and what is reported ----------------------------------------------------------


def n(path: str, setting: str = "providers.p.args", **kw: object) -> Need:
    return Need(Path(path), setting, **kw)  # type: ignore[arg-type]


def test_a_file_below_tmp_is_mapped_read_only_and_state_writable() -> None:
    c = conf()
    assert reaches(c, n("/tmp/c/catalog.json")) == "hidden"
    assert mount_for(c, n("/tmp/c/catalog.json"), None) == Mount(Path("/tmp/c/catalog.json"))
    state = n("/var/tmp/h/.codex", writable=True, own=True)
    assert mount_for(c, state, None) == Mount(Path("/var/tmp/h/.codex"), writable=True)
    assert mount_for(c, n("/srv/state", writable=True), None) == Mount(Path("/srv/state"), writable=True)
    # Already there: nothing added (/ is read-only visible, /tmp itself is the private one).
    assert mount_for(c, n("/usr/share/x"), None) is None
    assert mount_for(c, n("/tmp", writable=True), None) is None
    planned, needs = plan(c, [n("/tmp/c/catalog.json"), state, n("/var/tmp/h/.codex/auth.json")], None)
    assert check(planned, Reach("p", needs)) is None
    assert planned.sees(Path("/var/tmp/h/.codex/auth.json")) == "write"
    assert planned.sees(Path("/tmp/other")) == "hidden", "only what is named"


@pytest.mark.parametrize(
    ("path", "where"),
    [
        (HOME / "keys" / "catalog.json", "peerd's home"),
        (HOME, "peerd's home"),
        (OTHER / "notes.md", "the registered checkout /srv/other-repo"),
        (CHECKOUT / "cfg.toml", "the registered checkout /srv/repo"),
    ],
)
def test_a_path_peerd_hides_on_purpose_is_reported_not_mapped(path: Path, where: str) -> None:
    c = conf()
    need = Need(path, "providers.codex.env.CATALOG")
    assert mount_for(c, need, None) is None
    planned, needs = plan(c, [need], None)
    assert planned == c
    sentence = check(planned, Reach("codex", needs))
    assert sentence == (
        f"Provider 'codex' cannot start: {path}, named by providers.codex.env.CATALOG, lies in {where}"
        + (f" ({HOME})" if where == "peerd's home" else "")
        + ", which peerd hides from this run on purpose; move it out of peerd's home, its sockets and "
        "the registered checkouts, and name its new place in config.toml."
    )
    own = Need(path, "providers.codex.env.CODEX_HOME", writable=True, own=True)
    assert mount_for(c, own, None) is None, "nor when it is the CLI's state"


def test_a_links_run_never_gets_the_users_home_for_a_config_only_the_clis_own_files() -> None:
    c = link_conf()
    named = n(str(USER / "catalog.json"))
    assert mount_for(c, named, USER) is None
    sentence = problem(c, named, "codex", USER)
    assert sentence is not None and "your home directory (/home/me)" in sentence and "your home," in sentence
    state = n(str(USER / ".codex"), writable=True, own=True)  # ~/.codex, as always
    assert mount_for(c, state, USER) == Mount(USER / ".codex", writable=True)
    whole = n(str(USER), "providers.codex.env.HOME", writable=True, own=True)
    assert mount_for(c, whole, USER) is None  # HOME = the user's home itself: not for a link
    peerd_inside = n(str(USER / ".peerd" / "x"), writable=True, own=True)
    assert (
        mount_for(
            link_conf(hidden=(USER / ".peerd", USER), guarded=(USER / ".peerd", USER)), peerd_inside, USER
        )
        is None
    )
    # The owner's own run: the user's home is the owner's; mapped, since nothing is visible unasked.
    assert mount_for(conf(), named, None) == Mount(named.path)


def test_a_symlink_the_sandbox_hides_is_mapped_where_named_unless_it_leads_to_a_guarded_path() -> None:
    c = conf()
    # /tmp/clone/.cache/clis -> /opt/clis: named below /tmp, where the symlink is not shown.
    via = Need(
        Path("/tmp/clone/.cache/clis/catalog.json"),
        "providers.codex.args",
        real=Path("/opt/clis/catalog.json"),
        hops=((Path("/tmp/clone/.cache/clis"), Path("/tmp/clone/.cache/clis/catalog.json")),),
    )
    assert reaches(c, via) == "hidden"  # /opt is visible, but the CLI never gets past /tmp
    assert mount_for(c, via, None) == Mount(Path("/tmp/clone/.cache/clis/catalog.json"))
    # A symlink the sandbox shows is followed: the real path decides.
    shown = dataclasses.replace(
        via, path=Path("/srv/link/catalog.json"), hops=((Path("/srv/link"), Path("/srv/link/catalog.json")),)
    )
    assert reaches(conf(binds=(Mount(Path("/srv")), Mount(Path("/opt/clis")))), shown) == "read"
    # Leading into peerd's home, or to a directory holding it, is reported (another name for it).
    into_home = dataclasses.replace(via, real=HOME / "identity")
    assert mount_for(c, into_home, None) is None and "peerd's home" in (
        problem(c, into_home, "codex", None) or ""
    )
    above_home = dataclasses.replace(via, real=Path("/srv"))
    assert mount_for(c, above_home, None) is None


def test_a_directory_above_a_guarded_one_is_mapped_only_where_the_profile_hides_that_one() -> None:
    home = Path("/tmp/clone/peerd-home")  # peerd's home below /tmp, and a config naming /tmp/clone
    above = n("/tmp/clone")
    c = conf(hidden=(home,), guarded=(home,), private=(home,))
    assert mount_for(c, above, None) == Mount(Path("/tmp/clone"))
    assert c.plus(Mount(Path("/tmp/clone"))).sees(home / "peerd.db") == "hidden"  # hidden below it
    # A profile that binds only what a run needs and mounts nothing over peerd's home: not mapped.
    deny = conf(system=(), hidden=(), guarded=(home,), private=(home,))
    assert mount_for(deny, above, None) is None
    assert "/tmp/clone, named by providers.p.args, holds peerd's home (/tmp/clone/peerd-home)" in (
        problem(deny, above, "p", None) or ""
    )


def test_every_named_path_outside_the_runs_mounts_is_mapped() -> None:
    c = conf()
    assert mount_for(c, n("/opt/tools/cfg.json"), None) == Mount(Path("/opt/tools/cfg.json"))
    assert mount_for(c, n("/usr/lib/python3/x.py"), None) is None


def test_check_says_the_first_path_not_reached_in_one_sentence() -> None:
    c = conf()
    needs = (n("/tmp/a"), n(str(HOME / "x"), "providers.p.env.X"), n(str(OTHER / "y")))
    sentence = check(c, Reach("p", needs))
    assert sentence is not None and sentence.startswith(
        "Provider 'p' cannot start: /tmp/a, named by providers.p.args,"
    )
    assert "not visible inside peerd's sandbox" in sentence and sentence.count(". ") == 0
    assert check(conf(), Reach("p", (n("/usr/bin/env"),))) is None
    readonly = problem(conf(), n("/usr/state", writable=True), "p", None)
    assert readonly is not None and "is read-only inside peerd's sandbox" in readonly


# --- confine: the provider's launch ----------------------------------------------------------------


def launch_in(tmp_path: Path) -> tuple[Launch, Confinement]:
    scratch = tmp_path / "home" / "runs" / "r"
    scratch.mkdir(parents=True)
    base = conf(
        hidden=(tmp_path / "home",),
        guarded=(tmp_path / "home",),
        private=(tmp_path / "home",),
        binds=(Mount(scratch, optional=True),),
    )
    return Launch([sys.executable], {"PATH": "/usr/bin"}, tmp_path, None, scratch), base


def test_confine_maps_what_the_config_names_below_tmp(tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp/"), "pytest's tmp_path lies in /tmp here"
    tools = tmp_path / "tools"
    (tools / "state").mkdir(parents=True)
    (tools / "catalog.json").write_text("{}")
    launch, base = launch_in(tmp_path)
    config = ProviderConfig(
        args=["-c", f'model_catalog_json="{tools / "catalog.json"}"', f"--missing={tools / 'nothing'}"],
        env={"CODEX_HOME": str(tools / "state")},
    )
    state = Mount(tools / "state", writable=True)
    confine(launch, base, sys.executable, state, config=config, name="codex")
    assert launch.confinement is not None and launch.reach is not None
    assert launch.confinement.sees(tools / "catalog.json") == "read"
    assert launch.confinement.sees(tools / "state" / "auth.json") == "write"
    assert launch.confinement.sees(tools / "nothing") == "hidden", "what does not exist is not bound"
    settings = {need.path: need.setting for need in launch.reach.needs}
    assert settings[tools / "state"] == "providers.codex.env.CODEX_HOME"
    assert settings[tools / "catalog.json"] == "providers.codex.args"
    assert reach.check(launch.confinement, launch.reach) is None


def test_sandboxed_refuses_before_anything_starts_when_a_path_is_hidden_on_purpose(tmp_path: Path) -> None:
    launch, base = launch_in(tmp_path)
    secret = tmp_path / "home" / "identity" / "catalog.json"
    secret.parent.mkdir()
    secret.write_text("{}")
    config = ProviderConfig(env={"CATALOG": str(secret), "CODEX_HOME": str(tmp_path / "home" / "codex")})
    state = Mount(tmp_path / "home" / "codex", writable=True)
    confine(launch, base, sys.executable, state, config=config, name="codex")
    assert launch.confinement is not None
    assert launch.confinement.sees(secret) == "hidden"
    assert not (tmp_path / "home" / "codex").exists(), "a hidden state dir is not even made"
    with pytest.raises(ProviderPathUnreachable) as refused:
        sandboxed(launch)
    assert refused.value.code == "provider_path_unreachable"
    assert refused.value.message.startswith(
        f"Provider 'codex' cannot start: {tmp_path / 'home' / 'codex'}, named by providers.codex.env.CODEX_HOME, "
        f"lies in peerd's home ({tmp_path / 'home'})"
    )


def test_a_search_path_entry_is_mapped_when_it_may_be_and_never_fails_the_run(tmp_path: Path) -> None:
    launch, base = launch_in(tmp_path)
    tools_bin = tmp_path / "tools" / "bin"
    tools_bin.mkdir(parents=True)
    (tmp_path / "home" / "bin").mkdir()
    config = ProviderConfig(
        env={"PATH": f"{tools_bin}:{tmp_path / 'home' / 'bin'}:/usr/bin", "PEERD_HOME": "/usr"}
    )
    confine(launch, base, sys.executable, config=config, name="p")
    assert launch.confinement is not None and launch.reach is not None
    assert launch.confinement.sees(tools_bin) == "read"
    assert launch.confinement.sees(tmp_path / "home" / "bin") == "hidden"  # peerd's home: not mapped
    assert reach.check(launch.confinement, launch.reach) is None  # a search skips what is not there
    # PEERD_HOME never reaches a run (sandbox.clean_env drops it): not a path the run needs.
    assert not [n for n in launch.reach.needs if n.setting.endswith("PEERD_HOME")]


def test_the_interpreter_a_binary_names_is_needed_too(tmp_path: Path) -> None:
    launch, base = launch_in(tmp_path)
    node = tmp_path / "nodejs" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("")
    node.chmod(0o755)
    script = tmp_path / "tools" / "cli.js"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env node\n")
    launch.env["PATH"] = str(node.parent)
    confine(launch, base, str(script), config=ProviderConfig(binary=str(script)), name="p")
    assert launch.reach is not None and launch.confinement is not None
    needed = {n.path: n.setting for n in launch.reach.needs}
    assert needed[node] == f"the #! line of {script}" and needed[script] == "providers.p.binary"
    assert launch.confinement.sees(node) == "read" and launch.confinement.sees(script) == "read"
