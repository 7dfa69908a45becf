"""Access levels and mode caps, pure.

    read-only < approval-required < auto-accept-edits < auto < full-access

A link's access level caps every run it starts. A caller may send a narrower limit (its own
modes) and the narrower of the two applies; a limit can narrow a cap, never widen it. Explicit
modes above the cap are refused with a message saying what was asked and what is allowed;
omitted modes take the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.core.constants import INTERACTION_MODES, RUNTIME_MODES, InteractionMode, RuntimeMode
from peerd.errors import (
    CapabilityDenied,
    InteractionModeEscalationDenied,
    InvalidRequest,
    RuntimeModeEscalationDenied,
)

AccessLevel = RuntimeMode
ACCESS_LEVELS: tuple[AccessLevel, ...] = RUNTIME_MODES
DEFAULT_LINK_ACCESS: AccessLevel = "approval-required"


def runtime_rank(mode: RuntimeMode) -> int:
    return RUNTIME_MODES.index(mode)


def interaction_rank(mode: InteractionMode) -> int:
    return INTERACTION_MODES.index(mode)


def narrower_runtime(a: RuntimeMode, b: RuntimeMode) -> RuntimeMode:
    return a if runtime_rank(a) <= runtime_rank(b) else b


def narrower_interaction(a: InteractionMode, b: InteractionMode) -> InteractionMode:
    return a if interaction_rank(a) <= interaction_rank(b) else b


def parse_access(text: str) -> AccessLevel:
    if text not in ACCESS_LEVELS:
        raise InvalidRequest(f"Unknown access level {text!r}; use one of: {', '.join(ACCESS_LEVELS)}.")
    return text


@dataclass(frozen=True)
class ModeCap:
    """The widest modes a caller may use: a link's level, narrowed by the caller's own limit."""

    runtime: RuntimeMode
    interaction: InteractionMode

    def describe(self) -> str:
        return f"{self.runtime}/{self.interaction}"


@dataclass(frozen=True)
class LinkContext:
    """A caller that came in through a link: the box enforces its access and fence from this."""

    client_id: str
    label: str
    access: RuntimeMode
    cap: ModeCap
    # A signed-in agent (issue 29) sees only the threads it started; a linked peerd reads them all.
    own_threads_only: bool = False


def parse_mode_limit(header: str | None) -> ModeCap | None:
    """`<runtimeMode>/<interactionMode>` (the calling agent's own modes), or None when absent."""
    if header is None or not header.strip():
        return None
    runtime, sep, interaction = header.strip().partition("/")
    if runtime not in RUNTIME_MODES or (sep and interaction not in INTERACTION_MODES):
        raise InvalidRequest(
            f"Mode limit {header!r} must be <runtimeMode>/<interactionMode>, e.g. auto-accept-edits/default."
        )
    return ModeCap(runtime, interaction if sep else "default")  # type: ignore[arg-type]  # checked above


def cap_for(link_access: AccessLevel, limit: ModeCap | None) -> ModeCap:
    """The link's cap narrowed by the caller's limit; a wider limit changes nothing."""
    cap = ModeCap(link_access, "default")
    if limit is None:
        return cap
    return ModeCap(
        narrower_runtime(cap.runtime, limit.runtime), narrower_interaction(cap.interaction, limit.interaction)
    )


def resolve_modes(
    cap: ModeCap, runtime: RuntimeMode | None, interaction: InteractionMode | None
) -> tuple[RuntimeMode, InteractionMode]:
    """Explicit modes must fit under the cap; omitted ones take the cap."""
    if runtime is not None and runtime_rank(runtime) > runtime_rank(cap.runtime):
        raise RuntimeModeEscalationDenied(
            f"Runtime mode {runtime} is broader than this caller may use here ({cap.runtime})."
        )
    if interaction is not None and interaction_rank(interaction) > interaction_rank(cap.interaction):
        raise InteractionModeEscalationDenied(
            f"Interaction mode {interaction} is broader than this caller may use here ({cap.interaction})."
        )
    return runtime or cap.runtime, interaction or cap.interaction


def require_write(access: AccessLevel, what: str) -> None:
    """Read-only links may only read."""
    if access == "read-only":
        raise CapabilityDenied(f"This link has read-only access, so it cannot {what}.")


def access_within(requested: AccessLevel, ceiling: AccessLevel) -> bool:
    return runtime_rank(requested) <= runtime_rank(ceiling)
