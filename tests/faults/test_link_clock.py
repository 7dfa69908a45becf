"""Issue 26, case 9: the box's clock 31 days ahead must not cost the laptop its link.

Real `peerd serve` subprocesses. The box's wall clock steps 31 days ahead while it runs (its
`time.time`, through tests/faults/clockshift/sitecustomize.py; nothing else of it changes). By
its own clock the link's refresh token (30 days) has expired, and it says so. By the laptop's own
record (its clock when the box last answered a refresh, plus the lifetime the box gave then) the
link has 30 days left: the laptop reports `clock_skew`, names the box's clock, marks nothing, and
the link works again, without a new pairing, once the box's clock is right.

Not covered (the box's own rule, peerd/daemon.py:_prune_receipts): a box restarted with its clock
ahead deletes the refresh tokens its clock calls expired, and the link is then gone for good
(the laptop says "revoked"; a new pairing is needed)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from peerd.errors import PeerdError
from tests.faults.harness import linked_world, rows

SHIFT = Path(__file__).parent / "clockshift"
AHEAD_S = 31 * 86400.0


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_box_clock_31_days_ahead_does_not_expire_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock_file = tmp_path / "box-clock"
    async with linked_world(tmp_path) as w:
        forwarded = {"params": {"environmentId": w.box_id}}
        assert (await w.call("laptop", "GET", "/v1/projects", **forwarded))["items"], "linked, working"
        w.box.term()
        await w.box.exited()
        clock_file.write_text("0")
        monkeypatch.setenv("PEERD_TEST_CLOCK_FILE", str(clock_file))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SHIFT), os.environ.get("PYTHONPATH", "")]))
        await w.box.restart()  # the box's wall clock can be stepped now
        monkeypatch.delenv("PEERD_TEST_CLOCK_FILE")
        assert (await w.call("laptop", "GET", "/v1/projects", **forwarded))["items"], "still linked"
        clock_file.write_text(str(AHEAD_S))  # the box's clock steps 31 days ahead while it runs
        await asyncio.sleep(0.2)  # the box reads its clock file at most every 50 ms

        with pytest.raises(PeerdError) as refused:
            await w.call("laptop", "GET", "/v1/projects", **forwarded)
        assert refused.value.code == "clock_skew", refused.value.message
        assert "clock" in refused.value.message and "without a new pairing" in refused.value.message
        [link] = rows(w.laptop.db, "SELECT status, last_error FROM links WHERE env_id = ?", (w.box_id,))
        assert link["status"] != "expired", "judged by the laptop's own clock: not expired"
        [shown] = (await w.call("laptop", "GET", "/v1/environments"))["items"]
        assert shown["status"] != "expired" and "clock" in (shown["lastError"] or "")

        clock_file.write_text("0")  # the box's clock is set right (no restart, no new pairing)
        await asyncio.sleep(0.2)  # as above: read at most every 50 ms
        assert (await w.call("laptop", "GET", "/v1/projects", **forwarded))["items"], "the link works again"
        [link] = rows(w.laptop.db, "SELECT status FROM links WHERE env_id = ?", (w.box_id,))
        assert link["status"] == "reachable"
