"""The scripted coder: a deterministic stand-in for a coder CLI, for the demo and tests.

Run as `python -m peerd.providers.script_agent --state-dir DIR [--resume SESSION_ID] [--model M]
[--runtime-mode MODE] [--interaction-mode MODE]` with the worktree as cwd and the prompt on stdin.
Standard library only, so it starts fast.

Wire format ("script"): one JSON object per stdout line; stderr is logs.

    {"type": "session", "session_id": "<hex>"}                       always first
    {"type": "item", "kind": "assistant_message", "text": "..."}
    {"type": "item", "kind": "command", "text": "<cmd>", "data": {"exit_code": N, "output": "..."}}
    {"type": "item", "kind": "file_change", "text": "<path>",
     "data": {"action": "write"|"edit", "path": "...", "sha256": "<hex of the file's bytes after it>"}}
    {"type": "item", "kind": "tool_call", "text": "<tool>",
     "data": {"arguments": {...}, "result": {...}|null, "error": {"code", "message"}|null}}
    {"type": "item", "kind": "error", "text": "..."}
    {"type": "usage", "input_tokens": N, "output_tokens": N, "cached_tokens": N,
     "reasoning_tokens": N, "cost_usd": X|null}                    the run's usage so far
    {"type": "result", "status": "completed"|"failed"|"interrupted", "error": "..." (failed only)}

Exit codes: 0 completed, 1 failed (also: unknown --resume id, with no events at all), 130 on SIGINT.

The script comes from the prompt: a fenced block opened by a line "```peerd-script" and closed by
"```", or a line "peerd-script: <path>" naming a JSON file (relative to cwd). It is either
{"steps": [...]} (this run's steps) or {"runs": [{"steps": [...]}, ...]}: the run that carries
it takes entry 0, and each later run of the session whose prompt has no script (a follow-up, a
wake message) takes the next entry. Without a script or a remaining entry the reply is
"(script) " + the first 2,000 characters of the prompt.

Steps, one action key each:

    {"reply": "text"}                      {"reply_repeat": {"text": "ab", "times": N}}
    {"write": {"path": "p", "content": "..."}}
    {"edit": {"path": "p", "old": "...", "new": "..."}}       fails if `old` is not in the file
    {"run": "cmd"} or {"run": "cmd", "check": true} or {"run": {"cmd": "...", "check": true}}
    {"tool": {"name": "project_list", "arguments": {...}, "check": false}}
    {"wait": seconds}                      {"wait_for_file": "path"}     (polls every 50 ms)
    {"fail": "message"}

Any step may also carry synthetic usage, `"usage": {"input_tokens": N, "output_tokens": N,
"cached_tokens": N, "reasoning_tokens": N, "cost_usd": X}` (each key optional; a step may be only
that): after the step, the run's usage grows by it and the run's totals so far are emitted.

Variables: after each tool call, the scalar fields of its result (e.g. taskId, threadId, status,
result) are kept as variables of the session; "${name}" in any later string of a step (this run
or a later one) is replaced by its value. "${prompt}" is this run's prompt. So a parent can
delegate in run 1 and, woken in run 2, read `{"tool": {"name": "task_status", "arguments":
{"taskId": "${taskId}"}}}` and reply `"got: ${result}"`.

Modes, like a coder's sandbox: runtime modes rank read-only < approval-required <
auto-accept-edits < auto < full-access (the default); write/edit need auto-accept-edits, run
needs auto; interaction mode "plan" allows none of them. A denied step fails the run. Paths must
stay inside the worktree unless the mode is full-access.

Asking (`--ask`, at approval-required): like a real CLI's host protocol, the prompt comes as the
first stdin line, `{"type": "prompt", "text": "..."}`, and before each write, edit and run the
agent asks and waits for the answer on stdin:

    {"type": "ask", "key": "s<step>", "kind": "command"|"file_change", "tool": "run"|"write"|"edit",
     "summary": "...", "detail": {...}}
    <- {"type": "answer", "key": "s<step>", "allow": true|false, "message": "..."}

Allowed, the step runs; denied, a notice item carries the message (what a model would see) and
the run goes on (a step with "check" fails the run instead).

Tools: POST /v1/tools/<name> over the Unix socket in $PEERD_SOCKET, with
"Authorization: Bearer $PEERD_RUN_TOKEN" and the arguments as the JSON body; the answer is
{"result": {...}} on 2xx, else {"code", "message"}.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import http.client
    from collections.abc import Callable

from peerd.errors import BadResponse, Unavailable  # the standard library's only, as this module

RUNTIME_MODES = ("read-only", "approval-required", "auto-accept-edits", "auto", "full-access")
OUTPUT_LIMIT = 64 * 1024
ECHO_LIMIT = 2000
TOOL_TIMEOUT = 600.0
ACTIONS = ("reply", "reply_repeat", "write", "edit", "run", "tool", "wait", "wait_for_file", "fail")
USAGE_KEYS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens", "cost_usd")
_FENCED = re.compile(r"^```peerd-script[ \t]*\r?\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_FILE_REF = re.compile(r"^peerd-script:[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)


class RunFailed(Exception):
    """Ends the run as failed; the message becomes the error item and the result's error."""


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def emit_item(kind: str, text: str, data: dict[str, Any] | None = None) -> None:
    event: dict[str, Any] = {"type": "item", "kind": kind, "text": text}
    if data is not None:
        event["data"] = data
    emit(event)


def digest(path: Path) -> str:
    """The sha256 of the file's bytes as this step left them: what the coder wrote, so that peerd can
    tell its write from anyone else's later change of the same file (orchestrate's attribution)."""
    import hashlib  # noqa: PLC0415  # only steps that write load OpenSSL (6 ms of every start)

    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_line() -> str:
    """One line of the host's input, as UTF-8 (what peerd sends), whatever the locale."""
    return sys.stdin.buffer.readline().decode("utf-8", errors="replace")


def log(message: str) -> None:
    print(f"script-agent: {message}", file=sys.stderr, flush=True)


def find_script(prompt: str, cwd: Path) -> dict[str, Any] | None:
    """The script the prompt carries, validated; None when it has none. Raises RunFailed."""
    fenced = _FENCED.search(prompt)
    if fenced:
        source, origin = fenced.group(1), "the peerd-script block"
    else:
        ref = _FILE_REF.search(prompt)
        if not ref:
            return None
        path = cwd / ref.group(1)
        origin = f"peerd-script file {ref.group(1)}"
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RunFailed(f"Invalid script: cannot read {origin}: {exc.strerror or exc}") from exc
    try:
        script = json.loads(source)
    except ValueError as exc:
        raise RunFailed(f"Invalid script: {origin} is not valid JSON: {exc}") from exc
    validate_script(script, origin)
    return script  # type: ignore[no-any-return]


def validate_script(script: Any, origin: str) -> None:
    def bad(why: str) -> RunFailed:
        return RunFailed(f"Invalid script: {origin}: {why}")

    if not isinstance(script, dict) or ("steps" in script) == ("runs" in script):
        raise bad('expected an object with either "steps" or "runs"')
    runs = script.get("runs", [script])
    if not isinstance(runs, list) or not runs:
        raise bad('"runs" must be a non-empty list')
    for r, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("steps"), list):
            raise bad(f'run {r} must be an object with a "steps" list')
        for s, step in enumerate(run["steps"]):
            actions = [key for key in step if key in ACTIONS] if isinstance(step, dict) else []
            extra = set(step) - {*ACTIONS, "check", "usage"} if isinstance(step, dict) else set()
            only_usage = isinstance(step, dict) and not actions and "usage" in step
            if (len(actions) != 1 and not only_usage) or extra:
                raise bad(f"step {s} must have exactly one action of {', '.join(ACTIONS)}: {step!r}")
            usage = step.get("usage", {})
            if (
                not isinstance(usage, dict)
                or set(usage) - set(USAGE_KEYS)
                or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in usage.values()
                )
            ):
                raise bad(f"step {s}: usage takes non-negative numbers for {', '.join(USAGE_KEYS)}")


def load_session(state_dir: Path, session_id: str) -> dict[str, Any] | None:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", session_id):
        return None
    try:
        return json.loads((state_dir / f"{session_id}.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def save_session(state_dir: Path, session: dict[str, Any]) -> None:
    path = state_dir / f"{session['session_id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(session), encoding="utf-8")
    tmp.replace(path)


def steps_for_run(session: dict[str, Any], script: dict[str, Any] | None) -> list[Any] | None:
    """This run's steps (None: echo the prompt); advances the session's `runs` script."""
    if script is not None and "steps" in script:
        return list(script["steps"])
    if script is not None:
        session["runs_script"] = script["runs"]
        session["next_run"] = 0
    runs = session.get("runs_script") or []
    index = int(session.get("next_run", 0))
    if index >= len(runs):
        return None
    session["next_run"] = index + 1
    return list(runs[index]["steps"])


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(value: Any, variables: dict[str, str]) -> Any:
    """Replace ${name} in every string of a step; unknown names stay as they are."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, variables) for k, v in value.items()}
    return value


class Denied(Exception):
    """The person said no: the step is skipped (the message was reported)."""


class Agent:
    def __init__(
        self,
        cwd: Path,
        runtime_mode: str,
        interaction_mode: str,
        variables: dict[str, str] | None = None,
        *,
        asking: bool = False,
    ) -> None:
        self.cwd = cwd
        self.runtime_mode = runtime_mode
        self.interaction_mode = interaction_mode
        self.variables: dict[str, str] = variables if variables is not None else {}
        self.usage: dict[str, float] = {}
        self.asking = asking and runtime_mode == "approval-required" and interaction_mode != "plan"
        self.step_index = 0

    def run_steps(self, steps: list[Any]) -> None:
        for index, raw in enumerate(steps):
            self.step_index = index
            step = substitute(raw, self.variables)
            action = next((key for key in step if key in ACTIONS), None)
            if action is not None:
                check = bool(step.get("check", False))
                try:
                    getattr(self, f"step_{action}")(step[action], check)
                except Denied as exc:
                    if check:
                        raise RunFailed(str(exc)) from exc
            if "usage" in step:
                self.add_usage(step["usage"])

    def add_usage(self, spent: dict[str, Any]) -> None:
        """Grow the run's synthetic usage by a step's and report the totals so far."""
        for key in USAGE_KEYS:
            if key in spent:
                self.usage[key] = self.usage.get(key, 0) + spent[key]
        event: dict[str, Any] = {"type": "usage"}
        for key in USAGE_KEYS[:4]:
            event[key] = int(self.usage.get(key, 0))
        event["cost_usd"] = self.usage.get("cost_usd")
        emit(event)

    def ask(self, kind: str, tool: str, summary: str, detail: dict[str, Any]) -> None:
        """Ask the host and wait for its answer; raises Denied when refused."""
        key = f"s{self.step_index}"
        emit({"type": "ask", "key": key, "kind": kind, "tool": tool, "summary": summary, "detail": detail})
        while True:
            line = read_line()
            if not line:
                raise RunFailed("The host closed the conversation before answering.")
            answer = json.loads(line)
            if isinstance(answer, dict) and answer.get("type") == "answer" and answer.get("key") == key:
                break
        if not answer.get("allow"):
            message = str(answer.get("message") or "Not allowed.")
            emit_item("notice", message)
            raise Denied(message)

    def allow(
        self, what: str, needed: str, *, kind: str = "tool", summary: str = "", detail: Any = None
    ) -> None:
        if self.asking and self.interaction_mode != "plan":
            self.ask(kind, what, summary or what, dict(detail or {}))
            return
        if self.interaction_mode == "plan":
            raise RunFailed(
                f"Denied by interaction mode plan: {what} is not allowed, plan mode makes no changes."
            )
        if RUNTIME_MODES.index(self.runtime_mode) < RUNTIME_MODES.index(needed):
            raise RunFailed(f"Denied by runtime mode {self.runtime_mode}: {what} needs {needed}.")

    def resolve(self, raw: Any) -> Path:
        if not isinstance(raw, str) or not raw:
            raise RunFailed(f"Invalid script: a path must be a non-empty string, got {raw!r}")
        path = (self.cwd / raw).resolve()
        if self.runtime_mode != "full-access" and not path.is_relative_to(self.cwd.resolve()):
            raise RunFailed(f"Denied by runtime mode {self.runtime_mode}: {raw} is outside the worktree.")
        return path

    def step_reply(self, text: Any, _check: bool) -> None:
        emit_item("assistant_message", str(text))

    def step_reply_repeat(self, spec: Any, _check: bool) -> None:
        emit_item("assistant_message", str(spec["text"]) * int(spec["times"]))

    def step_write(self, spec: Any, _check: bool) -> None:
        path = self.resolve(spec.get("path"))
        content = str(spec.get("content", ""))
        change = {
            "path": str(spec.get("path")),
            "kind": "add" if not path.exists() else "update",
            "content": content,
        }
        self.allow(
            "write",
            "auto-accept-edits",
            kind="file_change",
            summary=f"write {spec.get('path')}",
            detail={"changes": [change]},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(spec.get("content", "")), encoding="utf-8")
        emit_item(
            "file_change", spec["path"], {"action": "write", "path": spec["path"], "sha256": digest(path)}
        )

    def step_edit(self, spec: Any, _check: bool) -> None:
        path = self.resolve(spec.get("path"))
        change = {
            "path": str(spec.get("path")),
            "kind": "update",
            "old": str(spec.get("old", "")),
            "new": str(spec.get("new", "")),
        }
        self.allow(
            "edit",
            "auto-accept-edits",
            kind="file_change",
            summary=f"edit {spec.get('path')}",
            detail={"changes": [change]},
        )
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise RunFailed(f"Edit failed: cannot read {spec['path']}: {why}") from exc
        old, new = str(spec.get("old", "")), str(spec.get("new", ""))
        if old not in content:
            raise RunFailed(f"Edit failed: the text to replace was not found in {spec['path']}.")
        path.write_text(content.replace(old, new, 1), encoding="utf-8")
        emit_item(
            "file_change", spec["path"], {"action": "edit", "path": spec["path"], "sha256": digest(path)}
        )

    def step_run(self, spec: Any, check: bool) -> None:
        if isinstance(spec, dict):
            cmd, check = str(spec.get("cmd", "")), bool(spec.get("check", check))
        else:
            cmd = str(spec)
        self.allow(
            "run",
            "auto",
            kind="command",
            summary=f"run `{cmd}` in {self.cwd}",
            detail={"command": cmd, "cwd": str(self.cwd)},
        )
        exit_code, output = run_command(cmd, self.cwd)
        emit_item("command", cmd, {"exit_code": exit_code, "output": output})
        if check and exit_code != 0:
            raise RunFailed(f"Command failed with exit code {exit_code}: {cmd}")

    def step_tool(self, spec: Any, check: bool) -> None:
        name = str(spec.get("name", ""))
        arguments = spec.get("arguments") or {}
        result, error = call_tool(name, arguments)
        emit_item("tool_call", name, {"arguments": arguments, "result": result, "error": error})
        if isinstance(result, dict):
            for key, value in result.items():
                if isinstance(value, (str, int, float, bool)):
                    self.variables[key] = str(value)
        if error is not None and (check or spec.get("check")):
            raise RunFailed(f"Tool {name} failed: {error['code']}: {error['message']}")

    def step_wait(self, seconds: Any, _check: bool) -> None:
        time.sleep(float(seconds))

    def step_wait_for_file(self, raw: Any, _check: bool) -> None:
        path = self.cwd / str(raw)
        while not path.exists():
            time.sleep(0.05)

    def step_fail(self, message: Any, _check: bool) -> None:
        raise RunFailed(str(message))


def run_command(cmd: str, cwd: Path) -> tuple[int, str]:
    """Run `cmd` with /bin/sh in our process group; (exit code, first 64 KiB of its output)."""
    kept = bytearray()
    with subprocess.Popen(
        ["/bin/sh", "-c", cmd],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        stdout = proc.stdout
        if stdout is None:
            raise RuntimeError("the command has no stdout pipe")
        try:
            while chunk := stdout.read(OUTPUT_LIMIT):
                if len(kept) < OUTPUT_LIMIT:
                    kept += chunk[: OUTPUT_LIMIT - len(kept)]
            exit_code = proc.wait()
        except BaseException:
            # Interrupted: the command must not outlive us, and must be reaped, not left a zombie.
            proc.kill()
            proc.wait()
            raise
    return exit_code, kept.decode("utf-8", errors="replace")


@functools.cache
def _unix_connection_class() -> Callable[[str, float], http.client.HTTPConnection]:
    """HTTP over the agent socket (http.client is imported here: 40 ms of every scripted run's
    start-up, and most scripts call no tool)."""
    import http.client  # noqa: PLC0415  # see above

    class UnixHTTPConnection(http.client.HTTPConnection):
        def __init__(self, socket_path: str, timeout: float) -> None:
            super().__init__("localhost", timeout=timeout)
            self.socket_path = socket_path

        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.socket_path)
            except OSError:
                sock.close()
                raise
            self.sock = sock

    return UnixHTTPConnection


def call_tool(name: str, arguments: Any) -> tuple[Any, dict[str, str] | None]:
    """(result, None) on success, (None, {"code", "message"}) on any failure."""
    socket_path = os.environ.get("PEERD_SOCKET")
    if not socket_path:
        return None, {
            "code": Unavailable.code,
            "message": "peerd agent tools are not configured for this run",
        }
    conn = _unix_connection_class()(socket_path, TOOL_TIMEOUT)
    try:
        conn.request(
            "POST",
            f"/v1/tools/{name}",
            body=json.dumps(arguments).encode(),
            headers={
                "Authorization": f"Bearer {os.environ.get('PEERD_RUN_TOKEN', '')}",
                "Content-Type": "application/json",
            },
        )
        response = conn.getresponse()
        status, raw = response.status, response.read()
    except OSError as exc:
        return None, {"code": Unavailable.code, "message": f"cannot reach peerd at {socket_path}: {exc}"}
    finally:
        conn.close()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not (200 <= status < 300 or body.get("code")):
        return None, {
            "code": BadResponse.code,
            "message": f"peerd answered HTTP {status} without a JSON object"
            if not isinstance(body, dict)
            else f"peerd answered HTTP {status} without an error code",
        }
    if 200 <= status < 300:
        return body.get("result"), None
    return None, {"code": str(body["code"]), "message": str(body.get("message") or f"HTTP {status}")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="script-agent", description="peerd's scripted coder")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--resume", metavar="SESSION_ID")
    parser.add_argument("--model")
    parser.add_argument("--runtime-mode", choices=RUNTIME_MODES, default="full-access")
    parser.add_argument("--interaction-mode", default="default")
    parser.add_argument(
        "--ask", action="store_true", help="ask the host before guarded steps (stdin stays open)"
    )
    args = parser.parse_args(argv)

    if args.ask:
        first = json.loads(read_line() or "{}")
        prompt = str(first.get("text", "")) if isinstance(first, dict) else ""
    else:
        # Bytes, not the locale's text encoding: peerd always sends UTF-8.
        prompt = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    cwd = Path.cwd()
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    log(f"model={args.model} runtime={args.runtime_mode} interaction={args.interaction_mode} cwd={cwd}")

    if args.resume:
        session = load_session(state_dir, args.resume)
        if session is None:
            log(f"No session found with id {args.resume}")
            return 1
    else:
        session = {"session_id": os.urandom(16).hex(), "runs": 0}
    session["runs"] = int(session.get("runs", 0)) + 1
    emit({"type": "session", "session_id": session["session_id"]})

    try:
        try:
            steps = steps_for_run(session, find_script(prompt, cwd))
        finally:
            save_session(state_dir, session)
        if steps is None:
            emit_item("assistant_message", "(script) " + prompt[:ECHO_LIMIT])
        else:
            variables = dict(session.get("vars") or {})
            variables["prompt"] = prompt
            try:
                Agent(cwd, args.runtime_mode, args.interaction_mode, variables, asking=args.ask).run_steps(
                    steps
                )
            finally:
                variables.pop("prompt", None)
                session["vars"] = variables
                save_session(state_dir, session)
    except RunFailed as exc:
        emit_item("error", str(exc))
        emit({"type": "result", "status": "failed", "error": str(exc)})
        return 1
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        message = f"Invalid script step: {type(exc).__name__}: {exc}"
        emit_item("error", message)
        emit({"type": "result", "status": "failed", "error": message})
        return 1
    emit({"type": "result", "status": "completed"})
    return 0


def reap_children(timeout: float) -> None:
    """Reap children the SIGINT killed, also one whose Popen it cut short (nobody else waits)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left
        if pid == 0:
            if time.monotonic() >= deadline:
                return  # still alive: peerd SIGKILLs the group once we are gone
            time.sleep(0.01)


def run() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        reap_children(0.5)
        with contextlib.suppress(OSError, ValueError, KeyboardInterrupt):
            emit({"type": "result", "status": "interrupted"})
        code = 130
    except BrokenPipeError:
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    run()
