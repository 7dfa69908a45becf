"""Environment and Connections: who this is, its health, its links and clients, pairing, linking."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from peerd.console.owner import Owner
from peerd.console.render import fragment, notice, page, shown_error
from peerd.console.state import CONSOLE
from peerd.core.constants import RUNTIME_MODES
from peerd.core.text import path_segment
from peerd.doctor import passed, run_checks
from peerd.doctor.gather import gather
from peerd.errors import PeerdError
from peerd.paths import Paths

OWNER = web.AppKey("console_owner", Owner)
PAIR_TTLS = (("600", "10 minutes"), ("1800", "30 minutes"), ("3600", "1 hour"))


def owner(request: web.Request) -> Owner:
    return request.app[OWNER]


async def form(request: web.Request) -> dict[str, str]:
    data = await request.post()
    return {k: v for k, v in data.items() if isinstance(v, str)}


def back(request: web.Request, to: str) -> web.HTTPSeeOther:
    """A redirect to the console's page `to` (a path below its root)."""
    return web.HTTPSeeOther(request.app[CONSOLE].root + to)


# --- Environment --------------------------------------------------------------------------------


async def environment(request: web.Request) -> web.StreamResponse:
    status = await owner(request).status()
    console = request.app[CONSOLE]
    return page(request, "environment.html", title="Environment", status_=status, console_url=console.url)


async def health(request: web.Request) -> web.StreamResponse:
    """The `peerd doctor` checks, gathered by the daemon for itself."""
    status = await owner(request).status()
    home = Path(status.home)
    checks = run_checks(await gather(Paths(home), config_home=home))
    return fragment(request, "_health.html", checks=checks, ok=passed(checks))


# --- Connections --------------------------------------------------------------------------------


async def connections(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    links = await api.links(probe=False)
    return page(
        request,
        "connections.html",
        title="Connections",
        links=links,
        live=False,
        clients=await api.clients(),
        codes=await api.pairing_codes(),
        signins=await api.agent_signins(),
        modes=RUNTIME_MODES,
        ttls=PAIR_TTLS,
    )


async def links_live(request: web.Request) -> web.StreamResponse:
    """The links, each box asked now (`GET /v1/environments` probes in parallel, 2 s at most)."""
    return fragment(request, "_links.html", links=await owner(request).links(probe=True), live=True)


async def pair(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    try:
        ttl = float(data.get("ttl", "600"))
        purpose = "agent" if data.get("for") == "agent" else "link"  # an agent's sign-in page (issue 29)
        created = await owner(request).pair(
            data.get("access", "approval-required"), ttl, data.get("label"), purpose
        )
    except (PeerdError, ValueError) as exc:
        notice(
            request, shown_error(exc) if isinstance(exc, PeerdError) else "Pick a lifetime.", level="error"
        )
        raise back(request, "/connections") from None
    import segno  # noqa: PLC0415  # ~45 ms: only for a pairing code, not at daemon start

    qr = segno.make(created.code, error="m").svg_inline(scale=4, dark="#000", light="#fff", omitsize=False)
    return page(request, "pair.html", title="Pairing code", created=created, qr=qr)


async def link(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    code = data.get("code", "").strip()
    if not code:
        notice(request, "Paste the pairing code the other machine showed.", level="error")
        raise back(request, "/connections")
    try:
        made = await owner(request).link(code, data.get("access", "approval-required"), data.get("label"))
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/connections") from None
    notice(request, f"Linked {made.label} ({made.access}).")
    raise back(request, "/connections")


async def revoke_confirm(request: web.Request) -> web.StreamResponse:
    client_id = request.match_info["id"]
    found = [x for x in await owner(request).clients() if x.id == client_id]
    label = found[0].label if found else client_id
    return page(
        request,
        "confirm.html",
        title="Revoke a client",
        question=f"Revoke {label}?",
        detail="It can no longer act here, and every run it started here stops now. This cannot be undone: "
        "linking again needs a new pairing code.",
        action=f"/connections/clients/{path_segment(client_id)}/revoke",
        button="Revoke",
        cancel="/connections",
    )


async def revoke(request: web.Request) -> web.StreamResponse:
    try:
        done = await owner(request).revoke_client(request.match_info["id"])
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/connections") from None
    stopped = f"; {len(done.stopped_threads)} of its threads stopped" if done.stopped_threads else ""
    notice(request, f"Revoked {done.label}{stopped}.")
    raise back(request, "/connections")


async def unlink_confirm(request: web.Request) -> web.StreamResponse:
    env_id = request.match_info["id"]
    found = [x for x in await owner(request).links(probe=False) if x.environment_id == env_id]
    label = found[0].label if found else env_id
    return page(
        request,
        "confirm.html",
        title="Unlink",
        question=f"Unlink {label}?",
        detail="This machine forgets the link (and revokes it there when it answers); its open tasks "
        "end. Linking again needs a new pairing code.",
        action=f"/connections/environments/{path_segment(env_id)}/unlink",
        button="Unlink",
        cancel="/connections",
    )


async def unlink(request: web.Request) -> web.StreamResponse:
    try:
        done = await owner(request).unlink(request.match_info["id"])
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/connections") from None
    notice(request, done.message)
    raise back(request, "/connections")


async def pairing_cancel(request: web.Request) -> web.StreamResponse:
    try:
        await owner(request).cancel_pairing(request.match_info["id"])
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/connections") from None
    notice(request, "Pairing code cancelled.")
    raise back(request, "/connections")


async def signin_decide(request: web.Request) -> web.StreamResponse:
    """Approve an outside agent's sign-in at a level, or deny it (issue 29)."""
    data = await form(request)
    approve = data.get("decision") == "approve"
    try:
        decided = await owner(request).decide_signin(
            request.match_info["id"], data.get("access", "read-only") if approve else None
        )
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
        raise back(request, "/connections") from None
    who = decided.client_name or decided.client_id
    notice(request, f"Approved {who} ({decided.access})." if approve else f"Denied {who}.")
    raise back(request, "/connections")


ROUTES = (
    ("GET", "/", environment),
    ("GET", "/environment/health", health),
    ("GET", "/connections", connections),
    ("GET", "/connections/links", links_live),
    ("POST", "/connections/pair", pair),
    ("POST", "/connections/link", link),
    ("GET", "/connections/clients/{id}/revoke", revoke_confirm),
    ("POST", "/connections/clients/{id}/revoke", revoke),
    ("GET", "/connections/environments/{id}/unlink", unlink_confirm),
    ("POST", "/connections/environments/{id}/unlink", unlink),
    ("POST", "/connections/pairing/{id}/cancel", pairing_cancel),
    ("POST", "/connections/signins/{id}", signin_decide),
)
