"""Before a move is recorded, on the machine it leaves: whether an environment can take the thread
(`preflight`, which refuses with a typed error), and every linked environment's answer with its
reason (`candidates`, the dry run). Each asks the environment's `POST /v1/handoff/check`; the
thread's repository key and provider name are all that is sent."""

from __future__ import annotations

import asyncio

from peerd import contracts as c
from peerd.errors import MoveRefused, PeerdError, ProviderUnavailable
from peerd.handoff.wire import Candidate, TakeAnswer
from peerd.operations import Caller, Operations
from peerd.peer.links import LinkService
from peerd.store import links as link_store


async def preflight(ops: Operations, env: str, thread: c.Thread, project: c.Project) -> TakeAnswer:
    """The environment there can take the thread, or a typed refusal saying why."""
    link = await link_store.get(ops.db, env)
    if link is not None and link.access == "read-only":
        raise MoveRefused(f"The link to {link.label!r} is read-only: a move needs one that allows writes.")
    if project.repository_key is None:
        raise MoveRefused(
            f"Project {project.id} has no origin remote, so no project there can be matched to it."
        )
    body = {"repositoryKey": project.repository_key, "provider": thread.provider}
    seen = TakeAnswer.model_validate(await ops.forward_raw(env, "POST", "/v1/handoff/check", body=body))
    if seen.project_id is None:
        raise MoveRefused(
            f"{env} has no project with repository {project.repository_key}; add a clone there."
        )
    if not seen.provider_installed or not seen.provider_allowed:
        why = "is not installed" if not seen.provider_installed else "may not be used by links"
        raise ProviderUnavailable(
            f"Provider {thread.provider!r} {why} there; installed there: {', '.join(seen.providers) or 'none'}. "
            "A thread moves with its own provider."
        )
    return seen


async def candidates(ops: Operations, links: LinkService, thread: c.Thread) -> list[Candidate]:
    """Every linked environment, by label, each asked in parallel."""
    project = await ops.project_show(Caller.local(), thread.project_id)
    rows = sorted(await links.environment_list(probe=False), key=lambda link: link.label)
    key = project.repository_key
    if key is None:
        reason = f"project {project.id} has no origin remote to match"
        return [
            Candidate(environment_id=r.environment_id, label=r.label, fits=False, reason=reason) for r in rows
        ]
    return list(await asyncio.gather(*(candidate(ops, r, key=key, provider=thread.provider) for r in rows)))


async def candidate(ops: Operations, link: c.LinkInfo, *, key: str, provider: str) -> Candidate:
    """One linked environment as a dry run sees it: whether it can take the thread, and why not."""
    base = {"environment_id": link.environment_id, "label": link.label}
    if link.status in ("revoked", "expired"):
        return Candidate(**base, fits=False, reason=f"the link is {link.status}: link again")
    if link.access == "read-only":
        return Candidate(**base, fits=False, reason="the link is read-only: it allows no writes there")
    try:
        data = await ops.forward_raw(
            link.environment_id,
            "POST",
            "/v1/handoff/check",
            body={"repositoryKey": key, "provider": provider},
        )
        seen = TakeAnswer.model_validate(data)
    except PeerdError as exc:
        return Candidate(**base, fits=False, reason=f"not reachable ({exc.code}): {exc.message}")
    if seen.project_id is None:
        return Candidate(**base, fits=False, reason=f"no project with repository {key} there")
    if not seen.provider_installed:
        there = ", ".join(seen.providers) or "none"
        return Candidate(**base, fits=False, reason=f"provider {provider} is not installed there (installed: {there})",
                         project_id=seen.project_id)  # fmt: skip
    if not seen.provider_allowed:
        return Candidate(**base, fits=False, reason=f"its owner does not let links use provider {provider}",
                         project_id=seen.project_id)  # fmt: skip
    if seen.access == "read-only":
        return Candidate(**base, fits=False, reason="the link is read-only there", project_id=seen.project_id)
    return Candidate(
        **base,
        fits=True,
        reason=f"project {seen.project_id}, {provider}, up to {seen.access}",
        project_id=seen.project_id,
    )
