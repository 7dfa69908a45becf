"""An outside agent's OAuth sign-in against a real daemon's TLS listener, by hand: the person who
reads the sign-in page and types the pairing code (`Person`), and a raw OAuth client (`Agent`)
that registers, builds authorization URLs with PKCE and exchanges codes. The MCP SDK test drives
the SDK's own client instead and uses only `Person`."""

from __future__ import annotations

import base64
import hashlib
import html
import re
import secrets
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp

from peerd.daemon import Daemon

REDIRECT = "http://127.0.0.1:53682/callback"


def tls_for(daemon: Daemon) -> ssl.SSLContext:
    """Trust exactly this daemon's self-signed certificate (real TLS, hostname checked)."""
    assert daemon.identity is not None
    return ssl.create_default_context(cafile=str(daemon.identity.cert_path))


def base_of(daemon: Daemon) -> str:
    return daemon.advertised_urls()[0].rstrip("/")


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def form_fields(page: str) -> dict[str, str]:
    """The hidden fields of the sign-in page's form."""
    found = re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', page)
    return {html.unescape(k): html.unescape(v) for k, v in found}


def query_of(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query, keep_blank_values=True).items()}


@dataclass
class Person:
    """A browser as a person uses it: keeps the page's cookie, sends the form with its Origin."""

    daemon: Daemon
    session: aiohttp.ClientSession = field(init=False)

    async def __aenter__(self) -> Person:
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            connector=aiohttp.TCPConnector(ssl=tls_for(self.daemon)),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def open(self, url: str) -> aiohttp.ClientResponse:
        resp = await self.session.get(url, allow_redirects=False)
        await resp.read()
        return resp

    async def approve(self, url: str, code: str) -> aiohttp.ClientResponse:
        """Open the sign-in page, type `code`, submit; the answer (a 303 to the client, or the page)."""
        page = await self.open(url)
        assert page.status == 200, await page.text()
        csp = page.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script" not in await page.text()
        fields = {**form_fields(await page.text()), "pairing_code": code}
        resp = await self.session.post(
            base_of(self.daemon) + "/oauth/authorize",
            data=fields,
            allow_redirects=False,
            headers={"Origin": base_of(self.daemon)},
        )
        await resp.read()
        return resp

    async def ask_owner(self, url: str) -> tuple[aiohttp.ClientResponse, str]:
        """Open the sign-in page and press "Ask the owner": the waiting page, and the request's id."""
        page = await self.open(url)
        assert page.status == 200, await page.text()
        fields = {**form_fields(await page.text()), "ask": "1"}
        resp = await self.session.post(
            base_of(self.daemon) + "/oauth/authorize",
            data=fields,
            allow_redirects=False,
            headers={"Origin": base_of(self.daemon)},
        )
        text = await resp.text()
        found = re.search(r"<code>(sir_[0-9a-f]+)</code>", text)
        return resp, found.group(1) if found else ""

    async def poll(self, request_id: str) -> aiohttp.ClientResponse:
        """What the waiting page's refresh gets."""
        return await self.open(
            base_of(self.daemon) + "/oauth/authorize/wait?" + urlencode({"request": request_id})
        )


@dataclass
class Agent:
    """A raw OAuth client (no SDK): registration, authorization URLs, token requests, MCP calls."""

    daemon: Daemon
    redirect_uri: str = REDIRECT
    client_id: str = ""
    session: aiohttp.ClientSession = field(init=False)

    async def __aenter__(self) -> Agent:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls_for(self.daemon)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    @property
    def base(self) -> str:
        return base_of(self.daemon)

    async def register(self, name: str = "test agent", uris: list[str] | None = None) -> str:
        body = {"redirect_uris": uris or [self.redirect_uri], "client_name": name}
        async with self.session.post(self.base + "/oauth/register", json=body) as resp:
            data = await resp.json()
            assert resp.status == 201, data
        self.client_id = str(data["client_id"])
        return self.client_id

    def authorize_url(self, challenge: str | None, **extra: str | None) -> str:
        params: dict[str, str | None] = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "state": "st-1",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "resource": self.base + "/mcp",
            **extra,
        }
        return self.base + "/oauth/authorize?" + urlencode({k: v for k, v in params.items() if v is not None})

    async def token(self, **form: str) -> tuple[int, dict[str, Any]]:
        async with self.session.post(self.base + "/oauth/token", data=form) as resp:
            return resp.status, await resp.json()

    async def exchange(self, code: str, verifier: str, **extra: str) -> tuple[int, dict[str, Any]]:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "client_id": self.client_id,
            "code_verifier": verifier,
            **extra,
        }
        return await self.token(**form)

    async def sign_in(self, pairing: str) -> dict[str, Any]:
        """The whole flow: register, approve with `pairing`, exchange; the token answer."""
        if not self.client_id:
            await self.register()
        verifier, challenge = pkce()
        async with Person(self.daemon) as person:
            resp = await person.approve(self.authorize_url(challenge), pairing)
        assert resp.status == 303, resp.status
        code = query_of(resp.headers["Location"])["code"]
        status, body = await self.exchange(code, verifier)
        assert status == 200, body
        return body

    async def mcp(
        self, token: str | None, method: str, params: dict[str, Any] | None = None
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        resp = await self.session.post(self.base + "/mcp", json=body, headers=headers)
        await resp.read()
        return resp

    async def call_tool(self, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        resp = await self.mcp(token, "tools/call", {"name": name, "arguments": arguments})
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = (await resp.json())["result"]
        return result
