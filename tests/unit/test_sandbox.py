"""peerd's sandbox profile, bwrap's arguments, the environment, and who is confined: pure rules."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.config import Config, LinksConfig, ProviderConfig, _validate, link_may_use
from peerd.doctor import ConfinementFacts, check_confinement, run_checks
from peerd.errors import ConfigInvalid
from peerd.runtime import runas, sandbox, sandbox_profile
from peerd.runtime.runas import Grant, RunAs
from peerd.runtime.sandbox import Confinement, Mount, bwrap_args, clean_env, decide
from peerd.runtime.sandbox_profile import (
    etc_plan,
    git_dir_of,
    install_dirs,
    profile,
    sanitized_git_config,
    system_mounts,
    writes_worktree,
)
from tests.support.doctor import facts

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
    assert args[:4] == ["--dev", "/dev", "--proc", "/proc"]  # deny by default: nothing else of `/`
    assert "/" not in pairs(args, "--ro-bind") + pairs(args, "--bind")
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--unshare-net"):
        assert flag in args
    assert "--new-session" not in args  # peerd signals the run's process group
    assert args[args.index("--cap-drop") + 1] == "ALL"  # also when peerd runs as root
    assert args[-2:] == ["--chdir", str(WT)]
    # peerd's home and the checkout lie below nothing bound: they are simply absent (no empty
    # directory tells that they exist); only the agent socket and the git dir are bound from them
    assert pairs(args, "--tmpfs") == ["/tmp"]
    assert pairs(args, "--remount-ro") == ["/"]  # the empty root: a write outside fails
    # below a bound directory, a hidden path gets an empty, read-only tmpfs, after what is bound in it
    shown = bwrap_args(conf(binds=(Mount(Path("/srv")), Mount(HOME / "agent.sock", writable=True))))
    assert pairs(shown, "--tmpfs") == ["/tmp", "/srv/peerd"] and pairs(shown, "--remount-ro") == [
        "/",
        "/srv/peerd",
    ]
    assert pairs(args, "--bind") == [str(WT)]
    assert pairs(args, "--bind-try") == [str(HOME / "agent.sock")]
    assert pairs(args, "--ro-bind") == ["/usr/lib/python3", "/tmp/repo/.git"]


def test_a_parent_is_mounted_before_what_lies_below_it() -> None:
    args = bwrap_args(conf(binds=(*conf().binds, Mount(Path("/srv")))))
    where: dict[str, int] = {}
    for i, value in enumerate(args):
        where.setdefault(value, i)  # where each path is first named
    assert where["/tmp"] < where["/tmp/repo/.git"]
    assert where["/srv/peerd"] < where[str(WT)] and where["/srv/peerd"] < where[str(HOME / "agent.sock")]
    assert max(i for i, a in enumerate(args) if a == "--remount-ro") > where[str(WT)]


def test_on_one_path_a_bind_beats_a_hide_and_read_only_beats_writable() -> None:
    in_place = conf(cwd=CHECKOUT, worktree=CHECKOUT, binds=(Mount(CHECKOUT / ".git", writable=True),))
    mounts = in_place.mounts()
    assert ("write", CHECKOUT) in mounts and ("hide", CHECKOUT) not in mounts  # its checkout, writable
    assert ("read", CHECKOUT / ".git") in mounts and ("write", CHECKOUT / ".git") not in mounts


def test_the_system_is_bound_read_only_and_its_symlinks_kept() -> None:
    system = conf(
        system=(Mount(Path("/usr"), optional=True), Mount(Path("/etc/passwd"), optional=True)),
        symlinks=((Path("/bin"), "usr/bin"),),
    )
    args = bwrap_args(system)
    at = args.index("--symlink")
    assert args[at : at + 3] == ["--symlink", "usr/bin", "/bin"]
    assert at > args.index("/etc/passwd"), "once the directories it lies in exist"
    assert pairs(args, "--ro-bind-try") == ["/usr", "/etc/passwd"]
    assert "/etc/passwd" in pairs(args, "--ro-bind-try") and "/etc" not in args
    # a hidden path below a system directory gets its tmpfs
    below = bwrap_args(dataclasses.replace(system, hidden=(Path("/usr/local/secret"),)))
    assert "/usr/local/secret" in pairs(below, "--tmpfs")


def test_network_and_the_worktrees_writability() -> None:
    assert "--unshare-net" not in bwrap_args(conf(share_net=True))
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
    assert owner.git_dir == repo / ".git" and owner.worktree_writable
    assert user in owner.tmp, "a private, empty home"
    assert Path("/usr") in [m.path for m in owner.system]
    assert Mount(socket_dir / "x-agent.sock", writable=True, optional=True) in owner.binds
    assert owner.private == (home, socket_dir)  # names dropped from the inherited environment
    link = profile(by_link=True, **{**common, "runtime_mode": "full-access"})  # type: ignore[arg-type]
    assert user in link.tmp and link.by_link and link.worktree_writable
    assert bwrap_args(link)[:4] == ["--dev", "/dev", "--proc", "/proc"], "a link's full-access run too"
    same = profile(by_link=False, **{**common, "agent_socket": socket_dir / "x.sock"})  # type: ignore[arg-type]
    assert not [b for b in same.binds if b.path.name.endswith(".sock")], "never the owner socket"
    # The notice says what the run may write: at approval-required, what a person approves.
    assert "its worktree (writable)" in owner.describe()
    asking = profile(by_link=True, **{**common, "runtime_mode": "approval-required"})  # type: ignore[arg-type]
    assert not asking.worktree_writable
    assert "its worktree (read-only, except the edits and commands a person approves" in asking.describe()
    planning = profile(  # type: ignore[arg-type]
        by_link=True, **{**common, "runtime_mode": "approval-required", "interaction_mode": "plan"}
    )
    reading = profile(by_link=True, **{**common, "runtime_mode": "read-only"})  # type: ignore[arg-type]
    assert (
        "its worktree (read-only)" in planning.describe() and "its worktree (read-only)" in reading.describe()
    )


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
    assert check_confinement(facts()) is None  # not looked at
    works = check_confinement(facts(confinement=ConfinementFacts(True, "bubblewrap works (/usr/bin/bwrap).")))
    assert works is not None and works.status == "ok" and "linked machines' runs" in works.detail
    assert len(works.table) == len(sandbox.VISIBLE) and "absent" in works.table[-1]
    here = ConfinementFacts(
        True, "works.", etc_left_out=("/etc/shadow",), readable=("/opt/tools",), run_as=65534
    )
    shown = check_confinement(facts(confinement=here))
    assert shown is not None and shown.table[-3:] == (
        "left out of /etc here     /etc/shadow",
        "added by the owner        /opt/tools",
        "runs as                   uid 65534, not root, with no capabilities",
    )
    assert shown.wire()["table"] == list(shown.table)
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


def test_etc_is_shown_without_what_only_its_owner_may_read_or_the_listed_secrets(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "private").mkdir(mode=0o700)
    (etc / "ssh").mkdir()
    (etc / "apt" / "sources.list.d").mkdir(parents=True)
    files = {
        "passwd": 0o644,
        "shadow": 0o640,
        "ssl/certs/ca.pem": 0o644,
        "ssl/openssl.cnf": 0o644,
        "ssh/ssh_config": 0o644,
        "ssh/ssh_host_ed25519_key.pub": 0o644,  # world-readable, and still a host key's name
        "apt/sources.list.d/x.list": 0o644,
        "wireguard.conf": 0o644,
    }
    for name, mode in files.items():
        (etc / name).write_text(name)
        (etc / name).chmod(mode)
    (etc / "ssl" / "private").chmod(0o700)
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/UTC")
    plan = etc_plan(etc, denied=("ssh/ssh_host_*", "wireguard*"))
    bound = {p.relative_to(etc).as_posix() for p in plan.binds}
    # a directory with nothing denied below it is bound whole; one with something denied is entered
    assert bound == {"apt", "passwd", "ssl/certs", "ssl/openssl.cnf", "ssh/ssh_config"}
    assert {p.relative_to(etc).as_posix() for p in plan.denied} == {
        "shadow",
        "ssl/private",
        "ssh/ssh_host_ed25519_key.pub",
        "wireguard.conf",
    }
    assert plan.symlinks == ((etc / "localtime", "/usr/share/zoneinfo/UTC"),)


def test_this_machines_system_view_holds_no_secret_of_etc() -> None:
    found = system_mounts(now=-1e9)  # made now, not cached
    shown = [m.path for m in found.mounts]
    assert Path("/usr") in shown and all(not m.writable for m in found.mounts)
    for secret in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssl/private"):
        assert not [p for p in shown if Path(secret).is_relative_to(p)], secret
    for nothing in ("/home", "/root", "/srv", "/opt", "/var", "/run", "/mnt", "/tmp"):
        assert not [p for p in shown if Path(nothing).is_relative_to(p) or p.is_relative_to(nothing)], nothing


def test_the_visibility_table_is_the_one_in_the_security_docs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    for row in sandbox.VISIBLE:
        assert row.markdown() in docs, row


def test_a_run_with_a_uid_of_its_own_drops_to_it_inside_after_its_paths_are_granted() -> None:
    who = RunAs(65534, 65534)
    confined = conf(run_as=who, worktree_writable=False, binds=(*conf().binds, Mount(Path("/s"), own=True)))
    argv = sandbox.command(confined, ["agent"], bwrap="/usr/bin/bwrap", python="/py")
    # outside, as root: the grants, then bwrap (so bwrap reaches every path it binds)
    assert argv[:4] == ["/py", "-I", "-S", str(sandbox.RUNAS_SCRIPT)] and argv[4] == "65534"
    cut = argv.index("--", 5)
    grants = [Grant.from_arg(g) for g in argv[5:cut]]
    assert grants == [
        Grant(WT, write=False, recursive=True),  # the worktree as it is shown: read-only here
        Grant(HOME / "agent.sock", write=True, recursive=True),
        Grant(Path("/s"), write=False, recursive=True),  # its own scratch dir
    ], "never the git dir, the system or the Python installation"
    assert argv[cut : cut + 2] == ["--", "/usr/bin/bwrap"]
    args = argv[cut + 2 : argv.index("--", cut + 2)]
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert pairs(args, "--cap-add") == ["CAP_SETUID", "CAP_SETGID"]  # for the drop only
    assert args[args.index("/tmp") - 3 : args.index("/tmp")] == ["--perms", "1777", "--tmpfs"]
    # the parents bwrap would make 0700 root are made 0755 first
    assert args[args.index("/srv") - 3 : args.index("/srv")] == ["--perms", "0755", "--dir"]
    inner = argv[argv.index("--", cut + 2) + 1 :]
    assert inner[:4] == ["/py", "-I", "-S", "-c"] and "setresuid" in inner[4] and "CapEff" in inner[4]
    assert inner[5:] == ["65534", "65534", "agent"]
    plain = sandbox.command(conf(), ["agent"], bwrap="/usr/bin/bwrap", python="/py")
    assert "--cap-add" not in plain and "setresuid" not in plain[4] and str(sandbox.RUNAS_SCRIPT) not in plain


def test_who_a_confined_run_runs_as() -> None:
    assert runas.decide(1000, {}) is None, "peerd's own uid when peerd is not root"
    assert runas.decide(0, {}) == RunAs(65534, 65534)
    assert runas.decide(0, {runas.RUN_AS_ENV: "1234:1235"}) == RunAs(1234, 1235)
    for bad in ("0:0", "x:1", "12", ""):
        assert runas.decide(0, {runas.RUN_AS_ENV: bad}) == RunAs(65534, 65534), bad
    # root of a user namespace that does not map the run's uid (unshare -r, a rootless container)
    host = "         0          0 4294967295\n"
    assert runas.decide(0, {}, uid_map=host, gid_map=host) == RunAs(65534, 65534)
    assert runas.decide(0, {}, uid_map="0 1000 1\n", gid_map=host) is None
    assert runas.decide(0, {}, uid_map=host, gid_map="0 1000 1\n") is None
    assert runas.decide(0, {}, uid_map="0 100000 65536\n", gid_map="0 100000 65536\n") == RunAs(65534, 65534)
    assert runas.mapped("0 100000 65536\n", 65535) and not runas.mapped("0 100000 65536\n", 65536)


def test_without_acls_for_its_worktree_the_run_keeps_peerds_uid_and_says_why(tmp_path: Path) -> None:
    unsupported = OSError(95, "Operation not supported")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runas, "grant_one", lambda *a, **k: (_ for _ in ()).throw(unsupported))
        mp.setattr(runas, "decide_here", lambda env: RunAs(65534, 65534))
        built = profile(
            home=tmp_path / "home",
            owner_socket=tmp_path / "home" / "peerd.sock",
            agent_socket=None,
            checkouts=[],
            checkout=tmp_path,
            worktree=tmp_path,
            scratch=tmp_path / "s",
            by_link=True,
            runtime_mode="auto",
            interaction_mode="default",
        )
    assert built.run_as is None and built.note and "no POSIX ACLs" in built.describe()


def test_an_acl_entry_for_the_runs_uid_keeps_the_owners_bits_and_widens_the_mask() -> None:
    base = runas.from_mode(0o640)
    assert runas.decode(runas.encode(base)) == sorted(base)
    granted = runas.with_user(base, 65534, 7)
    assert (
        (0x01, 6, 0xFFFFFFFF) in granted
        and (0x04, 4, 0xFFFFFFFF) in granted
        and (0x20, 0, 0xFFFFFFFF) in granted
    )
    assert (0x02, 7, 65534) in granted and (0x10, 7, 0xFFFFFFFF) in granted
    assert runas.allows(granted, 65534, 7) and not runas.allows(base, 65534, 4)
    assert runas.with_user(granted, 65534, 4) == granted, "idempotent, never narrower"
    masked = [e for e in granted if e[0] != 0x10] + [(0x10, 4, 0xFFFFFFFF)]
    assert not runas.allows(masked, 65534, 6), "the mask limits a named user"
    with pytest.raises(ValueError):
        runas.decode(b"\x01\x00\x00\x00")


@pytest.mark.skipif(os.geteuid() != 0, reason="granting another uid needs root")
def test_granted_paths_are_reachable_by_the_runs_uid_and_nothing_else_changes() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as made:  # its ancestors let others in
        tmp_path = Path(made)
        tmp_path.chmod(0o755)
        granted_tree(tmp_path)


def granted_tree(tmp_path: Path) -> None:
    tree = tmp_path / "wt"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("mine")
    (tree / "sub" / "f").chmod(0o600)
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o700)
    (tree / "link").symlink_to("/etc/hostname")
    other = tmp_path / "other"
    other.write_text("not granted")
    other.chmod(0o600)
    outside = tmp_path / "outside"
    outside.write_text("lives elsewhere too")
    outside.chmod(0o600)
    (tree / "hard").hardlink_to(outside)
    modes = {p: p.stat().st_mode for p in (tree / "sub" / "f", tree / "run.sh")}
    assert runas.apply([Grant(tree, write=True, recursive=True)], 65534) == []
    assert runas.apply([Grant(tree, write=True, recursive=True)], 65534) == [], "again: nothing to do"

    def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
        drop = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        return subprocess.run([*drop, *argv], capture_output=True, text=True, check=False)

    assert as_nobody("cat", str(tree / "sub" / "f")).stdout == "mine"
    assert (
        as_nobody("sh", "-c", f"echo more >> {tree / 'sub' / 'f'} && touch {tree / 'sub' / 'new'}").returncode
        == 0
    )
    assert as_nobody("cat", str(other)).returncode != 0, "only what was granted"
    assert as_nobody("cat", str(tree / "hard")).returncode != 0, "a hard link is not handed out"
    # the owner's bits are as they were (the ACL's mask shows in the group bits); x stays x
    for path, mode in modes.items():
        now = path.stat().st_mode
        assert now & 0o707 == mode & 0o707, path
    assert (tree / "run.sh").stat().st_mode & 0o100
    assert str((tree / "link").readlink()) == "/etc/hostname"


def test_the_owners_additions_never_show_what_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "identity").mkdir(parents=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    monkeypatch.setenv(sandbox_profile.READABLE_ENV, f"{home / 'identity'}:{tools}")
    built = profile(
        home=home,
        owner_socket=home / "peerd.sock",
        agent_socket=None,
        checkouts=[],
        checkout=tmp_path,
        worktree=tmp_path / "wt",
        scratch=home / "runs" / "r",
        by_link=True,
        runtime_mode="auto",
        interaction_mode="default",
    )
    shown = [b.path for b in built.binds]
    assert tools in shown and home / "identity" not in shown


_PART = st.sampled_from(["a", "b", "usr", "etc", "a.b", ".."])


@given(
    path=st.lists(_PART, min_size=0, max_size=4),
    tops=st.lists(st.lists(_PART, min_size=0, max_size=4), max_size=6),
)
def test_below_any_is_is_relative_to_over_the_set(path: list[str], tops: list[list[str]]) -> None:
    """The mounts' ancestor check answers as `is_relative_to` against each top would (it is taken
    from the path's parents instead of the ~170 mounts, which made launches quadratic)."""
    p = Path("/", *path)
    top_paths = {Path("/", *t) for t in tops}
    assert sandbox._below_any(p, top_paths) == any(p.is_relative_to(t) for t in top_paths)


def _dirs_made_by_the_first_rule(conf: Confinement) -> list[str]:
    """The `--perms 0755 --dir` arguments as bwrap_args made them when first written (the oracle):
    each mount's parents, highest first, unless made already or at or below something bound."""
    covered: list[Path] = [Path("/dev"), Path("/proc")]
    made: set[Path] = set()
    out: list[str] = []
    for kind, path in conf.mounts():
        for parent in reversed(path.parents[:-1]):
            if parent not in made and not any(parent.is_relative_to(c) for c in covered):
                out.append(str(parent))
                made.add(parent)
        if kind in ("tmp", "hide"):
            made.add(path)
        else:
            covered.append(path)
    return out


_ABS = st.lists(_PART, min_size=0, max_size=4).map(lambda parts: Path("/", *parts))  # "/" too


@given(
    tmp=st.lists(_ABS, max_size=3),
    hidden=st.lists(_ABS, max_size=3),
    binds=st.lists(st.tuples(_ABS, st.booleans()), max_size=6),
)
def test_the_run_s_uid_gets_the_same_parent_dirs_as_the_first_rule(
    tmp: list[Path], hidden: list[Path], binds: list[tuple[Path, bool]]
) -> None:
    """bwrap_args works on strings in O(depth) per mount; what it makes is what the first,
    quadratic rule made."""
    profile_ = conf(
        tmp=tuple(tmp),
        hidden=tuple(hidden),
        binds=tuple(Mount(p, writable=w) for p, w in binds),
        run_as=RunAs(65534, 65534),
    )
    args = bwrap_args(profile_)
    made = [args[i + 3] for i, a in enumerate(args) if a == "--perms" and args[i + 1] == "0755"]
    assert made == _dirs_made_by_the_first_rule(profile_)
