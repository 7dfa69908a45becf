"""Bad input from a hostile laptop (or a hostile box): a typed 400, and nothing changes.

Two real daemons on loopback. Every malformed request is sent raw (a client library would refuse
to build most of them) on the box's local socket and, where a read-only link reaches it, on the
network API with a read-only link's token; each one's answer must be `invalid_request` and the row
count of every table of both databases must be the same before and after.

The display rules are here too: labels and titles from peers are stored and printed without
control characters, a forged `delegatedFrom` is shown as the link's claim, and a link is stored
under the environment id of its pinned certificate's key, never one the box only claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

import peerd.agent_tools  # imported for their wire models (every model counts)
import peerd.api.orchestrate
import peerd.orchestrate.models
import peerd.orchestrate.transport  # noqa: F401
from peerd import contracts as c
from peerd.cli.main import cli
from peerd.cli.output import fields, table
from peerd.core.text import clean_label, strip_controls
from peerd.errors import PeerdError
from peerd.peer import pairing_code
from peerd.peer.client import PAIRING_GRANT
from peerd.peer.identity import load_or_create_identity, pinned_fingerprint, server_ssl_context
from tests.helpers import Pair, make_repo, script, two_daemons, wait_terminal

DEEP = 100_000
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x9b1m\r\x08\u202e"


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        yield p


async def read_only(pair: Pair) -> Pair:
    await pair.link("read-only")
    return pair


# --- raw requests -----------------------------------------------------------------------------------

Answer = tuple[int, Any]


async def local_raw(pair: Pair, method: str, path: str, data: bytes | None = None) -> Answer:
    """A request on the box's local socket, body sent as given."""
    connector = aiohttp.UnixConnector(path=str(pair.box.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(
            method, f"http://peerd{path}", data=data, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def network_raw(
    pair: Pair,
    method: str,
    path: str,
    data: bytes | dict[str, str] | None = None,
    *,
    token: bool = True,
) -> Answer:
    """A request on the box's TLS listener (pinned), with the laptop's link token unless `token=False`."""
    assert pair.laptop.peers is not None and pair.box.identity is not None
    headers = {"Content-Type": "application/json"} if isinstance(data, bytes) else {}
    if token:
        _row, access = await pair.laptop.peers.access_token(pair.box_id)
        headers["Authorization"] = f"Bearer {access}"
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            pair.box_url + path,
            data=data,
            headers=headers,
            ssl=pinned_fingerprint(pair.box.identity.fingerprint),
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def row_counts(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}  # noqa: S608


def snapshot(pair: Pair) -> tuple[dict[str, int], dict[str, int]]:
    return row_counts(pair.laptop.paths.db), row_counts(pair.box.paths.db)


def assert_invalid(answer: Answer) -> str:
    status, body = answer
    assert status == 400, body
    assert isinstance(body, dict) and body.get("code") == "invalid_request", body
    message: str = body["message"]
    return message


def nested(depth: int, key: str = "runs") -> bytes:
    return b'{"' + key.encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"


# --- deeply nested JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/threads", "/v1/pair", "/v1/links", "/v1/watch", "/v1/projects"])
async def test_json_nested_100000_deep_is_a_typed_400_on_the_socket(pair: Pair, path: str) -> None:
    before = snapshot(pair)
    message = assert_invalid(await local_raw(pair, "POST", path, nested(DEEP)))
    assert "nests deeper than" in message
    assert snapshot(pair) == before


@pytest.mark.parametrize("depth", [DEEP, 65])
async def test_json_nested_too_deep_is_a_typed_400_for_a_read_only_link(pair: Pair, depth: int) -> None:
    await read_only(pair)
    before = snapshot(pair)
    message = assert_invalid(await network_raw(pair, "POST", "/v1/watch", nested(depth)))
    assert "nests deeper than 64 levels" in message  # refused before anything walks it
    assert snapshot(pair) == before


async def test_json_at_the_depth_limit_is_parsed(pair: Pair) -> None:
    """The control: 64 levels reach the contract (which names the bad field), not the depth rule."""
    message = assert_invalid(await local_raw(pair, "POST", "/v1/watch", nested(63)))
    assert "nests deeper" not in message and "runs" in message


# --- cursors and other integers that reach SQLite -------------------------------------------------------

TOO_BIG = [str(2**63), str(2**64), "9" * 19, "9" * 40, "-1", "1e3", "0x10"]


@pytest.mark.parametrize("cursor", TOO_BIG)
@pytest.mark.parametrize("path", ["/v1/threads", "/v1/projects"])
async def test_a_cursor_beyond_64_bits_or_not_a_number_is_a_typed_400(
    pair: Pair, path: str, cursor: str
) -> None:
    await read_only(pair)
    before = snapshot(pair)
    assert "cursor" in assert_invalid(await local_raw(pair, "GET", f"{path}?cursor={cursor}"))
    assert "cursor" in assert_invalid(await network_raw(pair, "GET", f"{path}?cursor={cursor}"))
    assert snapshot(pair) == before


async def test_the_largest_cursor_is_accepted(pair: Pair) -> None:
    status, body = await local_raw(pair, "GET", f"/v1/threads?cursor={2**63 - 1}")
    assert (status, body["items"]) == (200, [])


@pytest.mark.parametrize(
    "query",
    [
        f"events?after={2**63}",
        f"events?after={2**70}",
        f"items?afterPosition={2**64}",
        f"items?textOffset={2**64}",
        "wait?timeout=nan",
        "wait?timeout=inf",
        "events?timeout=-inf",
    ],
)
async def test_integers_past_64_bits_and_non_finite_floats_in_queries_are_typed_400s(
    pair: Pair, query: str
) -> None:
    await read_only(pair)
    before = snapshot(pair)
    assert_invalid(await local_raw(pair, "GET", f"/v1/threads/thr_x/{query}"))
    assert_invalid(await network_raw(pair, "GET", f"/v1/threads/thr_x/{query}"))
    assert snapshot(pair) == before


@pytest.mark.parametrize("query", ["after=inf&timeout=1", "after=nan&timeout=1", "after=-inf"])
async def test_a_float_with_no_bound_of_its_own_still_refuses_nan_and_infinity(
    pair: Pair, query: str
) -> None:
    """`after` on an orchestration wait has only `ge=0`: the contract's base config is what stands."""
    before = snapshot(pair)
    assert "finite" in assert_invalid(await local_raw(pair, "GET", f"/v1/orchestrations/orc_x?{query}"))
    assert snapshot(pair) == before


def test_every_wire_model_refuses_nan_and_infinity() -> None:
    def every(cls: type[c.Wire]) -> list[type[c.Wire]]:
        return [cls, *(m for sub in cls.__subclasses__() for m in every(sub))]

    models = every(c.Wire)
    assert len(models) > 40
    assert [m.__name__ for m in models if m.model_config.get("allow_inf_nan") is not False] == []


# --- NaN, Infinity and huge lifetimes: no code spent, no client made --------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"access": "auto", "maxAgeS": Infinity}',
        b'{"access": "auto", "maxAgeS": -Infinity}',
        b'{"access": "auto", "maxAgeS": NaN}',
        b'{"access": "auto", "maxAgeS": 1e400}',
        b'{"access": "auto", "maxAgeS": 1e300}',
        b'{"access": "auto", "ttlS": NaN}',
    ],
)
async def test_pairing_refuses_non_finite_and_huge_numbers(pair: Pair, body: bytes) -> None:
    before = snapshot(pair)
    assert_invalid(await local_raw(pair, "POST", "/v1/pair", body))
    assert snapshot(pair) == before


@pytest.mark.parametrize("max_age", ["Infinity", "NaN", "1e400", "1e300"])
async def test_link_creation_refuses_a_bad_max_age_and_spends_nothing(pair: Pair, max_age: str) -> None:
    code = await pair.code("auto")
    before = snapshot(pair)
    body = f'{{"code": "{code}", "access": "auto", "maxAgeS": {max_age}}}'.encode()
    connector = aiohttp.UnixConnector(path=str(pair.laptop.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://peerd/v1/links", data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        assert_invalid((r.status, await r.json(content_type=None)))
    assert snapshot(pair) == before
    assert (await pair.link("auto", code=code))["status"] == "reachable", "the code is still good"


def code_parts(code: str) -> tuple[str, str]:
    decoded = pairing_code.decode(code)
    return decoded.code_id, decoded.secret


@pytest.mark.parametrize(
    "extra",
    [
        {"max_age": "inf"},
        {"max_age": "1e400"},
        {"max_age": "1e300"},
        {"max_age": "nan"},
        {"client_label": "x" * 10_000},
        {"client_env_id": "E" * 1_000},
    ],
    ids=["inf", "1e400", "1e300", "nan", "long-label", "long-env-id"],
)
async def test_the_token_endpoint_refuses_bad_fields_before_spending_the_code(
    pair: Pair, extra: dict[str, str]
) -> None:
    code = await pair.code("auto")
    code_id, secret = code_parts(code)
    before = snapshot(pair)
    form = {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, **extra}
    status, body = await network_raw(pair, "POST", "/oauth/token", form, token=False)
    assert (status, body["error"]) == (400, "invalid_request"), body
    assert snapshot(pair) == before, "no client, no refresh token, the code not spent"
    assert (await pair.link("auto", code=code))["status"] == "reachable"


async def test_a_stored_unusable_max_age_is_refused_before_the_code_is_spent(pair: Pair) -> None:
    """A code row written before max ages were bounded (Infinity): redeeming it must fail before the
    transaction writes anything, not after the client is made."""
    code = await pair.code("auto")
    code_id, _ = code_parts(code)
    with contextlib.closing(sqlite3.connect(pair.box.paths.db)) as db:
        db.execute("UPDATE pairing_codes SET max_age_s = ? WHERE id = ?", (math.inf, code_id))
        db.commit()
    before = snapshot(pair)
    with pytest.raises(PeerdError) as err:
        await pair.link("auto", code=code)
    assert err.value.code == "pairing_rejected"
    assert "max age" in err.value.message
    assert snapshot(pair) == before
    with contextlib.closing(sqlite3.connect(pair.box.paths.db)) as db:
        assert db.execute("SELECT state FROM pairing_codes WHERE id = ?", (code_id,)).fetchone() == ("open",)


# --- labels and titles: stored and printed without control characters ----------------------------------


def test_strip_controls_removes_what_a_terminal_acts_on() -> None:
    assert strip_controls("lap\x1b[31mtop\x1b[0m") == "laptop"
    assert strip_controls("a\x1b]0;title\x07b\x1b]8;;http://x\x1b\\c") == "abc"
    assert strip_controls("a\x9b2Jb\x85c\x00d\x7fe") == "ab cde"
    assert strip_controls("\u202eevil\u2066") == "evil"
    assert strip_controls("one\r\ntwo\tthree") == "one  two three"
    assert strip_controls("one\r\ntwo\tthree\x1b[2J", multiline=True) == "one\ntwo\tthree"
    assert strip_controls("ok: é 日本 ✓") == "ok: é 日本 ✓"
    assert clean_label(f"  box{ESCAPES}  ") == "box"


def test_cli_tables_and_fields_print_no_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    table(["id", "label"], [["cli_1", f"evil{ESCAPES}label"]])
    fields([("label", f"evil{ESCAPES}label"), ("n", 3)])
    out = capsys.readouterr().out
    assert "evil label" in out
    assert not any(ch in out for ch in "\x1b\x07\x9b\r\x08\u202e")


async def cli_output(home: Path, *args: str) -> str:
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["--home", str(home), *args])
    assert result.exit_code == 0, result.output
    return result.output


def assert_clean(text: str) -> None:
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ch != "\n" and strip_controls(ch) != ch})
    assert not bad, f"control characters printed: {bad}"


async def test_a_client_label_with_escapes_is_stored_and_listed_clean(pair: Pair) -> None:
    code_id, secret = code_parts(await pair.code("auto"))
    form = {
        "grant_type": PAIRING_GRANT,
        "code_id": code_id,
        "code_secret": secret,
        "client_label": f"evil{ESCAPES}laptop",
    }
    status, body = await network_raw(pair, "POST", "/oauth/token", form, token=False)
    assert status == 200, body
    [client] = (await pair.bc.call("GET", "/v1/clients"))["items"]
    assert client["label"] == "evil laptop"
    out = await cli_output(pair.box.paths.home, "client", "list")
    assert "evil laptop" in out
    assert_clean(out)


async def box_project(pair: Pair, tmp_path: Path) -> dict[str, Any]:
    repo = make_repo(tmp_path / "box-repo")
    project: dict[str, Any] = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    return project


async def test_a_link_launch_title_with_escapes_is_stored_and_listed_clean(
    pair: Pair, tmp_path: Path
) -> None:
    project = await box_project(pair, tmp_path)
    await pair.link("auto")
    body = {"projectId": project["id"], "prompt": script({"reply": "hi"}), "title": f"fix{ESCAPES} it"}
    launched = await pair.remote("POST", "/v1/threads", body=body)
    await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    thread = await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["title"] == "fix  it"
    out = await cli_output(pair.box.paths.home, "thread", "list")
    assert "fix  it" in out
    assert_clean(out)


async def test_a_forged_delegated_from_is_shown_as_the_links_claim(pair: Pair, tmp_path: Path) -> None:
    project = await box_project(pair, tmp_path)
    await pair.link("auto")
    forged = {"environmentId": "AAAAAA-AAAAAA-AAAAAA-AAAAAA", "threadId": "thr_forged", "title": "the boss"}
    body = {"projectId": project["id"], "prompt": script({"reply": "ok"}), "delegatedFrom": forged}
    launched = await pair.remote("POST", "/v1/threads", body=body)
    await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    out = await cli_output(pair.box.paths.home, "thread", "show", launched["threadId"])
    lineage = next(line for line in out.splitlines() if "thr_forged" in line)
    assert "(claimed by laptop)" in lineage, lineage
    assert "AAAAAA" not in out


# --- the environment id comes from the pinned certificate --------------------------------------------------


@dataclasses.dataclass
class Impostor:
    """An HTTPS server with its own key that claims to be the box and hands out tokens."""

    url: str = ""
    fingerprint: bytes = b""
    env_id: str = ""
    claimed: str = ""
    label: str = "box"
    token_body: bytes = b""
    seen: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@pytest.fixture
async def impostor(tmp_path: Path, pair: Pair) -> AsyncIterator[Impostor]:
    identity = load_or_create_identity(tmp_path / "impostor")
    server = Impostor(fingerprint=identity.fingerprint, env_id=identity.env_id, claimed=pair.box_id)

    async def anything(request: web.Request) -> web.StreamResponse:
        server.seen.append((request.method, request.path))
        if request.path == "/.well-known/peerd":
            desc = c.Descriptor(
                env_id=server.claimed, label=server.label, version="1", capabilities=["links"]
            )
            return web.json_response(desc.wire())
        if request.path == "/oauth/token" and server.token_body:
            return web.Response(body=server.token_body, content_type="application/json")
        if request.path == "/oauth/token":
            token = {"access_token": "a.b.c", "token_type": "Bearer", "expires_in": 900}
            return web.json_response(
                {**token, "refresh_token": "r", "client_id": "cli_fake", "scope": "auto"}
            )
        return web.json_response({"code": "not_found", "message": "no"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(identity))
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"https://{host}:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def test_a_box_claiming_another_environments_id_is_refused(pair: Pair, impostor: Impostor) -> None:
    """The code and the descriptor both name the real box; the certificate they pin is another key."""
    real = pairing_code.decode(await pair.code("auto"))
    forged = dataclasses.replace(real, urls=(impostor.url,), fingerprint=impostor.fingerprint)
    before = snapshot(pair)
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": forged.encode(), "access": "auto"})
    assert err.value.code == "wrong_environment"
    assert impostor.env_id in err.value.message and pair.box_id in err.value.message
    assert ("POST", "/oauth/token") not in impostor.seen, "nothing secret was sent"
    assert snapshot(pair) == before
    assert (await pair.lc.call("GET", "/v1/environments", params={"probe": "false"}))["items"] == []


async def test_a_link_is_stored_under_its_certificates_id(pair: Pair) -> None:
    linked = await pair.link("auto")
    assert pair.box.identity is not None
    assert linked["envId"] == pair.box.identity.env_id == pair.box_id


def own_code(real: pairing_code.PairingCode, impostor: Impostor) -> str:
    """A code that is honest about the impostor: its own id, its own certificate."""
    impostor.claimed = impostor.env_id
    own = dataclasses.replace(
        real, env_id=impostor.env_id, urls=(impostor.url,), fingerprint=impostor.fingerprint
    )
    return own.encode()


async def test_a_box_label_with_escapes_is_stored_clean(pair: Pair, impostor: Impostor) -> None:
    impostor.label = f"evil{ESCAPES}box"
    code = own_code(pairing_code.decode(await pair.code("auto")), impostor)
    linked = await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    assert linked["label"] == "evil box"
    [stored] = (await pair.lc.call("GET", "/v1/environments", params={"probe": "false"}))["items"]
    assert stored["label"] == "evil box"


@pytest.mark.parametrize(
    "token_body",
    [
        b'{"access_token": "a.b.c", "refresh_token": "r", "client_id": "c", "expires_in": 1e400}',
        b'{"access_token": "a.b.c", "refresh_token": "r", "client_id": "c", "expires_in": 900,'
        b' "refresh_expires_in": NaN}',
        b'{"access_token": "a.b.c", "refresh_token": "r", "client_id": "c", "expires_in": "soon"}',
        b'{"access_token": 7, "refresh_token": "r", "client_id": "c", "expires_in": 900}',
    ],
    ids=["infinite-expiry", "nan-refresh-expiry", "text-expiry", "numeric-token"],
)
async def test_a_box_answering_with_unusable_tokens_links_nothing(
    pair: Pair, impostor: Impostor, token_body: bytes
) -> None:
    impostor.token_body = token_body
    code = own_code(pairing_code.decode(await pair.code("auto")), impostor)
    before = snapshot(pair)
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    assert err.value.code == "pairing_rejected", err.value
    assert snapshot(pair) == before


async def test_a_box_cannot_widen_the_access_the_laptop_asked_for(pair: Pair, impostor: Impostor) -> None:
    impostor.token_body = (
        b'{"access_token": "a.b.c", "refresh_token": "r", "client_id": "c", "expires_in": 900,'
        b' "scope": "full-access"}'
    )
    code = own_code(pairing_code.decode(await pair.code("auto")), impostor)
    linked = await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "read-only"})
    assert linked["access"] == "read-only"
