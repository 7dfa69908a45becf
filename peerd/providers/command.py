"""Custom CLI coders: a command template from the config file, run only once the owner approved it.

The template substitutes exactly two placeholders, `{SPEC}` (a file holding the task) and
`{WORKTREE}` (the run's checkout), and is split like a shell would split it but never run by a
shell. A custom command is untrusted (it may come from a file someone else wrote): it runs only
when the owner approved that exact text (`peerd provider approve NAME`, or `approved_commands` in
the config file); otherwise the run fails with the command shown, so the owner sees what they
would approve.

Output: `format = "text"` takes all of stdout as the reply and exit code 0 as success; the other
formats reuse the Codex, Claude or Gemini stream parsers for a wrapper that speaks those.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from peerd.config import ProviderConfig
from peerd.errors import ProviderError
from peerd.providers.claude_events import ClaudeEvents
from peerd.providers.cli import (
    CliRun,
    Launch,
    StreamParser,
    base_env,
    bind_tools,
    confine,
    home_mounts,
    resolve_binary,
    scratch_dir,
    start_cli,
    write_private,
)
from peerd.providers.codex_events import CodexEvents
from peerd.providers.gemini_events import GeminiEvents
from peerd.providers.stream_common import tail_of_stderr
from peerd.runtime.provider import ItemProduced, RunFinished, RunSpec, SessionStarted

REPLY_MAX_CHARS = 200_000
Approved = Callable[[str, str], Awaitable[bool]]


class TextEvents:
    """Plain-text coders: stdout is the report; exit code 0 is success."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lines: list[str] = []
        self._size = 0

    @property
    def reply(self) -> str | None:
        text = "\n".join(self._lines).strip()
        return text or None

    def feed_text(self, line: str) -> list[SessionStarted | ItemProduced]:
        if self._size < REPLY_MAX_CHARS:
            self._lines.append(line)
            self._size += len(line) + 1
        return []

    def feed(self, line: Mapping[str, Any]) -> list[SessionStarted | ItemProduced]:
        return self.feed_text(json.dumps(line))

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        if interrupted and exit_code != 0:
            return RunFinished("interrupted", exit_code=exit_code)
        if exit_code != 0:
            detail = tail_of_stderr(stderr_tail) or self.reply or ""
            message = f"{self._name} exited with code {exit_code}"
            return RunFinished(
                "failed", error=f"{message}: {detail}" if detail else message, exit_code=exit_code
            )
        return RunFinished("completed", exit_code=exit_code)

    def final_items(self) -> list[ItemProduced]:
        return [ItemProduced("assistant_message", self.reply)] if self.reply else []


def expand(template: str, *, spec_file: str, worktree: str) -> list[str]:
    """The argv of a command template: split like a shell, then `{SPEC}` and `{WORKTREE}`."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ProviderError(f"The command {template!r} cannot be split into words: {exc}.") from None
    if not words:
        raise ProviderError("The custom command is empty.")
    return [w.replace("{SPEC}", spec_file).replace("{WORKTREE}", worktree) for w in words]


def _parser(config: ProviderConfig, name: str) -> StreamParser:
    if config.format == "codex-jsonl":
        return CodexEvents()
    if config.format == "claude-stream-json":
        return ClaudeEvents()
    if config.format == "gemini-stream-json":
        return GeminiEvents()
    return TextEvents(name)


class CommandProvider:
    """A custom coder (`kind = "command"` in the config file)."""

    kind = "command"

    def __init__(self, name: str, config: ProviderConfig, approved: Approved) -> None:
        if not config.command:
            raise ValueError("a command provider needs a command")
        self.name = name
        self.config = config
        self.command: str = config.command
        self.binary = shlex.split(self.command)[0] if self.command.strip() else ""
        self._approved = approved

    async def start(self, spec: RunSpec) -> CliRun:
        if not await self._approved(self.name, self.command):
            raise ProviderError(
                f"Custom provider {self.name!r} is not approved to run. It would run:\n  {self.command}\n"
                f"If you trust it, approve exactly this command with `peerd provider approve {self.name}` "
                f'(or add "{self.name}" to approved_commands in the config file).'
            )
        scratch = scratch_dir(spec)
        spec_file = write_private(scratch / "task.md", spec.prompt)
        argv = expand(self.command, spec_file=str(spec_file), worktree=str(spec.cwd))
        binding = bind_tools(spec, scratch)
        env = base_env(self.config, spec, binding)
        binary = resolve_binary(argv[0], env)
        if binary is None:
            raise ProviderError(f"Custom provider {self.name!r}: {argv[0]!r} was not found on PATH.")
        argv = [binary, *argv[1:], *self.config.args]
        launch = Launch(argv, env, spec.cwd, None, scratch, timeout_s=self.config.timeout_s)
        confine(
            launch,
            spec.confinement,
            binary,
            *home_mounts(self.config, env),
            config=self.config,
            name=self.name,
        )
        return await start_cli(launch, _parser(self.config, self.name), cli=self.name)
