"""Benchmark: how long `peerd` commands take to start, answer and exit, against `python -c ''`.

A real daemon (`peerd serve --no-listen`, a subprocess on a temporary home) answers; each command
below runs as a fresh process, the way a person or a script runs it, N times, interleaved with the
baseline `python -c ''` (the same interpreter, so the interpreter's own start-up, the venv's .pth
files and the machine's load are in both). Reported per command: p50 and p95 wall time, the ratio
of the p50s to the baseline's, and whether the budget is met.

The budget (issue 13): 120 ms each on this 2-core machine, where `python -c ''` takes about 40 ms
unloaded, so a ratio of at most 3.0 to the baseline measured in the same run. The machine is shared:
the ratio is the verdict, the milliseconds are printed for reference.

Standard library only. Run: .venv/bin/python bench/cli_start.py [--reps 20]
Figures go to stdout as a table and into bench/results.json under "cli_start" (other keys kept).
See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import load_average, peerd_argv, save_results

BUDGET_MS = 120.0
UNLOADED_BASELINE_MS = 40.0  # `python -c ''` on this machine when it is idle (issue 13)
BUDGET_RATIO = BUDGET_MS / UNLOADED_BASELINE_MS
COMMANDS: dict[str, list[str]] = {
    "peerd --help": ["--help"],
    "peerd --version": ["--version"],
    "peerd status": ["status"],
    "peerd environment list": ["environment", "list"],
    "peerd thread list": ["thread", "list"],
}
BASELINE = "python -c ''"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Series:
    name: str
    seconds: list[float] = field(default_factory=list)
    failures: int = 0

    def p(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    def figures(self, baseline_p50: float) -> dict[str, float | int | bool]:
        p50 = self.p(0.5)
        ratio = p50 / baseline_p50
        return {
            "n": len(self.seconds),
            "p50_ms": round(p50, 1),
            "p95_ms": round(self.p(0.95), 1),
            "mean_ms": round(statistics.fmean(self.seconds) * 1000, 1),
            "ratio_p50": round(ratio, 2),
            "failures": self.failures,
            "budget_met": ratio <= BUDGET_RATIO and self.failures == 0,
            "under_120_ms": p50 <= BUDGET_MS,
        }


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        say(f"{' '.join(argv[-3:])} exited {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}")
    return elapsed, done.returncode


def start_daemon(peerd: list[str], home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(home.parent / "daemon.log", "ab")  # noqa: SIM115  # the daemon's, closed below
    proc = subprocess.Popen(
        [*peerd, "--home", str(home), "serve", "--no-listen", "--label", "bench"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    log.close()
    t0 = time.perf_counter()
    while True:  # `status --wait` in slices, so a daemon that exits is noticed at once
        ready = subprocess.run(
            [*peerd, "--home", str(home), "status", "--wait", "1"], env=env, capture_output=True, check=False
        )
        if ready.returncode == 0:
            break
        if proc.poll() is not None or time.perf_counter() - t0 > 60:
            proc.kill()
            log_tail = (home.parent / "daemon.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"the daemon did not answer: {ready.stderr.decode()}{log_tail}")
    say(f"daemon answering after {time.perf_counter() - t0:.2f} s")
    return proc


def measure(reps: int, seed: int) -> tuple[dict[str, Series], float]:
    peerd = peerd_argv()
    with tempfile.TemporaryDirectory(prefix="peerd-bench-cli-") as tmp:
        home = Path(tmp) / "home"
        # PYTHONDONTWRITEBYTECODE off: the warm-up runs write the .pyc files an installed peerd
        # has, so no run measures compiling a module (a stale .pyc would be compiled every time).
        dropped = ("PEERD_HOME", "PEERD_CONFIG", "PYTHONDONTWRITEBYTECODE")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env["XDG_CONFIG_HOME"] = str(Path(tmp) / "config")  # no user config file in the way
        daemon = start_daemon(peerd, home, env)
        series = {name: Series(name) for name in [BASELINE, *COMMANDS]}
        order = list(COMMANDS)
        rng = random.Random(seed)
        t0 = time.perf_counter()
        try:
            for _ in range(2):  # warm the page cache and the .pyc files; not counted
                timed([sys.executable, "-c", ""], env)
                for args in COMMANDS.values():
                    timed([*peerd, "--home", str(home), *args], env)
            for rep in range(reps):
                rng.shuffle(order)
                for name in order:
                    # The baseline right before each command: both see the same moment's load.
                    elapsed, _ = timed([sys.executable, "-c", ""], env)
                    series[BASELINE].seconds.append(elapsed)
                    elapsed, code = timed([*peerd, "--home", str(home), *COMMANDS[name]], env)
                    series[name].seconds.append(elapsed)
                    series[name].failures += code != 0
                if (rep + 1) % 5 == 0:
                    say(f"{rep + 1}/{reps} rounds")
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        return series, time.perf_counter() - t0


def report(series: dict[str, Series], reps: int, wall_s: float) -> dict[str, object]:
    base = series[BASELINE]
    base_p50 = base.p(0.5)
    rows = {name: series[name].figures(base_p50) for name in COMMANDS}
    print(f"\nCLI start-up: {reps} runs of each command, each after a baseline run (wall {wall_s:.0f} s)")
    print(f"budget: {BUDGET_MS:g} ms at a {UNLOADED_BASELINE_MS:g} ms baseline = at most {BUDGET_RATIO:.1f}x")
    print(f"{'':26}{'p50 ms':>9}{'p95 ms':>9}{'x base':>9}  budget")
    print(f"{BASELINE:26}{base_p50:9.1f}{base.p(0.95):9.1f}{1.0:9.2f}")
    for name, fig in rows.items():
        verdict = "met" if fig["budget_met"] else "NOT met"
        if fig["failures"]:
            verdict += f" ({fig['failures']} failed)"
        print(f"{name:26}{fig['p50_ms']:9.1f}{fig['p95_ms']:9.1f}{fig['ratio_p50']:9.2f}  {verdict}")
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reps": reps,
        "load_average_1m": load_average(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "budget_ms": BUDGET_MS,
        "budget_ratio": BUDGET_RATIO,
        "baseline": {"command": BASELINE, "p50_ms": round(base_p50, 1), "p95_ms": round(base.p(0.95), 1)},
        "commands": rows,
        "all_met": all(fig["budget_met"] for fig in rows.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--seed", type=int, default=13, help="seed of the command order")
    parser.add_argument("--no-save", action="store_true", help="print only; leave bench/results.json alone")
    args = parser.parse_args(argv)
    series, wall_s = measure(max(1, args.reps), args.seed)
    figures = report(series, args.reps, wall_s)
    if not args.no_save:
        save_results({"cli_start": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
