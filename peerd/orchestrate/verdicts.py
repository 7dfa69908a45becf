"""Reading the hops: verification outcomes, the planner's and reviewer's JSON replies, and plan
directories (`load_plan_dir`, the one function here that reads files). The prompts each hop gets
are in `prompts.py` (re-exported here).

Verification is classified by what it did, never by words in its output (a test's own assertion
message may well say "permission denied"):

    passed         exit 0
    timeout        the command ran out of time
    content        it failed  -> back to the same coder once, with the output
    environmental  established by peerd only (`review.verifying`): the check failed, and peerd's
                   own re-run of the same commit passed; or (for a coder's run, `implement.py`)
                   the coder's structured events report that its sandbox declined a step
    empty_diff, coder_error  (set by the engine)  -> a different coder once
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pydantic

from peerd.errors import InvalidRequest
from peerd.orchestrate.models import (
    Classification,
    PacketSpec,
    ReviewVerdict,
    VerificationResult,
    validate_plan,
)
from peerd.orchestrate.prompts import (
    PLAN_SCHEMA,
    TAIL_CHARS,
    implementer_prompt,
    planner_prompt,
    reviewer_prompt,
    scripted_review,
    scripted_reviewer_prompt,
    tail,
)

__all__ = [
    "PLAN_SCHEMA",
    "classify_verification",
    "implementer_prompt",
    "load_plan_dir",
    "parse_plan_reply",
    "parse_review_reply",
    "planner_prompt",
    "reviewer_prompt",
    "scripted_review",
    "scripted_reviewer_prompt",
    "tail",
    "verification_result",
]


def classify_verification(exit_code: int | None, timed_out: bool, output: str = "") -> Classification:
    """The class of one check run on its own: the output is never read for it."""
    if timed_out:
        return "timeout"
    if exit_code == 0:
        return "passed"
    return "content"


def verification_result(
    command: str,
    exit_code: int | None,
    timed_out: bool,
    output: str,
    *,
    limit: int = TAIL_CHARS,
    evidence: str = "",
    seconds: float | None = None,
) -> VerificationResult:
    classification = classify_verification(exit_code, timed_out, output)
    return VerificationResult(
        command=command,
        exit_code=exit_code,
        passed=classification == "passed",
        timed_out=timed_out,
        output_tail=tail(output, limit),
        classification=classification,
        evidence=evidence,
        seconds=seconds,
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
    packets, errors = _packets(found["packets"])
    granted = [p.id for p in packets or [] if p.allow_out_of_scope is not False]
    if granted:
        # Leave to the person: a planner may not let its own packets land outside their files.
        return None, [
            f"Packet {pid!r}: allow_out_of_scope is not the planner's to give; leave it out "
            "(list every file the packet needs in `files`)."
            for pid in granted
        ]
    return packets, errors


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
