"""Logging: JSON on stderr, one chain for stdlib records, secrets redacted by key and by pattern."""

from __future__ import annotations

import inspect
import json
import logging
import traceback
from collections.abc import Iterator
from typing import Any, TextIO

import pytest
import structlog
import structlog.dev

from peerd.logs import (
    OWN_LOGGER,
    REDACTED,
    THIRD_PARTY_LOGGERS,
    configure_logging,
    get_logger,
    redact_secrets,
    scrub_text,
)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Leave the root logger, the loggers we set and structlog as we found them, for other tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    names = (OWN_LOGGER, *THIRD_PARTY_LOGGERS, "someone.else")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    out, err = capsys.readouterr()
    assert out == ""  # stdout belongs to MCP stdio
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def test_json_lines_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    get_logger("peerd.test").info("hello", peer="ABCDEF", count=3)
    [line] = json_lines(capsys)
    assert line["event"] == "hello"
    assert line["level"] == "info"
    assert line["logger"] == "peerd.test"
    assert line["peer"] == "ABCDEF"
    assert line["count"] == 3
    assert line["timestamp"].endswith("Z")


def test_secret_keys_are_redacted_at_any_depth(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    get_logger("peerd.test").info(
        "request",
        token="t0",
        Authorization="Basic dXNlcjpwYXNz",
        headers={"Set-Cookie": "sid=1", "Accept": "application/json"},
        items=[{"refresh_token": "r1", "id": 1}, ("keep", {"password": "p"})],
        creds={"client_secret": "cs", "nested": {"private_key": "pk", "run_token": "rt"}},
        pairing_code="pc",
        code_secret="s",
        secret="x",
        cookie="c",
        access_token="a",
    )
    [line] = json_lines(capsys)
    for key in ("token", "Authorization", "pairing_code", "code_secret", "secret", "cookie", "access_token"):
        assert line[key] == REDACTED, key
    assert line["headers"] == {"Set-Cookie": REDACTED, "Accept": "application/json"}
    assert line["items"] == [{"refresh_token": REDACTED, "id": 1}, ["keep", {"password": REDACTED}]]
    assert line["creds"] == {
        "client_secret": REDACTED,
        "nested": {"private_key": REDACTED, "run_token": REDACTED},
    }
    for secret in ("t0", "dXNlcjpwYXNz", "sid=1", "r1", "cs", "pk", "rt"):
        assert secret not in json.dumps(line)


def test_secrets_inside_strings_are_scrubbed(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    log = get_logger("peerd.test")
    log.info("calling peer with Authorization: Bearer eyJhbGciOi.payload.sig-_~+/=")
    log.info("pair with peerd-pair:AbC.12_3~x+y/z=", note="env PEERD_RUN_TOKEN=abc123 next")
    log.info("env", env="{'PEERD_RUN_TOKEN': 'q1w2', 'HOME': '/root'}", args=["bearer zz9"])
    first, second, third = json_lines(capsys)
    assert first["event"] == f"calling peer with Authorization: Bearer {REDACTED}"
    assert second["event"] == f"pair with peerd-pair:{REDACTED}"
    assert second["note"] == f"env PEERD_RUN_TOKEN={REDACTED} next"
    assert third["env"] == f"{{'PEERD_RUN_TOKEN': {REDACTED}, 'HOME': '/root'}}"
    assert third["args"] == [f"bearer {REDACTED}"]


def test_an_agents_sign_in_secrets_are_scrubbed(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    log = get_logger("peerd.test")
    log.info(
        "typed peerd-agent:3f9c0a1b2d4e.Xq3v9TzK0bR2mW8s",
        code_verifier="v" * 43,
        csrf="c",
        authorization_code="a",
    )
    [line] = json_lines(capsys)
    assert line["event"] == f"typed peerd-agent:{REDACTED}"
    assert line["code_verifier"] == line["csrf"] == line["authorization_code"] == REDACTED


def test_stdlib_records_share_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    structlog.contextvars.bind_contextvars(request_id="req-1")
    logging.getLogger("aiohttp.server").error(
        "bad header %s", "Authorization: Bearer zzz", extra={"token": "t", "peer": "p1"}
    )
    [line] = json_lines(capsys)
    assert line["logger"] == "aiohttp.server"
    assert line["level"] == "error"
    assert line["event"] == f"bad header Authorization: Bearer {REDACTED}"
    assert line["token"] == REDACTED
    assert line["peer"] == "p1"
    assert line["request_id"] == "req-1"


def test_exception_messages_are_scrubbed(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    try:
        raise RuntimeError("peer said: Bearer sekrit-value")
    except RuntimeError:
        get_logger("peerd.test").exception("call failed")
    _, err = capsys.readouterr()
    assert "sekrit" not in err
    [line] = [json.loads(x) for x in err.splitlines()]
    assert line["exception"][0]["exc_type"] == "RuntimeError"
    assert line["exception"][0]["exc_value"] == f"peer said: Bearer {REDACTED}"


def test_configuring_twice_keeps_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    configure_logging()
    configure_logging()
    ours = [h for h in root.handlers if type(h).__name__ == "_StderrHandler"]
    assert len(ours) == 1
    assert other in root.handlers  # someone else's handler is left alone
    get_logger("peerd.test").info("once")
    assert [line["event"] for line in json_lines(capsys)] == ["once"]


def test_levels(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level=logging.WARNING)
    log = get_logger("peerd.test")
    log.info("quiet")
    log.warning("loud")
    logging.getLogger("aiohttp.access").info("GET / 200")
    assert [line["event"] for line in json_lines(capsys)] == ["loud"]
    configure_logging(level=logging.DEBUG)
    logging.getLogger("aiohttp.access").info("GET / 200")  # access lines stay at WARNING
    log.debug("detail")
    assert [line["event"] for line in json_lines(capsys)] == ["detail"]


def test_console_mode(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=False)
    get_logger("peerd.test").info("hello console", token="t0", note="Bearer abc")
    logging.getLogger("aiohttp.client").warning("retrying peerd-pair:xyz")
    out, err = capsys.readouterr()
    assert out == ""
    first, second = err.splitlines()
    assert "hello console" in first
    assert "peerd.test" in first
    assert f"token={REDACTED}" in first
    assert "t0" not in first
    assert "abc" not in first
    assert f"retrying peerd-pair:{REDACTED}" in second
    assert "\x1b[" not in err  # no colour codes when stderr is not a terminal
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)


def test_redact_secrets_processor_directly() -> None:
    event = {"event": "x Bearer abc", "TOKEN": "t", "data": ({"Password": "p"}, "ok"), "n": 5}
    out = redact_secrets(None, "info", event)
    assert out == {
        "event": f"x Bearer {REDACTED}",
        "TOKEN": REDACTED,
        "data": ({"Password": REDACTED}, "ok"),
        "n": 5,
    }


def test_scrub_text_prefers_over_redaction() -> None:
    assert scrub_text("peer at 127.0.0.1 said no") == "peer at 127.0.0.1 said no"
    # Any word after "bearer" goes: a false positive in prose is cheaper than a leaked token.
    assert scrub_text("bearer of bad news") == f"bearer {REDACTED} bad news"


@pytest.mark.parametrize("name", [*THIRD_PARTY_LOGGERS, "someone.else", "aiosqlite.core"])
def test_third_party_loggers_stay_at_warning_at_debug(capsys: pytest.CaptureFixture[str], name: str) -> None:
    configure_logging(level=logging.DEBUG)
    other = logging.getLogger(name)
    other.debug("executing %s", "('ref-secret-1',)")
    other.info("info detail")
    other.warning("worth a look")
    get_logger("peerd.store").debug("own detail")
    assert [(line["logger"], line["event"]) for line in json_lines(capsys)] == [
        (name, "worth a look"),
        ("peerd.store", "own detail"),
    ]


def test_a_library_that_lowers_its_own_level_is_still_held(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level=logging.DEBUG)
    logging.getLogger("aiosqlite").setLevel(logging.DEBUG)  # after us: only the filter stands
    logging.getLogger("aiosqlite").debug("executing INSERT ... ('acc-secret',)")
    assert json_lines(capsys) == []


def test_own_loggers_follow_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level=logging.ERROR)
    get_logger("peerd.x").warning("quiet")
    logging.getLogger("aiohttp.server").warning("quiet too")  # never below WARNING, here above it
    get_logger("peerd.x").error("loud")
    assert [line["event"] for line in json_lines(capsys)] == ["loud"]


def _fail_with_secret_local() -> None:
    pairing_secret = "pS3cr3t-in-a-local-variable"  # noqa: F841  # a frame local, never printed
    raise ValueError("boom")


@pytest.mark.parametrize("as_json", [True, False])
def test_tracebacks_never_show_locals(capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    configure_logging(json=as_json)
    try:
        _fail_with_secret_local()
    except ValueError:
        get_logger("peerd.api.app").exception("api.unhandled")
        logging.getLogger("aiohttp.server").exception("Error handling request")
    _, err = capsys.readouterr()
    assert "_fail_with_secret_local" in err  # the frames are there
    assert "boom" in err
    assert "pS3cr3t" not in err
    assert "pairing_secret" not in err


def test_console_tracebacks_stay_plain_even_with_rich_installed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With rich (or better_exceptions) installed, structlog's default formatter prints locals."""

    def locals_showing(sio: TextIO, exc_info: Any) -> None:  # stands in for rich_traceback
        tb = exc_info[2]
        while tb.tb_next is not None:
            tb = tb.tb_next
        sio.write("".join(traceback.format_exception(*exc_info)))
        sio.write(f"locals: {tb.tb_frame.f_locals!r}\n")

    defaults = list(structlog.dev.ConsoleRenderer.__init__.__defaults__ or ())
    index = list(inspect.signature(structlog.dev.ConsoleRenderer.__init__).parameters)
    defaults[index.index("exception_formatter") - 1] = locals_showing
    monkeypatch.setattr(structlog.dev.ConsoleRenderer.__init__, "__defaults__", tuple(defaults))
    monkeypatch.setattr(structlog.dev, "default_exception_formatter", locals_showing)
    monkeypatch.setattr(structlog.dev, "default_monochrome_exception_formatter", locals_showing)
    configure_logging(json=False)
    try:
        _fail_with_secret_local()
    except ValueError:
        get_logger("peerd.x").exception("failed")
    _, err = capsys.readouterr()
    assert "Traceback" in err
    assert "pS3cr3t" not in err
