"""`peerd orchestrate`: plan -> implement -> review -> integrate with several coders and machines.

    peerd orchestrate "<task>" [--coder SPEC]... [-n N] [--plan DIR] [--verify CMD]
                      [--reviewer SPEC] [--on ENV]... [--non-interactive] [--allow-command NAME]...
                      [--include-dirty] [--serialize-overlaps] [--keep] [--push REMOTE] [--pr [--ready]]
                      [--until checks|review|merged] [--budget LIMITS] [--packet-budget LIMITS]
    peerd orchestrate status RUN      peerd orchestrate cancel RUN      peerd orchestrate list

The daemon runs the orchestration (it survives a restart); this command starts it and shows its
progress until it ends (Ctrl-C only stops watching; `peerd orchestrate status RUN` picks it up).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import exit_code_of_end, fail, json_option, with_client
from peerd.cli.output import emit_json, table
from peerd.core.text import path_segment
from peerd.errors import PeerdError, UsageError
from peerd.present import ago

FOLLOW_CHUNK_S = 30.0


class _DefaultToRun(click.Group):
    """`peerd orchestrate "<task>" ...` runs; a known subcommand name selects that subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToRun, subcommand_metavar='"TASK" [RUN OPTIONS] | COMMAND [ARGS]...')
def orchestrate() -> None:
    """Plan, implement, verify, review and integrate a change with several coders and machines.

    \b
    peerd orchestrate "TASK" [RUN OPTIONS]   is short for `peerd orchestrate run "TASK" ...`
    peerd orchestrate run --help             the run options
    """


def remember_default(path: Path, coder: str) -> None:
    """Write `default_coder` into the project config (kept out of git by the daemon)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if "default_coder" not in text:
        path.write_text(f'default_coder = "{coder}"\n' + text, encoding="utf-8")
        click.echo(f"Saved default_coder = {coder!r} in {path}.", err=True)


def _toplevel() -> str | None:
    """The top of the working tree here (`git rev-parse --show-toplevel`, through peerd's git
    runner), or None outside one."""
    import asyncio  # noqa: PLC0415  # the CLI imports no asyncio at load (test_cli_startup)

    from peerd.runtime import git  # noqa: PLC0415

    try:
        return str(asyncio.run(git.toplevel(Path.cwd())))
    except (PeerdError, OSError):
        return None


def _project_here(client: LocalClient) -> str:
    top = _toplevel()
    cursor = None
    while True:
        page = client.call("GET", "/v1/projects", params={"cursor": cursor, "limit": 100})
        for project in page["items"]:
            if top is not None and Path(project["path"]).resolve() == Path(top).resolve():
                return str(project["id"])
        cursor = page.get("nextCursor")
        if not cursor:
            break
    return fail(
        UsageError(
            "This directory is not a registered project: pass --project NAME, or `peerd project add .` first."
        )
    )


@orchestrate.command("run")
@click.argument("task", nargs=-1)
@click.option("--project", default=None, help="Project id or name (default: the project of this directory).")
@click.option("--coder", "coders", multiple=True, help="Coder spec [ENV/]BACKEND[:MODEL] (repeatable).")
@click.option(
    "-n", "concurrency", type=click.IntRange(1, 16), default=3, show_default=True, help="Packets in flight."
)
@click.option(
    "--plan", "plan_dir", type=click.Path(path_type=Path), default=None, help="A directory of packet files."
)
@click.option("--verify", default=None, help="The full check run once on the integrated result.")
@click.option(
    "--packet-timeout",
    type=click.FloatRange(min=1),
    default=None,
    help="Stop a coder's turn after this many seconds (it then goes to another coder once).",
)
@click.option(
    "--reviewer", default=None, help="Reviewer coder spec (default: another backend than the implementer)."
)
@click.option(
    "--on",
    "environments",
    multiple=True,
    help="Place coders on this linked environment (repeatable; auto: chosen per hop by capacity).",
)
@click.option("--non-interactive", is_flag=True, help="Never ask; choose by the documented order and log it.")
@click.option("--allow-command", "allow", multiple=True, help="Run this custom command coder (repeatable).")
@click.option(
    "--include-dirty",
    is_flag=True,
    help="Start from your working state (uncommitted and untracked files included); your checkout stays as it is.",
)
@click.option(
    "--allow-out-of-scope",
    is_flag=True,
    help="Integrate packets whose changes go beyond their files (otherwise such a packet is held).",
)
@click.option("--serialize-overlaps", is_flag=True, help="Packets that share files run one after the other.")
@click.option(
    "--keep", is_flag=True, help="Keep the worktrees and thread branches after the run, for a look."
)
@click.option("--push", "push", default=None, metavar="REMOTE", help="Push the integration branch to REMOTE.")
@click.option(
    "--pr", is_flag=True, help="Open a pull request with the report (gh; pushes to --push, default origin)."
)
@click.option("--ready", is_flag=True, help="With --pr: a ready pull request, not a draft.")
@click.option(
    "--until",
    type=click.Choice(["checks", "review", "merged"]),
    default=None,
    help="With --pr: wait until its checks pass, its review approves or it is merged; a failing check "
    "or a review asking for changes gets a fix packet.",
)
@click.option(
    "--budget",
    default=None,
    metavar="LIMITS",
    help="Stop the whole run past tokens=N,usd=X,seconds=S (every run, the planner's too).",
)
@click.option(
    "--packet-budget",
    default=None,
    metavar="LIMITS",
    help="Park a packet past tokens=N,usd=X,seconds=S (its runs, every hop).",
)
@click.option(
    "--access",
    type=click.Choice(["approval-required", "auto-accept-edits", "auto", "full-access"]),
    default="auto",
    show_default=True,
    help="The implementers' access level; approval-required: you approve each command and edit.",
)
@click.option(
    "--detach", is_flag=True, help="Start it and return; follow with `peerd orchestrate status RUN`."
)
@json_option
@click.pass_context
def orchestrate_run(
    ctx: click.Context,
    task: tuple[str, ...],
    project: str | None,
    coders: tuple[str, ...],
    concurrency: int,
    plan_dir: Path | None,
    verify: str | None,
    packet_timeout: float | None,
    reviewer: str | None,
    environments: tuple[str, ...],
    non_interactive: bool,
    allow: tuple[str, ...],
    include_dirty: bool,
    allow_out_of_scope: bool,
    serialize_overlaps: bool,
    keep: bool,
    push: str | None,
    pr: bool,
    ready: bool,
    until: str | None,
    budget: str | None,
    packet_budget: str | None,
    access: str,
    detach: bool,
    as_json: bool,
) -> None:
    """Run TASK: plan it into packets (or take --plan DIR), implement each in its own worktree,
    verify, review, and merge the approved ones into the branch orchestrate/RUN/integrated."""
    body: dict[str, Any] = {
        "task": " ".join(task),
        "coders": list(coders),
        "concurrency": concurrency,
        "packetTimeoutS": packet_timeout,
        "verify": verify,
        "reviewer": reviewer,
        "on": list(environments),
        "nonInteractive": non_interactive or bool(as_json),
        "allowCommands": list(allow),
        "includeDirty": include_dirty,
        "allowOutOfScope": allow_out_of_scope,
        "serializeOverlaps": serialize_overlaps,
        "keep": keep,
        "push": push,
        "pr": pr,
        "ready": ready,
        "until": until,
        "budget": _limits(budget, "--budget"),
        "packetBudget": _limits(packet_budget, "--packet-budget"),
        "access": access,
    }
    if ready and not pr:
        fail(UsageError("--ready is for --pr: add --pr, or drop --ready."))
    if until and not pr:
        fail(
            UsageError(f"--until {until} waits on the pull request the run opens: add --pr, or drop --until.")
        )
    if plan_dir is not None:
        from peerd.orchestrate.verdicts import load_plan_dir  # noqa: PLC0415  # pydantic: only here

        try:
            packets, notes = load_plan_dir(plan_dir, default_verify=verify)
        except PeerdError as exc:  # a file --plan names: the command line is wrong
            fail(UsageError(f"{exc.code}: {exc.message}"))
        for note in notes:
            click.echo(f"plan: {note}", err=True)
        body["plan"] = [p.model_dump(mode="json", by_alias=True) for p in packets]

    def preview(client: LocalClient) -> Any:
        body["projectId"] = project or _project_here(client)
        return client.call("POST", "/v1/orchestrations", body={**body, "dryRun": True})

    resolved = with_client(ctx, preview)
    if resolved.get("defaultOptions") and not coders and not body["nonInteractive"]:
        # No coder named and no default_coder yet: ask once, and remember it in the project config.
        choice = click.prompt(
            "Which coder should implement by default?", type=click.Choice(resolved["defaultOptions"])
        )
        remember_default(Path(resolved["configFile"]), choice)
        body["coders"] = [choice]
        resolved = with_client(ctx, preview)
    for line in resolved["log"]:
        click.echo(f"coder choice: {line}", err=True)
    for line in resolved.get("warnings", []):
        click.echo(f"warning: {line}", err=True)
    if not body["nonInteractive"]:
        for item in resolved["needsConfirmation"]:
            click.echo(
                f"\nCustom coder {item['name']} would run, in each packet's worktree:\n\n  {item['command']}\n"
            )
            if click.confirm(f"Run {item['name']} as a coder?", default=False):
                body["allowCommands"].append(item["name"])

    def start(client: LocalClient) -> Any:
        return client.call("POST", "/v1/orchestrations", body=body)

    info = with_client(ctx, start)
    if not as_json:
        click.echo(
            f"orchestration {info['id']}: base {info['baseCommit'][:12]}, integration branch {info['branch']}"
        )
    if detach:
        emit_json(info) if as_json else click.echo(f"Follow it with `peerd orchestrate status {info['id']}`.")
        return
    final = _follow(ctx, info, quiet=as_json)
    if as_json:
        emit_json(final)
    else:
        render_report(final)
    # 0 only when everything was integrated and verified; 6 cancelled; 5 any other end (failed,
    # not_integrated, check_failed, or completed with packets parked).
    ctx.exit(
        0
        if succeeded(final)
        else exit_code_of_end("cancelled" if final["status"] == "cancelled" else "failed")
    )


def _limits(text: str | None, flag: str) -> dict[str, float | int] | None:
    """`--budget`'s LIMITS, parsed like `peerd thread launch --budget`."""
    if text is None:
        return None
    from peerd.cli.threads import parse_budget  # noqa: PLC0415  # only when given

    try:
        return parse_budget(text)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=flag) from None


def _follow(ctx: click.Context, info: dict[str, Any], *, quiet: bool) -> dict[str, Any]:
    from peerd.orchestrate.report import TERMINAL, progress  # noqa: PLC0415  # stdlib only, lazily

    seen: dict[str, Any] = {}
    while True:
        if not quiet:
            for line in progress(info, seen):
                click.echo(line)
        if info["status"] in TERMINAL:
            return info
        info = with_client(ctx, _waiter(info["id"], info["updatedAt"]))


def _waiter(run_id: str, after: float) -> Callable[[LocalClient], Any]:
    def wait(client: LocalClient) -> Any:
        params = {"after": after, "timeout": FOLLOW_CHUNK_S}
        return client.call("GET", f"/v1/orchestrations/{path_segment(run_id)}", params=params)

    return wait


def succeeded(info: dict[str, Any]) -> bool:
    from peerd.orchestrate.report import succeeded as ok  # noqa: PLC0415  # stdlib only, lazily

    return ok(info)


def render_report(info: dict[str, Any]) -> None:
    from peerd.orchestrate.report import render  # noqa: PLC0415  # stdlib only, lazily

    click.echo("\n" + render(info), nl=False)


@orchestrate.command("status")
@click.argument("run_id")
@click.option("--follow", is_flag=True, help="Keep showing progress until it ends.")
@json_option
@click.pass_context
def orchestrate_status(ctx: click.Context, run_id: str, follow: bool, as_json: bool) -> None:
    """Show an orchestration: packets, hops, receipts and the integration result."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", f"/v1/orchestrations/{path_segment(run_id)}")

    info = with_client(ctx, go)
    if follow:
        info = _follow(ctx, info, quiet=as_json)
    if as_json:
        emit_json(info)
        return
    if not follow:
        from peerd.orchestrate.report import who  # noqa: PLC0415  # stdlib only, lazily

        for packet in info["packets"]:
            # where each hop ran: the implementer, and the reviewer once it has one
            reviewer = f"; reviewer {who(packet['reviewer'])}" if packet.get("reviewer") else ""
            click.echo(f"  {packet['id']:<20} {packet['state']:<12} {who(packet.get('coder'))}{reviewer}")
            if waiting := packet.get("awaitingApproval"):
                click.echo(
                    f"    waiting for your approval: {waiting['summary']} (peerd approval show {waiting['approvalId']})"
                )
    render_report(info)


@orchestrate.command("cancel")
@click.argument("run_id")
@click.option("--reason", default=None, help="Why (recorded with the run).")
@json_option
@click.pass_context
def orchestrate_cancel(ctx: click.Context, run_id: str, reason: str | None, as_json: bool) -> None:
    """Stop every packet of an orchestration, here and on linked machines."""

    def go(client: LocalClient) -> Any:
        return client.call(
            "POST", f"/v1/orchestrations/{path_segment(run_id)}/cancel", body={"reason": reason}
        )

    info = with_client(ctx, go)
    emit_json(info) if as_json else click.echo(f"orchestration {run_id} {info['status']}")


@orchestrate.command("list")
@json_option
@click.pass_context
def orchestrate_list(ctx: click.Context, as_json: bool) -> None:
    """List orchestrations, newest last."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/orchestrations")

    items = with_client(ctx, go)["items"]
    if as_json:
        emit_json(items)
        return
    table(
        ["id", "status", "packets", "branch", "started", "task"],
        [
            [i["id"], i["status"], i["packets"], i["branch"], ago(i["createdAt"]), (i["task"] or "")[:40]]
            for i in items
        ],
    )
