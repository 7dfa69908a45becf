"""`make demo`: one peerd daemon, one project, one scripted thread that fixes a bug in its own worktree.

Everything happens in a temporary directory, which is removed at the end (set DEMO_KEEP=1 to keep
it). The commands shown with `$` are the real CLI, run as subprocesses; the scripted provider stands
in for a coder, so the demo needs no model and no network. Standard library and peerd only.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peerd.paths import Paths

READY_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 40

ORIGIN = "git@github.com:example/shop.git"

BUGGY_PRICING = '''\
"""Prices for the shop."""


def discounted_total(prices: list[float], discount: float) -> float:
    """The sum of `prices` after `discount`, a fraction: 0.25 means 25% off."""
    return round(sum(prices) * (1 + discount), 2)
'''

CHECK = (
    "python3 -c 'from pricing import discounted_total as t; total = t([10, 30], 0.25); "
    'assert total == 30.0, total; print("discounted_total([10, 30], 0.25) =", total)\''
)

# What the scripted provider does: the same steps a coder would take, made deterministic.
SCRIPT = {
    "steps": [
        {
            "edit": {
                "path": "pricing.py",
                "old": "sum(prices) * (1 + discount)",
                "new": "sum(prices) * (1 - discount)",
            }
        },
        {"run": CHECK, "check": True},
        {
            "reply": "Fixed discounted_total in pricing.py: the discount was added to the total "
            "instead of subtracted. Checked: 25% off [10, 30] is now 30.0."
        },
    ]
}

PROMPT = (
    "Fix the discount bug in pricing.py: a 25% discount makes the total larger, not smaller.\n"
    "\n"
    "```peerd-script\n"
    + '{"steps": [\n'
    + ",\n".join("  " + json.dumps(step) for step in SCRIPT["steps"])
    + "\n]}\n```\n"
)


class DemoFailed(Exception):
    pass


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.project = root / "shop"
        self.log_path = root / "daemon.log"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if k not in ("PEERD_SOCKET", "PEERD_RUN_TOKEN")}
        self.env["PEERD_HOME"] = str(self.home)
        self.step_number = 0

    # --- output -------------------------------------------------------------------------------

    def heading(self, title: str) -> None:
        self.step_number += 1
        line = f"{self.step_number}. {title}"
        print(f"\n{line}\n{'-' * len(line)}", flush=True)

    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)

    # --- commands -----------------------------------------------------------------------------

    def peerd(self, *args: str, show: bool = True) -> str:
        """Run the real CLI (`python -m peerd ...`) with PEERD_HOME set; fail on a non-zero exit."""
        return self._run(["peerd", *args], [sys.executable, "-m", "peerd", *args], show=show)

    def git(self, *args: str, show: bool = True) -> str:
        return self._run(["git", *args], ["git", *args], show=show)

    def _run(self, shown: list[str], argv: list[str], *, show: bool) -> str:
        if show:
            self.say("$ " + " ".join(_quote(a) for a in shown))
        try:
            done = subprocess.run(
                argv,
                cwd=self.root,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"`{' '.join(shown)}` did not finish in {COMMAND_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).rstrip()
            raise DemoFailed(f"`{' '.join(shown)}` exited with code {done.returncode}:\n{output}")
        if show and done.stdout:
            self.say(done.stdout.rstrip("\n"))
        return done.stdout

    def quiet_git(self, *args: str) -> None:
        """Set-up git commands: no global config needed, nothing printed."""
        identity = ["-c", "user.name=peerd demo", "-c", "user.email=demo@peerd.invalid"]
        self.git(*identity, "-c", "commit.gpgsign=false", "-C", str(self.project), *args, show=False)

    # --- the demo -----------------------------------------------------------------------------

    def make_project(self) -> None:
        self.heading("Make a small git project with a bug")
        self.project.mkdir()
        (self.project / "pricing.py").write_text(BUGGY_PRICING, encoding="utf-8")
        self.git("-c", "init.defaultBranch=main", "init", "-q", str(self.project), show=False)
        self.quiet_git("add", "pricing.py")
        self.quiet_git("commit", "-q", "-m", "Add pricing")
        self.quiet_git("remote", "add", "origin", ORIGIN)
        self.say(f"{self.project}: one commit, origin {ORIGIN}")
        self.say("pricing.py:")
        self.say(_indent(BUGGY_PRICING))

    def start_daemon(self) -> None:
        self.heading("Start a daemon")
        argv = [sys.executable, "-m", "peerd", "--home", str(self.home), "serve"]
        argv += ["--listen", "127.0.0.1:0", "--log-format", "console"]
        self.say(f"$ peerd --home {self.home} serve --listen 127.0.0.1:0 --log-format console &")
        self.say(f"(logs go to {self.log_path})")
        with open(self.log_path, "wb") as log:
            # A session of its own: a Ctrl-C at the terminal reaches the demo, which then stops the
            # daemon the proper way (SIGTERM) instead of both racing.
            self.daemon = subprocess.Popen(
                argv,
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready()
        self.say(f"$ export PEERD_HOME={self.home}    # the CLI below finds the daemon through it")

    def wait_ready(self) -> None:
        """Poll the daemon's local socket until `GET /v1/status` answers 200."""
        socket_path = Paths(self.home).socket
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.daemon is not None and self.daemon.poll() is not None:
                raise DemoFailed(f"the daemon exited with code {self.daemon.returncode} while starting")
            if _status_ok(socket_path):
                return
            time.sleep(0.1)
        raise DemoFailed(f"the daemon did not answer on {socket_path} within {READY_TIMEOUT_S:.0f} s")

    def run_thread(self) -> None:
        self.heading("Show the environment")
        self.peerd("status")

        self.heading("Register the project")
        self.peerd("project", "add", "shop")

        self.heading("Launch a scripted thread and wait for its run")
        prompt_file = self.root / "fix-discount.md"
        prompt_file.write_text(PROMPT, encoding="utf-8")
        self.say("The prompt file carries a peerd-script block: the scripted provider's stand-in for a")
        self.say("coder. It edits pricing.py, runs a check, and replies.")
        self.say(f"$ cat {prompt_file.name}")
        self.say(PROMPT.rstrip("\n"))
        launched = self.peerd(
            "thread",
            "launch",
            "--project",
            "shop",
            "--title",
            "Fix the discount in pricing.py",
            "--prompt-file",
            prompt_file.name,
            "--wait",
            "60",
        )
        found = re.search(r"\bthread (thr_\w+)", launched)
        if found is None:
            raise DemoFailed(f"cannot find the thread id in the launch output:\n{launched}")
        thread_id = found.group(1)

        self.heading("Read the thread")
        self.peerd("thread", "show", thread_id)
        info = json.loads(self.peerd("thread", "show", thread_id, "--json", show=False))["thread"]
        run = info.get("latestRun") or {}
        if run.get("status") != "completed":
            raise DemoFailed(f"the run ended {run.get('status')}: {run.get('reason')}")

        self.heading("The change is in the thread's worktree; the project checkout is untouched")
        worktree = info["worktreePath"]
        self.say(f"The thread works in {worktree}, on branch {info['branch']}.")
        diff = self.git("-C", worktree, "diff")
        if "+    return round(sum(prices) * (1 - discount), 2)" not in diff:
            raise DemoFailed("the worktree's diff does not hold the fix")
        status = self.git("-C", "shop", "status", "--short")
        if status.strip():
            raise DemoFailed(f"the project checkout has changes:\n{status}")
        self.say("(no output: the project's own checkout is clean)")

    def stop_daemon(self) -> None:
        self.heading("Stop the daemon")
        if self.daemon is None:
            return
        self.say(f"$ kill -TERM {self.daemon.pid}")
        code = self._terminate()
        if code != 0:
            raise DemoFailed(f"the daemon exited with code {code} after SIGTERM")
        tail = [line for line in _tail(self.log_path, 3).splitlines() if line.strip()]
        self.say("daemon exited with code 0; the last lines of its log:")
        self.say(_indent("\n".join(tail)))

    def _terminate(self) -> int | None:
        """SIGTERM the daemon and wait; SIGKILL it if it does not exit in time."""
        daemon = self.daemon
        if daemon is None or daemon.poll() is not None:
            return None if daemon is None else daemon.returncode
        daemon.send_signal(signal.SIGTERM)
        try:
            return daemon.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
            raise DemoFailed(f"the daemon did not exit within {STOP_TIMEOUT_S:.0f} s of SIGTERM") from None

    def cleanup(self) -> None:
        """After a failure or Ctrl-C: never leave a daemon behind."""
        try:
            self._terminate()
        except DemoFailed as exc:
            print(f"demo: {exc}", file=sys.stderr)


def _status_ok(socket_path: Path) -> bool:
    conn = _UnixHTTPConnection(str(socket_path))
    try:
        conn.request("GET", "/v1/status")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=2.0)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else "" for line in text.rstrip("\n").splitlines())


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no daemon log)"
    return "\n".join(text.splitlines()[-lines:])


def main() -> int:
    started = time.monotonic()
    keep = os.environ.get("DEMO_KEEP") == "1"
    root = Path(tempfile.mkdtemp(prefix="peerd-demo-"))
    demo = Demo(root)
    print(f"peerd demo in {root}")
    failed = False
    try:
        demo.make_project()
        demo.start_daemon()
        demo.run_thread()
        demo.stop_daemon()
    except (DemoFailed, KeyboardInterrupt) as exc:
        failed = True
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"\ndemo failed: {reason}", file=sys.stderr)
        demo.cleanup()
        print(f"\nlast {LOG_TAIL_LINES} lines of the daemon log ({demo.log_path}):", file=sys.stderr)
        print(_indent(_tail(demo.log_path, LOG_TAIL_LINES)), file=sys.stderr)
    finally:
        demo.cleanup()
        if keep:
            print(f"\nDEMO_KEEP=1: kept {root} (daemon home: {demo.home})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if failed:
        if not keep:
            print("Run `DEMO_KEEP=1 make demo` to keep the temporary directory for a look.", file=sys.stderr)
        return 1
    print(f"\nDone in {time.monotonic() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
