"""Structured logging: one structlog chain for our records and for stdlib ones (aiohttp, mcp, ...).

Everything goes to stderr: stdout belongs to the MCP stdio transport. Secrets are redacted twice:
by key name and by pattern before rendering (``redact_secrets``), and by pattern once more on the
rendered line, which also covers tracebacks and exception messages.

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
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["REDACTED", "SECRET_KEYS", "configure_logging", "get_logger", "redact_secrets", "scrub_text"]

REDACTED = "[REDACTED]"

# Compared after lowercasing and mapping "-" to "_", so "Set-Cookie" and "X-Api-Key" match too.
SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "access_token",
        "refresh_token",
        "pairing_code",
        "code_secret",
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
        exc: Processor = structlog.processors.dict_tracebacks
    else:
        colors = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        renderer = structlog.dev.ConsoleRenderer(colors=colors)
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
    root = logging.getLogger()
    # Replace only our own handler: others (pytest's caplog, an embedding app) stay untouched.
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger for ``name`` (usually ``__name__``); safe to create at import time."""
    return structlog.stdlib.get_logger(name)
