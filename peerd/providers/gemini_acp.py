"""Gemini CLI's ACP mode: a coder run whose guarded actions a person approves (see `peerd.providers.asking`).

Verified against gemini-cli **0.61.0** (its bundle: `packages/cli/src/acp/*`, the
`@agentclientprotocol/sdk` schema it carries, and by driving the real CLI against tests/fakemodel.py);
the pure driver is `peerd.providers.gemini_acp_driver`.

- argv: `gemini --acp --skip-trust [-m MODEL] --approval-mode default [--allowed-mcp-server-names
  peerd] ARGS...` (`--experimental-acp` is the deprecated spelling), `GEMINI_CLI_NO_RELAUNCH=1`.
  peerd's MCP server is attached exactly as on the headless path (`gemini_tool_settings`): the
  system settings file (0600, `GEMINI_CLI_SYSTEM_SETTINGS_PATH`) names the daemon's loopback URL
  with the run token as a bearer header, `trust: true` (its tools run without asking: peerd checks
  them itself). ACP's own `mcpServers` (`session/new`) is left empty: it takes http servers with
  headers, but without `trust`, so each peerd tool would be asked.
- JSON-RPC 2.0, one JSON object per line. peerd sends `initialize` {protocolVersion: 1,
  clientCapabilities: {fs: {readTextFile: false, writeTextFile: false}, terminal: false}} (the CLI
  reads and writes files itself), then `session/new` {cwd, mcpServers: []} -> {sessionId, modes,
  models}, or to resume `session/load` {sessionId, cwd, mcpServers: []} (the session files are the
  headless path's: either path resumes the other's session). The loaded history is streamed back as
  `session/update`s around the load's response; a request sent after it (`_peerd/history_done`, an
  unknown method: answered -32601) is answered after all of it, and the prompt follows that answer.
  A session that cannot be loaded starts a new one, with a notice. 0.61.0's `session/load` first
  starts a throwaway recording for the session id, named `session-<UTC minute>-<id[:8]>.jsonl`: in
  the minute the session's own file was created that is the same file, and the appended header
  empties the session ("No previous sessions found for this project.", the conversation lost). So a
  file of that session named with the current minute is renamed to an earlier minute before the
  launch (`spare_same_minute_session`); the CLI finds sessions by the id inside, not by file name.
  No `authenticate`: `session/new` authenticates with the user's configured auth
  (`security.auth.selectedType`, `GEMINI_API_KEY`); without any it answers -32000 with why.
- `session/prompt` {sessionId, prompt: [{type: text, text}]} -> {stopReason: end_turn | cancelled |
  max_turn_requests | max_tokens | refusal, _meta: {quota: {token_count: {input_tokens,
  output_tokens}, model_usage: [...]}}} ends the turn; then stdin is closed. 0.61.0 stays up while
  an MCP server is connected, so the shell ends it a second later (SIGTERM: the CLI's graceful
  shutdown, exit 0).
- `session/update` {sessionId, update: {sessionUpdate: ...}}: `agent_message_chunk` {content: {type:
  text, text}}, `agent_thought_chunk`, `tool_call` {toolCallId: "<tool>__<call id>", status:
  in_progress, title, content, locations, kind} for a tool run without asking, `tool_call_update`
  {status: completed | failed, content: a shell command's is empty (its output goes to the model
  only), a file write's its diff, an MCP tool's its text}, `available_commands_update`; in a loaded
  history also
  `user_message_chunk` and finished `tool_call`s.
- The CLI asks with the request `session/request_permission` {sessionId, toolCall: {toolCallId,
  status: pending, title, content, locations, kind}, options: [{optionId, name, kind}]}: options
  `proceed_always` (allow_always), `proceed_once` (allow_once), `cancel` (reject_once); MCP tools
  also `proceed_always_server`/`proceed_always_tool`. A shell command's title is the command line
  and its content text `[current working directory D] (description)` or `[in D]`; a file write's
  (write_file, replace) content is `{type: diff, path, oldText, newText, _meta: {kind: add|modify|
  delete}}`. peerd answers {outcome: {outcome: selected, optionId: proceed_once | cancel}}, or
  {outcome: cancelled}. Asked (approval mode default, the bundled policies/*.toml): run_shell_command,
  write_file, replace, web_fetch, activate_skill and the tools of MCP servers other than peerd's;
  never asked: read_file, glob, grep_search, list_directory, google_web_search (read-only.toml)
  and peerd's own tools (trusted).
- A denial cannot carry a message in 0.61.0: the model reads `Tool "X" was canceled by the user.`
  (the CLI sends no `tool_call_update` for it). A denial's reason reaches the model in a follow-up
  `session/prompt` once the turn has ended (at most 3 per run).
- Interrupt: the `session/cancel` notification {sessionId}, every open permission request answered
  `cancelled` (ACP's rule), the prompt then ends with stopReason `cancelled`; DuplexRun's signals
  follow (SIGTERM at once: the CLI's graceful shutdown).
- Usage: only the prompt response's `token_count` (input and output tokens of the turn's model
  requests); no cached or thought tokens and no duration on this path (the headless `stats` have them).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from peerd import __version__
from peerd.config import ProviderConfig
from peerd.providers.cli import MCP_SERVER_NAME, MCP_TOOL_TIMEOUT_S, Launch, ToolBinding, write_private
from peerd.providers.duplex import DuplexDriver
from peerd.providers.gemini_acp_driver import GeminiAcpDriver
from peerd.runtime.provider import RunSpec

_SESSION_PREFIX = re.compile(r"[0-9A-Za-z-]{8}")
GEMINI_ASKS = (
    "Gemini CLI asks before each shell command, each file write and each call of an MCP tool other "
    "than peerd's (ACP mode, --acp); peerd asks a person and answers. Gemini CLI cannot pass a "
    "denial's reason to the model: peerd tells it in a follow-up turn."
)


def writable_ancestor(path: Path) -> Path | None:
    """The nearest directory above `path` that group or others may write, if any."""
    for parent in path.parents:
        try:
            if parent.stat().st_mode & 0o022:
                return parent
        except OSError:
            return parent
    return None


def gemini_tool_settings(
    config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[list[str], dict[str, str], list[str]]:
    """peerd's MCP server for this run as Gemini CLI's system settings file: (argv, env, notices).
    The same on the headless path (`peerd.providers.coders.gemini_argv`) and the asking path."""
    if binding is None:
        return [], {}, []
    server: dict[str, object]
    if binding.url:  # the daemon's MCP endpoint (streamable HTTP); the token only in this 0600 file
        server = {"httpUrl": binding.url, "headers": binding.bearer()}
    else:
        server = {"command": binding.command, "args": binding.args, "env": binding.env}
    server["trust"] = True  # calls to an untrusted server are refused (headless) or asked (ACP)
    server["timeout"] = MCP_TOOL_TIMEOUT_S * 1000
    settings = {
        "mcpServers": {MCP_SERVER_NAME: server},
        # Attempts per model request, the first included (Gemini retries for minutes otherwise).
        "general": {"maxAttempts": config.model_retries + 1},
    }
    path = write_private(scratch / "gemini-settings.json", json.dumps(settings))
    notices = []
    if (unsafe := writable_ancestor(path)) is not None:
        notices.append(
            f"Gemini CLI ignores settings files below a directory others can write ({unsafe}), so "
            "peerd's tools are not available to this run. Keep peerd's home (PEERD_HOME) in a "
            "directory only you can write."
        )
    env = {"GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(path)}
    return ["--allowed-mcp-server-names", MCP_SERVER_NAME], env, notices


def gemini_home(env: Mapping[str, str]) -> Path | None:
    """Where the CLI keeps its sessions: `$GEMINI_CLI_HOME/.gemini`, else `$HOME/.gemini`."""
    home = env.get("GEMINI_CLI_HOME") or env.get("HOME")
    return Path(home) / ".gemini" if home else None


def spare_same_minute_session(gemini_dir: Path, session_id: str, now: datetime) -> list[Path]:
    """Rename the session's own files named with `now`'s UTC minute to an earlier free minute, so
    0.61.0's `session/load` (whose throwaway recording is named with the minute it starts in)
    cannot append to them. Returns the new paths."""
    short = session_id[:8]
    if not _SESSION_PREFIX.fullmatch(short) or not (gemini_dir / "tmp").is_dir():
        return []  # not a session id Gemini made (a UUID): no glob of other files
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    stamp = minute.strftime("%Y-%m-%dT%H-%M")
    moved = []
    for path in (gemini_dir / "tmp").glob(f"*/chats/session-{stamp}-{short}.jsonl"):
        for back in range(1, 60):
            earlier = (minute - timedelta(minutes=back)).strftime("%Y-%m-%dT%H-%M")
            target = path.with_name(f"session-{earlier}-{short}.jsonl")
            if not target.exists():
                try:
                    path.rename(target)
                except OSError:
                    break  # left as it is: the load may then fail, and a new session starts
                moved.append(target)
                break
    return moved


def duplex_launch(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[Launch, DuplexDriver] | None:
    if spec.resume_session and (home := gemini_home({**os.environ, **config.env})) is not None:
        spare_same_minute_session(home, spec.resume_session, datetime.now(UTC))
    argv = [binary, "--acp", "--skip-trust"]
    if model := spec.model or config.model:
        argv += ["-m", model]
    argv += ["--approval-mode", "default"]
    tools, tool_env, notices = gemini_tool_settings(config, binding, scratch)
    argv += tools
    argv += config.args
    # One process (no self-relaunch as a child) so a signal reaches the CLI itself.
    env = {"GEMINI_CLI_NO_RELAUNCH": "1", **tool_env}
    launch = Launch(argv, env, spec.cwd, None, scratch, [GEMINI_ASKS, *notices])
    launch.skip_sigint = True  # SIGTERM is the CLI's graceful shutdown
    driver = GeminiAcpDriver(
        prompt=spec.prompt, cwd=str(spec.cwd), resume_session=spec.resume_session, client_version=__version__
    )
    return launch, driver
