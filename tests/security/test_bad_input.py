"""Bad input from a hostile laptop (or a hostile box): a typed 400, and nothing changes.

Two real daemons on loopback. Every malformed request is sent raw (a client library would refuse
to build most of them) on the box's local socket and, where a read-only link reaches it, on the
network API with a read-only link's token; each one's answer must be `invalid_request` and the row
count of every table of both databases must be the same before and after.

What peers say about themselves (labels, titles, lineage, their environment id, their tokens) is
in tests/security/test_peer_claims.py.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

import peerd.agent_tools  # imported for their wire models (every model counts)
import peerd.api.orchestrate
import peerd.orchestrate.models
import peerd.orchestrate.transport  # noqa: F401
from peerd import contracts as c
from peerd.errors import PeerdError
from peerd.peer.client import PAIRING_GRANT
from tests.helpers import Pair, two_daemons
from tests.support.raw import assert_invalid, code_parts, local_raw, network_raw, snapshot

DEEP = 100_000


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        yield p


async def read_only(pair: Pair) -> Pair:
    await pair.link("read-only")
    return pair


# --- raw requests -----------------------------------------------------------------------------------


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
