"""The console's templates: Jinja2, autoescaped (peer text is untrusted), strict about undefined
names; the environment is built on the first page, not at daemon start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from peerd.console.state import CONSOLE, SESSION
from peerd.core.text import path_segment
from peerd.core.usage import Usage, describe
from peerd.errors import PeerdError
from peerd.orchestrate.report import limits as words
from peerd.present import ago, local_time

if TYPE_CHECKING:
    import jinja2

NAV = (
    ("environment", "/", "Environment"),
    ("connections", "/connections", "Connections"),
    ("board", "/board", "Board"),
    ("needs", "/needs-you", "Needs you"),
    ("threads", "/threads", "Threads"),
    ("tasks", "/tasks", "Tasks"),
    ("approvals", "/approvals", "Approvals"),
    ("orchestrations", "/orchestrations", "Orchestrations"),
    ("fleet", "/fleet", "Fleet"),
)
# A symbol beside each status word: the state is readable without colour (and the word is there).
SYMBOLS = {
    "running": "▶",
    "starting": "▶",
    "queued": "…",
    "pending": "…",
    "completed": "✓",
    "integrated": "✓",
    "approved": "✓",
    "reachable": "✓",
    "active": "✓",
    "ok": "✓",
    "open": "○",
    "failed": "✗",
    "fail": "✗",
    "parked": "✗",
    "not_integrated": "✗",  # an orchestration that integrated nothing
    "check_failed": "✗",  # an orchestration whose full check failed
    "unreachable": "✗",
    "version_skew": "⚠",
    "revoked": "✗",
    "expired": "⌛",
    "cancelled": "■",
    "interrupted": "■",
    "archived": "▪",
    "moved": "→",
    "warn": "!",
    "skip": "-",
}

_env: jinja2.Environment | None = None
_markdown: Any = None  # markdown_it.MarkdownIt, built on first use


def markdown(text: str) -> Any:
    """An agent's text as HTML, safely: CommonMark by markdown-it-py with raw HTML off (any tag in
    the text is shown as text, escaped), links only to what markdown-it's `validateLink` allows (no
    `javascript:`, `vbscript:`, `file:` or `data:`), and no images (the CSP would block another
    site's, and an image can say the page was read)."""
    global _markdown  # noqa: PLW0603  # one parser per process, built when first needed
    import markupsafe  # noqa: PLC0415  # jinja2's own dependency, loaded with it

    if _markdown is None:
        from markdown_it import MarkdownIt  # noqa: PLC0415  # on the first thread page only

        _markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
        _markdown.disable("image")
    return markupsafe.Markup(_markdown.render(str(text)).strip())  # noqa: S704  # raw HTML is off: escaped


def pretty(value: Any) -> str:
    """A tool's arguments or result as indented JSON (escaped by the template like any text)."""
    import json  # noqa: PLC0415

    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def limits(budget: Any) -> str:
    return words(budget)


def spent(value: Any) -> str:
    """A usage (the contract's model, or its JSON) in one line; null is "not reported": unknown,
    not zero. An estimated cost reads "~$0.0120 (estimate)"."""
    if value is None:
        return "not reported"
    data = value.wire() if hasattr(value, "wire") else value
    return describe(Usage.from_json(data)) if isinstance(data, dict) else "not reported"


def spent_short(value: Any) -> str:
    """A usage on a board card: its tokens and cost ("1,200 tok, $0.5000"); '' when unknown."""
    data = value.wire() if hasattr(value, "wire") else value
    if not isinstance(data, dict):
        return ""
    usage = Usage.from_json(data)
    text = f"{usage.total_tokens:,} tok"
    if usage.cost_usd is not None:
        text += f", {'~' if usage.cost_estimated else ''}${usage.cost_usd:,.4f}"
    return text


def _environment() -> jinja2.Environment:
    global _env  # noqa: PLW0603  # one environment per process, built when first needed
    if _env is None:
        import jinja2  # noqa: PLC0415  # ~30 ms: on the first page, not at daemon start

        env = jinja2.Environment(
            loader=jinja2.PackageLoader("peerd.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters["local_time"] = local_time
        env.filters["ago"] = ago
        env.filters["seg"] = path_segment  # an id in a URL path: one escaped segment
        env.filters["short"] = lambda value, n=12: (
            str(value) if value is None or len(str(value)) <= n else str(value)[:n] + "…"
        )
        env.filters["usage_short"] = spent_short
        env.filters["markdown"] = markdown
        env.filters["pretty"] = pretty
        env.filters["usage"] = spent  # a run's, thread's, task's or hop's usage in one line
        env.globals["limits"] = limits  # a budget in words ("50,000 tokens, $2.0000"; "none")
        env.globals["symbol"] = lambda status: SYMBOLS.get(str(status), "•")
        env.globals["nav"] = NAV
        _env = env
    return _env


def render_text(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _common(request: web.Request) -> dict[str, Any]:
    console = request.app[CONSOLE]
    session = request.get(SESSION)
    notices = []
    if session is not None:
        notices, session.notices = session.notices, []
    return {
        "here": console.label,
        "env_id": console.env_id,
        "csrf": "" if session is None else session.csrf,
        "signed_in": session is not None,
        "notices": notices,
        "path": request.path[len(console.root) :] or "/",
        "root": console.root,
    }


def page(
    request: web.Request, template: str, *, title: str, status: int = 200, **context: Any
) -> web.Response:
    body = render_text(template, title=title, **_common(request), **context)
    return web.Response(status=status, text=body, content_type="text/html", charset="utf-8")


def fragment(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    return page(request, template, title="", status=status, **context)


def notice(request: web.Request, text: str, *, level: str = "info") -> None:
    """A one-line message shown on the next page this session renders (after a redirect)."""
    session = request.get(SESSION)
    if session is not None:
        session.notices.append((level, text))


def shown_error(exc: PeerdError) -> str:
    return f"{exc.code}: {exc.message}"
