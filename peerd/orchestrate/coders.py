"""Which coders an orchestration uses: spec parsing, the project's config, resolution and assignment.

A coder spec is `[<environment>/]<backend>[:<model>]`: `codex`, `claude:opus`, `box/codex:gpt-5.5`,
`"gemini:Gemini 3.1 Pro (High)"` (everything after the first colon is the model, spaces and colons
included). The environment `auto` (`auto/codex`, or `--on auto`) lets placement choose here or a
linked box for each hop as it starts (peerd/orchestrate/placing.py). Backends are peerd's
providers: `script`, `codex`, `claude`, `gemini`, or a custom command.

The project's `.peerd/orchestrate.toml` (all keys optional; unknown keys are refused):

    default_coder = "codex"                # used when no --coder is given
    coders = ["codex", "claude:opus", { name = "my-coder", command = "my-coder --task-file {SPEC}" }]
    reviewer = "claude"                    # default reviewer (--reviewer wins)
    sandbox_workarounds = ["dprint: run `dprint fmt --incremental=false`"]  # added to every packet
    verify = "make check"                  # the full verification command

Custom commands are untrusted (the file lives in the repository under work): they run only when
allowed (`--allow-command NAME`), already approved, or confirmed by the user. Everything here is
pure except `load_project_config`, which reads that one file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

import pydantic

from peerd.config import BUILTIN_KINDS, problems
from peerd.errors import ConfigInvalid, InvalidRequest
from peerd.orchestrate.models import (
    CoderChoice,
    CoderSpec,
    CustomCoder,
    OrchestrateConfig,
    PacketSpec,
    Resolution,
)

__all__ = ["CoderSpec", "CustomCoder", "OrchestrateConfig", "Resolution"]  # re-exported from models

PROJECT_CONFIG = PurePosixPath(".peerd/orchestrate.toml")
PROBE_ORDER: tuple[str, ...] = ("codex", "claude", "gemini")
AUTO = "auto"  # an environment placement chooses per hop (docs/user/fleet.md)
BUILTIN_BACKENDS = frozenset({*BUILTIN_KINDS, "script"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_EXAMPLES = 'e.g. codex, claude:opus, box/codex:gpt-5.5, "gemini:Gemini 3.1 Pro (High)"'


def split_spec(text: str) -> CoderSpec:
    """The syntax of a coder spec, without checking that its environment exists."""
    raw = text.strip()
    head, colon, model = raw.partition(":")
    model = model.strip()
    environment, slash, backend = head.strip().rpartition("/")
    if not raw:
        problem = "it is empty"
    elif colon and not model:
        problem = "nothing follows ':'; give a model after it or drop the colon"
    elif slash and (not environment or "/" in environment or any(c.isspace() for c in environment)):
        problem = "the environment before '/' must be one linked environment's name"
    elif not _NAME.match(backend):
        problem = f"{backend!r} is not a backend name (letters, digits, '.', '_', '-')"
        if " " in backend:
            problem += "; a model goes after a colon and must be quoted when it has spaces"
    elif len(model) > 200:
        problem = "the model name is longer than 200 characters"
    else:
        return CoderSpec(backend=backend, model=model or None, environment=environment or None)
    raise InvalidRequest(
        f"Coder spec {text!r}: {problem}. Write [<environment>/]<backend>[:<model>], {_EXAMPLES}."
    )


def parse_coder_spec(text: str, *, known_environments: Collection[str]) -> CoderSpec:
    spec = split_spec(text)
    if spec.environment not in (None, AUTO) and spec.environment not in known_environments:
        known = ", ".join(sorted(known_environments)) or "none linked yet (`peerd link`)"
        raise InvalidRequest(
            f"Coder spec {text!r}: no linked environment named {spec.environment!r} (known: {known}). "
            "Drop the '<environment>/' prefix to run it here."
        )
    return spec


# --- the project's config -----------------------------------------------------------------------


def listed_backends(config: OrchestrateConfig) -> set[str]:
    """Backend names the config's `coders` list mentions."""
    return {c.name if isinstance(c, CustomCoder) else split_spec(c).backend for c in config.coders}


def check_project_config(raw: dict[str, object], source: str) -> OrchestrateConfig:
    try:
        config = OrchestrateConfig.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ConfigInvalid(f"{source}: {problems(exc)}") from None
    try:
        for spec in [config.default_coder, config.reviewer, *config.coders]:
            if isinstance(spec, str):
                split_spec(spec)
    except InvalidRequest as exc:
        raise ConfigInvalid(f"{source}: {exc.message}") from None
    names: set[str] = set()
    for entry in config.coders:
        if not isinstance(entry, CustomCoder):
            continue
        if not _NAME.match(entry.name) or entry.name in BUILTIN_BACKENDS:
            raise ConfigInvalid(
                f"{source}: coders: {entry.name!r} cannot name a custom command (a built-in backend, or "
                "not letters, digits, '.', '_', '-')."
            )
        if entry.name in names:
            raise ConfigInvalid(f"{source}: coders: custom command {entry.name!r} is defined twice.")
        names.add(entry.name)
    return config.model_copy(update={"source": source})


def load_project_config(project_dir: Path | str) -> OrchestrateConfig:
    """Read `<project>/.peerd/orchestrate.toml`; a missing file is the empty config."""
    path = Path(project_dir) / PROJECT_CONFIG
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return OrchestrateConfig()
    except OSError as exc:
        raise ConfigInvalid(f"Cannot read {path}: {exc.strerror or exc}.") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"{path}: not valid TOML: {exc}.") from None
    return check_project_config(raw, str(path))


# --- resolution ---------------------------------------------------------------------------------


def resolve_coders(
    flags: Sequence[str],
    config: OrchestrateConfig,
    available: Mapping[str, bool],
    *,
    interactive: bool,
    allow_commands: Collection[str],
    custom_commands: Mapping[str, str],
    approved: Collection[str],
    on: Sequence[str],
    known_environments: Collection[str],
) -> Resolution:
    """The coders of a run, per the rules in the module docstring of `peerd orchestrate`.

    Order: --coder flags, else the config's default_coder, else (no default) the first runnable of
    codex, claude, gemini (then script, only when the config lists it) — interactive callers also get
    `default_options` to ask the user. Unknown names stop an interactive run and are skipped otherwise.
    A custom command needs --allow-command or an approval; interactively it is kept and returned in
    `needs_confirmation`, non-interactively it is skipped (non-interactive runs also use only the
    custom commands the config's `coders` lists). `--on` places every coder without an environment
    prefix, round-robin over the environments (with more environments than coders, coders repeat so
    every environment gets one). Local coders that are not runnable here are skipped; if none is
    left, the probe-order fallback is tried, then `InvalidRequest` names everything tried.
    """
    log: list[str] = []
    skipped: list[str] = []
    for env in on:
        if env != AUTO and env not in known_environments:
            known = ", ".join(sorted(known_environments)) or "none linked yet (`peerd link`)"
            raise InvalidRequest(f"--on {env}: no linked environment named so (known: {known}).")
    source = config.source or str(PROJECT_CONFIG)
    file_commands = config.custom
    listed = listed_backends(config)
    fallback_order = [*PROBE_ORDER, *(["script"] if "script" in listed else [])]

    def runnable(name: str) -> bool:
        custom = name in file_commands or name in custom_commands
        return available.get(name, custom or name == "script")

    specs: list[CoderSpec] = []
    origin = ""
    default_options: list[str] = []
    if flags:
        specs = [parse_coder_spec(flag, known_environments=known_environments) for flag in flags]
        origin = "--coder"
        log.append(f"Coders from --coder: {', '.join(s.text for s in specs)}.")
    elif config.default_coder:
        specs = [parse_coder_spec(config.default_coder, known_environments=known_environments)]
        origin = f"default_coder in {source}"
        log.append(f"Coder {specs[0].text} is default_coder in {source}.")
    else:
        log.append(f"No --coder and no default_coder in {source}.")
        if interactive:
            default_options = [n for n in [*fallback_order, *sorted(listed)] if runnable(n)]
            default_options = list(dict.fromkeys(default_options))

    kept: list[CoderSpec] = []
    commands: dict[str, str] = {}
    confirm: list[tuple[str, str]] = []
    for spec in dict.fromkeys(specs):  # CoderSpec is frozen, hence hashable: drop repeats, keep order
        name = spec.backend
        custom = name in file_commands or name in custom_commands
        builtin = name in BUILTIN_BACKENDS or (name in available and not custom)
        if not builtin and not custom:
            names = sorted({*BUILTIN_BACKENDS, *listed, *custom_commands, *available})
            reason = (
                f"{name!r} is neither a peerd provider nor a custom command of {source} "
                f"(known: {', '.join(names)})"
            )
            if interactive:
                raise InvalidRequest(
                    f"Coder {spec.text}: {reason}. Add it to `coders` in {source} or pick a known one."
                )
            skipped.append(f"{spec.text}: {reason}")
            continue
        if custom:
            command = file_commands.get(name) or custom_commands[name]
            if (
                name in file_commands
                and name in custom_commands
                and file_commands[name] != custom_commands[name]
            ):
                skipped.append(
                    f"{spec.text}: {source} gives it the command `{file_commands[name]}` but peerd's config "
                    f"has `{custom_commands[name]}`; make them agree"
                )
                continue
            if not interactive and name not in listed:
                skipped.append(
                    f"{spec.text}: custom command `{command}` is not in `coders` of {source}; "
                    "non-interactive runs use only the custom commands listed there"
                )
                continue
            if name in allow_commands or command in allow_commands:
                log.append(f"Custom command {name} allowed by --allow-command: `{command}`.")
            elif name in approved:
                log.append(f"Custom command {name} is already approved: `{command}`.")
            elif interactive:
                if (name, command) not in confirm:
                    confirm.append((name, command))
            else:
                skipped.append(
                    f"{spec.text}: custom command `{command}` is untrusted and not approved; "
                    f"pass --allow-command {name} to run it"
                )
                continue
            commands[name] = command
        kept.append(spec)

    coders: list[CoderChoice] = []
    for spec, reason in _place([(s, origin) for s in kept], on, log):
        if spec.environment is None and not runnable(spec.backend):
            skipped.append(f"{spec.text}: not runnable here (`peerd provider list` shows why)")
        else:
            coders.append(spec.choice(reason))

    if not coders:
        candidates = fallback_order if on else [n for n in fallback_order if runnable(n)]
        if candidates:
            why = "the first" if on else "the first runnable"
            why = f"fallback: {why} in probe order {', '.join(fallback_order)}"
            pick, reason = _place([(CoderSpec(backend=candidates[0]), why)], on, log)[0]
            log.append(f"Falling back to {pick.text}, {why.removeprefix('fallback: ')}.")
            coders.append(pick.choice(reason))
        else:
            tried = [s.text for s in specs] + fallback_order
            detail = f" Skipped: {'; '.join(skipped)}." if skipped else ""
            raise InvalidRequest(
                f"No coder can run: tried {', '.join(tried)}; none is runnable here.{detail} "
                "Install one of codex, claude or gemini, or name a coder with --coder."
            )
    log.extend(f"Skipped {line}." for line in skipped)
    return Resolution(
        coders=coders,
        commands={k: v for k, v in commands.items() if any(s.backend == k for s in coders)},
        log=log,
        needs_confirmation=[c for c in confirm if any(s.backend == c[0] for s in coders)],
        skipped=skipped,
        default_options=default_options,
    )


def _place(
    specs: list[tuple[CoderSpec, str]], on: Sequence[str], log: list[str]
) -> list[tuple[CoderSpec, str]]:
    """Put every coder without an environment on the --on environments, round-robin; the spread
    takes the place of the first unplaced coder, coders with an environment keep theirs."""
    unplaced = [item for item in specs if item[0].environment is None]
    if not on or not unplaced:
        return specs
    spread = []
    for i in range(max(len(unplaced), len(on))):
        spec, reason = unplaced[i % len(unplaced)]
        spread.append((spec.placed(on[i % len(on)]), f"{reason}; placed on {on[i % len(on)]} by --on"))
    log.append(f"Placed by --on: {', '.join(s.text for s, _ in spread)}.")
    out: dict[CoderSpec, str] = {}
    for item in specs:
        if item[0].environment is not None:
            out.setdefault(*item)
        elif item is unplaced[0]:
            for spec, reason in spread:
                out.setdefault(spec, reason)
    return list(out.items())


# --- assignment ---------------------------------------------------------------------------------

Nature = Literal["docs", "tests"]
DOC_SUFFIXES = frozenset({".md", ".markdown", ".rst", ".txt", ".adoc"})
NATURE_PREFERENCE: dict[Nature, tuple[str, ...]] = {"docs": ("claude", "gemini"), "tests": ("codex",)}


def _is_doc(path: str) -> bool:
    p = PurePosixPath(path.rstrip("/"))
    return p.suffix.lower() in DOC_SUFFIXES or (p.parts[:1] in (("docs",), ("doc",)))


def _is_test(path: str) -> bool:
    p = PurePosixPath(path.rstrip("/"))
    name = p.name.lower()
    return (
        any(part in {"tests", "test", "__tests__"} for part in p.parts)
        or name.startswith("test_")
        or p.stem.endswith("_test")
        or ".test." in name
        or ".spec." in name
    )


def packet_nature(packet: PacketSpec) -> Nature | None:
    """A simple hint: only docs (markdown, rst, txt, or under docs/) or only tests."""
    if packet.files and all(_is_doc(f) for f in packet.files):
        return "docs"
    if packet.files and all(_is_test(f) for f in packet.files):
        return "tests"
    return None


def _override(text: str, coders: Sequence[CoderSpec]) -> CoderSpec | None:
    try:
        want = split_spec(text)
    except InvalidRequest:
        return None
    for spec in coders:
        if spec == want:
            return spec
    for spec in coders:
        if (
            spec.backend == want.backend
            and want.model in (None, spec.model)
            and want.environment in (None, spec.environment)
        ):
            return spec
    return None


CoderLike = CoderSpec | CoderChoice


def as_spec(coder: CoderLike | str) -> CoderSpec:
    """A coder as a spec; a string is only syntax-checked (use `parse_coder_spec` to check its
    environment against the linked ones)."""
    if isinstance(coder, str):
        return split_spec(coder)
    if isinstance(coder, CoderChoice):
        return CoderSpec(backend=coder.backend, model=coder.model, environment=coder.environment)
    return coder


def assign(
    packets: Sequence[PacketSpec],
    coders: Sequence[CoderLike],
    *,
    reviewer_flag: CoderLike | str | None = None,
) -> dict[str, CoderChoice]:
    """A coder per packet: the packet's own `coder` when it is one of the resolved coders, else a
    nature hint (docs-only packets prefer claude then gemini, test-only packets prefer codex, when
    there are several coders), else round-robin over the coders in plan order. `reviewer_flag` only
    adds a note to the reason when a packet's implementer has the reviewer's backend."""
    if not coders:
        raise InvalidRequest("No coders to assign packets to.")
    specs = [as_spec(c) for c in coders]
    reviewer = as_spec(reviewer_flag) if reviewer_flag else None
    out: dict[str, CoderChoice] = {}
    turn = 0
    for packet in packets:
        reason = ""
        chosen: CoderSpec | None = None
        if packet.coder:
            chosen = _override(packet.coder, specs)
            if chosen is not None:
                reason = f"packet override ({packet.coder})"
            else:
                reason = f"packet asks for {packet.coder}, which is not among the resolved coders; "
        nature = packet_nature(packet)
        if chosen is None and nature is not None and len(specs) > 1:
            for backend in NATURE_PREFERENCE[nature]:
                chosen = next((s for s in specs if s.backend == backend), None)
                if chosen is not None:
                    reason += f"nature hint: {nature}-only packet prefers {backend}"
                    break
        if chosen is None:
            chosen = specs[turn % len(specs)]
            reason += f"round-robin (coder {turn % len(specs) + 1} of {len(specs)})"
            turn += 1
        if reviewer is not None and reviewer.backend == chosen.backend:
            reason += "; same backend as --reviewer"
        out[packet.id] = chosen.choice(reason)
    return out


def choose_reviewer(
    impl: CoderChoice,
    coders: Sequence[CoderLike],
    reviewer_flag: CoderLike | str | None,
    *,
    configured: CoderLike | str | None = None,
    available: Mapping[str, bool] | None = None,
) -> CoderChoice:
    """The reviewer of one packet: --reviewer, else the config's `reviewer`, else a backend other than
    the implementer's (one of the run's coders first, then the first runnable of codex, claude,
    gemini), else the implementer's own backend in a fresh thread."""
    if reviewer_flag:
        return as_spec(reviewer_flag).choice("--reviewer")
    if configured:
        return as_spec(configured).choice("reviewer in the project config")
    other = next((as_spec(s) for s in coders if s.backend != impl.backend), None)
    if other is not None:
        return other.choice(f"a different backend from the implementer ({impl.backend}), from the coders")
    runnable = available or {}
    backend = next((b for b in PROBE_ORDER if b != impl.backend and runnable.get(b, False)), None)
    if backend is not None:
        return CoderSpec(backend=backend).choice(
            f"a different backend from the implementer ({impl.backend}): the first runnable here"
        )
    if impl.backend == "script":
        why = (
            "no other backend is installed: peerd's scripted reviewer, in a fresh thread (it approves, or "
            "answers the verdicts the packet's goal scripts in a ```peerd-review block)"
        )
    else:
        why = "no other backend is available: the implementer's backend reviews in a fresh thread"
    return impl.model_copy(update={"reason": why})
