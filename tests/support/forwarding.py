"""The forwarding tests' fixture `linked`: a laptop linked to a box (`auto`), one project on each
side, each its own repository."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Pair, make_repo, two_daemons


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[tuple[Pair, dict[str, Any], dict[str, Any]]]:
    """A laptop linked to a box with `auto` access; one project on each side, one repository."""
    async with two_daemons(tmp_path) as pair:
        lc, bc = pair.lc, pair.bc
        here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "laptop-repo"))})
        there = await bc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))})
        await pair.link("auto")
        yield pair, here, there
