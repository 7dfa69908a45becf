"""`peerd console`: the browser console's URL with a one-time login token.

The daemon makes the token (`POST /v1/console/login-token` on the owner socket); it works once,
within five minutes. `--open` opens it in a browser through a small page in the home (mode 0600)
that forwards to the URL, as Jupyter does: a URL given to the browser's command line would put the
token in the process list. `--qr` also prints the URL as a QR code for a phone's camera (useful
with `console.public_url`, e.g. behind `tailscale serve`).
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import cli_context, json_option, with_client
from peerd.cli.output import JsonOutput, emit_json
from peerd.present import when

OPEN_PAGE = "console-open.html"


def open_page(home: Path, url: str) -> Path:
    """A page (0600, rewritten each time) that forwards the browser to `url`."""
    path = home / OPEN_PAGE
    quoted = html.escape(url, quote=True)
    text = (
        '<!doctype html><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={quoted}">'
        f'<title>peerd console</title><p><a href="{quoted}">Open the peerd console</a></p>\n'
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    path.chmod(0o600)
    return path


@click.command()
@click.option("--open", "open_browser", is_flag=True, help="Also open it in this machine's browser.")
@click.option("--qr", is_flag=True, help="Also print the URL as a QR code (for a phone).")
@json_option
@click.pass_context
def console(ctx: click.Context, open_browser: bool, qr: bool, as_json: JsonOutput | None) -> None:
    """Print the URL of the browser console with a one-time login token."""

    def go(client: LocalClient) -> Any:
        return client.call("POST", "/v1/console/login-token")

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
    else:
        click.echo(data["url"])
        click.echo(f"The login token in it works once; it expires {when(data['expiresAt'])}.", err=True)
    if qr:
        import segno  # noqa: PLC0415  # only for --qr

        segno.make(data["url"], error="l").terminal(compact=True)
    if open_browser:
        import webbrowser  # noqa: PLC0415  # only for --open (it imports subprocess, shlex)

        page = open_page(cli_context(ctx).home, data["url"])
        if not webbrowser.open(page.as_uri()):
            click.echo("No browser could be started here; open the URL above.", err=True)
