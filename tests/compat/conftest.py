"""The previous release, built once per test session (tests/compat/release.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.compat.release import Release, build


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    yield build(tmp_path_factory.mktemp("previous-release"))
