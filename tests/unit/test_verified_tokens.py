"""The link auth's cache of verified access tokens (peer/tokens.py:VerifiedTokens): a token is
verified in full once, any other string (a tampered one) in full every time, and an expired one is
refused even though it was verified before."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.peer import tokens
from peerd.peer.tokens import TokenRejected, VerifiedTokens, sign_access_token
from tests.fakeclock import FakeClock

ENV = "env_box"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = tokens.verify_access_token

    def counting(public_key: object, token: str, *, env_id: str) -> tokens.AccessClaims:
        calls.append(token)
        return real(public_key, token, env_id=env_id)  # type: ignore[arg-type]

    monkeypatch.setattr(tokens, "verify_access_token", counting)
    return calls


def test_a_token_is_verified_once_and_its_claims_reused(counted: list[str]) -> None:
    key = Ed25519PrivateKey.generate()
    token, _ = sign_access_token(key, env_id=ENV, client_id="cli_a", access="auto")
    cache = VerifiedTokens(key.public_key(), env_id=ENV)
    first = cache.verify(token)
    assert cache.verify(token) == first == tokens.AccessClaims("cli_a", "auto", first.expires_at)
    assert counted == [token]


def test_a_tampered_or_foreign_token_is_verified_in_full_and_refused(counted: list[str]) -> None:
    key = Ed25519PrivateKey.generate()
    token, _ = sign_access_token(key, env_id=ENV, client_id="cli_a", access="auto")
    cache = VerifiedTokens(key.public_key(), env_id=ENV)
    cache.verify(token)
    header, payload, signature = token.split(".")
    tampered = f"{header}.{payload}.{signature[:-2]}{'AA' if signature[-2:] != 'AA' else 'BB'}"
    forged, _ = sign_access_token(Ed25519PrivateKey.generate(), env_id=ENV, client_id="cli_a", access="auto")
    for bad in (tampered, forged, token + "x"):
        with pytest.raises(TokenRejected):
            cache.verify(bad)
        with pytest.raises(TokenRejected):  # and again: a refusal is never remembered as a pass
            cache.verify(bad)
    assert counted.count(token) == 1 and len(counted) == 7


def test_an_expired_token_is_refused_though_it_was_verified_before() -> None:
    key = Ed25519PrivateKey.generate()
    token, expires = sign_access_token(key, env_id=ENV, client_id="cli_a", access="auto")
    clock = FakeClock(wall=float(expires - 60))
    cache = VerifiedTokens(key.public_key(), env_id=ENV, clock=clock)
    cache.verify(token)
    clock.advance(61.0)
    with pytest.raises(TokenRejected):
        cache.verify(token)


def test_the_cache_is_bounded() -> None:
    key = Ed25519PrivateKey.generate()
    cache = VerifiedTokens(key.public_key(), env_id=ENV)
    for i in range(VerifiedTokens.MAX + 10):
        token, _ = sign_access_token(key, env_id=ENV, client_id=f"cli_{i}", access="read-only")
        cache.verify(token)
    assert len(cache._seen) == VerifiedTokens.MAX
