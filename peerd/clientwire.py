"""What both clients of the owner socket share: the CLI's synchronous one (`peerd/cli/client.py`)
and the asyncio one (`peerd/api/localclient.py`). Standard library only, so the CLI stays light.

The request/answer rules:
- `--env` (`environment_id`) adds `environmentId`: to the query of a GET, to the body otherwise;
- `path` is already encoded (ids as `core.text.path_segment`s) and sent as is; query values are
  percent-encoded here, booleans as `true`/`false`, `None` values left out;
- an answer that is not JSON is a `PeerdError`; an error answer `{code, message}` is raised as the
  typed error of its code (`errors.from_body`);
- no daemon at the socket -> `DaemonNotRunning`; a daemon that drops the connection, or says
  nothing for `READ_TIMEOUT_S`, -> `DaemonConnectionError`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from peerd.errors import PeerdError, from_body

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 70.0  # long-polls last up to 50 s on the wire; allow for that plus slack


class DaemonConnectionError(ConnectionError):
    """The daemon took the call but closed the connection, or went silent, before it answered."""


def with_environment(
    method: str, body: dict[str, Any] | None, params: dict[str, Any] | None, environment_id: str | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """`--env`: every call names this linked environment, so it runs there through the link."""
    if environment_id is None:
        return body, params
    if method == "GET":
        return body, {"environmentId": environment_id, **(params or {})}
    return {"environmentId": environment_id, **(body or {})}, params


def query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def query_string(params: dict[str, Any] | None) -> str:
    """`k=v&...` with keys and values percent-encoded; `None` values are left out."""
    return "&".join(
        f"{quote(str(k), safe='')}={quote(query_value(v), safe='')}"
        for k, v in (params or {}).items()
        if v is not None
    )


def decode_answer(status: int, raw: bytes) -> Any:
    """The JSON of an answer, or its typed error. An empty body is `None` (as aiohttp's json())."""
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if text.strip() else None
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise PeerdError(f"The daemon sent a response that is not JSON (HTTP {status}).") from None
    if status >= 400:
        if isinstance(data, dict) and "code" in data and "message" in data:
            raise from_body(data)
        raise PeerdError(f"The daemon answered HTTP {status}.")
    return data
