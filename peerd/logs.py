"""Structured logging: one structlog chain for our records and for stdlib ones (aiohttp, mcp, ...).

Everything goes to stderr: stdout belongs to the MCP stdio transport. Secrets are redacted twice:
by key name and by pattern before rendering (``redact_secrets``), and by pattern once more on the
rendered line, which also covers tracebacks and exception messages.

Nothing secret at any level (issue 11): only peerd's own loggers follow ``--log-level``; every other
logger (aiosqlite prints SQL parameters at DEBUG, aiohttp, asyncio, authlib, joserfc, mcp, httpx,
urllib3, ...) is held at WARNING, by its level and again by a filter on our handler, so a library
that sets its own level still cannot print below WARNING. Tracebacks are rendered without local
variables in every renderer (structlog's defaults show them, with ``rich`` too): a frame's locals
are where secrets live.

Bind request/task context with ``structlog.contextvars.bind_contextvars(...)``; it is merged into
every record, stdlib ones included.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = [
    "OWN_LOGGER",
    "REDACTED",
    "SECRET_KEYS",
    "THIRD_PARTY_LOGGERS",
    "THIRD_PARTY_MIN_LEVEL",
    "configure_logging",
    "get_logger",
    "redact_secrets",
    "scrub_text",
]

REDACTED = "[REDACTED]"

OWN_LOGGER = "peerd"  # it and its children follow --log-level; every other logger stays at WARNING
THIRD_PARTY_MIN_LEVEL = logging.WARNING
# Named explicitly as well (their level is set, not only inherited), so an early `getLogger(...)
# .setLevel(DEBUG)` in one of them is undone at configure time; the handler filter covers the rest.
THIRD_PARTY_LOGGERS = (
    "a2a",  # the a2a-sdk logs request bodies at DEBUG (a push config's token among them)
    "aiosqlite",
    "asyncio",
    "aiohttp",
    "aiohttp.access",
    "aiohttp.client",
    "aiohttp.internal",
    "aiohttp.server",
    "aiohttp.web",
    "aiohttp.websocket",
    "authlib",
    "joserfc",
    "mcp",
    "httpx",
    "httpx2",
    "httpcore",
    "urllib3",
    "anyio",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "multipart",
    "python_multipart",
    "cryptography",
    "pydantic",
)

# Compared after lowercasing and mapping "-" to "_", so "Set-Cookie" and "X-Api-Key" match too.
SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "access_token",
        "refresh_token",
        "pairing_code",
        "code_secret",
        "code_verifier",  # an agent's OAuth sign-in (api/agent_signin.py)
        "authorization_code",
        "csrf",
        "client_secret",
        "password",
        "token",
        "run_token",
        "peerd_run_token",
        "private_key",
        "cookie",
        "set_cookie",
        "secret",
    }
)

_B64_CHARS = r"[A-Za-z0-9._~+/=-]+"  # RFC 6750 b64token, which also covers our pairing codes
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"(?i)\b(bearer\s+){_B64_CHARS}"), rf"\1{REDACTED}"),
    (re.compile(rf"\b(peerd-pair:){_B64_CHARS}"), rf"\1{REDACTED}"),
    (re.compile(rf"\b(peerd-agent:){_B64_CHARS}"), rf"\1{REDACTED}"),
    # PEERD_RUN_TOKEN=x, PEERD_RUN_TOKEN="x", and the repr of an env dict: 'PEERD_RUN_TOKEN': 'x'
    (
        re.compile(r"""(PEERD_RUN_TOKEN['"]?\s*[=:]\s*)(?:"[^"]*"|'[^']*'|[^\s'",}]+)"""),
        rf"\1{REDACTED}",
    ),
)


def scrub_text(text: str) -> str:
    """``text`` with bearer tokens, pairing codes and run tokens replaced by ``[REDACTED]``."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _is_secret_key(key: object) -> bool:
    return isinstance(key, str) and key.lower().replace("-", "_") in SECRET_KEYS


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        return {k: REDACTED if _is_secret_key(k) else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v) for v in value)
    return value


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: secret keys (any depth) -> ``[REDACTED]``; scrub secrets in strings."""
    for key, value in event_dict.items():
        event_dict[key] = REDACTED if _is_secret_key(key) else _redact(value)
    return event_dict


def _scrubbing(renderer: Processor) -> Processor:
    """Wrap a renderer so the final line is scrubbed too (tracebacks are rendered after redaction)."""

    def render(logger: WrappedLogger, method: str, event_dict: EventDict) -> Any:
        out = renderer(logger, method, event_dict)
        return scrub_text(out) if isinstance(out, str) else out

    return render


def _is_own(name: str) -> bool:
    return name == OWN_LOGGER or name.startswith(OWN_LOGGER + ".")


class _ThirdPartyFloor(logging.Filter):
    """Drops records below WARNING from any logger that is not peerd's, whatever its level says."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= THIRD_PARTY_MIN_LEVEL or _is_own(record.name)


# Tracebacks as frames (file, line, function) and the exception, never the frames' locals.
_dict_tracebacks_without_locals = structlog.processors.ExceptionRenderer(
    ExceptionDictTransformer(show_locals=False)
)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at emit time (like ``logging.lastResort``).

    A stream captured at configure time goes stale under pytest capture or a later redirect.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:  # StreamHandler.setStream; nothing to keep
        pass


def configure_logging(*, json: bool = True, level: int = logging.INFO) -> None:
    """Route structlog and stdlib logging through one redacting chain to stderr. Idempotent."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # No caching: a module-level logger used before configure_logging() would otherwise keep
        # structlog's default (stdout) pipeline forever. The lookup cost is negligible here.
        cache_logger_on_first_use=False,
    )
    renderer: Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
        exc: Processor = _dict_tracebacks_without_locals
    else:
        colors = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        # plain_traceback: the default (rich or better_exceptions when installed) prints locals.
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.plain_traceback
        )
        exc = structlog.dev.set_exc_info
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,  # stdlib records (aiohttp, mcp, authlib) get the same treatment
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            exc,
            _scrubbing(renderer),
        ],
    )
    handler = _StderrHandler()
    handler.setFormatter(formatter)
    handler.addFilter(_ThirdPartyFloor())
    root = logging.getLogger()
    # Replace only our own handler: others (pytest's caplog, an embedding app) stay untouched.
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # The root (so every logger not named below) never goes under WARNING; peerd's follow the flag.
    root.setLevel(max(level, THIRD_PARTY_MIN_LEVEL))
    logging.getLogger(OWN_LOGGER).setLevel(level)
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, THIRD_PARTY_MIN_LEVEL))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger for ``name`` (usually ``__name__``); safe to create at import time."""
    return structlog.stdlib.get_logger(name)
