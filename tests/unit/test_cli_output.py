"""The CLI's output layer: JSON times in ISO 8601 UTC, `--json FIELDS` selection, `-q`, times for
people, and table rows that a title's line break cannot split."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner

from peerd.cli.output import (
    JsonOutput,
    PeerdGroup,
    emit_ids,
    emit_json,
    emit_json_line,
    iso_utc,
    json_option,
    json_ready,
    quiet_option,
    select,
    table,
)
from peerd.present import ago, local_time, when

T0 = 1_777_000_000.25  # 2026-04-24T03:06:40.250Z


@pytest.fixture
def in_zone() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_times_in_json_are_iso_8601_utc_whatever_the_daemon_sent() -> None:
    assert iso_utc(T0) == "2026-04-24T03:06:40.250Z"
    assert iso_utc(int(T0)) == "2026-04-24T03:06:40.000Z"
    assert iso_utc("2026-04-24T05:06:40.250+02:00") == "2026-04-24T03:06:40.250Z"
    assert iso_utc("2026-04-24T03:06:40.25Z") == "2026-04-24T03:06:40.250Z"
    assert iso_utc("2026-04-24T03:06:40") == "2026-04-24T03:06:40.000Z"  # no zone: UTC
    assert iso_utc("soon") == "soon" and iso_utc(None) is None
    data = {
        "createdAt": T0,
        "endedAt": None,
        "items": [{"updatedAt": "2026-04-24T05:06:40.250+02:00", "status": "ok", "ttlS": 600}],
        "latestRun": {"startedAt": T0, "exitCode": 0},
        "config": {"expires_at": T0, "format": "text"},
        "flat": True,
    }
    assert json_ready(data) == {
        "createdAt": "2026-04-24T03:06:40.250Z",
        "endedAt": None,
        "items": [{"updatedAt": "2026-04-24T03:06:40.250Z", "status": "ok", "ttlS": 600}],
        "latestRun": {"startedAt": "2026-04-24T03:06:40.250Z", "exitCode": 0},
        "config": {"expires_at": "2026-04-24T03:06:40.250Z", "format": "text"},
        "flat": True,
    }


def test_people_see_local_time_with_its_zone_or_how_long_ago(in_zone: None) -> None:
    assert local_time(T0) == "2026-04-24 05:06:40 CEST"
    assert local_time("2026-01-10T12:00:00Z") == "2026-01-10 13:00:00 CET"
    assert ago(T0, now=T0 + 2) == "just now"
    assert ago(T0, now=T0 + 42) == "42 s ago"
    assert ago(T0, now=T0 + 190) == "3 min ago"
    assert ago(T0, now=T0 + 5 * 3600 + 10) == "5 h ago"
    assert ago(T0, now=T0 + 86400 * 1.5) == "1 day ago"
    assert ago(T0, now=T0 + 86400 * 4) == "4 days ago"
    assert ago(T0, now=T0 - 600) == "in 10 min"
    assert ago(None) == "" and when(None) == ""
    assert when(T0, now=T0 + 190) == "2026-04-24 05:06:40 CEST, 3 min ago"


def test_field_selection_keeps_the_order_asked_and_names_the_fields_that_exist() -> None:
    records = [{"id": "a", "status": "x", "title": "t"}, {"id": "b", "title": "u"}]
    assert select(records, ["status", "id"]) == [{"status": "x", "id": "a"}, {"status": None, "id": "b"}]
    assert select({"id": "a", "n": 1}, ["n"]) == {"n": 1}
    assert select([], ["anything"]) == []
    with pytest.raises(click.UsageError) as err:
        select(records, ["id", "state"])
    assert err.value.message == "No field 'state' here; the fields are: id, status, title."


def test_emitted_json_is_selected_sorted_and_iso(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json({"b": 1, "createdAt": T0, "a": 2})
    assert json.loads(capsys.readouterr().out) == {"a": 2, "b": 1, "createdAt": "2026-04-24T03:06:40.250Z"}
    emit_json([{"id": "x", "createdAt": T0, "z": 1}], JsonOutput(("z", "createdAt")))
    assert (
        capsys.readouterr().out
        == '[\n  {\n    "z": 1,\n    "createdAt": "2026-04-24T03:06:40.250Z"\n  }\n]\n'
    )
    emit_json_line({"seq": 3, "type": "run.updated", "createdAt": T0})
    emit_json_line({"seq": 4, "type": "item.added"}, JsonOutput(("seq",)))
    assert capsys.readouterr().out.splitlines() == [
        '{"createdAt":"2026-04-24T03:06:40.250Z","seq":3,"type":"run.updated"}',
        '{"seq":4}',
    ]
    emit_ids([{"id": "a"}, {"id": "b\x1b[2Jc"}], "id")
    assert capsys.readouterr().out == "a\nbc\n"


def test_a_title_with_a_line_break_stays_on_its_row(capsys: pytest.CaptureFixture[str]) -> None:
    table(["id", "title", "status"], [["thr_1", "first line\nsecond\r\nthird\x1b]0;owned\x07", "active"]])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].split() == ["thr_1", "first", "line", "second", "third", "active"]


@click.group(cls=PeerdGroup)
def demo() -> None:
    pass


@demo.command("show")
@click.argument("thing_id")
@click.option("--reason", default=None)
@json_option
def show(thing_id: str, reason: str | None, as_json: JsonOutput | None) -> None:
    emit_json({"id": thing_id, "reason": reason, "status": "ok"}, as_json) if as_json else click.echo(
        thing_id
    )


@demo.command("send")
@click.argument("thing_id")
@click.argument("text")
@json_option
def send(thing_id: str, text: str, as_json: JsonOutput | None) -> None:
    emit_json({"id": thing_id, "text": text}, as_json)


@demo.command("list")
@click.argument("parent", required=False)
@json_option
@quiet_option
def listing(parent: str | None, as_json: JsonOutput | None, quiet: bool) -> None:
    records = [{"id": "a", "parent": parent, "status": "x"}, {"id": "b", "parent": parent, "status": "y"}]
    if quiet:
        emit_ids(records, "id")
    elif as_json:
        emit_json(records, as_json)


def run(*args: str) -> tuple[int, Any]:
    done = CliRunner().invoke(demo, list(args))
    try:
        return done.exit_code, json.loads(done.output)
    except ValueError:
        return done.exit_code, done.output


@pytest.mark.parametrize(
    ("args", "printed"),
    [
        (["show", "thr_1", "--json"], {"id": "thr_1", "reason": None, "status": "ok"}),
        (["show", "--json", "thr_1"], {"id": "thr_1", "reason": None, "status": "ok"}),
        (["show", "--json", "shop"], {"id": "shop", "reason": None, "status": "ok"}),  # a name, not fields
        (["show", "shop", "--json", "status"], {"status": "ok"}),
        (["show", "--json", "status,id", "shop"], {"status": "ok", "id": "shop"}),
        (["show", "--json=id", "shop"], {"id": "shop"}),
        (["show", "--json", "--reason", "r", "shop"], {"id": "shop", "reason": "r", "status": "ok"}),
        (["show", "--reason", "r", "--json", "shop"], {"id": "shop", "reason": "r", "status": "ok"}),
        (["send", "--json", "thr_1", "hello"], {"id": "thr_1", "text": "hello"}),
        (["send", "thr_1", "--json", "hello"], {"id": "thr_1", "text": "hello"}),
        (["send", "thr_1", "hello", "--json", "text"], {"text": "hello"}),
        (["list", "--json", "id"], [{"id": "a"}, {"id": "b"}]),
        (
            ["list", "--json", "thr_9"],
            [{"id": "a", "parent": "thr_9", "status": "x"}, {"id": "b", "parent": "thr_9", "status": "y"}],
        ),
        (
            ["list", "thr_9", "--json", "parent,id"],
            [{"parent": "thr_9", "id": "a"}, {"parent": "thr_9", "id": "b"}],
        ),
        (["list", "-q"], "a\nb\n"),
    ],
)
def test_json_fields_or_an_argument(args: list[str], printed: Any) -> None:
    code, out = run(*args)
    assert (code, out) == (0, printed)


def test_unknown_fields_and_bad_lists_are_usage_errors() -> None:
    code, out = run("show", "thr_1", "--json", "id,nope")
    assert code == 2 and "No field 'nope' here; the fields are: id, reason, status." in out
    code, out = run("show", "thr_1", "--json=id,,x")
    assert code == 2 and "is not a list of field names" in out


@click.group(cls=PeerdGroup, invoke_without_command=True)
@json_option
@click.pass_context
def maker(ctx: click.Context, as_json: JsonOutput | None) -> None:
    if ctx.invoked_subcommand is None:
        emit_json({"made": True, "id": "m1"}, as_json)


@maker.command("list")
@json_option
def maker_list(as_json: JsonOutput | None) -> None:
    emit_json([{"id": "m1"}], as_json)


def test_a_groups_json_never_takes_a_subcommand_name() -> None:
    runner = CliRunner()
    assert json.loads(runner.invoke(maker, ["--json", "id"]).output) == {"id": "m1"}
    listed = runner.invoke(maker, ["--json", "list"])
    assert (listed.exit_code, json.loads(listed.output)) == (0, [{"id": "m1"}])
