"""Link credentials: short-lived Ed25519-signed access tokens and rotating refresh tokens.

An access token is a JWT (RFC 9068 shape, `typ: at+jwt`) signed with the box's identity key,
audience and issuer = the box's environment id, subject = the client id, with the link's access
level. It proves who the caller is for 15 minutes, but the box still checks on every request
that the client has not been revoked, so revocation takes effect at once.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey
from joserfc.jwt import JWTClaimsRegistry

from peerd.core.access import ACCESS_LEVELS, AccessLevel

ACCESS_TOKEN_TTL_S = 15 * 60
ALGORITHM = "Ed25519"  # joserfc flags the older "EdDSA" name as deprecated (RFC 9864)


class TokenRejected(Exception):
    """The bearer token is not one this box issued, or it expired; the reason is for logs only."""


@dataclass(frozen=True)
class AccessClaims:
    client_id: str
    access: AccessLevel
    expires_at: int


def sign_access_token(
    key: Ed25519PrivateKey, *, env_id: str, client_id: str, access: AccessLevel, ttl: int = ACCESS_TOKEN_TTL_S
) -> tuple[str, int]:
    now = int(time.time())
    claims = {
        "iss": env_id,
        "aud": env_id,
        "sub": client_id,
        "client_id": client_id,
        "access": access,
        "iat": now,
        "exp": now + ttl,
        "jti": secrets.token_urlsafe(12),
    }
    token = jwt.encode(
        {"alg": ALGORITHM, "typ": "at+jwt"}, claims, OKPKey.import_key(key), algorithms=[ALGORITHM]
    )
    return token, now + ttl


def verify_access_token(public_key: Ed25519PublicKey, token: str, *, env_id: str) -> AccessClaims:
    try:
        decoded = jwt.decode(token, OKPKey.import_key(public_key), algorithms=[ALGORITHM])
        JWTClaimsRegistry(
            iss={"essential": True, "value": env_id},
            aud={"essential": True, "value": env_id},
            exp={"essential": True},
            sub={"essential": True},
        ).validate(decoded.claims)
    except (JoseError, ValueError) as exc:
        raise TokenRejected(type(exc).__name__) from None
    access = decoded.claims.get("access")
    if access not in ACCESS_LEVELS:
        raise TokenRejected("unknown access level")
    return AccessClaims(str(decoded.claims["sub"]), access, int(decoded.claims["exp"]))


class VerifiedTokens:
    """Access tokens whose signature and claims were checked, so a link's next request with the
    same token costs a dict lookup, not an Ed25519 verification (a laptop sends one token for up
    to 15 minutes). Keyed by the whole token: any other string, a tampered one included, is
    verified in full. Expiry is checked again at every use, and revocation is not this cache's
    business: the caller still asks the store whether the client is active on every request."""

    MAX = 1024  # tokens kept (each link holds one or two at a time)

    def __init__(
        self, public_key: Ed25519PublicKey, *, env_id: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = public_key
        self._env_id = env_id
        self._clock = clock
        self._seen: dict[str, AccessClaims] = {}

    def verify(self, token: str) -> AccessClaims:
        claims = self._seen.get(token)
        if claims is None:
            claims = verify_access_token(self._key, token, env_id=self._env_id)
            if len(self._seen) >= self.MAX:
                self._seen.pop(next(iter(self._seen)))  # the oldest
            self._seen[token] = claims
        if claims.expires_at < int(self._clock()):  # as joserfc's `exp` check, leeway 0
            self._seen.pop(token, None)
            raise TokenRejected("ExpiredTokenError")
        return claims
