"""`peerd doctor`: gather the facts (files, the daemon's answers, the certificate, git), run the
checks of `peerd.doctor` on them and print each with its fix."""

from __future__ import annotations

import click

from peerd.cli.common import EXIT_ERROR, EXIT_OK, cli_context, interrupted, json_option
from peerd.cli.output import colour_wanted, emit_json


@click.command()
@json_option
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check this machine's peerd and print a fix for each problem.

    Checks the daemon, the socket and file permissions, the store's integrity (`PRAGMA
    quick_check`), the certificate, each link's reachability
    and token, each provider's CLI and version, and git. Works without a running daemon (the
    daemon check then fails and the link and provider checks are skipped). Exits 1 when a check
    failed; warnings do not fail.
    """
    # CLI start-up: the checks and their facts (asyncio, aiohttp, pydantic, cryptography, the
    # store) are imported only when the doctor runs (tests/integration/test_cli_startup.py).
    import asyncio  # noqa: PLC0415  # CLI start-up

    from peerd.doctor import passed, render, run_checks  # noqa: PLC0415  # CLI start-up
    from peerd.doctor.gather import gather  # noqa: PLC0415  # CLI start-up

    try:
        home = cli_context(ctx)
        facts = asyncio.run(gather(home.paths, config_home=None if home.given_by == "default" else home.home))
    except KeyboardInterrupt:
        interrupted()
    checks = run_checks(facts)
    ok = passed(checks)
    if as_json:
        emit_json({"checks": [ch.wire() for ch in checks], "ok": ok})
    else:
        for line in render(checks, colour=colour_wanted()):
            click.echo(line)
    ctx.exit(EXIT_OK if ok else EXIT_ERROR)
