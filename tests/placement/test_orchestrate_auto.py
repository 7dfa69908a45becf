"""`--on auto` and `auto/<backend>` coder specs in `peerd orchestrate`: each hop is placed as it
starts, and the report says where and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import PlacementConfig
from peerd.errors import InvalidRequest
from peerd.orchestrate.coders import parse_coder_spec
from peerd.orchestrate.report import progress, render
from peerd.orchestrate.states import TERMINAL_RUN
from peerd.placement import capacity
from tests.helpers import git, two_daemons
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
)

GIB = 2**30


def test_auto_is_an_environment_of_a_coder_spec() -> None:
    spec = parse_coder_spec("auto/codex:gpt-5.5", known_environments=[])
    assert (spec.environment, spec.backend, spec.model) == ("auto", "codex", "gpt-5.5")
    with pytest.raises(InvalidRequest):
        parse_coder_spec("studio/codex", known_environments=["box"])


@pytest.mark.slow
async def test_on_auto_places_each_packet_and_the_report_says_why(tmp_path: Path) -> None:
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    homes = {"laptop": tmp_path / "laptop", "box": tmp_path / "box"}
    capacity.OVERRIDES[str(homes["laptop"])] = capacity.Readers(
        load=lambda: (3.8, 4), memory=lambda: (GIB, 16 * GIB)
    )
    capacity.OVERRIDES[str(homes["box"])] = capacity.Readers(
        load=lambda: (0.2, 8), memory=lambda: (24 * GIB, 32 * GIB)
    )
    config = settings(tmp_path).model_copy(
        update={"placement": PlacementConfig(max_runs=8, preference="prefer")}
    )
    try:
        async with two_daemons(tmp_path, settings=config) as pair:
            for side, client in (("laptop", pair.lc), ("box", pair.bc)):
                git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
                await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
            await pair.link("auto")
            project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
            plan = [packet("fix", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
            info = await start(pair.lc, project, plan=plan, coders=["script"], on=["auto"])
            done = await finished(pair.lc, info["id"])
    finally:
        for home in homes.values():
            capacity.OVERRIDES.pop(str(home), None)
    assert done["status"] == "completed", done
    fix = packets_of(done)["fix"]
    assert fix["environment"] == "box" and fix["state"] == "integrated"
    reason = fix["coder"]["reason"]
    assert "placed by auto: box: 0 of 8 runs, load 0.2, 24.0 GiB free, prefers; laptop: " in reason, reason
    assert "placed by auto: box: " in render(done)


@pytest.mark.slow
async def test_on_auto_places_the_reviewer_and_the_report_shows_where_it_ran(tmp_path: Path) -> None:
    """Issue 32: the reviewer of an `--on auto` run showed "on auto" though it ran on the box. Every
    hop shows where it ran: the report, the live progress, and the API's packet."""
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    homes = {"laptop": tmp_path / "laptop", "box": tmp_path / "box"}
    capacity.OVERRIDES[str(homes["laptop"])] = capacity.Readers(
        load=lambda: (3.8, 4), memory=lambda: (GIB, 16 * GIB)
    )
    capacity.OVERRIDES[str(homes["box"])] = capacity.Readers(
        load=lambda: (0.2, 8), memory=lambda: (24 * GIB, 32 * GIB)
    )
    config = settings(tmp_path).model_copy(
        update={"placement": PlacementConfig(max_runs=8, preference="prefer")}
    )
    lines: list[str] = []
    try:
        async with two_daemons(tmp_path, settings=config) as pair:
            for side, client in (("laptop", pair.lc), ("box", pair.bc)):
                git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
                await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
            await pair.link("auto")
            project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
            plan = [packet("fix", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
            info = await start(pair.lc, project, plan=plan, coders=["script"], on=["auto"], reviewer=None)
            seen: dict[str, Any] = {}
            while info["status"] not in TERMINAL_RUN:
                lines += progress(info, seen)
                info = await pair.lc.call(
                    "GET",
                    f"/v1/orchestrations/{info['id']}",
                    params={"after": info["updatedAt"], "timeout": 10},
                )
            lines += progress(info, seen)
    finally:
        for home in homes.values():
            capacity.OVERRIDES.pop(str(home), None)
    assert info["status"] == "completed", info
    fix = packets_of(info)["fix"]
    assert fix["reviewer"]["environment"] == "box", fix["reviewer"]
    (review,) = receipts_of(info, "review", "fix")
    assert review["reviewer"]["environment"] == "box"
    text = render(info)
    assert "reviewer: box/script (its default model, on box)" in text, text
    assert "on auto" not in text and not any("on auto" in line for line in lines), "\n".join(lines)
    assert any("reviewing" in line and "on box" in line for line in lines), "\n".join(lines)
