"""The route table of an outside agent's sign-in (api/agent_signin.py): the handlers aiohttp calls,
the models `peerd.api.openapi` describes them with, and `add_agent_signin_routes`."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, RootModel

from peerd.api.agent_signin import ASM_PATH, MCP_PATH, PRM_PATHS, REGISTER_PATH, AgentSignin
from peerd.api.app import SAME_ORIGIN_PATHS
from peerd.api.routes import Example, Route, add_routes
from peerd.api.signin_page import AUTHORIZE_PATH, WAIT_PATH

AGENT_SIGNIN = web.AppKey("agent_signin", AgentSignin)


async def _protected_resource(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].protected_resource(request)


async def _authorization_server(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorization_server(request)


async def _register(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].register(request)


async def _authorize_page(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorize_page(request)


async def _authorize_submit(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorize_submit(request)


async def _authorize_wait(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorize_wait(request)


def add_agent_signin_routes(app: web.Application, signin: AgentSignin) -> None:
    """Mount the metadata, registration and authorization endpoints (the network listener's app)."""
    app[AGENT_SIGNIN] = signin
    app[SAME_ORIGIN_PATHS] = frozenset({AUTHORIZE_PATH})  # the sign-in form posts from its own page
    add_routes(app, ROUTES)


# --- the route table (what `peerd.api.openapi` describes) ------------------------------------------


class ProtectedResource(BaseModel):
    """RFC 9728 protected resource metadata of `/mcp`."""

    resource: str
    authorization_servers: list[str]
    bearer_methods_supported: list[str]
    resource_name: str


class AuthorizationServer(BaseModel):
    """RFC 8414 authorization server metadata (the fields peerd publishes)."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str
    revocation_endpoint: str
    response_types_supported: list[str]
    grant_types_supported: list[str]
    code_challenge_methods_supported: list[str]
    token_endpoint_auth_methods_supported: list[str]
    revocation_endpoint_auth_methods_supported: list[str]
    client_id_metadata_document_supported: bool
    authorization_response_iss_parameter_supported: bool


class Registration(BaseModel):
    """RFC 7591 client metadata: what peerd reads of it (other fields are ignored)."""

    model_config = ConfigDict(extra="allow")
    redirect_uris: list[str] = Field(
        description="1 to 10: https, http on a loopback address, or a private-use scheme; no fragment"
    )
    client_name: str | None = Field(default=None, max_length=200)
    grant_types: list[str] | None = Field(default=None, description="authorization_code, refresh_token")
    response_types: list[str] | None = Field(default=None, description="code")


class Registered(BaseModel):
    """The registered client (RFC 7591 §3.2.1): a public client, PKCE its proof."""

    client_id: str
    client_id_issued_at: int
    redirect_uris: list[str]
    client_name: str | None = None
    grant_types: list[str]
    response_types: list[str]
    token_endpoint_auth_method: str


class RegistrationError(BaseModel):
    """RFC 7591 §3.2.2 (or RFC 8628's `slow_down` past 30 registrations a minute)."""

    error: str
    error_description: str | None = None


class SignInPage(RootModel[str]):
    """The sign-in page, or the page saying what is wrong: text/html (a strict CSP, no script)."""


class AuthorizeQuery(BaseModel):
    """An authorization request (RFC 6749 §4.1.1, RFC 7636, RFC 8707)."""

    response_type: Literal["code"]
    client_id: str = Field(
        description="a registered client id, or an https URL (a client ID metadata document)"
    )
    redirect_uri: str
    code_challenge: str = Field(description="BASE64URL(SHA256(code_verifier)), 43 characters")
    code_challenge_method: Literal["S256"]
    state: str | None = None
    resource: str | None = Field(default=None, description="this box's /mcp")
    scope: str | None = Field(default=None, description="ignored: the pairing code sets the level")


class WaitQuery(BaseModel):
    """The waiting page's poll (the browser's cookie says it is the one that asked)."""

    request: str = Field(description="the sign-in request (`sir_...`)")


class AuthorizeForm(AuthorizeQuery):
    """The sign-in page's form: the request again, the page's CSRF token and the typed code."""

    csrf: str
    pairing_code: str = Field(description="peerd-agent:ID.SECRET, from `peerd pair --for agent`")
    ask: Literal["1"] | None = Field(
        default=None, description="ask the owner to approve in the console instead"
    )


_REGISTRATION_STATUS = {"invalid_redirect_uri": 400, "invalid_client_metadata": 400, "slow_down": 429}
_PAGE = (
    "Answers text/html, not JSON: the sign-in page (200), or a page naming what is wrong (400: an "
    "unknown client or a redirect URI it did not register, never redirected to; 403: a form without its "
    "page's cookie; 429: too many wrong codes)."
)
_BASE = "https://box.example:7433"
_PRM = Example(
    {
        "resource": _BASE + MCP_PATH,
        "authorization_servers": [_BASE + "/"],
        "bearer_methods_supported": ["header"],
        "resource_name": "peerd on box",
    }
)
_ASM = Example(
    {
        "issuer": _BASE + "/",
        "authorization_endpoint": _BASE + AUTHORIZE_PATH,
        "token_endpoint": _BASE + "/oauth/token",
        "registration_endpoint": _BASE + REGISTER_PATH,
        "revocation_endpoint": _BASE + "/oauth/revoke",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": True,
    }
)
_REDIRECT = "http://127.0.0.1:53682/callback"
_REQUEST = {
    "response_type": "code",
    "client_id": "dcr_3f9c0a1b2d4e5f60718a",
    "redirect_uri": _REDIRECT,
    "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
    "code_challenge_method": "S256",
    "state": "af0ifjsldkj",
    "resource": _BASE + MCP_PATH,
}
ROUTES: tuple[Route, ...] = (
    Route("GET", PRM_PATHS[0], _protected_resource, "oauth_protected_resource",
          "Where to sign in for /mcp (RFC 9728).", "oauth", answer=ProtectedResource, example=_PRM),
    Route("GET", PRM_PATHS[1], _protected_resource, "oauth_protected_resource_mcp",
          "Where to sign in for /mcp (RFC 9728, the path-suffixed form).", "oauth", answer=ProtectedResource,
          example=_PRM),
    Route("GET", ASM_PATH, _authorization_server, "oauth_authorization_server",
          "The box's OAuth server for outside agents (RFC 8414).", "oauth", answer=AuthorizationServer,
          example=_ASM),
    Route("POST", REGISTER_PATH, _register, "oauth_register",
          "Register an outside agent's OAuth client (RFC 7591; a public client).", "oauth",
          body=Registration, answer=Registered, status=201, errors=tuple(_REGISTRATION_STATUS),
          error_body=RegistrationError, error_status=_REGISTRATION_STATUS,
          example=Example(
              {"client_id": "dcr_3f9c0a1b2d4e5f60718a", "client_id_issued_at": 1796229075, "redirect_uris": [_REDIRECT],
               "client_name": "Claude Code", "grant_types": ["authorization_code", "refresh_token"],
               "response_types": ["code"], "token_endpoint_auth_method": "none"},
              body={"redirect_uris": [_REDIRECT], "client_name": "Claude Code"})),
    Route("GET", AUTHORIZE_PATH, _authorize_page, "oauth_authorize",
          "The sign-in page an outside agent opens; a person types an agent pairing code.", "oauth",
          query=AuthorizeQuery, answer=SignInPage, other={303: None}, media_type="text/html",
          example=Example("<!doctype html>...", query=_REQUEST),
          description=_PAGE + " An invalid request of a known client and redirect URI is 303 to the "
          "redirect URI with error, state and iss."),
    Route("POST", AUTHORIZE_PATH, _authorize_submit, "oauth_authorize_submit",
          "The sign-in page's form: 303 to the client with code, state and iss (RFC 9207).", "oauth",
          body=AuthorizeForm, form=True, answer=SignInPage, other={303: None}, description=_PAGE,
          media_type="text/html",
          example=Example("(303 to the redirect URI)",
                          body={**_REQUEST, "csrf": "q7Tz...", "pairing_code": "peerd-agent:3f9c0a1b2d4e.Xq3v..."})),
    Route("GET", WAIT_PATH, _authorize_wait, "oauth_authorize_wait",
          "The page waiting for the owner's approval in the console: 303 to the client once decided.", "oauth",
          query=WaitQuery, answer=SignInPage, other={303: None}, media_type="text/html",
          description="Answers text/html: 202 while the owner decides (it looks again every 3 s), 400 when "
          "the request is unknown, expired, answered, or not this browser's.",
          example=Example("<!doctype html>...", query={"request": "sir_3f9c0a1b2d4e5f60718a"})),
)  # fmt: skip
