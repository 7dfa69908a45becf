"""A sign-in the owner approves in the console instead of with a typed code (issue 29): the person
presses "Ask the owner" on the sign-in page, the owner decides over the owner socket (what the
console calls), and the waiting page sends the browser back to the agent with a code, or with
`access_denied`. Only the browser that asked collects, and only once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from yarl import URL

from peerd.api.signin_page import WAIT_COOKIE
from peerd.daemon import Daemon
from peerd.errors import Conflict
from tests.helpers import LocalClient
from tests.support.signin import Agent, Person, pkce, query_of


@pytest.fixture
async def agent(daemon: Daemon) -> AsyncIterator[Agent]:
    async with Agent(daemon) as a:
        yield a


async def test_the_owner_approves_a_sign_in_at_a_level_and_the_agent_gets_it(
    agent: Agent, client: LocalClient
) -> None:
    await agent.register(name="asking-agent")
    verifier, challenge = pkce()
    async with Person(agent.daemon) as person:
        waiting, request_id = await person.ask_owner(agent.authorize_url(challenge, state="st ate"))
        assert waiting.status == 202 and request_id
        assert 'http-equiv="refresh"' in await waiting.text()
        listed = (await client.call("GET", "/v1/agent-signins"))["items"]
        assert [(r["id"], r["clientName"], r["state"]) for r in listed] == [
            (request_id, "asking-agent", "pending")
        ]
        assert (await person.poll(request_id)).status == 202  # still waiting
        decided = await client.call(
            "POST", f"/v1/agent-signins/{request_id}/decision", body={"access": "read-only"}
        )
        assert (decided["state"], decided["access"]) == ("approved", "read-only")
        back = await person.poll(request_id)
        assert back.status == 303
        got = query_of(back.headers["Location"])
        assert got["state"] == "st ate" and got["iss"] == agent.base + "/"
        again = await person.poll(request_id)  # collected once
        assert again.status == 400 and "Location" not in again.headers
    status, tokens = await agent.exchange(got["code"], verifier)
    assert status == 200 and tokens["scope"] == "read-only", tokens
    assert (await client.call("GET", "/v1/agent-signins"))["items"] == []


async def test_a_denied_sign_in_goes_back_with_access_denied(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    async with Person(agent.daemon) as person:
        _, request_id = await person.ask_owner(agent.authorize_url(pkce()[1]))
        decided = await client.call("POST", f"/v1/agent-signins/{request_id}/decision", body={})
        assert decided["state"] == "denied"
        back = await person.poll(request_id)
    assert back.status == 303
    got = query_of(back.headers["Location"])
    assert got["error"] == "access_denied" and got["state"] == "st-1" and "code" not in got


async def test_only_the_browser_that_asked_collects(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    async with Person(agent.daemon) as asker, Person(agent.daemon) as other:
        _, request_id = await asker.ask_owner(agent.authorize_url(pkce()[1]))
        await client.call("POST", f"/v1/agent-signins/{request_id}/decision", body={"access": "auto"})
        stolen = await other.poll(request_id)  # no cookie at all
        assert stolen.status == 400 and "Location" not in stolen.headers
        other.session.cookie_jar.update_cookies(
            {WAIT_COOKIE: "a-guess"}, URL(agent.base + "/oauth/authorize")
        )
        forged = await other.poll(request_id)  # a cookie, not the asker's
        assert forged.status == 400 and "Location" not in forged.headers
        assert (await asker.poll(request_id)).status == 303


async def test_a_decided_request_cannot_be_decided_again(agent: Agent, client: LocalClient) -> None:
    await agent.register()
    async with Person(agent.daemon) as person:
        _, request_id = await person.ask_owner(agent.authorize_url(pkce()[1]))
    await client.call("POST", f"/v1/agent-signins/{request_id}/decision", body={})
    with pytest.raises(Conflict):
        await client.call("POST", f"/v1/agent-signins/{request_id}/decision", body={"access": "full-access"})
