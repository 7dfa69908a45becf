"""`make demo`: two peerd daemons on this machine, "laptop" and "box", linked; an agent on the laptop
delegates a fix to the box and is woken with the result; the laptop restarts mid-task; the box
revokes the link.

Everything happens in a temporary directory, removed at the end (DEMO_KEEP=1 keeps it). Every `$`
line is the real CLI, run as a subprocess. The agents are peerd's scripted coder by default (no model,
no network); DEMO_PROVIDER=claude or DEMO_PROVIDER=codex runs the laptop's and the box's agent as
that real CLI against a scripted fake model on 127.0.0.1 (`make demo` installs the pinned CLIs
first). The scripts are in examples/scripts/. Standard library and peerd only.
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
from typing import Any

from peerd.paths import Paths

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPTS = HERE / "scripts"
READY_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 30
# What the box's slow agent waits for, in its own worktree: peerd confines a linked machine's runs,
# so the worktree is the one place both it and this demo can see (its /tmp is its own).
RELEASE_FILE = ".release"

BUGGY_PRICING = '''\
"""Prices for the shop."""


def discounted_total(prices: list[float], discount: float) -> float:
    """The sum of `prices` after `discount`, a fraction: 0.25 means 25% off."""
    return round(sum(prices) * (1 + discount), 2)
'''


# A scripted prompt's script block, shortened when a command's output is shown.
SCRIPT_BLOCK = re.compile(r"```peerd-script\n.*?\n\s*```", re.DOTALL)


class DemoFailed(Exception):
    pass


def fenced(script: dict[str, Any]) -> str:
    """A prompt part the scripted coder runs: a ```peerd-script block."""
    return "```peerd-script\n" + json.dumps(script, indent=1) + "\n```"


def load_script(name: str, **subs: str) -> dict[str, Any]:
    """A script from examples/scripts/, with "@name" string values replaced."""

    def fill(value: Any) -> Any:
        if isinstance(value, str) and value.startswith("@") and value[1:] in subs:
            return subs[value[1:]]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    loaded: dict[str, Any] = fill(json.loads((SCRIPTS / name).read_text(encoding="utf-8")))
    return loaded


class Node:
    """One machine of the demo: a peerd home, a checkout of the shop, a daemon process."""

    def __init__(self, demo: Demo, name: str) -> None:
        self.demo = demo
        self.name = name
        self.dir = demo.root / name
        self.home = self.dir / "home"
        self.checkout = self.dir / "shop"
        self.log_path = self.dir / "daemon.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
        self.env["PEERD_HOME"] = str(self.home)

    def peerd(self, *args: str, show: bool = True, check: bool = True, stdin: str | None = None) -> str:
        argv = [sys.executable, "-m", "peerd", *args]
        return self.demo.run(self, ["peerd", *args], argv, show, check, stdin=stdin)

    def json(self, *args: str) -> Any:
        return json.loads(self.peerd(*args, "--json", show=False))

    def start(self) -> None:
        argv = [sys.executable, "-m", "peerd", "serve", "--label", self.name, "--listen", "127.0.0.1:0"]
        argv += ["--log-format", "console"]
        if self.demo.config is not None:
            argv += ["--config", str(self.demo.config)]
        self.demo.say(
            f"[{self.name}]$ peerd serve --label {self.name} --listen 127.0.0.1:0 &   (log: {self.log_path})"
        )
        with open(self.log_path, "ab") as log:
            # A session of its own: Ctrl-C reaches the demo, which stops the daemon properly.
            self.process = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        socket_path = Paths(self.home).socket
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _status_ok(socket_path):
            if self.process.poll() is not None:
                raise DemoFailed(f"the {self.name} daemon exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"the {self.name} daemon did not answer within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)  # the socket does not exist yet: nothing to wait on but time

    def stop(self, *, show: bool = True) -> int | None:
        process = self.process
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        if show:
            self.demo.say(f"[{self.name}]$ kill -TERM {process.pid}")
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise DemoFailed(f"the {self.name} daemon did not exit within {STOP_TIMEOUT_S:.0f} s") from None


class Demo:
    def __init__(self, root: Path, provider: str) -> None:
        self.root = root
        self.provider = provider
        self.config: Path | None = None
        self.fake: subprocess.Popen[bytes] | None = None
        self.laptop = Node(self, "laptop")
        self.box = Node(self, "box")
        self.step_number = 0

    # --- output and commands ------------------------------------------------------------------

    def heading(self, title: str) -> None:
        self.step_number += 1
        line = f"{self.step_number}. {title}"
        print(f"\n{line}\n{'-' * len(line)}", flush=True)

    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)

    def run(
        self,
        node: Node | None,
        shown: list[str],
        argv: list[str],
        show: bool,
        check: bool,
        *,
        stdin: str | None = None,
    ) -> str:
        where = f"[{node.name}]" if node else ""
        if show:
            self.say(f"{where}$ " + " ".join(_quote(a) for a in shown))
        try:
            done = subprocess.run(
                argv,
                cwd=node.dir if node else self.root,
                env=node.env if node else None,
                capture_output=True,
                input=stdin,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"`{' '.join(shown)}` did not finish in {COMMAND_TIMEOUT_S:.0f} s") from None
        if check and done.returncode != 0:
            raise DemoFailed(f"`{' '.join(shown)}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
        if show and done.stdout.strip():
            self.say(
                _indent(
                    SCRIPT_BLOCK.sub(
                        "```peerd-script ... ``` (the script, from examples/scripts/)", done.stdout
                    )
                )
            )
        return done.stdout

    def git(self, *args: str, show: bool = False) -> str:
        identity = [
            "-c",
            "user.name=peerd demo",
            "-c",
            "user.email=demo@peerd.invalid",
            "-c",
            "commit.gpgsign=false",
        ]
        return self.run(None, ["git", *args], ["git", *identity, *args], show, True)

    # --- the steps ----------------------------------------------------------------------------

    def start_fake_model(self) -> None:
        """DEMO_PROVIDER: a scripted model server for the real CLI, and a config pointing at it."""
        sys.path.insert(0, str(REPO))
        from tests.realcli import offline_settings  # noqa: PLC0415  # the tests' offline CLI settings

        port_file = self.root / "fake-model.port"
        argv = [
            sys.executable,
            str(REPO / "tests" / "fakemodel.py"),
            "--scripts",
            str(SCRIPTS / "fake-model.json"),
        ]
        argv += ["--port-file", str(port_file), "--log", str(self.root / "fake-model.jsonl")]
        self.fake = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not port_file.exists():
            if time.monotonic() > deadline or self.fake.poll() is not None:
                raise DemoFailed("the fake model server did not start")
            time.sleep(0.05)

        class _Fake:
            base_url = f"http://127.0.0.1:{port_file.read_text().strip()}"

        settings = offline_settings(self.root / "clis", _Fake())  # type: ignore[arg-type]
        self.config = self.root / "config.toml"
        self.config.write_text(
            _toml_providers(settings.model_dump(mode="json")["providers"]), encoding="utf-8"
        )
        self.say(
            f"A scripted model answers {self.provider} on {_Fake.base_url} (examples/scripts/fake-model.json)."
        )

    def make_repositories(self) -> None:
        self.heading("One repository, a checkout on each machine")
        origin = self.root / "origin.git"
        seed = self.root / "seed"
        self.git("init", "-q", "--bare", "-b", "main", str(origin))
        self.git("init", "-q", "-b", "main", str(seed))
        (seed / "pricing.py").write_text(BUGGY_PRICING, encoding="utf-8")
        self.git("-C", str(seed), "add", "pricing.py")
        self.git("-C", str(seed), "commit", "-q", "-m", "Add pricing")
        self.git("-C", str(seed), "push", "-q", str(origin), "main")
        for node in (self.laptop, self.box):
            node.dir.mkdir()
            self.git("clone", "-q", str(origin), str(node.checkout))
        self.say(f"origin: {origin} (bare); clones: {self.laptop.checkout} and {self.box.checkout}")
        self.say("pricing.py has a bug: a 25% discount makes the total larger.")
        self.say(_indent(BUGGY_PRICING))

    def start_daemons(self) -> None:
        self.heading('Start two daemons: "laptop" and "box" (TLS on loopback)')
        if self.provider != "script":
            self.start_fake_model()
        self.box.start()
        self.laptop.start()
        for node in (self.laptop, self.box):
            node.peerd("project", "add", str(node.checkout), "--name", "shop")
        self.say("Both projects carry the same repository key, so a task for the box lands in its checkout.")

    def link(self) -> None:
        self.heading("Pair on the box, link from the laptop")
        code = self.box.json("pair", "--access", "auto")["code"]
        self.say("[box]$ peerd pair --access auto")
        self.say(_indent(f"{code[:48]}...  (one-time code, 10 minutes)"))
        # The code goes in on standard input, never on a command line (where shell history keeps it).
        self.laptop.peerd("link", "-", "--access", "auto", show=False, stdin=code + "\n")
        self.say("[laptop]$ peerd link - --access auto      (the code pasted on standard input)")
        self.laptop.peerd("environment", "list")
        self.box.peerd("client", "list")

    def launch_parent(
        self, title: str, script: dict[str, Any] | None = None, prompt: str | None = None
    ) -> tuple[str, str]:
        """Launch a thread on the laptop; (thread id, its first run's id)."""
        slug = re.sub(r"\W+", "-", title.lower())
        prompt_file = self.laptop.dir / f"{slug}.md"
        prompt_file.write_text(prompt if prompt is not None else f"{title}.\n\n{fenced(script or {})}\n")
        provider = self.provider if script is None else "script"
        data = json.loads(
            self.laptop.peerd(
                "thread",
                "launch",
                "--project",
                "shop",
                "--provider",
                provider,
                "--runtime-mode",
                "auto",
                "--title",
                title,
                "--prompt-file",
                str(prompt_file),
                "--json",
                show=False,
            )
        )
        self.say(f"[laptop]$ peerd thread launch --project shop --provider {provider} --title {title!r} ...")
        self.say(_indent(f"thread {data['threadId']}, run {data['runId']}"))
        return str(data["threadId"]), str(data["runId"])

    def wait_woken(self, thread_id: str, first_run: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for the parent's first run, then for the wake run the task's end causes."""
        self.laptop.peerd(
            "thread", "wait", thread_id, "--run", first_run, "--timeout", str(timeout), show=False
        )
        deadline = time.monotonic() + timeout
        while True:
            info: dict[str, Any] = self.laptop.json("thread", "show", thread_id)
            run = info["thread"]["latestRun"]
            if run["id"] == first_run and run["status"] == "failed":  # no wake follows: say why now
                raise DemoFailed(f"the laptop's run {first_run} failed: {run.get('reason')}")
            if run["id"] != first_run:
                self.laptop.peerd(
                    "thread", "wait", thread_id, "--run", run["id"], "--timeout", str(timeout), show=False
                )
                done: dict[str, Any] = self.laptop.json("thread", "show", thread_id)
                return done
            if time.monotonic() > deadline:
                raise DemoFailed(f"thread {thread_id} was not woken within {timeout:.0f} s")
            self.laptop.peerd("thread", "wait", thread_id, "--timeout", "5", show=False, check=False)

    def delegate_and_wake(self) -> None:
        self.heading(f"An agent on the laptop ({self.provider}) delegates the fix to the box")
        if self.provider == "script":
            task = "Fix the discount bug in pricing.py.\n\n" + fenced(load_script("box-fix.json"))
            lead = load_script("lead.json", task=task, title="Fix the discount", key="fix-discount")
            self.say("The laptop's agent calls delegate_task with only target.environmentId = box")
            self.say("(examples/scripts/lead.json; the box's agent follows examples/scripts/box-fix.json).")
            thread_id, first_run = self.launch_parent("Fix the discount", lead)
        else:
            self.say(
                f"The laptop's {self.provider} calls peerd's delegate_task through `peerd mcp`, with only"
            )
            self.say("target.environmentId = box; the box runs the same provider in its checkout.")
            thread_id, first_run = self.launch_parent(
                "Fix the discount", prompt="[[fake:lead]] Fix the discount bug on the box."
            )

        self.heading("The parent is woken with the result, in a new run of the same thread")
        done = self.wait_woken(thread_id, first_run)
        if done["thread"]["latestRun"]["status"] != "completed":
            raise DemoFailed(f"the woken run ended {done['thread']['latestRun']}")
        self.laptop.peerd("thread", "show", thread_id)

        self.heading("Lineage both ways, and task_status")
        tasks = self.laptop.json("task", "list", thread_id)
        self.laptop.peerd("task", "list", thread_id)
        child = tasks[0]["remoteChild"]["threadId"]
        self.laptop.peerd("task", "show", tasks[0]["taskId"])
        child_info = self.box.json("thread", "show", child)["thread"]
        self.box.peerd("thread", "show", child)
        if tasks[0]["status"] != "completed":
            raise DemoFailed(f"the task ended {tasks[0]['status']}: {tasks[0]['lastError']}")

        self.heading("Only the box's checkout of the task changed")
        diff = self.git("-C", child_info["worktreePath"], "diff", "--stat", show=False)
        self.say(f"[box]$ git -C {child_info['worktreePath']} diff --stat")
        self.say(_indent(diff or "(no changes)"))
        if "pricing.py" not in diff:
            raise DemoFailed("the box's worktree does not hold the fix")
        for node in (self.laptop, self.box):
            status = self.git("-C", str(node.checkout), "status", "--porcelain", show=False)
            self.say(f"[{node.name}]$ git -C shop status --porcelain   -> {status.strip() or '(clean)'}")
            if status.strip():
                raise DemoFailed(f"the {node.name}'s own checkout changed")
        parent_tree = self.laptop.json("thread", "show", thread_id)["thread"]["worktreePath"]
        if self.git("-C", parent_tree, "status", "--porcelain", show=False).strip():
            raise DemoFailed("the laptop parent's worktree changed")
        self.say("[laptop] the parent's worktree is clean too: the work happened on the box.")

    def restart_mid_task(self) -> None:
        self.heading("A second delegation; the laptop's daemon restarts in the middle")
        task = "Write NOTES.md.\n\n" + fenced(load_script("box-slow.json", release=RELEASE_FILE))
        lead = load_script("lead.json", task=task, title="Write the notes", key="write-notes")
        thread_id, first_run = self.launch_parent("Write the notes", lead)
        self.laptop.peerd("thread", "wait", thread_id, "--run", first_run, "--timeout", "60", show=False)
        task_id = self.laptop.json("task", "list", thread_id)[0]["taskId"]
        self.say(f"Task {task_id} is running on the box (its agent waits for a release file).")
        release = self.box_release_file(thread_id)
        code = self.laptop.stop()
        self.say(f"The laptop's daemon stopped (exit {code}). Meanwhile the box finishes the task:")
        release.write_text("go\n")
        self.say(f"$ touch {release}")
        self.laptop.start()
        self.say("The laptop's daemon is back; it resumes following every open remote task at start.")
        done = self.wait_woken(thread_id, first_run)
        reply = [i for i in done["items"] if i["kind"] == "assistant_message"][-1]["text"]
        self.say(_indent(f"woken run {done['thread']['latestRun']['id']}: {reply}"))
        self.laptop.peerd("task", "show", task_id)

    def box_release_file(self, thread_id: str) -> Path:
        """The file the box's agent waits for: in its own worktree, the one place of the box's
        filesystem both it (confined by peerd) and this demo can see."""
        child = self.laptop.json("task", "list", thread_id)[0]["remoteChild"]["threadId"]
        worktree = self.box.json("thread", "show", child)["thread"]["worktreePath"]
        return Path(worktree) / RELEASE_FILE

    def revoke(self) -> None:
        self.heading("A third task is running on the box; the box revokes the link")
        task = "Write NOTES.md.\n\n" + fenced(load_script("box-slow.json", release=RELEASE_FILE))
        lead = load_script("lead.json", task=task, title="Before the revocation", key="third-task")
        thread_id, first_run = self.launch_parent("Before the revocation", lead)
        self.laptop.peerd("thread", "wait", thread_id, "--run", first_run, "--timeout", "60", show=False)
        release = self.box_release_file(thread_id)
        client_id = self.box.json("client", "list")[0]["id"]
        self.box.peerd("client", "revoke", client_id)
        self.say("The laptop's follower learns it at once (the box ends the link's open long-poll);")
        self.say("the task fails with the reason and the parent is woken with it:")
        done = self.wait_woken(thread_id, first_run)
        self.laptop.peerd("task", "list", thread_id)
        task_info = self.laptop.json("task", "list", thread_id)[0]
        if task_info["status"] != "failed" or "revoked" not in (task_info["result"] or ""):
            raise DemoFailed(f"the third task did not fail with the revocation: {task_info}")
        self.say(_indent(f"task result: {task_info['result']}"))
        reply = [i for i in done["items"] if i["kind"] == "assistant_message"][-1]["text"]
        self.say(_indent(f"woken run: {reply}"))
        self.laptop.peerd("environment", "list")
        release.write_text("go\n")  # let the box's agent finish; nothing reaches the laptop any more

    def stop_all(self) -> None:
        self.heading("Stop everything")
        for node in (self.laptop, self.box):
            code = node.stop()
            if code not in (0, None):
                raise DemoFailed(f"the {node.name} daemon exited with code {code}")
        self.stop_fake()
        self.say("Both daemons exited with code 0; nothing is left running.")

    def stop_fake(self) -> None:
        if self.fake is not None and self.fake.poll() is None:
            self.fake.terminate()
            self.fake.wait(timeout=STOP_TIMEOUT_S)

    def cleanup(self) -> None:
        for node in (self.laptop, self.box):
            try:
                node.stop(show=False)
            except DemoFailed as exc:
                print(f"demo: {exc}", file=sys.stderr)
        self.stop_fake()


def _toml_providers(providers: dict[str, Any]) -> str:
    """The providers table of a config file (strings, lists and tables of strings only)."""
    lines = []
    for name, entry in providers.items():
        lines.append(f"[providers.{name}]")
        for key, value in entry.items():
            if value is None or value in ([], {}) or (key == "format" and value == "text"):
                continue
            if isinstance(value, dict):
                text = "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items()) + "}"
            else:
                text = json.dumps(value)
            lines.append(f"{key} = {text}")
        lines.append("")
    return "\n".join(lines)


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
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main() -> int:
    started = time.monotonic()
    provider = os.environ.get("DEMO_PROVIDER", "script") or "script"
    if provider not in ("script", "claude", "codex"):
        print(f"DEMO_PROVIDER must be script, claude or codex (not {provider!r})", file=sys.stderr)
        return 2
    keep = os.environ.get("DEMO_KEEP") == "1"
    # Below the repository's .cache when a real CLI runs: Gemini-style CLIs distrust files below
    # directories others can write, such as /tmp.
    base = REPO / ".cache" if provider != "script" else None
    if base is not None:
        base.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="peerd-demo-", dir=base))
    demo = Demo(root, provider)
    print(f"peerd demo in {root} (agents: {provider})")
    failed = False
    try:
        demo.make_repositories()
        demo.start_daemons()
        demo.link()
        demo.delegate_and_wake()
        demo.restart_mid_task()
        demo.revoke()
        demo.stop_all()
    except (DemoFailed, KeyboardInterrupt) as exc:
        failed = True
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"\ndemo failed: {reason}", file=sys.stderr)
        demo.cleanup()
        for node in (demo.laptop, demo.box):
            print(f"\nlast {LOG_TAIL_LINES} lines of the {node.name} log:", file=sys.stderr)
            print(_indent(_tail(node.log_path, LOG_TAIL_LINES)), file=sys.stderr)
    finally:
        demo.cleanup()
        if keep:
            print(f"\nDEMO_KEEP=1: kept {root}")
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
