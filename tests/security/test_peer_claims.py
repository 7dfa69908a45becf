"""What a peer says is checked or shown as a claim, never taken as fact (two real daemons).

Labels and titles from peers are stored and printed without control characters; a forged
`delegatedFrom` is shown as the link's claim; a link is stored under the environment id of its
pinned certificate's key, never one the box only claims; a box's token answer must be usable and
may not widen the access asked for. Malformed requests: tests/security/test_bad_input.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from peerd import contracts as c
from peerd.cli.main import cli
from peerd.cli.output import fields, table
from peerd.core import pairing_code
from peerd.core.text import clean_label, strip_controls
from peerd.errors import PeerdError
from peerd.peer.client import PAIRING_GRANT
from peerd.peer.identity import load_or_create_identity
from tests.helpers import Pair, make_repo, pinned_server, script, two_daemons, wait_terminal
from tests.support.raw import code_parts, network_raw, snapshot

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x9b1m\r\x08\u202e"


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        yield p


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    async with pinned_server(app, identity) as url:
        server.url = url
        yield server


@pytest.mark.slow
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


@pytest.mark.slow
async def test_a_link_is_stored_under_its_certificates_id(pair: Pair) -> None:
    linked = await pair.link("auto")
    assert pair.box.identity is not None
    assert linked["environmentId"] == pair.box.identity.env_id == pair.box_id


def own_code(real: pairing_code.PairingCode, impostor: Impostor) -> str:
    """A code that is honest about the impostor: its own id, its own certificate."""
    impostor.claimed = impostor.env_id
    own = dataclasses.replace(
        real, env_id=impostor.env_id, urls=(impostor.url,), fingerprint=impostor.fingerprint
    )
    return own.encode()


@pytest.mark.slow
async def test_a_box_label_with_escapes_is_stored_clean(pair: Pair, impostor: Impostor) -> None:
    impostor.label = f"evil{ESCAPES}box"
    code = own_code(pairing_code.decode(await pair.code("auto")), impostor)
    linked = await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    assert linked["label"] == "evil box"
    [stored] = (await pair.lc.call("GET", "/v1/environments", params={"probe": "false"}))["items"]
    assert stored["label"] == "evil box"


@pytest.mark.slow
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


@pytest.mark.slow
async def test_a_box_cannot_widen_the_access_the_laptop_asked_for(pair: Pair, impostor: Impostor) -> None:
    impostor.token_body = (
        b'{"access_token": "a.b.c", "refresh_token": "r", "client_id": "c", "expires_in": 900,'
        b' "scope": "full-access"}'
    )
    code = own_code(pairing_code.decode(await pair.code("auto")), impostor)
    linked = await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "read-only"})
    assert linked["access"] == "read-only"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        {"access_token": "a", "refresh_token": "r", "expires_in": float("inf")},
        {"access_token": "a", "refresh_token": "r", "expires_in": "900"},
        {"access_token": "a", "expires_in": 900},
        ["not", "an", "object"],
    ],
)
async def test_a_box_answering_a_refresh_with_unusable_tokens_changes_nothing(
    pair: Pair, answer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pair.link("auto")
    peers = pair.laptop.peers
    assert peers is not None
    before = await peers.load_link(pair.box_id)

    async def post_form(*_: Any, **__: Any) -> tuple[int, Any]:
        return 200, answer

    monkeypatch.setattr(peers, "post_form", post_form)
    with pytest.raises(PeerdError) as refused:
        await peers.access_token(pair.box_id, force_refresh=True)
    assert refused.value.code == "unreachable"
    after = await peers.load_link(pair.box_id)
    assert (after.refresh_token, after.access_token) == (before.refresh_token, before.access_token)
    listed = await pair.lc.call("GET", "/v1/environments", params={"probe": "false"})
    assert [e["environmentId"] for e in listed["items"]] == [pair.box_id]


async def test_a_box_answer_over_the_size_bound_is_not_taken() -> None:
    """A box cannot fill the laptop's memory: every answer of a box is read through `read_answer`,
    which stops at MAX_ANSWER_BYTES (real HTTP on loopback, a body one byte over)."""
    from peerd.peer.client import MAX_ANSWER_BYTES, read_answer  # noqa: PLC0415

    # A small answer, one of several MiB (read whole, in many chunks), and one a byte over the bound.
    medium = b'{"pad": "' + b"y" * (3 * 1024 * 1024) + b'"}'
    sizes = {
        "/small": b'{"ok": true}',
        "/medium": medium,
        "/big": b'{"pad": "' + b"x" * (MAX_ANSWER_BYTES - 10) + b'"}',
    }

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=sizes[request.path], content_type="application/json")

    app = web.Application()
    app.router.add_get("/{name}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{host}:{port}/small") as resp:
                assert await read_answer(resp) == {"ok": True}
            async with session.get(f"http://{host}:{port}/medium") as resp:
                assert len((await read_answer(resp))["pad"]) == 3 * 1024 * 1024
            async with session.get(f"http://{host}:{port}/big") as resp:
                assert len(sizes["/big"]) == MAX_ANSWER_BYTES + 1
                with pytest.raises(ValueError, match="over"):
                    await read_answer(resp)
    finally:
        await runner.cleanup()
