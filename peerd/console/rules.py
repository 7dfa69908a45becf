"""The console's request rules, pure: where it may listen, which Host and Origin it answers.

- **Bind**: `HOST:PORT`; off loopback only with TLS (`core/console_bind.py`, which the config
  check reads too).
- **Host** (DNS rebinding): a page of another site that makes its name resolve to 127.0.0.1 sends
  its own name as Host; only the console's own names are answered (`allowed_hosts`).
- **Origin** (the console's own origin rule; the API's "no Origin at all" rule stays for the API):
  every change (any method but GET/HEAD) must carry an Origin naming the console itself, and a
  `Sec-Fetch-Site` other than `same-origin` is refused. A page on another port of 127.0.0.1 is
  the *same site* to a browser (SameSite cookies go there too), so this and the CSRF token are
  what stop it, not the cookie's SameSite.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from peerd.core.console_bind import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True)
class Site:
    """Where the console is: the Host values it answers and the origins a change may come from."""

    hosts: frozenset[str]
    origins: frozenset[str]
    base_url: str  # what `peerd console` prints (the public URL when one is configured)


def site_for(bound_host: str, port: int, *, tls: bool, public_url: str | None = None) -> Site:
    """The names a browser may use for a console bound at (`bound_host`, `port`): the loopback
    names on that port when it is bound on loopback, the bound host itself, and the public URL's."""
    scheme = "https" if tls else "http"
    names = {bound_host if ":" not in bound_host else f"[{bound_host}]"}
    if is_loopback(bound_host):
        names.update(LOOPBACK_NAMES)
    hosts = {_hostport(name, port) for name in names}
    origins = {f"{scheme}://{h}" for h in hosts}
    shown = "127.0.0.1" if is_loopback(bound_host) else bound_host
    base = f"{scheme}://{_hostport(shown, port)}"
    if public_url:
        parts = urlsplit(public_url.rstrip("/"))
        if parts.scheme in ("http", "https") and parts.netloc:
            hosts.add(parts.netloc.lower())
            origins.add(f"{parts.scheme}://{parts.netloc.lower()}")
            base = f"{parts.scheme}://{parts.netloc.lower()}"
    return Site(frozenset(h.lower() for h in hosts), frozenset(o.lower() for o in origins), base)


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # one sentence a person can act on


def check_host(site: Site, host: str | None) -> Refusal | None:
    if host is None or host.lower() not in site.hosts:
        return Refusal(
            421,
            f"This console answers only at {site.base_url}; open it there (`peerd console` prints the URL).",
        )
    return None


def check_change(site: Site, method: str, origin: str | None, fetch_site: str | None) -> Refusal | None:
    """A request that changes something must come from a page of the console itself."""
    if method.upper() in SAFE_METHODS:
        return None
    if origin is None or origin.lower() not in site.origins:
        return Refusal(
            403, "Changes are accepted only from the console's own pages; reload it and try again."
        )
    if fetch_site is not None and fetch_site != "same-origin":
        return Refusal(
            403, "Changes are accepted only from the console's own pages; reload it and try again."
        )
    return None
