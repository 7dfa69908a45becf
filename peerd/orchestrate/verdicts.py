"""Reading the hops: verification outcomes, the planner's and reviewer's JSON replies, the prompts
each hop gets, and plan directories (`load_plan_dir`, the one function here that reads files).

Verification is classified so the engine retries the right way, once at most (`retry_action`):

    passed         exit 0
    timeout        the command ran out of time
    environmental  it failed because of where it ran, not what the coder wrote: the output matches
                   one of ENVIRONMENTAL_PATTERNS (permission denied / EACCES, read-only file system,
                   operation not permitted / EPERM, network is unreachable, could not resolve host,
                   temporary failure in name resolution, sandbox, no space left on device), or it
                   never exited on its own  -> re-run it; that run is authoritative
    content        any other failure  -> back to the same coder once, with the output
    empty_diff, coder_error  (set by the engine, not here)  -> a different coder once
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic

from peerd.errors import InvalidRequest
from peerd.orchestrate.models import (
    Classification,
    PacketSpec,
    ReviewEvidence,
    ReviewVerdict,
    VerificationResult,
    validate_plan,
)

TAIL_CHARS = 4_000
MAX_DIFF_CHARS = 80_000
ENVIRONMENTAL_PATTERNS: tuple[str, ...] = (
    r"permission denied",
    r"\beacces\b",
    r"read-only file system",
    r"\berofs\b",
    r"operation not permitted",
    r"\beperm\b",
    r"network is unreachable",
    r"could not resolve host",
    r"temporary failure in name resolution",
    r"\bsandbox(?:ed|ing)?\b",
    r"no space left on device",
    r"\benospc\b",
)
_ENVIRONMENTAL = re.compile("|".join(ENVIRONMENTAL_PATTERNS), re.IGNORECASE)


def environmental_signal(output: str) -> str | None:
    """The first line of the output that shows sandbox, permission, network or disk trouble."""
    match = _ENVIRONMENTAL.search(output)
    if match is None:
        return None
    start = output.rfind("\n", 0, match.start()) + 1
    end = output.find("\n", match.end())
    return output[start : end if end != -1 else len(output)].strip()


def classify_verification(exit_code: int | None, timed_out: bool, output: str) -> Classification:
    if timed_out:
        return "timeout"
    if exit_code == 0:
        return "passed"
    if exit_code is None or environmental_signal(output) is not None:
        return "environmental"
    return "content"


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def verification_result(
    command: str, exit_code: int | None, timed_out: bool, output: str, *, limit: int = TAIL_CHARS
) -> VerificationResult:
    classification = classify_verification(exit_code, timed_out, output)
    return VerificationResult(
        command=command,
        exit_code=exit_code,
        passed=classification == "passed",
        timed_out=timed_out,
        output_tail=tail(output, limit),
        classification=classification,
    )


# --- finding JSON in a reply --------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z]*)[^\n]*\n(.*?)```", re.DOTALL)


def _find_object(text: str, key: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The last fenced JSON block holding `key`, else the last bare top-level object holding it."""
    fenced_errors: list[str] = []
    fenced: list[dict[str, Any]] = []
    for match in _FENCE.finditer(text):
        if match.group(1).lower() not in ("json", "jsonc", ""):
            continue
        try:
            value = json.loads(match.group(2))
        except json.JSONDecodeError as exc:
            if match.group(1):
                fenced_errors.append(f"The ```json block is not valid JSON: {exc}.")
            continue
        if isinstance(value, dict) and key in value:
            fenced.append(value)
    if fenced:
        return fenced[-1], []
    decoder = json.JSONDecoder()
    bare: dict[str, Any] | None = None
    at = text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict) and key in value:
            bare = value
        at = text.find("{", end)
    if bare is not None:
        return bare, []
    return None, fenced_errors or [f"No JSON object with a {key!r} key found in the reply."]


def _problems(exc: pydantic.ValidationError, where: str) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"])
        lines.append(f"{where}{'.' + loc if loc else ''}: {error['msg']}.")
    return lines


def _packets(raw: Any) -> tuple[list[PacketSpec] | None, list[str]]:
    if not isinstance(raw, list):
        return None, ["`packets` must be a list of packet objects."]
    packets: list[PacketSpec] = []
    errors: list[str] = []
    for index, item in enumerate(raw):
        name = item.get("id") if isinstance(item, dict) else None
        where = f"packets[{index}]" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            packets.append(PacketSpec.model_validate(item))
        except pydantic.ValidationError as exc:
            errors.extend(_problems(exc, where))
    if errors:
        return None, errors
    errors = validate_plan(packets)
    return (None, errors) if errors else (packets, [])


def parse_plan_reply(text: str) -> tuple[list[PacketSpec] | None, list[str]]:
    """The plan in a planner's reply, validated; or None and the problems, one line each."""
    found, errors = _find_object(text, "packets")
    if found is None:
        return None, errors
    return _packets(found["packets"])


def parse_review_reply(text: str) -> tuple[ReviewVerdict | None, list[str]]:
    """A reviewer's verdict: approve, reject or request_changes, with evidence for the last two."""
    found, errors = _find_object(text, "verdict")
    if found is None:
        return None, errors
    if isinstance(found.get("verdict"), str):
        found["verdict"] = re.sub(r"[\s-]+", "_", found["verdict"].strip().lower())
    try:
        verdict = ReviewVerdict.model_validate(found)
    except pydantic.ValidationError as exc:
        return None, _problems(exc, "review")
    if verdict.verdict != "approve" and not verdict.evidence:
        return None, [
            f"A {verdict.verdict} verdict needs at least one evidence entry {{file, line, reason}}."
        ]
    return verdict, []


# --- prompts ------------------------------------------------------------------------------------

PLAN_SCHEMA = """{
  "packets": [
    {
      "id": "short-kebab-id",
      "goal": "what this packet must achieve, self-contained",
      "files": ["relative/path.py", "relative/dir/"],
      "constraints": ["rules the coder must follow"],
      "verify": "the exact command that proves it works",
      "depends_on": ["ids of packets that must land first"]
    }
  ]
}"""


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {item}" for item in items) if items else "- (none)"


def planner_prompt(
    task: str, *, verify_default: str | None, workarounds: Sequence[str], errors: Sequence[str] | None
) -> str:
    parts = [
        "You are the planner of an orchestrated coding run. Read the repository as you need, but do not "
        "edit any files: decompose the task "
        "below into work packets that other coding agents will implement, each in its own worktree.",
        f"Task:\n{task}",
        "Rules:\n"
        "- Each packet is independently implementable and verifiable, roughly PR-sized or smaller; "
        "a task that does not decompose is one packet.\n"
        "- `id`: lowercase letters, digits and '-'; unique.\n"
        "- `files`: paths or directories relative to the repository root (no absolute paths, no '..').\n"
        "- `constraints`: project rules the coder would not otherwise see (from AGENTS.md, CLAUDE.md...).\n"
        "- `verify`: the exact command that checks the packet, run from the repository root.\n"
        "- `depends_on`: only ids of this plan; no cycles.",
    ]
    if verify_default:
        parts.append(
            f"The project's full verification command is `{verify_default}`; prefer narrower commands "
            "per packet when they exist."
        )
    if workarounds:
        parts.append(
            f"These sandbox workarounds are added to every packet's constraints:\n{_bullets(workarounds)}"
        )
    parts.append(f"Reply with the plan as JSON only, in one ```json block, in this shape:\n{PLAN_SCHEMA}")
    if errors:
        parts.append(
            f"Your previous plan was rejected:\n{_bullets(errors)}\nReply with a corrected plan in full."
        )
    return "\n\n".join(parts)


def implementer_prompt(
    packet: PacketSpec,
    *,
    workspace_root: str,
    base_commit: str,
    branch: str,
    workarounds: Sequence[str],
    previous_failure: str | None = None,
    review_changes: Sequence[ReviewEvidence] | None = None,
) -> str:
    constraints = [*packet.constraints, *workarounds]
    parts = [
        "You are a delegated implementation agent. An orchestrator assigned you one work packet; it "
        "reviews your diff and decides whether it is accepted.",
        f"Your workspace root is {workspace_root} (branch {branch}, based on commit {base_commit}). "
        f"Make edits only under {workspace_root}; do not touch anything outside it. Stay on branch "
        f"{branch}: do not switch branches, rebase or push. Uncommitted changes are fine.",
        f"Packet {packet.id}\n\nGoal:\n{packet.goal}",
        f"Files in scope:\n{_bullets(packet.files)}",
        f"Constraints:\n{_bullets(constraints)}",
        f"Verification command (run it from the workspace root before you finish):\n{packet.verify}",
        "When you are done, end with a short final report: the files you changed, and the verification "
        "status (the command, and whether it passed or what failed).",
    ]
    if previous_failure:
        parts.append(
            "This is a retry. The previous attempt failed verification with this output; fix the cause:\n"
            f"```\n{tail(previous_failure)}\n```"
        )
    if review_changes:
        lines = [f"{e.file}{f':{e.line}' if e.line else ''}: {e.reason}" for e in review_changes]
        parts.append(f"This is a retry. The reviewer requested these changes:\n{_bullets(lines)}")
    return "\n\n".join(parts)


def reviewer_prompt(packet: PacketSpec, diff: str, verification: VerificationResult) -> str:
    shown = diff if len(diff) <= MAX_DIFF_CHARS else diff[:MAX_DIFF_CHARS] + "\n… (diff truncated)"
    status = "passed" if verification.passed else f"failed ({verification.classification})"
    return "\n\n".join(
        [
            "You are the reviewer of one work packet that another coding agent implemented. Do not edit "
            "files. Judge the diff against the packet's goal and constraints.",
            f"Packet {packet.id}\n\nGoal:\n{packet.goal}",
            f"Files in scope:\n{_bullets(packet.files)}",
            f"Constraints:\n{_bullets(packet.constraints)}",
            f"Verification: `{verification.command}` {status}, exit code {verification.exit_code}.\n"
            f"```\n{verification.output_tail}\n```",
            f"Diff:\n```diff\n{shown}\n```",
            "Answer with JSON only, nothing else:\n"
            '{"verdict": "approve" | "reject" | "request_changes", '
            '"evidence": [{"file": "path", "line": 12, "reason": "what is wrong and why"}], '
            '"summary": "one or two sentences"}\n'
            "The verdict is exactly one of approve, reject, request_changes. request_changes and reject "
            "need at least one evidence entry pointing at a file (and line, when there is one).",
        ]
    )


# --- plan directories ---------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A\+\+\+[ \t]*\n(.*?)\n\+\+\+[ \t]*(?:\n|\Z)(.*)\Z", re.DOTALL)


def _slug(stem: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")


def load_plan_dir(path: Path | str, *, default_verify: str | None) -> tuple[list[PacketSpec], list[str]]:
    """The packets of a plan directory, and notes on what was skipped.

    Either `plan.json` (the planner's JSON shape, `{"packets": [...]}`), or one markdown file per
    packet, in name order, opening with TOML front matter between `+++` lines (`files`, `verify`,
    `constraints`, `depends_on`, `coder`, optional `id` and `goal`); the id defaults to the file name
    (`01-models.md` -> `01-models`), the goal to the markdown body, `verify` to `default_verify`.
    Markdown files without front matter (a README, an overview) are skipped and noted.
    """
    root = Path(path)
    if not root.is_dir():
        raise InvalidRequest(f"--plan {root}: not a directory.")
    plan_json = root / "plan.json"
    if plan_json.is_file():
        try:
            raw = json.loads(plan_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"{plan_json}: cannot read it as JSON: {exc}.") from None
        packets, errors = _packets(raw.get("packets") if isinstance(raw, dict) else raw)
        if packets is None:
            raise InvalidRequest(f"{plan_json}:\n" + "\n".join(errors))
        return packets, []
    items: list[dict[str, Any]] = []
    notes: list[str] = []
    for file in sorted(root.glob("*.md")):
        match = _FRONT_MATTER.match(file.read_text(encoding="utf-8"))
        if match is None:
            notes.append(f"{file.name}: no +++ front matter; not a packet.")
            continue
        try:
            meta = tomllib.loads(match.group(1))
        except tomllib.TOMLDecodeError as exc:
            raise InvalidRequest(f"{file}: the front matter is not valid TOML: {exc}.") from None
        meta.setdefault("id", _slug(file.stem))
        meta.setdefault("goal", match.group(2).strip())
        if default_verify:
            meta.setdefault("verify", default_verify)
        items.append(meta)
    if not items:
        raise InvalidRequest(f"--plan {root}: no plan.json and no packet files (*.md with +++ front matter).")
    packets, errors = _packets(items)
    if packets is None:
        raise InvalidRequest(f"--plan {root}:\n" + "\n".join(errors))
    return packets, notes
