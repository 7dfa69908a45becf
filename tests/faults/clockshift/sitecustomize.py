"""A test-only wall clock for a `peerd serve` subprocess (issue 26, case 9): with
PEERD_TEST_CLOCK_FILE set, `time.time` (and `time.time_ns`) return the real time plus the
seconds written in that file, read again at most every 50 ms, so a test steps the daemon's wall
clock back or forward while it runs. `time.monotonic` is left alone, as a real clock step leaves
it. Put this directory first on the subprocess's PYTHONPATH; without the variable nothing changes."""

from __future__ import annotations

import os
import time

_FILE = os.environ.get("PEERD_TEST_CLOCK_FILE")

if _FILE:
    _real, _real_ns, _mono = time.time, time.time_ns, time.monotonic
    _state = {"offset": 0.0, "read_at": -1.0}

    def _offset() -> float:
        now = _mono()
        if now - _state["read_at"] > 0.05:
            _state["read_at"] = now
            try:
                with open(_FILE) as f:  # before pathlib is worth importing here
                    _state["offset"] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return _state["offset"]

    def _time() -> float:
        return _real() + _offset()

    def _time_ns() -> int:
        return _real_ns() + int(_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
