"""The certificate, the listeners, the links and the providers."""

from __future__ import annotations

from peerd import __version__
from peerd import contracts as c
from peerd.doctor.facts import (
    CERT_WARN_DAYS,
    DAY_S,
    INSTALL,
    TOKEN_WARN_DAYS,
    Check,
    Facts,
)
from peerd.doctor.text import (
    day_of,
    days_text,
    quoted,
)
from peerd.peer.client import is_loopback_url

# --- the certificate ---------------------------------------------------------------------------


def check_certificate(facts: Facts) -> Check:
    cert = facts.certificate
    name = "certificate"
    relink = "each laptop linked to this machine must then link again (`peerd pair` here, `peerd link` there)"
    rebuild = (
        f"Move it away (`mv {quoted(cert.path)} {quoted(cert.path + '.old')}`) and restart the daemon: it makes a new "
        f"certificate for the same environment id, with a new fingerprint; {relink}."
    )
    restore = f"Restore {cert.path} from a backup before the daemon restarts; otherwise {relink}."
    if not cert.exists:
        if not facts.daemon_up:
            return Check(
                name, "skip", f"{cert.path} does not exist yet; the daemon creates it when it starts"
            )
        return Check(
            name,
            "fail",
            f"{cert.path} is missing; the daemon's next start makes a new one, with a new fingerprint",
            restore,
        )
    if cert.error is not None:
        return Check(name, "fail", f"{cert.path} does not load: {cert.error}", restore)
    if cert.for_key is False:
        return Check(
            name,
            "fail",
            f"{cert.path} is not the certificate of the identity key; the daemon's next start replaces it, "
            "with a new fingerprint",
            restore,
        )
    status = facts.status
    if status is not None and cert.fingerprint is not None and cert.fingerprint != status.fingerprint:
        return Check(
            name,
            "fail",
            f"{cert.path} ({cert.fingerprint}) is not the certificate the running daemon presents "
            f"({status.fingerprint}); it changed since the daemon started",
            restore,
        )
    if cert.not_after is not None and cert.not_after <= facts.now:
        return Check(name, "fail", f"{cert.path} expired on {day_of(cert.not_after)}", rebuild)
    if cert.not_before is not None and cert.not_before > facts.now:
        return Check(
            name,
            "warn",
            f"{cert.path} is not valid before {day_of(cert.not_before)}",
            "Check this machine's clock (`timedatectl` or `date`); the certificate was made at a later time.",
        )
    compared = (
        "matches the running daemon" if status is not None else "not compared: the daemon is not running"
    )
    if cert.not_after is not None and cert.not_after - facts.now < CERT_WARN_DAYS * DAY_S:
        return Check(
            name,
            "warn",
            f"{cert.path} expires on {day_of(cert.not_after)}, in {days_text(cert.not_after - facts.now)}; {compared}",
            rebuild,
        )
    until = f", valid until {day_of(cert.not_after)}" if cert.not_after is not None else ""
    return Check(name, "ok", f"{cert.fingerprint}{until}; {compared}")


# --- listeners, links, providers ---------------------------------------------------------------


def _daemon_down(facts: Facts) -> str:
    if facts.daemon.answered:
        return "not checked: the daemon did not give its status"
    return "not checked: the daemon is not running"


def check_console(facts: Facts) -> Check | None:
    """The browser console: where it listens, or why not (its port taken: another daemon here?)."""
    status = facts.status
    if status is None or status.console is None:
        return None  # not running, or a daemon that does not say
    console = status.console
    if console.state == "off":
        return Check("console", "skip", console.note or "off (console.enabled = false)")
    if console.state == "not_listening" or console.url is None:
        return Check(
            "console",
            "warn",
            console.note or "not listening",
            "Set console.listen in config.toml to a free port.",
        )
    if console.state == "moved":
        return Check(
            "console",
            "warn",
            f"{console.url}: console.listen's port was taken (another peerd on this machine?)",
            "Give each daemon on this machine its own console.listen port in its config.toml.",
        )
    return Check("console", "ok", console.url)


def check_pushes(facts: Facts) -> Check | None:
    """A2A push notifications given up lately (peerd/a2a/push.py): a webhook that did not answer."""
    status = facts.status
    if status is None or status.a2a_pushes is None:
        return None  # not running, or a daemon that does not say
    pushes = status.a2a_pushes
    days = f"{pushes.window_s / DAY_S:g} days"
    if pushes.given_up == 0:
        return Check("a2a-pushes", "ok", f"none given up in the last {days}")
    detail = f"{pushes.given_up} push notification(s) given up in the last {days}"
    if pushes.latest:
        latest = pushes.latest[0]
        detail += f"; the latest, to {latest.webhook} for task {latest.task_id}: {latest.reason}"
    return Check(
        "a2a-pushes",
        "warn",
        detail,
        "A webhook must answer 2xx (each push is retried 12 times with backoff, then given up); one on a "
        "private or loopback address needs its network in [a2a] allow_private_push in config.toml. Nothing "
        "of the task is lost: its A2A client reads it with GetTask, which lists the pushes given up "
        "(docs/user/a2a.md).",
        tuple(f"{p.task_id}  {p.state:<14}  {p.webhook}  {p.reason}" for p in pushes.latest),
    )


def check_listeners(facts: Facts) -> Check:
    status = facts.status
    if status is None:
        return Check("listeners", "skip", _daemon_down(facts))
    tcp = [x for x in status.listeners if x.kind == "tcp"]
    if not tcp:
        return Check(
            "listeners",
            "warn",
            "only the local socket: other machines cannot link to this one (it can still link to them)",
            "To let other machines link here, restart the daemon with `--listen HOST:PORT` "
            "(or set `listen` in the config file).",
        )
    addresses = ", ".join(x.address for x in tcp)
    plain = [x.address for x in tcp if not x.tls]
    if plain:
        return Check(
            "listeners",
            "warn",
            f"{', '.join(plain)} is plain HTTP: nothing is pinned, fit for tests only",
            "Restart the daemon without `--no-tls` (and without `tls = false` in the config file).",
        )
    if all(is_loopback_url(x.address) for x in tcp):
        return Check(
            "listeners",
            "ok",
            f"{addresses} (loopback only: other machines reach it only through a tunnel or proxy)",
        )
    return Check("listeners", "ok", addresses)


def check_link(link: c.LinkInfo, now: float) -> Check:
    name = f"link:{link.label}"
    label = quoted(link.label)
    where = ", ".join(link.urls) or "no address"
    relink = (
        f"Make a new pairing code on {link.label} (`peerd pair` there) and link again here "
        "(`peerd link CODE`); the new link replaces this one."
    )
    if link.status == "expired":
        return Check(
            name,
            "fail",
            f"the link to {link.label} expired: {link.last_error or 'its lifetime ran out'}",
            relink,
        )
    if link.status == "revoked":
        why = link.last_error or f"{link.label} no longer accepts this link"
        return Check(name, "fail", f"the link to {link.label} was revoked: {why}", relink)
    token = ""
    soon = False
    if link.expires_at is not None:
        left = link.expires_at - now
        token = f"; its token expires on {day_of(link.expires_at)}, in {days_text(max(left, 0.0))}"
        soon = left < TOKEN_WARN_DAYS * DAY_S
    if link.status == "unreachable":
        return Check(
            name,
            "warn",
            f"{link.label} does not answer: {link.last_error or 'no address answered'}{token}",
            f"Check that {link.label} is up and its daemon runs with a listener (`peerd status` there), and that "
            f"this machine reaches {where}; `peerd environment show {label}` tries again.",
        )
    if link.status == "version_skew":
        return Check(
            name,
            "warn",
            f"{link.label} answers at {where} but runs a peerd too old for this one: "
            f"{link.last_error or 'it lacks the change feed'}{token}",
            f"Update peerd on {link.label} to this release (peerd {__version__}) and restart it there; "
            "tasks delegated to it wait meanwhile, and `peerd environment show "
            f"{label}` asks it again.",
        )
    if soon:
        return Check(
            name,
            "warn",
            f"reachable at {where}{token}",
            f"Use the link before then to renew its token (e.g. `peerd project list --env {label}`); a link made "
            f"with --max-age ends then anyway: make a new code on {link.label} and link again.",
        )
    return Check(name, "ok", f"reachable at {where}{token}, {link.access} access")


def check_links(facts: Facts) -> list[Check]:
    if facts.daemon.links is None:
        if not facts.daemon_up:
            return [Check("links", "skip", _daemon_down(facts))]
        return [
            Check(
                "links",
                "fail",
                f"the daemon could not list its links: {facts.daemon.links_error}",
                "Read the daemon's log (stderr of `peerd serve`), then run `peerd environment list`.",
            )
        ]
    if not facts.daemon.links:
        return [Check("links", "ok", "no linked environments")]
    return [check_link(link, facts.now) for link in facts.daemon.links]


def check_provider(p: c.ProviderInfo, config_path: str) -> Check:
    name = f"provider:{p.name}"
    config = f"the config file ({config_path} unless the daemon was given another)"
    if p.kind == "script":
        return Check(name, "ok", "built in")
    if p.kind == "command":
        if not p.found:
            return Check(
                name,
                "warn",
                f"custom command: {p.problem or 'its program was not found'}",
                f"Install {p.binary or 'its program'}, or correct providers.{p.name}.command in {config}; "
                "then restart the daemon.",
            )
        if not p.approved:
            return Check(
                name,
                "warn",
                f"custom command not approved, so it does not run: {p.command}",
                f"Read the command, then approve it: `peerd provider approve {quoted(p.name)}`.",
            )
        return Check(name, "ok", f"approved custom command, {p.path}")
    product = INSTALL.get(p.kind, p.binary or p.name)
    if not p.found:
        return Check(
            name,
            "warn",
            f"{p.binary or p.kind!r} not found on the daemon's PATH (needed only for {p.name} threads)",
            f"Install {product}, or set providers.{p.name}.binary in {config} to where it is; "
            "then restart the daemon.",
        )
    if p.version is None:
        return Check(
            name,
            "warn",
            f"found at {p.path}, but `{p.path} --version` did not answer",
            f"Run `{quoted(p.path or p.name)} --version` yourself to see what is wrong (a broken install, a prompt).",
        )
    return Check(name, "ok", f"{p.version}, {p.path}")


def check_providers(facts: Facts) -> list[Check]:
    if facts.daemon.providers is None:
        if not facts.daemon_up:
            return [Check("providers", "skip", _daemon_down(facts))]
        return [
            Check(
                "providers",
                "fail",
                f"the daemon could not list its providers: {facts.daemon.providers_error}",
                "Read the daemon's log (stderr of `peerd serve`), then run `peerd provider list`.",
            )
        ]
    return [check_provider(p, facts.config_path) for p in facts.daemon.providers]
