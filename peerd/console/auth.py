"""Console logins, sans-IO: one-time login tokens, sessions, CSRF tokens.

`peerd console` asks the daemon (owner socket, `POST /v1/console/login-token`) for a login token;
it travels in the URL it prints (`/login?token=...`), is good for `TOKEN_TTL_S` and works once:
the first request that shows it gets a session and the token is gone. The session's id is the
cookie (`HttpOnly`, `SameSite=Strict`, `Secure`); each session has its own CSRF token, which every
change must send back (form field `csrf` or header `X-CSRF-Token`). Sessions end after
`IDLE_S` without a request or `MAX_AGE_S` after the login, and on logout; they live in memory, so
a daemon restart signs everyone out. Tokens and session ids are kept only as SHA-256 hashes and
compared in constant time; none is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TOKEN_TTL_S = 300.0
IDLE_S = 4 * 3600.0
MAX_AGE_S = 24 * 3600.0
MAX_OPEN_TOKENS = 32  # more unused tokens than this: the oldest goes
MAX_SESSIONS = 64  # more sessions than this: the least recently used goes


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Session:
    csrf: str
    created_at: float
    last_seen_at: float
    notices: list[tuple[str, str]] = field(default_factory=list)  # (level, text) for the next page


@dataclass
class Sessions:
    """Login tokens and sessions of one console (all in memory)."""

    now: Callable[[], float] = time.time
    token_ttl_s: float = TOKEN_TTL_S
    idle_s: float = IDLE_S
    max_age_s: float = MAX_AGE_S
    _tokens: dict[str, float] = field(default_factory=dict)  # hash -> expires at
    _sessions: dict[str, Session] = field(default_factory=dict)  # hash of the id -> session

    def issue_token(self) -> tuple[str, float]:
        """A new one-time login token and when it expires."""
        self._drop_expired_tokens()
        while len(self._tokens) >= MAX_OPEN_TOKENS:
            oldest = min(self._tokens, key=self._tokens.__getitem__)
            del self._tokens[oldest]
        token = secrets.token_urlsafe(32)
        expires = self.now() + self.token_ttl_s
        self._tokens[_digest(token)] = expires
        return token, expires

    def exchange(self, token: str) -> tuple[str, Session] | None:
        """A session for a valid token (which is then used up), else None."""
        self._drop_expired_tokens()
        found = None
        wanted = _digest(token)
        for known in list(self._tokens):
            if hmac.compare_digest(known, wanted):
                found = known
        if found is None:
            return None
        del self._tokens[found]
        if len(self._sessions) >= MAX_SESSIONS:
            stale = min(self._sessions, key=lambda k: self._sessions[k].last_seen_at)
            del self._sessions[stale]
        session_id = secrets.token_urlsafe(32)
        now = self.now()
        session = Session(csrf=secrets.token_urlsafe(24), created_at=now, last_seen_at=now)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie (and it counts as used now), else None."""
        if not session_id:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self.now()
        if now - session.last_seen_at > self.idle_s or now - session.created_at > self.max_age_s:
            del self._sessions[key]
            return None
        session.last_seen_at = now
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_digest(session_id), None)

    def end_all(self) -> None:
        self._sessions.clear()
        self._tokens.clear()

    def _drop_expired_tokens(self) -> None:
        now = self.now()
        for key in [k for k, expires in self._tokens.items() if expires <= now]:
            del self._tokens[key]


def csrf_ok(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
