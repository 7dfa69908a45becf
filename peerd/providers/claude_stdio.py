"""Claude Code's stdio permission protocol: a run whose guarded actions a person approves
(see `peerd.providers.asking`)."""

from __future__ import annotations

from pathlib import Path

from peerd.config import ProviderConfig
from peerd.providers.base import RunSpec
from peerd.providers.cli import Launch, ToolBinding
from peerd.providers.duplex import DuplexDriver


def duplex_launch(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[Launch, DuplexDriver] | None:
    """Not built yet: None keeps today's headless behaviour (the nearest narrower mode)."""
    return None
