"""The pure rules of an agent's OAuth sign-in (peerd/core/agent_oauth.py)."""

from __future__ import annotations

import base64
import hashlib

import pytest

from peerd.api.client_metadata import client_from_document
from peerd.core import agent_oauth as rules
from peerd.errors import InvalidClient, InvalidRequest

VERIFIER = "v" * 43 + "-._~"
CHALLENGE = base64.urlsafe_b64encode(hashlib.sha256(VERIFIER.encode()).digest()).decode().rstrip("=")
RESOURCE = "https://box:7433/mcp"


def test_pkce_s256_matches_only_the_verifier() -> None:
    assert rules.pkce_matches(VERIFIER, CHALLENGE)
    assert not rules.pkce_matches(VERIFIER + "x", CHALLENGE)
    assert not rules.pkce_matches(None, CHALLENGE)
    assert not rules.pkce_matches(CHALLENGE, CHALLENGE)  # plain: the challenge as its own verifier
    assert not rules.pkce_matches("short", rules.s256("short"))  # under 43 characters
    assert not rules.pkce_matches("é" * 43, CHALLENGE)


@pytest.mark.parametrize(
    ("given", "allowed"),
    [
        ("https://app.example/cb", True),
        ("https://app.example/cb/", False),
        ("https://app.example/cb?x=1", False),
        ("https://app.example:444/cb", False),
        ("http://127.0.0.1:9999/callback", True),  # a loopback port may vary (RFC 8252 §7.3)
        ("http://127.0.0.1:9999/other", False),
        ("http://localhost:9999/callback", False),  # another host, even a loopback one
        ("http://127.0.0.1:9999/callback#f", False),
        ("http://127.0.0.1:notaport/callback", False),
        ("https://127.0.0.1:9999/callback", False),  # only http loopback varies its port
    ],
)
def test_redirect_uris_match_exactly_but_a_loopback_port(given: str, allowed: bool) -> None:
    registered = ("https://app.example/cb", "http://127.0.0.1:53682/callback")
    assert rules.redirect_allowed(given, registered) is allowed


def authorize(**changes: str | None) -> rules.AuthorizeRequest:
    fields: dict[str, str | None] = {
        "client_id": "dcr_x",
        "redirect_uri": "http://127.0.0.1:1/cb",
        "response_type": "code",
        "state": "s",
        "code_challenge": CHALLENGE,
        "code_challenge_method": "S256",
        "resource": RESOURCE,
    }
    fields.update(changes)
    return rules.check_authorize(**fields, this_resource=RESOURCE)  # type: ignore[arg-type]


def test_an_authorization_request_needs_code_s256_and_this_resource() -> None:
    assert authorize().code_challenge == CHALLENGE
    assert authorize(resource=None).resource == RESOURCE
    for bad in (
        {"response_type": "token"},
        {"code_challenge": None},
        {"code_challenge_method": "plain"},
        {"code_challenge_method": None},
        {"code_challenge": "not-a-challenge"},
        {"resource": "https://elsewhere/mcp"},
        {"client_id": None},
    ):
        with pytest.raises(InvalidRequest):
            authorize(**bad)


def stored(**changes: object) -> rules.StoredCode:
    fields: dict[str, object] = {
        "oauth_client_id": "dcr_x",
        "redirect_uri": "http://127.0.0.1:1/cb",
        "code_challenge": CHALLENGE,
        "resource": RESOURCE,
        "expires_at": 100.0,
        "used": False,
    }
    fields.update(changes)
    return rules.StoredCode(**fields)  # type: ignore[arg-type]


def verdict(code: rules.StoredCode | None, **changes: object) -> str | None:
    fields: dict[str, object] = {
        "client_id": "dcr_x",
        "redirect_uri": "http://127.0.0.1:1/cb",
        "verifier": VERIFIER,
        "resource": None,
        "now": 50.0,
    }
    fields.update(changes)
    return rules.code_verdict(code, **fields)  # type: ignore[arg-type]


def test_a_code_is_worth_something_once_for_its_client_redirect_and_verifier() -> None:
    assert verdict(stored()) is None
    assert verdict(None) == "unknown"
    assert verdict(stored(used=True)) == "reused"
    assert verdict(stored(used=True), verifier="wrong") == "reused"  # reuse wins: it revokes
    assert verdict(stored(), now=100.0) == "expired"
    assert verdict(stored(), client_id="dcr_y") == "client"
    assert verdict(stored(), redirect_uri="http://127.0.0.1:2/cb") == "redirect_uri"
    assert verdict(stored(), redirect_uri=None) == "redirect_uri"
    assert verdict(stored(), resource="https://other/mcp") == "resource"
    assert verdict(stored(), verifier=None) == "pkce"
    assert verdict(stored(), verifier="w" * 43) == "pkce"


@pytest.mark.parametrize(
    ("address", "default", "allowed_private"),
    [
        ("93.184.216.34", True, True),
        ("2606:2800:220:1:248:1893:25c8:1946", True, True),
        ("127.0.0.1", False, True),
        ("::1", False, True),
        ("10.1.2.3", False, True),
        ("192.168.1.1", False, True),
        ("169.254.169.254", False, True),
        ("::ffff:127.0.0.1", False, True),
        ("0.0.0.0", False, False),  # noqa: S104  # an address to refuse, not one to bind
        ("224.0.0.1", False, False),
        ("not an address", False, False),
    ],
)
def test_metadata_fetches_reach_only_global_addresses_by_default(
    address: str, default: bool, allowed_private: bool
) -> None:
    assert rules.address_allowed(address, allow_private=False) is default
    assert rules.address_allowed(address, allow_private=True) is allowed_private


@pytest.mark.parametrize(
    "url",
    ["http://app.example/meta.json", "https://app.example", "https://app.example/", "https://u:p@app.example/m",
     "https://app.example/m#f", "https://" + "a" * 2000 + ".example/m", "https://app.example:99999/m"],
)  # fmt: skip
def test_a_metadata_url_must_be_https_with_a_path(url: str) -> None:
    with pytest.raises(InvalidClient):
        rules.metadata_url_allowed(url)


def test_the_agent_code_reads_back_as_typed() -> None:
    code = rules.agent_code("a1b2c3", "Se-cr_et")
    assert rules.agent_code_parts(code) == ("a1b2c3", "Se-cr_et")
    assert rules.agent_code_parts(" a1b2c3.Se-cr_et \n") == ("a1b2c3", "Se-cr_et")
    assert rules.agent_code_parts("peerd-pair:eyJ2IjoxfQ") is None
    assert rules.agent_code_parts("XYZ.secret") is None
    assert rules.agent_code_parts("") is None


def test_a_sign_in_lasts_thirty_days_or_the_code_max_age() -> None:
    assert rules.signin_expiry(0.0, None) == 30 * 24 * 3600
    assert rules.signin_expiry(0.0, 3600.0) == 3600.0
    assert rules.signin_expiry(0.0, 90 * 24 * 3600.0) == 30 * 24 * 3600


def test_a_metadata_document_names_itself_and_its_redirect_uris() -> None:
    url = "https://app.example/oauth/client.json"
    doc = {"client_id": url, "client_name": "App", "redirect_uris": ["http://127.0.0.1:3000/cb"]}
    client = client_from_document(url, doc)
    assert (client.client_id, client.name, client.redirect_uris) == (
        url,
        "App",
        ("http://127.0.0.1:3000/cb",),
    )
    for bad in (
        {**doc, "client_id": "https://elsewhere.example/c.json"},
        {**doc, "redirect_uris": []},
        {**doc, "redirect_uris": ["http://evil.example/cb"]},
        {**doc, "redirect_uris": "http://127.0.0.1:3000/cb"},
        {**doc, "client_name": 7},
    ):
        with pytest.raises(InvalidClient):
            client_from_document(url, bad)
