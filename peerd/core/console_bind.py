"""Where the console may listen and which public URL it may name, pure: read by the config check
(`config.py:console_problem`) and by the console itself (`console/server.py`, `console/rules.py`).

`console.listen` is `HOST:PORT`; off loopback only with TLS (a certificate and key in `[console]`):
plain HTTP with a session cookie must never cross a network. `tailscale serve` in front of the
loopback port is the documented way to reach it from a phone.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

DEFAULT_LISTEN = "127.0.0.1:7434"


class BindRefused(ValueError):
    """`console.listen` is malformed, or not loopback without TLS (the sentence says which)."""


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_bind(listen: str, *, tls: bool) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:7434`) -> (host, port); refused off loopback without TLS."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise BindRefused(f"console.listen {listen!r} must be HOST:PORT, e.g. {DEFAULT_LISTEN}.")
    port = int(port_text)
    if port > 65535:
        raise BindRefused(f"console.listen port {port} is out of range (0-65535).")
    host = host.strip("[]")
    if not tls and not is_loopback(host):
        raise BindRefused(
            f"Refusing to serve the console on {host} without TLS: give console.tls_cert and "
            "console.tls_key, or keep it on loopback and put `tailscale serve` in front of it."
        )
    return host, port


def bind_problem(listen: str, *, tls: bool) -> str | None:
    try:
        parse_bind(listen, tls=tls)
    except BindRefused as exc:
        return str(exc)
    return None


def public_url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        return (
            f"console.public_url {url!r} must be an origin such as https://box.tailnet.ts.net "
            "(scheme and host, no path)."
        )
    return None
