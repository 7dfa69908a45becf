"""What the fuzzer found, kept as plain tests (the short fuzz stage might not draw them again)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from peerd.peer.identity import pinned_fingerprint
from tests.helpers import running_daemon


@pytest.mark.parametrize("path", ["/oauth/token", "/oauth/revoke"])
@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=x"])
async def test_an_oauth_body_that_is_not_a_readable_form_is_invalid_request(
    tmp_path: Path, path: str, content_type: str
) -> None:
    """Found by schemathesis's content-type probe: a multipart type without its boundary (or a body
    that is not that multipart) was a 500 from the form parser."""
    async with running_daemon(tmp_path / "box") as box, aiohttp.ClientSession() as session:
        assert box.identity is not None
        async with session.post(
            box.advertised_urls()[0] + path,
            data=b"token=abc&grant_type=refresh_token",
            headers={"Content-Type": content_type},
            ssl=pinned_fingerprint(box.identity.fingerprint),
        ) as resp:
            assert resp.status == 400
            body = await resp.json()
    assert body["error"] == "invalid_request"
    assert "x-www-form-urlencoded" in body["error_description"]
