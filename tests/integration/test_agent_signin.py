"""Outside agents sign in to a real daemon's `/mcp` over OAuth 2.1 + PKCE, on its real TLS listener
(issue 29): the official MCP SDK client end to end, then each hostile case by hand.

The test plays the person: it follows the authorization URL, reads the sign-in page and types the
pairing code the owner minted with `peerd pair --for agent` (the CLI, or the owner API)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.oauth2 import AuthorizationCodeResult
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from structlog.testing import capture_logs

from peerd.agent_tools import TOOL_SPECS
from peerd.api.oauth import PAIRING_FAILURES_PER_WINDOW, PAIRING_GRANT
from peerd.config import AgentsConfig, Config
from peerd.core import pairing_code
from peerd.daemon import Daemon
from tests.helpers import LocalClient, client_for, running_daemon, script
from tests.support.cli import ok, peerd
from tests.support.mcp import live_run
from tests.support.signin import REDIRECT, Agent, Person, base_of, pkce, query_of, tls_for


async def agent_code(client: LocalClient, access: str = "auto") -> str:
    data = await client.call("POST", "/v1/pair", body={"access": access, "purpose": "agent"})
    return str(data["code"])


class Memory(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.fixture
async def agent(daemon: Daemon) -> AsyncIterator[Agent]:
    async with Agent(daemon) as a:
        yield a


def launch_args(project: dict[str, Any], reply: str = "hi") -> dict[str, Any]:
    return {"projectId": project["id"], "prompt": script({"reply": reply}), "provider": "script"}


# --- the official SDK client, end to end ---------------------------------------------------------


@pytest.mark.slow
async def test_the_mcp_sdk_signs_in_with_pkce_calls_tools_and_is_refused_after_revoke(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    code = ok(await peerd(daemon.paths.home, "pair", "--for", "agent", "--access", "auto")).strip()
    assert code.startswith("peerd-agent:")
    url = base_of(daemon) + "/mcp"
    authorization: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: dict[str, str] = {}

    async def redirect_handler(auth_url: str) -> None:
        authorization.set_result(auth_url)

    async def callback_handler() -> AuthorizationCodeResult:
        auth_url = await authorization
        seen.update(query_of(auth_url))
        async with Person(daemon) as person:
            resp = await person.approve(auth_url, code)
        assert resp.status == 303, resp.status
        back = query_of(resp.headers["Location"])
        return AuthorizationCodeResult(code=back["code"], state=back.get("state"), iss=back.get("iss"))

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="sdk-test-agent",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
        ),
        storage=Memory(),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    http = httpx2.AsyncClient(auth=provider, verify=tls_for(daemon), timeout=30)
    async with http, Client(streamable_http_client(url, http_client=http)) as session:
        listed = await session.list_tools()
        projects = await session.call_tool("project_list", {})
        launched = await session.call_tool("thread_launch", launch_args(project))
        modern = session.protocol_version
    # The same sign-in over the other revision (2025-11-25: the initialize handshake).
    http = httpx2.AsyncClient(auth=provider, verify=tls_for(daemon), timeout=30)
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as old:
        old_listed = await old.list_tools()
        old_projects = await old.call_tool("project_list", {})
        legacy = old.protocol_version
    assert (modern, legacy) == ("2026-07-28", "2025-11-25")
    assert {tool.name for tool in old_listed.tools} == set(TOOL_SPECS) and not old_projects.is_error
    assert seen["code_challenge_method"] == "S256" and seen["resource"] == url
    assert {tool.name for tool in listed.tools} == set(TOOL_SPECS)
    assert not projects.is_error and projects.structured_content is not None
    assert not launched.is_error, launched.content
    assert launched.structured_content is not None
    thread_id = launched.structured_content["threadId"]

    # The agent is a client of the box, listed with its kind and name, and its thread is its own.
    listed_clients = ok(await peerd(daemon.paths.home, "client", "list"))
    row = next(line for line in listed_clients.splitlines() if "sdk-test-agent" in line)
    assert row.split()[4] == "agent"
    client_id = row.split()[0]
    thread = await client.call("GET", f"/v1/threads/{thread_id}")
    assert thread["linkOrigin"] == client_id

    ok(await peerd(daemon.paths.home, "client", "revoke", client_id, "--yes"))
    http = httpx2.AsyncClient(verify=tls_for(daemon), timeout=30)
    async with http:
        token = provider.context.current_tokens
        assert token is not None
        refused = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={
                "Authorization": f"Bearer {token.access_token}",
                "Accept": "application/json, text/event-stream",
            },
        )
        refreshed = await http.post(
            base_of(daemon) + "/oauth/token",
            data={"grant_type": "refresh_token", "refresh_token": token.refresh_token or ""},
        )
    assert refused.status_code == 401
    assert 'resource_metadata="' in refused.headers["WWW-Authenticate"]
    assert refreshed.status_code == 400 and refreshed.json()["peerd_reason"] == "revoked"
    assert "peerd pair --for agent" in refreshed.json()["error_description"]


# --- discovery ----------------------------------------------------------------------------------


async def test_mcp_without_a_token_points_at_the_metadata(agent: Agent) -> None:
    resp = await agent.mcp(None, "tools/list")
    assert resp.status == 401
    challenge = resp.headers["WWW-Authenticate"]
    assert challenge == f'Bearer resource_metadata="{agent.base}/.well-known/oauth-protected-resource/mcp"'
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        async with agent.session.get(agent.base + path) as got:
            prm = await got.json()
        assert prm["resource"] == agent.base + "/mcp"
        assert prm["authorization_servers"] == [agent.base + "/"]
    async with agent.session.get(agent.base + "/.well-known/oauth-authorization-server") as got:
        asm = await got.json()
    assert asm["issuer"] == agent.base + "/"
    assert asm["code_challenge_methods_supported"] == ["S256"]
    assert asm["client_id_metadata_document_supported"] is True
    assert set(asm["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert asm["response_types_supported"] == ["code"]
    for key in ("authorization_endpoint", "token_endpoint", "registration_endpoint", "revocation_endpoint"):
        assert asm[key].startswith(agent.base + "/oauth/")


# --- what a signed-in agent may do --------------------------------------------------------------


async def test_an_agent_signed_in_read_only_cannot_launch(
    agent: Agent, client: LocalClient, project: dict[str, Any]
) -> None:
    tokens = await agent.sign_in(await agent_code(client, "read-only"))
    assert tokens["scope"] == "read-only"
    result = await agent.call_tool(tokens["access_token"], "thread_launch", launch_args(project))
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("capability_denied: ")
    listed = await agent.call_tool(tokens["access_token"], "project_list", {})
    assert listed.get("isError") is not True


async def test_an_agent_sees_only_its_own_threads(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    owners = await client.call("POST", "/v1/threads", body=launch_args(project, "owner's"))
    async with Agent(daemon) as first, Agent(daemon) as second:
        one = await first.sign_in(await agent_code(client))
        two = await second.sign_in(await agent_code(client))
        mine = await first.call_tool(one["access_token"], "thread_launch", launch_args(project, "first's"))
        assert mine.get("isError") is not True, mine
        first_thread = mine["structuredContent"]["threadId"]
        for thread_id in (first_thread, owners["threadId"]):
            read = await second.call_tool(two["access_token"], "thread_read", {"threadId": thread_id})
            assert read["isError"] is True and read["content"][0]["text"].startswith("thread_not_found: ")
            waited = await second.call_tool(
                two["access_token"], "thread_wait", {"threadId": thread_id, "timeout": 0}
            )
            assert waited["isError"] is True
            sent = await second.call_tool(
                two["access_token"], "thread_send", {"threadId": thread_id, "text": "x"}
            )
            assert sent["isError"] is True
        own = await first.call_tool(one["access_token"], "thread_read", {"threadId": first_thread})
        assert own.get("isError") is not True, own
        # An agent's token is not a link's: /v1 refuses it.
        async with first.session.get(
            first.base + "/v1/threads", headers={"Authorization": f"Bearer {one['access_token']}"}
        ) as resp:
            assert resp.status == 401


@pytest.mark.slow
async def test_an_agent_cannot_read_or_cancel_another_threads_task(
    tmp_path: Path, daemon: Daemon, agent: Agent, client: LocalClient, project: dict[str, Any]
) -> None:
    tokens = await agent.sign_in(await agent_code(client))
    async with live_run(client, project, tmp_path) as run:  # the owner's run delegates a task
        assert daemon.mcp.url is not None
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {run.token}"})
        async with http, Client(streamable_http_client(daemon.mcp.url, http_client=http)) as session:
            delegated = await session.call_tool("delegate_task", {"task": script({"reply": "child"})})
        assert not delegated.is_error and delegated.structured_content is not None, delegated.content
        task_id = delegated.structured_content["taskId"]
        for tool in ("task_status", "task_cancel"):
            result = await agent.call_tool(tokens["access_token"], tool, {"taskId": task_id})
            assert result["isError"] is True, result
            assert result["content"][0]["text"].startswith("task_not_found: ")
        shown = await client.call("GET", f"/v1/tasks/{task_id}")
        assert shown["status"] != "cancelled"


# --- the authorization request ------------------------------------------------------------------


async def test_an_unregistered_redirect_uri_is_shown_never_redirected_to(agent: Agent) -> None:
    await agent.register()
    _, challenge = pkce()
    async with Person(agent.daemon) as person:
        for uri in (
            "http://127.0.0.1:53682/other",
            "https://evil.example/callback",
            "http://127.0.0.1:53682/callback#x",
        ):
            resp = await person.open(agent.authorize_url(challenge, redirect_uri=uri))
            assert resp.status == 400 and "Location" not in resp.headers
            assert "redirect_uri is not one this client registered" in await resp.text()
        # A loopback redirect may change its port (RFC 8252 §7.3), nothing else.
        resp = await person.open(
            agent.authorize_url(challenge, redirect_uri="http://127.0.0.1:40001/callback")
        )
        assert resp.status == 200


async def test_an_unknown_client_is_shown_never_redirected_to(agent: Agent) -> None:
    agent.client_id = "dcr_nobody"
    async with Person(agent.daemon) as person:
        resp = await person.open(agent.authorize_url(pkce()[1]))
    assert resp.status == 400 and "Location" not in resp.headers


@pytest.mark.parametrize(
    ("challenge", "method"), [(None, "S256"), ("x" * 43, "plain"), ("x" * 43, None), ("short", "S256")]
)
async def test_pkce_is_required_and_only_s256(
    agent: Agent, challenge: str | None, method: str | None
) -> None:
    await agent.register()
    url = agent.authorize_url(challenge, code_challenge_method=method)
    async with Person(agent.daemon) as person:
        resp = await person.open(url)
    assert resp.status == 303
    back = query_of(resp.headers["Location"])
    assert back["error"] == "invalid_request" and back["state"] == "st-1"
    assert back["iss"] == agent.base + "/"
    assert "code" not in back


async def test_a_wrong_verifier_is_refused_and_spends_the_code(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    verifier, challenge = pkce()
    async with Person(agent.daemon) as person:
        resp = await person.approve(agent.authorize_url(challenge), await agent_code(client))
    code = query_of(resp.headers["Location"])["code"]
    status, body = await agent.exchange(code, pkce()[0])
    assert (status, body["error"], body["peerd_reason"]) == (400, "invalid_grant", "pkce")
    status, body = await agent.exchange(code, verifier)  # no second guess
    assert (status, body["peerd_reason"]) == (400, "reused")
    status, body = await agent.token(
        grant_type="authorization_code",
        code="nothing",
        redirect_uri=agent.redirect_uri,
        client_id=agent.client_id,
    )
    assert (status, body["peerd_reason"]) == (400, "unknown")


async def test_a_missing_verifier_or_another_redirect_uri_is_refused(
    agent: Agent, client: LocalClient
) -> None:
    await agent.register(uris=[REDIRECT, "http://127.0.0.1:53682/second"])
    for extra, reason in (
        ({"code_verifier": ""}, "pkce"),
        ({"redirect_uri": "http://127.0.0.1:53682/second"}, "redirect_uri"),
    ):
        verifier, challenge = pkce()
        async with Person(agent.daemon) as person:
            resp = await person.approve(agent.authorize_url(challenge), await agent_code(client))
        code = query_of(resp.headers["Location"])["code"]
        status, body = await agent.exchange(code, verifier, **extra)
        assert (status, body.get("peerd_reason")) == (400, reason), body


async def test_state_comes_back_exactly(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    state = "a b&c=d/é?%20+"
    _, challenge = pkce()
    async with Person(agent.daemon) as person:
        resp = await person.approve(agent.authorize_url(challenge, state=state), await agent_code(client))
    assert resp.status == 303
    back = query_of(resp.headers["Location"])
    assert back["state"] == state and back["iss"] == agent.base + "/" and back["code"]
    assert resp.headers["Location"].startswith(REDIRECT + "?")


async def test_a_reused_authorization_code_is_refused_and_revokes_the_sign_in(
    agent: Agent, client: LocalClient
) -> None:
    await agent.register()
    verifier, challenge = pkce()
    async with Person(agent.daemon) as person:
        resp = await person.approve(agent.authorize_url(challenge), await agent_code(client))
    code = query_of(resp.headers["Location"])["code"]
    status, first = await agent.exchange(code, verifier)
    assert status == 200, first
    assert (await agent.mcp(first["access_token"], "tools/list")).status == 200
    status, again = await agent.exchange(code, verifier)
    assert (status, again["error"], again["peerd_reason"]) == (400, "invalid_grant", "reused")
    assert (await agent.mcp(first["access_token"], "tools/list")).status == 401  # at once
    listed = (await client.call("GET", "/v1/clients"))["items"]
    assert [c["status"] for c in listed if c["id"] == first["client_id"]] == ["revoked"]


async def test_a_sign_in_lasts_at_most_thirty_days(agent: Agent, client: LocalClient) -> None:
    tokens = await agent.sign_in(await agent_code(client))
    listed = (await client.call("GET", "/v1/clients"))["items"]
    (row,) = [c for c in listed if c["id"] == tokens["client_id"]]
    assert row["kind"] == "agent" and row["agentName"] == "test agent"
    assert row["expiresAt"] - row["createdAt"] == pytest.approx(30 * 24 * 3600, abs=1)
    assert tokens["refresh_expires_in"] <= 30 * 24 * 3600


# --- pairing codes: an agent's and a link's never cross -----------------------------------------


async def test_a_link_code_cannot_approve_an_agent(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    link_code = pairing_code.decode(
        str((await client.call("POST", "/v1/pair", body={"access": "auto"}))["code"])
    )
    async with Person(agent.daemon) as person:
        for typed in (
            f"peerd-agent:{link_code.code_id}.{link_code.secret}",
            f"{link_code.code_id}.{link_code.secret}",
        ):
            resp = await person.approve(agent.authorize_url(pkce()[1]), typed)
            assert resp.status == 400 and "Location" not in resp.headers
            assert "no such agent pairing code" in await resp.text()
    codes = (await client.call("GET", "/v1/pair"))["items"]
    assert [c["state"] for c in codes if c["id"] == link_code.code_id] == ["open"]


async def test_an_agent_code_cannot_make_a_link(agent: Agent, client: LocalClient) -> None:
    code_id, _, secret = (await agent_code(client)).removeprefix("peerd-agent:").partition(".")
    status, body = await agent.token(grant_type=PAIRING_GRANT, code_id=code_id, code_secret=secret)
    assert (status, body["error"], body["peerd_reason"]) == (400, "invalid_grant", "unknown_code")
    codes = (await client.call("GET", "/v1/pair"))["items"]
    assert [(c["state"], c["purpose"]) for c in codes if c["id"] == code_id] == [("open", "agent")]


async def test_wrong_codes_count_toward_burning_and_the_form_needs_its_cookie(
    agent: Agent, client: LocalClient
) -> None:
    await agent.register()
    code_id, _, _secret = (await agent_code(client)).removeprefix("peerd-agent:").partition(".")
    async with Person(agent.daemon) as person:
        for _ in range(5):
            resp = await person.approve(agent.authorize_url(pkce()[1]), f"peerd-agent:{code_id}.wrong")
            assert resp.status == 400
    codes = (await client.call("GET", "/v1/pair", params={"all": True}))["items"]
    assert [c["state"] for c in codes if c["id"] == code_id] == ["burnt"]
    # Without the page's cookie (another site's form), nothing is looked at.
    async with agent.session.post(
        agent.base + "/oauth/authorize", data={"csrf": "x", "pairing_code": "peerd-agent:00.x"}
    ) as resp:
        assert resp.status == 403


# --- client ID metadata documents: no fetch into this machine or its network --------------------


@pytest.mark.parametrize(
    "client_id",
    ["https://127.0.0.1:9/agent.json", "https://10.1.2.3/agent.json", "https://localhost:9/agent.json",
     "https://[::1]:9/agent.json", "https://169.254.169.254/latest", "http://example.com/agent.json"],
)  # fmt: skip
async def test_a_metadata_url_on_a_private_address_is_refused(agent: Agent, client_id: str) -> None:
    agent.client_id = client_id
    async with Person(agent.daemon) as person:
        resp = await person.open(agent.authorize_url(pkce()[1]))
    assert resp.status == 400 and "Location" not in resp.headers
    if client_id.startswith("https://"):  # refused for its address, before any connection
        assert "names an address this box does not fetch from" in await resp.text()


async def test_the_owner_may_allow_private_metadata_urls(tmp_path: Path) -> None:
    settings = Config(agents=AgentsConfig(allow_private_metadata_urls=True))
    async with running_daemon(tmp_path / "home", settings=settings) as daemon, Agent(daemon) as agent:
        for client_id in ("https://127.0.0.1:9/agent.json", "https://localhost:9/agent.json"):
            agent.client_id = client_id
            async with Person(daemon) as person:
                resp = await person.open(agent.authorize_url(pkce()[1]))
            # Fetched this time (nothing answers on port 9): refused for that, not for its address.
            assert resp.status == 400 and "could not be fetched" in await resp.text()


async def test_registration_is_bounded(agent: Agent) -> None:
    for body in (
        {"redirect_uris": []},
        {"redirect_uris": ["javascript:alert(1)"]},
        {"redirect_uris": ["http://evil.example/cb"]},
        {"redirect_uris": [REDIRECT] * 11},
        {"redirect_uris": [REDIRECT], "client_name": "x" * 201},
        {"redirect_uris": [REDIRECT], "grant_types": ["client_credentials"]},
    ):
        async with agent.session.post(agent.base + "/oauth/register", json=body) as resp:
            assert resp.status == 400, body
            assert (await resp.json())["error"] in ("invalid_redirect_uri", "invalid_client_metadata")


async def test_on_a_plain_loopback_listener_a_browser_can_sign_in_too(tmp_path: Path) -> None:
    """`peerd serve --listen 127.0.0.1:PORT --no-tls`: the listener a browser on this machine can
    open (browsers do not take the TLS listener's Ed25519 certificate): the same sign-in, over http."""
    async with running_daemon(tmp_path / "home", tls=False) as daemon, Agent(daemon) as agent:
        assert agent.base.startswith("http://127.0.0.1:")
        async with client_for(daemon.paths.home) as owner:
            tokens = await agent.sign_in(await agent_code(owner, "read-only"))
        listed = await agent.call_tool(tokens["access_token"], "project_list", {})
        assert listed.get("isError") is not True
        async with agent.session.get(agent.base + "/.well-known/oauth-authorization-server") as got:
            assert (await got.json())["issuer"] == agent.base + "/"


async def test_old_codes_and_unused_registrations_are_pruned(
    daemon: Daemon, agent: Agent, client: LocalClient
) -> None:
    db = daemon.db
    await agent.register()
    await agent.sign_in(await agent_code(client))
    used = agent.client_id
    async with db.write() as tx:
        await tx.execute("UPDATE auth_codes SET expires_at = expires_at - 2 * 86400, created_at = 0")
        await tx.execute("UPDATE oauth_clients SET created_at = created_at - 2 * 86400")
    async with Agent(daemon) as idle, Agent(daemon) as newer:
        await idle.register()
        async with db.write() as tx:
            await tx.execute(
                "UPDATE oauth_clients SET created_at = created_at - 2 * 86400 WHERE client_id = ?",
                (idle.client_id,),
            )
        await newer.sign_in(await agent_code(client))  # registers and approves: both prune
        await idle.register()  # again, now that `used` has no code left: it has its sign-in
        kept = {r["client_id"] for r in await db.fetchall("SELECT client_id FROM oauth_clients")}
        codes = await db.fetchall("SELECT oauth_client_id FROM auth_codes")
    assert used in kept and newer.client_id in kept and len(kept) == 3  # the idle one's first is gone
    assert [r["oauth_client_id"] for r in codes] == [newer.client_id]


async def test_nothing_secret_reaches_the_log(agent: Agent, client: LocalClient) -> None:
    pairing = await agent_code(client)
    with capture_logs() as logs:
        await agent.register()
        verifier, challenge = pkce()
        async with Person(agent.daemon) as person:
            resp = await person.approve(agent.authorize_url(challenge), pairing)
        code = query_of(resp.headers["Location"])["code"]
        _, tokens = await agent.exchange(code, verifier)
        _, refreshed = await agent.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        await agent.exchange(code, verifier)  # the reuse is logged too
    assert "access_token" in refreshed
    text = repr(logs)
    assert any(entry["event"] == "agent_signin.signed_in" for entry in logs)
    secrets_used = (
        pairing.partition(".")[2],
        verifier,
        challenge,
        code,
        tokens["access_token"],
        tokens["refresh_token"],
    )
    for secret in secrets_used:
        assert secret not in text


async def test_an_agents_refresh_token_rotates_and_a_reused_one_revokes(
    agent: Agent, client: LocalClient
) -> None:
    tokens = await agent.sign_in(await agent_code(client))
    status, rotated = await agent.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert status == 200 and rotated["refresh_token"] != tokens["refresh_token"]
    assert (await agent.mcp(rotated["access_token"], "tools/list")).status == 200
    status, again = await agent.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert (status, again["peerd_reason"]) == (400, "reused")
    assert (await agent.mcp(rotated["access_token"], "tools/list")).status == 401


async def test_wrong_codes_on_the_page_and_link_redemptions_share_one_brake(agent: Agent) -> None:
    await agent.register()
    async with Person(agent.daemon) as person:
        for _ in range(PAIRING_FAILURES_PER_WINDOW):
            resp = await person.approve(agent.authorize_url(pkce()[1]), "peerd-agent:0123456789ab.guess")
            assert resp.status == 400
        resp = await person.approve(agent.authorize_url(pkce()[1]), "peerd-agent:0123456789ab.guess")
        assert resp.status == 429 and "try again in" in await resp.text()
    status, body = await agent.token(grant_type=PAIRING_GRANT, code_id="0123456789ab", code_secret="guess")
    assert (status, body["error"]) == (429, "slow_down")  # a link's redemption is braked too


async def test_pair_list_and_client_list_say_which_kind(
    daemon: Daemon, agent: Agent, client: LocalClient
) -> None:
    pairing = ok(await peerd(daemon.paths.home, "pair", "--for", "agent", "--access", "read-only")).strip()
    code_id = pairing.removeprefix("peerd-agent:").partition(".")[0]
    listed = ok(await peerd(daemon.paths.home, "pair", "list"))
    (row,) = [line.split() for line in listed.splitlines() if line.startswith(code_id)]
    assert row[1:4] == ["read-only", "open", "agent"]
    assert pairing.partition(".")[2] not in listed  # never the secret


async def test_an_agent_pairing_code_approves_once(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    pairing = await agent_code(client)
    async with Person(agent.daemon) as person:
        first = await person.approve(agent.authorize_url(pkce()[1]), pairing)
        again = await person.approve(agent.authorize_url(pkce()[1]), pairing)
    assert first.status == 303
    assert again.status == 400 and "Location" not in again.headers
    assert "already used" in await again.text()
