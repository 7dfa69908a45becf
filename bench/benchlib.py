"""What the benchmarks share: their results file, and a few facts about the machine and the CLI.

Each bench is run as a script (`.venv/bin/python bench/NAME.py`), so this module is imported by
its name (the script's folder is on `sys.path`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"


def save_results(figures: Mapping[str, Any], *, path: Path = RESULTS) -> None:
    """Merge `figures` (top-level key -> figures) into bench/results.json; every other key is
    kept as it is. Written to a temporary file first and renamed, so a bench that is stopped never
    leaves a half-written file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            data = {}
    except (FileNotFoundError, ValueError):
        data = {}
    data.update(figures)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(
        f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({', '.join(figures)})",
        file=sys.stderr,
    )


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def overloaded() -> float | None:
    """The load average when it is past one per CPU (other work shares the machine), else None."""
    load = load_average()
    return load if load is not None and load / (os.cpu_count() or 1) > 1.0 else None


def unreliable_load() -> str | None:
    """Why the machine's load makes a timing unreliable now (one sentence), else None."""
    load = overloaded()
    if load is None:
        return None
    return (
        f"load average {load} on {os.cpu_count() or 1} CPUs (over one per CPU): other work shared the machine"
    )


def peerd_argv() -> list[str]:
    """The console script next to this interpreter (what a user runs), else `python -m peerd`."""
    script = Path(sys.executable).parent / "peerd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "peerd"]
