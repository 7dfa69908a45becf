"""Wire constants the command line needs, kept free of pydantic so `peerd` starts at once.

`peerd.contracts` re-exports them; define them here only.
"""

from __future__ import annotations

from typing import Literal

RuntimeMode = Literal["read-only", "approval-required", "auto-accept-edits", "auto", "full-access"]
RUNTIME_MODES: tuple[RuntimeMode, ...] = (
    "read-only",
    "approval-required",
    "auto-accept-edits",
    "auto",
    "full-access",
)
InteractionMode = Literal["default", "plan"]
INTERACTION_MODES: tuple[InteractionMode, ...] = ("plan", "default")  # narrowest first
LONG_POLL_MAX_S = 50.0
