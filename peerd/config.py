"""The config file: `config.toml`, one per environment (`default_path`).

Which file: `--config` / `PEERD_CONFIG` when given; else `<home>/config.toml` when the home was
named (`--home` or `PEERD_HOME`), so two environments side by side never share a `listen =`; else,
for the default home, `$XDG_CONFIG_HOME/peerd/config.toml` (`~/.config/peerd/config.toml`).

Everything is optional; a missing file means the defaults. Command-line flags win over the file.
Unknown keys are refused with the file and key named, so a typo never silently does nothing.

    label = "box"
    listen = "0.0.0.0:7433"            # or false: only the local socket
    tls = true
    web_cert = "/etc/peerd/box.crt"    # the certificate browsers get on the listener (the agent
    web_key = "/etc/peerd/box.key"     # sign-in page); default: a self-signed ECDSA one peerd makes
    advertise = ["https://box.tailnet.ts.net:7433"]
    approved_commands = ["my-coder"]   # custom commands approved as written in this file
    continue_cut_runs = true           # a delegated child's run cut by a stop or crash of this
                                       # daemon goes on in its session after the restart

    [providers.codex]                  # codex, claude, gemini: the built-in kinds
    binary = "/opt/codex/bin/codex"    # default: the name on PATH
    model = "gpt-5.5"                  # used when a thread names no model
    args = ["-c", "model_reasoning_effort=\\"high\\""]
    env = { OPENAI_API_KEY = "..." }   # hidden by `peerd config show`

    [providers.my-coder]               # a custom CLI coder (untrusted until approved)
    kind = "command"
    command = "my-coder run --task-file {SPEC} --workdir {WORKTREE}"
    format = "text"                    # or codex-jsonl, claude-stream-json, gemini-stream-json

    [links]                            # what runs a linked machine starts here may use
    providers = ["script", "codex", "claude", "gemini"]   # the default; custom commands only if listed
    script_run = true                  # the scripted provider's `run` step (only ever confined)
    allow_unconfined = false           # true: without bubblewrap, still run a link's runs above
                                       # read-only, with only the coder's own sandbox

    [prices."gpt-5.1-codex"]           # dollars per million tokens, for CLIs that report no cost
    input_per_mtok = 1.25              # (Codex, Gemini CLI): their runs' cost is then an estimate
    cached_input_per_mtok = 0.125      # optional: as input_per_mtok when not given
    output_per_mtok = 10.0             # the key: a model, or a provider name for any of its runs

    [console]                          # the browser console (docs/user/console.md)
    enabled = true                     # false: no console listener
    listen = "127.0.0.1:7434"          # off loopback only with tls_cert and tls_key
    public_url = "https://box.tailnet.ts.net"   # where people open it (`tailscale serve`), if not here
    tls_cert = "/etc/peerd/console.crt"         # PEM certificate and key: the console serves HTTPS
    tls_key = "/etc/peerd/console.key"

    [placement]                        # what this machine tells its links for `auto` (fleet.md)
    max_runs = 4                       # runs at once before `auto` passes it by (live < max_runs)
    preference = "normal"              # or "prefer", "less", "manual-only" (never chosen by auto)

    [runs]
    start_slots = 1                    # runs starting at once (default: half the CPUs, at least 1);
                                       # a launch is answered at once, its start waits its turn
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from peerd.core import console_bind
from peerd.core.usage import Price
from peerd.errors import ConfigInvalid
from peerd.paths import config_file

BUILTIN_KINDS = ("codex", "claude", "gemini")
ProviderKind = Literal["codex", "claude", "gemini", "command"]
CommandFormat = Literal["text", "codex-jsonl", "claude-stream-json", "gemini-stream-json"]
HIDDEN = "********"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    kind: ProviderKind | None = None  # default: the entry's name, when it is a built-in kind
    binary: str | None = None
    model: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # Custom commands only: a template where {SPEC} is a file holding the task and {WORKTREE} the
    # run's checkout; split like a shell would, but never run by a shell.
    command: str | None = None
    format: CommandFormat = "text"
    timeout_s: float | None = Field(default=None, gt=0)
    # How often the CLI retries a failing model request (5xx, overloaded) before the run fails:
    # the CLIs' own defaults keep a run silently "running" for minutes against a broken server.
    model_retries: int = Field(default=2, ge=0, le=20)


LINK_PROVIDERS_DEFAULT = ("script", *BUILTIN_KINDS)


class LinksConfig(_Strict):
    """What the runs a link starts here may use (`[links]`)."""

    providers: list[str] = Field(default_factory=lambda: list(LINK_PROVIDERS_DEFAULT))
    script_run: bool = True
    allow_unconfined: bool = False
    # Ceilings per link that no caller can raise (docs/user/usage.md): runs a link may start, and
    # dollars its runs may spend (as the CLIs report cost), in any 24 hours. None: no ceiling.
    max_runs: int | None = Field(default=None, ge=0)
    max_usd_per_day: float | None = Field(default=None, ge=0)

    def allows(self, provider: str) -> bool:
        return provider in self.providers


class PriceConfig(_Strict):
    """One model's price (`[prices."MODEL"]`), dollars per million tokens (peerd/core/usage.py)."""

    input_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    output_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    cached_input_per_mtok: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    def price(self) -> Price:
        return Price(
            input_per_mtok=self.input_per_mtok,
            output_per_mtok=self.output_per_mtok,
            cached_input_per_mtok=self.cached_input_per_mtok,
        )


class ConsoleConfig(_Strict):
    """The browser console the daemon serves (`[console]`; peerd/console/)."""

    enabled: bool = True
    listen: str = "127.0.0.1:7434"
    public_url: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


class ApprovalsConfig(_Strict):
    """Approvals that reach a person (`[approvals]`; docs/user/approvals.md)."""

    # How long a question waits for a person before it is denied (the model is told why).
    deadline_minutes: float = Field(default=30.0, gt=0, le=7 * 24 * 60)
    # What a linked machine's runs do when they need approval: `ask` the person on that machine
    # (and this machine's owner), or `deny` at once. Per link, by client id or label: `links`.
    link_policy: Literal["ask", "deny"] = "ask"
    links: dict[str, Literal["ask", "deny"]] = Field(default_factory=dict)
    desktop: bool = True  # a desktop notification (notify-send) where one can be shown
    webhook_url: str | None = Field(default=None, pattern=r"^https?://")  # e.g. an ntfy topic

    def policy_for(self, client_id: str, label: str | None) -> Literal["ask", "deny"]:
        if client_id in self.links:
            return self.links[client_id]
        if label is not None and label in self.links:
            return self.links[label]
        return self.link_policy


class A2AConfig(_Strict):
    """The A2A face (`[a2a]`; docs/user/a2a.md)."""

    # Networks a push webhook may reach although they are loopback, private, link-local or
    # multicast (refused by default: no SSRF). CIDR strings, e.g. ["127.0.0.1/32"].
    allow_private_push: list[str] = Field(default_factory=list)

    @field_validator("allow_private_push")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not a network (write e.g. 127.0.0.1/32)") from None
        return value


class PlacementConfig(_Strict):
    """How `auto` sees this machine (`[placement]`; peerd/placement/, docs/user/fleet.md)."""

    max_runs: int = Field(default=4, ge=0, le=100_000)
    preference: Literal["prefer", "normal", "less", "manual-only"] = "normal"


class RunsConfig(_Strict):
    """How this machine starts runs (`[runs]`; peerd/runtime/slots.py)."""

    # Runs starting at once (worktree, sandbox, the CLI's own start-up until its first event, 5 s
    # at most); others wait their turn. Default: half the CPUs peerd may use, at least 1.
    start_slots: int | None = Field(default=None, ge=1, le=1024)


class WaitsConfig(_Strict):
    """Waits on a pull request (`[waits]`; peerd/waits/, docs/user/delegation.md)."""

    # How often an open wait asks GitHub through `gh` (two calls: the pull request and its checks).
    # Rate limits and failures back off beyond it; GitHub allows 5,000 calls an hour to a login.
    poll_seconds: float = Field(default=30.0, ge=0.05, le=3600.0)


class AgentsConfig(_Strict):
    """Outside agents that sign in over OAuth (`[agents]`; api/agent_signin.py, docs/user/agents.md)."""

    # Fetch client ID metadata documents from loopback, private and link-local addresses too
    # (refused by default: the fetch must not reach this machine's or its network's services).
    allow_private_metadata_urls: bool = False


class Config(_Strict):
    label: str | None = None
    listen: str | Literal[False] | None = None
    tls: bool = True
    # The certificate and key (PEM) the listener shows clients that take no Ed25519, i.e. browsers
    # opening the agent sign-in page (peer/webcert.py). Default: a self-signed one peerd makes.
    web_cert: str | None = None
    web_key: str | None = None
    advertise: list[str] = Field(default_factory=list)
    approved_commands: list[str] = Field(default_factory=list)
    # A delegated child's run cut by a stop or crash of this daemon is continued in its session
    # after the restart (false: it ends interrupted, and so does its task). Wakes always are.
    continue_cut_runs: bool = True
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    links: LinksConfig = Field(default_factory=LinksConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    a2a: A2AConfig = Field(default_factory=A2AConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    runs: RunsConfig = Field(default_factory=RunsConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    waits: WaitsConfig = Field(default_factory=WaitsConfig)
    # What models cost, for CLIs that report no cost: model (or provider) name -> price.
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    source: str | None = Field(default=None, exclude=True)

    def price_table(self) -> dict[str, Price]:
        return {name: entry.price() for name, entry in self.prices.items()}

    def default_models(self) -> dict[str, str]:
        """Each provider's configured model (what a thread that names none runs)."""
        return {name: entry.model for name, entry in self.providers.items() if entry.model}

    def provider_kind(self, name: str) -> ProviderKind:
        entry = self.providers.get(name)
        if entry is not None and entry.kind is not None:
            return entry.kind
        if name in BUILTIN_KINDS:
            return name  # type: ignore[return-value]  # checked just above
        return "command"

    def shown(self) -> dict[str, Any]:
        """The effective config as `peerd config show` prints it: secrets (provider env) hidden."""
        data = self.model_dump(mode="json", exclude_none=True)
        for entry in data.get("providers", {}).values():
            entry["env"] = {key: HIDDEN for key in entry.get("env", {})}
        return data


def link_may_use(config: Config, provider: str) -> bool:
    """Whether a run a link starts here may use `provider` (`links.providers`)."""
    return config.links.allows(provider)


def default_path(env: dict[str, str] | None = None, *, home: Path | None = None) -> Path:
    """The config file to read (`paths.config_file`): PEERD_CONFIG; else `<home>/config.toml`
    for a home named by `--home` (`home`) or PEERD_HOME; else the XDG config file."""
    return config_file(env, home=home)


def problems(exc: pydantic.ValidationError) -> str:
    """A config file's validation errors, one `key.path: message` each."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors(include_url=False)
    )


def _validate(raw: dict[str, Any], source: str) -> Config:
    try:
        config = Config.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ConfigInvalid(f"{source}: {problems(exc)}") from None
    for name, entry in config.providers.items():
        if name == "script":
            raise ConfigInvalid(f"{source}: providers.script is built in and cannot be configured.")
        kind = config.provider_kind(name)
        if kind == "command" and not entry.command:
            raise ConfigInvalid(
                f"{source}: providers.{name}: a custom provider needs `command` "
                '(e.g. command = "my-coder --task-file {SPEC} --workdir {WORKTREE}"), '
                f"or kind = one of {', '.join(BUILTIN_KINDS)}."
            )
        if kind != "command" and entry.command:
            raise ConfigInvalid(f'{source}: providers.{name}: `command` is only for kind = "command".')
    for name in config.links.providers:
        if name != "script" and name not in BUILTIN_KINDS and name not in config.providers:
            raise ConfigInvalid(
                f"{source}: links.providers: {name!r} is not a provider here (the built-in script, "
                f"{', '.join(BUILTIN_KINDS)}, or one of [providers.*])."
            )
    if (config.web_cert is None) != (config.web_key is None):
        raise ConfigInvalid(f"{source}: give both web_cert and web_key (PEM files), or neither.")
    problem = console_problem(config.console)
    if problem is not None:
        raise ConfigInvalid(f"{source}: {problem}")
    return config.model_copy(update={"source": source})


def console_problem(console: ConsoleConfig) -> str | None:
    """What is wrong with `[console]`, in one sentence, or None (rules: peerd/core/console_bind.py)."""
    if (console.tls_cert is None) != (console.tls_key is None):
        return "console: give both tls_cert and tls_key (PEM files), or neither."
    if console.public_url is not None and (problem := console_bind.public_url_problem(console.public_url)):
        return problem
    return console_bind.bind_problem(console.listen, tls=console.tls)


def load(path: Path | None = None, *, required: bool = False, home: Path | None = None) -> Config:
    """Read the config file (`path`, else `default_path(home=home)`); a missing file is the
    defaults unless it was named explicitly. `source` says which file was read."""
    path = path or default_path(home=home)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        # Not a directory: the default file's home is not a directory (yet); the daemon says so
        # itself (`home_unusable`), which is what the person needs to hear.
        if required:
            raise ConfigInvalid(f"No config file at {path}.") from None
        return Config()
    except OSError as exc:
        raise ConfigInvalid(f"Cannot read {path}: {exc.strerror or exc}.") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"{path}: not valid TOML: {exc}.") from None
    return _validate(raw, str(path))
