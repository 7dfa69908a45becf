"""Placement that spreads (issue 33): every choice reserves a run on the chosen environment at once,
a later report absorbs it, ties go to the one chosen least recently. The rules pure (a ledger and an
injected now), then through the real service: 60 choices at once over one store."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd import contracts as c
from peerd.config import PlacementConfig
from peerd.errors import NoPlacement
from peerd.placement import capacity, rules
from peerd.placement import store as placement_store
from peerd.placement.rules import ABSORB_AFTER_S, Candidate, Ledger, Need, held_for
from peerd.placement.service import Placement
from peerd.store import links
from peerd.store.db import Database

KEY = "github.com/peerd/demo"
NOW = 1_000_000.0
GIB = 2**30
NEED = Need(provider="script", repository_key=KEY, here_project_id="prj_here")
BURST = 60


def cap(**kw: Any) -> c.Capacity:
    base: dict[str, Any] = {
        "live_runs": 0,
        "max_runs": 4,
        "load": 0.0,
        "cpus": 4,
        "mem_available": 8 * GIB,
        "mem_total": 16 * GIB,
        "providers": ["script"],
        "projects": [c.ProjectKey(id="prj_box", name="demo", repository_key=KEY)],
        "preference": "normal",
    }
    return c.Capacity(**{**base, **kw})


def box(label: str, *, seen: float = NOW - 5, **kw: Any) -> Candidate:
    return Candidate(f"ENV-{label}", label, cap(**kw), seen_at=seen, access="auto")


def burst(candidates: list[Candidate], n: int = BURST, ledger: Ledger | None = None) -> Counter[str]:
    """`n` choices made at once: every one reads the same reports (nothing reports in between)."""
    ledger = ledger or Ledger()
    split: Counter[str] = Counter()
    for i in range(n):
        placed, ledger = rules.place(candidates, NEED, ledger, NOW + i * 0.001)
        split[placed.label] += 1
    return split


def test_without_the_ledger_a_burst_herds_and_with_it_splits_evenly() -> None:
    """The issue's herd: every box reports 0 runs, so the same one wins every time, unless each
    choice counts the runs placed before it."""
    boxes = [box(label, max_runs=24, load=load) for label, load in (("a", 0.0), ("b", 0.1), ("c", 0.2))]
    herd = Counter(rules.choose(boxes, NEED, NOW).label for _ in range(BURST))
    assert herd == {"a": BURST}  # a is a little less loaded than the others: it wins every time
    split = burst(boxes)
    assert split == {"a": 21, "b": 20, "c": 19}, split


JITTER = st.floats(min_value=0.0, max_value=0.02)  # load per CPU: one machine read at other moments


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    max_runs=st.integers(min_value=4, max_value=64),  # 4: past every max_runs, still split
    jitter=st.lists(st.tuples(JITTER, JITTER), min_size=3, max_size=3),
    order=st.permutations([0, 1, 2]),
)
def test_sixty_at_once_over_three_equal_boxes_split_within_20_percent(
    max_runs: int, jitter: list[tuple[float, float]], order: list[int]
) -> None:
    boxes = [
        box(
            f"box{i}",
            max_runs=max_runs,
            load=load * 4,
            mem_available=int((0.5 - mem) * 16 * GIB),
            seen=NOW - 10 * i,
        )
        for i, (load, mem) in enumerate(jitter)
    ]
    split = burst([boxes[i] for i in order])
    assert sum(split.values()) == BURST
    for label in ("box0", "box1", "box2"):
        assert 16 <= split[label] <= 24, split  # 20 +- 20%


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(
    max_runs=st.sampled_from([2, 4, 8, 16]),
    jitter=st.lists(JITTER, min_size=21, max_size=21),
    order=st.permutations(list(range(21))),
)
def test_sixty_at_once_over_twenty_boxes_and_the_laptop_none_gets_twice_its_share(
    max_runs: int, jitter: list[float], order: list[int]
) -> None:
    fleet = [Candidate(None, "laptop", cap(max_runs=max_runs, load=jitter[0] * 4), seen_at=NOW)]
    fleet += [box(f"box{i:02}", max_runs=max_runs, load=jitter[i] * 4) for i in range(1, 21)]
    split = burst([fleet[i] for i in order])
    assert sum(split.values()) == BURST
    share = BURST / len(fleet)
    assert max(split.values()) <= 2 * share, split
    assert len(split) == len(fleet)  # every one took some


def test_weights_follow_max_runs() -> None:
    boxes = [box("small", max_runs=10), box("mid", max_runs=20), box("big", max_runs=40)]
    split = burst(boxes, 70)
    assert split == {"small": 10, "mid": 20, "big": 40}
    split = burst(boxes, BURST)
    for label, weight in (("small", 10), ("mid", 20), ("big", 40)):
        share = BURST * weight / 70
        assert abs(split[label] - share) <= 0.2 * share, split


def test_a_burst_past_the_room_left_spreads_by_max_runs_and_a_full_report_refuses() -> None:
    """Reserved runs are an estimate: they weigh, but only a report says a box is full."""
    boxes = [box("a", max_runs=2), box("b", max_runs=1)]
    assert burst(boxes, 3) == {"a": 2, "b": 1}  # the room there was
    assert burst(boxes, 9) == {"a": 6, "b": 3}  # past it: in proportion to max_runs
    placed, _ = rules.place(
        boxes, NEED, rules.reserve(rules.reserve(Ledger(), "ENV-a", NOW), "ENV-a", NOW), NOW
    )
    assert "a: 2 of 2 runs (2 just placed)" in placed.reason
    with pytest.raises(NoPlacement) as err:
        rules.place(
            [box("a", max_runs=2, live_runs=2), box("b", max_runs=1, queued_runs=1)], NEED, Ledger(), NOW
        )
    assert (
        "a: full: 2 of 2 runs" in err.value.message and "b: full: 1 of 1 runs (1 queued)" in err.value.message
    )


def test_queued_runs_count() -> None:
    placed = rules.choose([box("a", queued_runs=3, max_runs=8), box("b", live_runs=2, max_runs=8)], NEED, NOW)
    assert placed.label == "b"
    assert "a: 3 of 8 runs (3 queued)" in placed.reason
    verdict = rules.judge(box("a", live_runs=1, queued_runs=3), NEED, NOW)
    assert verdict.reason.startswith("full: 4 of 4 runs (3 queued)")


def test_a_report_read_after_a_reservation_absorbs_it() -> None:
    ledger = Ledger()
    for i in range(3):
        ledger = rules.reserve(ledger, "ENV-a", NOW + i)
    assert held_for(ledger, box("a", seen=NOW - 5)) == 3  # read before: counts none of them
    assert held_for(ledger, box("a", seen=NOW + 1.5)) == 3  # too soon after: the runs may not be in it
    assert held_for(ledger, box("a", seen=NOW + 1 + ABSORB_AFTER_S + 0.1)) == 1  # the two oldest are
    assert held_for(ledger, box("a", seen=NOW + 10)) == 0
    assert held_for(ledger, box("b", seen=NOW - 5)) == 0  # another box's
    assert held_for(ledger, Candidate("ENV-a", "a", None)) == 3  # never read

    # Choosing: a's old report counts its reserved runs; a fresh one (which counts what ran) does not.
    b = box("b", live_runs=1)
    assert rules.choose([box("a"), b], NEED, NOW + 3, ledger=ledger).label == "b"
    assert rules.choose([box("a", seen=NOW + 10), b], NEED, NOW + 11, ledger=ledger).label == "a"


def test_old_reservations_are_dropped_and_a_released_one_no_longer_counts() -> None:
    ledger = rules.reserve(Ledger(), "ENV-a", NOW)
    ledger = rules.reserve(ledger, "ENV-a", NOW + 200)  # the first is past 2 x MAX_AGE_S
    assert [r.at for r in ledger.held] == [NOW + 200]
    ledger = rules.release(ledger, ledger.seq)
    assert ledger.held == () and ledger.last_chosen == {"ENV-a": 2}


def test_a_tie_goes_to_the_one_chosen_least_recently() -> None:
    """Sequential choices whose runs end before the next (every report fresh, nothing held): the
    choice goes round, instead of the same label winning each time."""
    ledger = Ledger()
    order = []
    for i in range(6):
        now = NOW + 10 * i
        fleet = [Candidate(None, "laptop", cap(), seen_at=now), box("a", seen=now), box("b", seen=now)]
        placed, ledger = rules.place(fleet, NEED, ledger, now)
        order.append(placed.label)
    assert order == ["laptop", "a", "b", "laptop", "a", "b"]
    # Only a tie: a less loaded candidate still wins, however recently it was chosen.
    fleet = [box("a", seen=NOW + 100), box("b", seen=NOW + 100, live_runs=1)]
    assert rules.choose(fleet, NEED, NOW + 100, ledger=ledger).label == "a"


# --- through the service: 60 at once over one store ------------------------------------------


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


def link_row(label: str) -> links.LinkRow:
    return links.LinkRow(
        env_id=f"ENV-{label}",
        label=label,
        urls=(f"https://{label}.invalid:7433",),
        fingerprint=b"\x01" * 32,
        access="auto",
        client_id=f"cli_{label}",
        refresh_token="r",
        refresh_expires_at=None,
        access_token="a",
        access_expires_at=time.time() + 3600,
        linked_at=1.0,
    )


async def service_over(db: Database, boxes: list[tuple[str, float]]) -> Placement:
    """The placement service of a manual-only laptop with a link and a fresh report per box."""
    for label, load in boxes:
        await links.upsert(db, link_row(label))
        await placement_store.save(db, f"ENV-{label}", cap(max_runs=24, load=load), now=time.time())
    return Placement(
        db,
        PlacementConfig(preference="manual-only"),
        env_id="ENV-laptop",
        label="laptop",
        providers=lambda: {"script": True},
        readers=capacity.Readers(load=lambda: (0.0, 4), memory=lambda: (8 * GIB, 16 * GIB)),
        peers=None,
    )


async def test_sixty_launches_at_once_through_the_service_split_over_three_boxes(db: Database) -> None:
    """Every launch reads the same reports (none arrives during the burst); the choose-and-reserve
    step has no await in it, so each sees the runs reserved by the ones before."""
    service = await service_over(db, [("a", 0.0), ("b", 0.1), ("c", 0.2)])
    placed = await asyncio.gather(
        *(service.place(NEED, via_link=False, key=f"launch:owner:{i}") for i in range(BURST))
    )
    split = Counter(p.label for p in placed)
    assert split == {"a": 21, "b": 20, "c": 19}, split  # as the rules alone split it (above)
    assert "just placed" in placed[-1].reason
    # A retry of a key is the choice kept, and reserves nothing more.
    again = await service.place(NEED, via_link=False, key="launch:owner:0")
    assert again == placed[0] and service.ledger.seq == BURST
    # A fresh report (after the runs reached the boxes) absorbs what was reserved on it.
    later = time.time() + ABSORB_AFTER_S + 1
    service.clock = lambda: later
    await placement_store.save(db, "ENV-a", cap(max_runs=24, live_runs=20), now=later)
    found = {cand.label: cand for cand in await service.candidates(via_link=False)}
    assert held_for(service.ledger, found["a"]) == 0 and held_for(service.ledger, found["b"]) == 20


async def test_two_first_tries_of_one_key_at_once_reserve_one_run(db: Database) -> None:
    service = await service_over(db, [("a", 0.0), ("b", 0.0)])
    first, second = await asyncio.gather(
        *(service.place(NEED, via_link=False, key="task:owner:same") for _ in range(2))
    )
    assert first == second
    assert service.ledger.seq == 2  # both chose (neither found the other's choice kept yet)
    assert len(service.ledger.held) == 1  # the one not kept released its reservation


class CountingPeers:
    """A stand-in for the peer client: answers `GET /v1/link` with a box's report, counting."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def call(self, env_id: str, method: str, path: str) -> dict[str, Any]:
        assert (method, path) == ("GET", "/v1/link")
        self.calls[env_id] += 1
        await asyncio.sleep(0.01)  # an answer takes a while: the other launches come meanwhile
        report = cap(max_runs=24).model_dump(mode="json", by_alias=True)
        return {
            "envId": env_id,
            "clientId": "cli_laptop",
            "label": "box",
            "access": "auto",
            "capacity": report,
        }


async def test_launches_at_once_with_stale_reports_check_each_box_once(db: Database) -> None:
    service = await service_over(db, [("a", 0.0), ("b", 0.0), ("c", 0.0)])
    async with db.write() as tx:  # every report older than the bound: read again before choosing
        await tx.execute("UPDATE link_capacity SET seen_at = seen_at - 3600")
    peers = CountingPeers()
    service.peers = peers  # type: ignore[assignment]
    placed = await asyncio.gather(*(service.place(NEED, via_link=False, key=f"k{i}") for i in range(30)))
    assert peers.calls == {"ENV-a": 1, "ENV-b": 1, "ENV-c": 1}
    assert Counter(p.label for p in placed) == {"a": 10, "b": 10, "c": 10}
