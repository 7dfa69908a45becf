"""The placement rules, pure: who qualifies, who wins, the reasons, staleness (an injected now)."""

from __future__ import annotations

from typing import Any

import pytest

from peerd import contracts as c
from peerd.errors import NoPlacement
from peerd.placement.rules import MAX_AGE_S, Candidate, Need, choose, is_stale, judge, score, standing

KEY = "github.com/peerd/demo"
NOW = 1_000_000.0
GIB = 2**30


def cap(**kw: Any) -> c.Capacity:
    base: dict[str, Any] = {
        "live_runs": 0,
        "max_runs": 4,
        "load": 0.0,
        "cpus": 4,
        "mem_available": 8 * GIB,
        "mem_total": 16 * GIB,
        "providers": ["script", "codex"],
        "projects": [c.ProjectKey(id="prj_box", name="demo", repository_key=KEY)],
        "preference": "normal",
    }
    return c.Capacity(**{**base, **kw})


def box(label: str = "box", *, seen: float = NOW - 5, access: c.RuntimeMode = "auto", **kw: Any) -> Candidate:
    return Candidate(f"ENV-{label}", label, cap(**kw), seen_at=seen, access=access)


def here(**kw: Any) -> Candidate:
    return Candidate(None, "laptop", cap(**kw), seen_at=NOW)


NEED = Need(provider="script", repository_key=KEY, here_project_id="prj_here")


def test_the_least_loaded_wins_and_every_candidate_has_its_reason() -> None:
    placed = choose([here(live_runs=3, load=3.0), box(live_runs=1, max_runs=8, load=0.4)], NEED, NOW)
    assert placed.environment_id == "ENV-box"
    assert placed.project_id == "prj_box"  # the one project there with this repository
    assert placed.reason.startswith("box: 1 of 8 runs, load 0.4, 8.0 GiB free, normal; laptop: 3 of 4 runs")


def test_here_runs_in_its_own_project() -> None:
    placed = choose([here(), box(live_runs=2)], NEED, NOW)
    assert (placed.environment_id, placed.project_id) == (None, "prj_here")


def test_a_tie_goes_to_here() -> None:
    assert choose([box(), here()], NEED, NOW).environment_id is None


def test_a_full_box_is_passed_by() -> None:
    """live runs < max_runs: at max_runs a box takes no more, however idle it looks."""
    verdict = judge(box(live_runs=4, max_runs=4), NEED, NOW)
    assert not verdict.ok
    assert verdict.reason.startswith("full: 4 of 4 runs")
    placed = choose([here(live_runs=3, load=4.0, mem_available=GIB), box(live_runs=4, max_runs=4)], NEED, NOW)
    assert placed.environment_id is None


def test_max_runs_zero_takes_nothing() -> None:
    assert not judge(box(max_runs=0), NEED, NOW).ok


def test_preference_weighs_the_load() -> None:
    """prefer < normal < less: the same load scores lower the more a box is preferred, and a
    preferred box wins against a somewhat less loaded normal one."""
    same = {"live_runs": 1, "load": 1.0}
    assert (
        score(cap(preference="prefer", **same)) < score(cap(**same)) < score(cap(preference="less", **same))
    )
    placed = choose([here(live_runs=1), box(live_runs=2, preference="prefer")], NEED, NOW)
    assert placed.environment_id == "ENV-box"
    assert "prefers" in placed.reason
    placed = choose([here(live_runs=1), box(live_runs=0, preference="less")], NEED, NOW)
    assert placed.environment_id is None


def test_manual_only_is_never_chosen() -> None:
    verdict = judge(box(preference="manual-only"), NEED, NOW)
    assert (verdict.ok, verdict.reason) == (False, "manual only")
    with pytest.raises(NoPlacement) as err:
        choose([here(preference="manual-only")], NEED, NOW)
    assert err.value.code == "no_placement"


def test_a_box_without_the_provider_or_the_project_is_passed_by_with_its_reason() -> None:
    assert judge(box(providers=["codex"]), NEED, NOW).reason == "no provider script"
    assert judge(box(projects=[]), NEED, NOW).reason == "no project with this repository"
    two = [c.ProjectKey(id=f"p{i}", repository_key=KEY) for i in (1, 2)]
    assert judge(box(projects=two), NEED, NOW).reason.startswith("several projects with this repository")
    unkeyed = Need("script", None, "prj_here")
    assert judge(box(), unkeyed, NOW).reason == "this project has no repository to match there"
    assert judge(here(projects=[]), unkeyed, NOW).ok  # here is the project itself


def test_the_link_must_allow_the_modes() -> None:
    assert judge(box(access="read-only"), NEED, NOW).reason.startswith("the link is read-only")
    wide = Need("script", KEY, "prj_here", runtime_mode="full-access")
    assert judge(box(access="auto"), wide, NOW).reason == "the link allows at most auto, not full-access"
    assert judge(box(access="full-access"), wide, NOW).ok
    assert judge(here(), wide, NOW).ok  # here the caller's own cap applies at the launch


def test_nothing_qualifies_lists_every_candidate() -> None:
    with pytest.raises(NoPlacement) as err:
        choose([here(live_runs=4), box(access="read-only"), box("studio", providers=[])], NEED, NOW)
    message = err.value.message
    assert "laptop: full: 4 of 4 runs" in message
    assert "box: the link is read-only" in message
    assert "studio: no provider script" in message


def test_staleness() -> None:
    assert not is_stale(box(seen=NOW - MAX_AGE_S), NOW)
    assert is_stale(box(seen=NOW - MAX_AGE_S - 1), NOW)
    assert is_stale(Candidate("ENV-x", "x", None), NOW)  # never read
    assert not is_stale(here(), NOW)  # read now, always
    assert not is_stale(Candidate("ENV-x", "x", None, blocked="the link was revoked there"), NOW)


def test_an_unreachable_stale_box_is_passed_by_and_a_fresh_report_still_counts() -> None:
    down = Candidate(
        "ENV-s", "studio", cap(), seen_at=NOW - 600, error="not reachable: refused", access="auto"
    )
    assert judge(down, NEED, NOW).reason == "not reachable: refused"
    fresh = Candidate(
        "ENV-s", "studio", cap(), seen_at=NOW - 1, error="not reachable: refused", access="auto"
    )
    assert judge(fresh, NEED, NOW).ok  # the feed brought a report after the failed check
    older = Candidate("ENV-o", "old", None, error="reports no capacity (an older peerd)", access="auto")
    assert judge(older, NEED, NOW).reason == "reports no capacity (an older peerd)"
    placed = choose([here(live_runs=2), down], NEED, NOW)
    assert placed.reason.endswith("studio: not reachable: refused")


def test_standing_reads_like_the_issue() -> None:
    text = standing(cap(live_runs=1, max_runs=8, load=0.4, mem_available=None, preference="prefer"))
    assert text == "1 of 8 runs, load 0.4, prefers"


def test_a_boxs_report_is_bounded_and_plain() -> None:
    """What a box reports is its claim: refused when oversized or odd, names kept to one line."""
    base = {"liveRuns": 0, "maxRuns": 4}
    with pytest.raises(ValueError):
        c.Capacity.model_validate({**base, "providers": [f"p{i}" for i in range(65)]})
    with pytest.raises(ValueError):
        c.Capacity.model_validate({**base, "providers": ["co\x1b[2Jdex"]})
    with pytest.raises(ValueError):
        c.Capacity.model_validate({**base, "projects": [{"id": "prj\n; x"}]})
    with pytest.raises(ValueError):
        c.Capacity.model_validate({**base, "load": float("nan")})
    shown = c.Capacity.model_validate({**base, "projects": [{"id": "prj_1", "name": "shop\x1b[31m\nrm"}]})
    assert "\x1b" not in shown.projects[0].name and "\n" not in shown.projects[0].name
    older = c.LinkSelf.model_validate({"envId": "E", "clientId": "cli_1", "label": "l", "access": "auto"})
    assert older.capacity is None  # an older box sends none
