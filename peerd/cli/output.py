"""Printing for people (aligned tables, times in local time) and for programs (`--json`, `-q`).

Much of what is printed came from peers (client labels, box labels, thread titles, agent output),
so every table cell and field value goes through `one_line` and every block of text through
`block` (`core.text.strip_controls`): a label cannot move the cursor, clear the screen, retitle
the terminal or hide text, and a title with a line break stays on its row. The stores strip
labels too; this is the second line of defence. `--json` output is JSON-escaped already.

Times: the daemon sends epoch seconds (or ISO 8601); `json_ready` turns every `...At` field into
ISO 8601 UTC with `Z` for programs, and people see `ago` ("3 min ago") in tables and `when`
("2026-05-01 14:03:07 CEST, 3 min ago") in a single record's fields (`peerd/present.py`, shared
with the console).

`--json` alone prints every field; `--json id,status` only those (of each element, for lists); a
field that does not exist is a usage error naming those that do. `-q` prints a list's ids, one per
line. Commands take `--json FIELDS` before or after their arguments: `JsonCommand` tells a field
list from an argument (`peerd thread show --json THREAD_ID` shows that thread in JSON).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from peerd.present import as_datetime, one_line

# --- times ----------------------------------------------------------------------------------------

_TIME_KEY = re.compile(r"(?:[a-z0-9]At|_at)$")


def iso_utc(value: Any) -> Any:
    """ISO 8601 UTC with `Z` and milliseconds, e.g. `2026-05-01T12:03:07.250Z`; other values as
    they are."""
    moment = as_datetime(value)
    if moment is None:
        return value
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_ready(data: Any) -> Any:
    """`data` with every time field (`createdAt`, `expires_at`, ...) as `iso_utc`, at any depth."""
    if isinstance(data, dict):
        return {
            k: iso_utc(v) if _TIME_KEY.search(str(k)) and not isinstance(v, dict | list) else json_ready(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [json_ready(v) for v in data]
    return data


# --- --json [FIELDS] and -q ----------------------------------------------------------------------

ALL_FIELDS = "*"
_FIELD_LIST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:,[A-Za-z][A-Za-z0-9]*)*")


@dataclass(frozen=True)
class JsonOutput:
    """`--json` was given: print JSON, every field (`fields` None) or only these."""

    fields: tuple[str, ...] | None = None


def _json_value(ctx: click.Context, param: click.Parameter, value: str | None) -> JsonOutput | None:
    if value is None:
        return None
    if value in (ALL_FIELDS, ""):
        return JsonOutput()
    if not _FIELD_LIST.fullmatch(value):
        raise click.BadParameter(
            f"{value!r} is not a list of field names; give them comma-separated, e.g. --json id,status.",
            ctx,
            param,
        )
    return JsonOutput(tuple(dict.fromkeys(value.split(","))))


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json [FIELDS]`: the command's parameter `as_json` is a `JsonOutput`, or None."""
    return _json_flag(_json_value)(fn)


def json_option_for(route: str, *extra: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--json [FIELDS]` on a command that changes something: FIELDS are checked against the
    answer of `route` ("POST /v1/threads", from the generated `answer_fields`; `extra` fields the
    command adds) while the options are parsed, so an unknown field is a usage error before
    anything is sent, not after the change was made."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> JsonOutput | None:
        asked = _json_value(ctx, param, value)
        if asked is not None and asked.fields is not None:
            from peerd.cli.answer_fields import ANSWER_FIELDS  # noqa: PLC0415  # big: only for --json FIELDS

            known = (*ANSWER_FIELDS[route], *extra)
            unknown = [f for f in asked.fields if f not in known]
            if unknown:
                raise click.BadParameter(
                    f"No field {', '.join(repr(f) for f in unknown)} in the answer; "
                    f"the fields are: {', '.join(known)}. Nothing was sent.",
                    ctx,
                    param,
                )
        return asked

    return _json_flag(check)


def _json_flag(
    callback: Callable[[click.Context, click.Parameter, str | None], JsonOutput | None],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--json",
        "as_json",
        is_flag=False,
        flag_value=ALL_FIELDS,
        default=None,
        metavar="[FIELDS]",
        callback=callback,
        help="Print JSON for programs; --json id,status prints only those fields.",
    )


def quiet_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help="Print only the ids, one per line.")(fn)


def select(data: Any, fields: Sequence[str] | None) -> Any:
    """Only `fields` of a record, or of each record of a list (in the order asked)."""
    if fields is None or not isinstance(data, dict | list):
        return data
    records = data if isinstance(data, list) else [data]
    known: dict[str, None] = {}
    for record in records:
        if isinstance(record, dict):
            known.update(dict.fromkeys(record))
    unknown = [f for f in fields if f not in known]
    if unknown and records:
        raise click.UsageError(
            f"No field {', '.join(repr(f) for f in unknown)} here; the fields are: {', '.join(known)}."
        )
    picked = [{f: r.get(f) for f in fields} if isinstance(r, dict) else r for r in records]
    return picked if isinstance(data, list) else picked[0]


def _asked() -> JsonOutput | None:
    """The running command's `--json [FIELDS]`, for callers that do not pass it."""
    ctx = click.get_current_context(silent=True)
    value = None if ctx is None else ctx.params.get("as_json")
    return value if isinstance(value, JsonOutput) else None


def emit_json(data: Any, output: JsonOutput | None = None) -> None:
    """`data` as indented JSON, times as ISO 8601 UTC; with `--json FIELDS` (`output`, else the
    running command's) only those fields."""
    output = output or _asked()
    fields = None if output is None else output.fields
    ready = json_ready(select(data, fields))
    click.echo(json.dumps(ready, indent=2, sort_keys=fields is None))


def emit_json_line(data: Any, output: JsonOutput | None = None) -> None:
    """One record as one line of JSON (a stream: `--follow --json`), flushed at once."""
    fields = None if output is None else output.fields
    ready = json_ready(select(data, fields))
    click.echo(json.dumps(ready, sort_keys=fields is None, separators=(",", ":")))
    sys.stdout.flush()


def emit_ids(records: Sequence[dict[str, Any]], key: str) -> None:
    """`-q`: each record's id, one per line."""
    for record in records:
        click.echo(one_line(record.get(key)))


def _required_positionals(command: click.Command) -> int:
    return sum(
        p.nargs for p in command.params if isinstance(p, click.Argument) and p.required and p.nargs > 0
    )


def _positionals(command: click.Command, tokens: Sequence[str]) -> int:
    """How many of `tokens` click will take as arguments (option values skipped)."""
    valued: dict[str, int] = {}
    for p in command.params:
        if isinstance(p, click.Option) and not p.is_flag and not p.count:
            for name in (*p.opts, *p.secondary_opts):
                valued[name] = max(p.nargs, 1)
    count, skip, literal = 0, 0, False
    for arg in tokens:
        if skip:
            skip -= 1
        elif literal:
            count += 1
        elif arg == "--":
            literal = True
        elif arg.startswith("-") and len(arg) > 1:
            skip = valued.get(arg, 0)  # `--opt=value` carries its value
        else:
            count += 1
    return count


def place_json_value(command: click.Command, args: list[str]) -> list[str]:
    """`--json X`: X is the field list when it reads as one and the command's arguments are there
    without it; otherwise X is an argument (or a group's subcommand) and `--json` means every
    field."""
    if "--json" not in args:
        return args
    at = args.index("--json")
    if "--" in args[:at] or at + 1 >= len(args):
        return args
    value = args[at + 1]
    if value.startswith("-") and len(value) > 1:
        return args  # click leaves it for the next option
    rest = [*args[:at], *args[at + 2 :]]
    subcommand = isinstance(command, click.Group) and value in command.commands
    if (
        not subcommand
        and _FIELD_LIST.fullmatch(value)
        and _positionals(command, rest) >= _required_positionals(command)
    ):
        return args
    return [*args[:at], f"--json={ALL_FIELDS}", *args[at + 1 :]]


class JsonCommand(click.Command):
    """A command whose `--json [FIELDS]` never swallows its argument (`place_json_value`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, place_json_value(self, list(args)))


class PeerdGroup(click.Group):
    """A group whose commands are `JsonCommand`s, and whose subgroups are `PeerdGroup`s; its own
    `--json` (`peerd pair --json`) never takes a subcommand's name."""

    command_class = JsonCommand
    group_class = type

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, place_json_value(self, list(args)))


# --- tables and fields ---------------------------------------------------------------------------


def colour_wanted(stream: Any = None, environ: Any = None) -> bool:
    """Colour on a person's terminal: `stream` (stdout) is a tty, `NO_COLOR` is not set
    (no-color.org) and the terminal is not `dumb`."""
    import os  # noqa: PLC0415  # CLI start-up: only the commands that colour ask

    env = os.environ if environ is None else environ
    out = sys.stdout if stream is None else stream
    return bool(out.isatty()) and "NO_COLOR" not in env and env.get("TERM") != "dumb"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[one_line(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """`key  value` lines, aligned; a field with nothing to say (None, empty) is left out, as
    `gh` and `kubectl describe` do (`--json` keeps every field)."""
    shown = [(key, value) for key, value in pairs if value is not None and value not in ("", [])]
    if not shown:
        return
    width = max(len(k) for k, _ in shown)
    for key, value in shown:
        click.echo(f"{key.ljust(width)}  {one_line(value)}")
