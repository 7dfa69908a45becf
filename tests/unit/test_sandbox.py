"""peerd's sandbox profile, bwrap's arguments, the environment, and who is confined: pure rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from peerd.config import Config, LinksConfig, ProviderConfig, _validate, link_may_use
from peerd.doctor import ConfinementFacts, check_confinement, run_checks
from peerd.errors import ConfigInvalid
from peerd.runtime import sandbox
from peerd.runtime.sandbox import Confinement, Mount, bwrap_args, clean_env, decide
from peerd.runtime.sandbox_profile import (
    git_dir_of,
    install_dirs,
    profile,
    sanitized_git_config,
    writes_worktree,
)

HOME = Path("/srv/peerd")
WT = HOME / "worktrees" / "thr_1"
CHECKOUT = Path("/tmp/repo")


def conf(**kw: object) -> Confinement:
    base: dict[str, object] = {
        "cwd": WT,
        "worktree": WT,
        "worktree_writable": True,
        "git_dir": CHECKOUT / ".git",
        "tmp": (Path("/tmp"),),
        "hidden": (HOME, CHECKOUT),
        "binds": (Mount(Path("/usr/lib/python3")), Mount(HOME / "agent.sock", writable=True, optional=True)),
        "private": (HOME,),
    }
    base.update(kw)
    return Confinement(**base)  # type: ignore[arg-type]


def pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_the_base_profile() -> None:
    args = bwrap_args(conf())
    assert args[:7] == ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--unshare-net"):
        assert flag in args
    assert "--new-session" not in args  # peerd signals the run's process group
    assert args[args.index("--cap-drop") + 1] == "ALL"  # also when peerd runs as root
    assert args[-2:] == ["--chdir", str(WT)]
    assert pairs(args, "--tmpfs") == ["/tmp", "/srv/peerd", "/tmp/repo"]
    assert pairs(args, "--remount-ro") == ["/srv/peerd", "/tmp/repo"]  # hidden; /tmp stays writable
    assert pairs(args, "--bind") == [str(WT)]
    assert pairs(args, "--bind-try") == [str(HOME / "agent.sock")]
    assert pairs(args, "--ro-bind")[1:] == ["/usr/lib/python3", "/tmp/repo/.git"]


def test_a_parent_is_mounted_before_what_lies_below_it() -> None:
    args = bwrap_args(conf())
    where: dict[str, int] = {}
    for i, value in enumerate(args):
        where.setdefault(value, i)  # where each path is first named
    assert where["/tmp"] < where["/tmp/repo"] < where["/tmp/repo/.git"]
    assert where["/srv/peerd"] < where[str(WT)] and where["/srv/peerd"] < where[str(HOME / "agent.sock")]
    assert max(i for i, a in enumerate(args) if a == "--remount-ro") > where[str(WT)]


def test_on_one_path_a_bind_beats_a_hide_and_read_only_beats_writable() -> None:
    in_place = conf(cwd=CHECKOUT, worktree=CHECKOUT, binds=(Mount(CHECKOUT / ".git", writable=True),))
    mounts = in_place.mounts()
    assert ("write", CHECKOUT) in mounts and ("hide", CHECKOUT) not in mounts  # its checkout, writable
    assert ("read", CHECKOUT / ".git") in mounts and ("write", CHECKOUT / ".git") not in mounts


def test_network_and_root_writability() -> None:
    assert "--unshare-net" not in bwrap_args(conf(share_net=True))
    full = bwrap_args(conf(root_writable=True))
    assert full[:3] == ["--bind", "/", "/"] and "/srv/peerd" in pairs(full, "--tmpfs")
    readonly = bwrap_args(conf(worktree_writable=False))
    assert str(WT) in pairs(readonly, "--ro-bind") and str(WT) not in pairs(readonly, "--bind")


def test_command_wraps_bwrap_in_signal_shims() -> None:
    argv = sandbox.command(conf(), ["agent", "--x"], bwrap="/usr/bin/bwrap", python="/py")
    assert argv[:4] == ["/py", "-I", "-S", "-c"] and "SIG_IGN" in argv[4]
    assert argv[5] == "/usr/bin/bwrap"
    inner = argv.index("--", 6)
    assert argv[inner + 1 : inner + 5] == ["/py", "-I", "-S", "-c"] and "SIG_DFL" in argv[inner + 5]
    assert argv[-2:] == ["agent", "--x"]


def test_the_environment_loses_agent_sockets_and_inherited_names_of_peerds_home() -> None:
    inherited = {
        "PATH": "/usr/bin",
        "SSH_AUTH_SOCK": "/run/user/1/ssh",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1/bus",
        "GIT_ASKPASS": "/usr/bin/ask",
        "PEERD_HOME": "/srv/peerd",
        "SOMETHING": "/srv/peerd/peerd.db",
    }
    env = {**inherited, "PEERD_SOCKET": "/srv/peerd/agent.sock", "PEERD_RUN_TOKEN_FILE": "/srv/peerd/x/t"}
    assert clean_env(env, conf(), inherited=inherited) == {
        "PATH": "/usr/bin",
        "PEERD_SOCKET": "/srv/peerd/agent.sock",  # the run's own bindings stay
        "PEERD_RUN_TOKEN_FILE": "/srv/peerd/x/t",
    }


@pytest.mark.parametrize(
    ("by_link", "mode", "available", "allow", "outcome"),
    [
        (False, "full-access", True, False, "unconfined"),  # the owner is the owner
        (False, "full-access", False, False, "unconfined"),
        (False, "auto", True, False, "confined"),
        (False, "read-only", True, False, "confined"),
        (True, "full-access", True, False, "confined"),  # a link's full access is still confined
        (True, "read-only", True, False, "confined"),
        (False, "auto", False, False, "unconfined+notice"),
        (True, "read-only", False, False, "unconfined+notice"),
        (True, "approval-required", False, False, "refused"),
        (True, "auto", False, False, "refused"),
        (True, "full-access", False, False, "refused"),
        (True, "auto", False, True, "unconfined+notice"),
    ],
)
def test_who_is_confined(by_link: bool, mode: str, available: bool, allow: bool, outcome: str) -> None:
    decision = decide(by_link=by_link, runtime_mode=mode, available=available, allow_unconfined=allow)
    if decision.refusal is not None:
        got = "refused"
        assert "apt-get install bubblewrap" in decision.refusal and "allow_unconfined" in decision.refusal
    elif decision.confine:
        got = "confined"
    else:
        got = "unconfined+notice" if decision.notice else "unconfined"
    assert got == outcome


@pytest.mark.parametrize(
    ("runtime", "interaction", "writes"),
    [
        ("read-only", "default", False),
        ("approval-required", "default", False),
        ("auto-accept-edits", "default", True),
        ("auto", "default", True),
        ("full-access", "default", True),
        ("full-access", "plan", False),
    ],
)
def test_when_the_worktree_is_writable(runtime: str, interaction: str, writes: bool) -> None:
    assert writes_worktree(runtime, interaction) is writes


def test_a_runs_profile_hides_home_sockets_checkouts_and_for_links_the_users_home(tmp_path: Path) -> None:
    home, user, other = tmp_path / "home", tmp_path / "user", tmp_path / "other-repo"
    repo = tmp_path / "repo"
    for path in (home / "worktrees" / "t", user, other, repo / ".git"):
        path.mkdir(parents=True)
    socket_dir = tmp_path / "short"
    socket_dir.mkdir()
    common = {
        "home": home,
        "owner_socket": socket_dir / "x.sock",
        "agent_socket": socket_dir / "x-agent.sock",
        "checkouts": [repo, other, tmp_path / "gone"],
        "checkout": repo,
        "worktree": home / "worktrees" / "t",
        "scratch": home / "providers" / "script" / "runs" / "r",
        "runtime_mode": "auto",
        "interaction_mode": "default",
        "user_home": user,
    }
    owner = profile(by_link=False, **common)  # type: ignore[arg-type]
    assert set(owner.hidden) == {home, repo, other, socket_dir}  # what does not exist is skipped
    assert owner.git_dir == repo / ".git" and owner.worktree_writable and not owner.root_writable
    assert Mount(socket_dir / "x-agent.sock", writable=True, optional=True) in owner.binds
    assert owner.private == (home, socket_dir)  # names dropped from the inherited environment
    link = profile(by_link=True, **{**common, "runtime_mode": "full-access"})  # type: ignore[arg-type]
    assert user in link.hidden and link.root_writable and link.by_link
    same = profile(by_link=False, **{**common, "agent_socket": socket_dir / "x.sock"})  # type: ignore[arg-type]
    assert not [b for b in same.binds if b.path.name.endswith(".sock")], "never the owner socket"


def test_the_git_dir_of_a_checkout_and_of_a_linked_worktree(tmp_path: Path) -> None:
    main = tmp_path / "main"
    (main / ".git" / "worktrees" / "w").mkdir(parents=True)
    (main / ".git" / "worktrees" / "w" / "commondir").write_text("../..\n")
    linked = tmp_path / "w"
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'w'}\n")
    assert git_dir_of(main) == main / ".git"
    assert git_dir_of(linked) == main / ".git"
    assert git_dir_of(tmp_path) is None


def test_an_npm_cli_brings_its_whole_node_modules_and_its_interpreter(tmp_path: Path) -> None:
    modules = tmp_path / "prefix" / "node_modules"
    script = modules / "@x" / "cli" / "bin" / "cli.js"
    script.parent.mkdir(parents=True)
    node = tmp_path / "nodejs" / "bin" / "node"
    node.parent.mkdir(parents=True)
    (tmp_path / "nodejs" / "lib").mkdir()
    node.write_text("")
    node.chmod(0o755)
    script.write_text("#!/usr/bin/env node\n")
    (modules / ".bin").mkdir()
    (modules / ".bin" / "cli").symlink_to(script)
    dirs = install_dirs(str(modules / ".bin" / "cli"), {"PATH": str(node.parent)})
    assert modules in dirs and tmp_path / "nodejs" in dirs  # node's prefix: bin/ with lib/ beside it
    assert not [d for d in dirs if d in (tmp_path, tmp_path / "prefix")]


def test_links_providers_default_to_the_built_ins_and_must_name_providers() -> None:
    config = Config()
    assert [p for p in ("script", "codex", "claude", "gemini", "my-coder") if link_may_use(config, p)] == [
        "script",
        "codex",
        "claude",
        "gemini",
    ]
    custom = {"my-coder": ProviderConfig(kind="command", command="my-coder {SPEC}")}
    listed = _validate(
        {
            "providers": {"my-coder": {"kind": "command", "command": "my-coder {SPEC}"}},
            "links": {"providers": ["my-coder"]},
        },
        "config.toml",
    )
    assert (
        listed.providers == custom and link_may_use(listed, "my-coder") and not link_may_use(listed, "codex")
    )
    with pytest.raises(ConfigInvalid, match=r"links\.providers: 'nope'"):
        _validate({"links": {"providers": ["nope"]}}, "config.toml")
    with pytest.raises(ConfigInvalid, match="links"):
        _validate({"links": {"script-run": False}}, "config.toml")
    assert LinksConfig().script_run and not LinksConfig().allow_unconfined


def test_the_probe_finds_a_working_bwrap() -> None:
    """The suite needs bubblewrap (`make test` installs it where it can); this says so first."""
    found = sandbox.probe()
    assert found.ok and found.binary, found.detail


def test_doctor_says_whether_runs_are_confined_and_what_it_means_for_links() -> None:
    from tests.unit.test_doctor import facts  # noqa: PLC0415  # the doctor tests' complete Facts

    assert check_confinement(facts()) is None  # not looked at
    works = check_confinement(facts(confinement=ConfinementFacts(True, "bubblewrap works (/usr/bin/bwrap).")))
    assert works is not None and works.status == "ok" and "linked machines' runs" in works.detail
    missing = ConfinementFacts(False, "bubblewrap (bwrap) is not on PATH.")
    refused = check_confinement(facts(confinement=missing))
    assert refused is not None and refused.status == "warn"
    assert "above read-only are refused" in refused.detail
    assert refused.fix and "apt-get install bubblewrap" in refused.fix and "allow_unconfined" in refused.fix
    allowed = check_confinement(facts(confinement=dataclasses.replace(missing, allow_unconfined=True)))
    assert allowed is not None and allowed.status == "warn" and "allow_unconfined = true" in allowed.detail
    assert "confinement" in [c.name for c in run_checks(facts(confinement=missing))]


def test_a_sanitized_git_config_keeps_only_what_git_needs_to_read_the_repository() -> None:
    text = (
        "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = /tmp/evil\n\tbare = false\n"
        '[remote "origin"]\n\turl = https://u:SECRET@x/r.git\n[extensions]\n\tobjectFormat = sha256\n'
        "[include]\n\tpath = ~/.gitconfig-secrets\n[credential]\n\thelper = store\n[core\n\tworktree = /\n"
    )
    assert sanitized_git_config(text) == (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[extensions]\n\tobjectformat = sha256\n"
    )


def test_a_swapped_file_is_bound_from_its_source_last() -> None:
    conf = Confinement(
        cwd=Path("/w"),
        worktree=Path("/w"),
        worktree_writable=True,
        git_dir=Path("/c/.git"),
        hidden=(Path("/c"),),
        binds=(Mount(Path("/c/.git/config"), source=Path("/s/git-config")),),
    )
    args = bwrap_args(conf)
    at = args.index("/s/git-config")
    assert args[at - 1 : at + 2] == ["--ro-bind", "/s/git-config", "/c/.git/config"]
    assert at > args.index("/c/.git"), "after the git dir it lies in"
