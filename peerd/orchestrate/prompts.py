"""The prompts each hop gets (planner, implementer, reviewer), and the scripted reviewer.

peerd's scripted coder (`script`) can review too: when a packet's reviewer is `script`, its prompt
opens with a script that answers the packet's ```peerd-review block (a verdict, or a list of
verdicts, one per review round, the last one repeating) or, without one, approves (the packet
reached review, so its verification passed). The implementer's own ```peerd-script block in the
goal further down is then never replayed by the reviewer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from peerd.orchestrate.models import PacketSpec, ReviewEvidence, VerificationResult

TAIL_CHARS = 4_000
MAX_DIFF_CHARS = 80_000


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


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
        f"Files in scope:\n{_bullets(packet.files)}\nChange only these: a change to any other file is "
        "shown to the reviewer and is not integrated unless the person allowed it.",
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


def out_of_scope_section(out_of_scope: Sequence[str], not_allowed: Sequence[str]) -> str | None:
    """What the reviewer is told about the diff's changes outside the packet's files (None: none)."""
    if not out_of_scope:
        return None
    text = (
        "Out of scope: this diff also changes files outside the packet's files in scope:\n"
        f"{_bullets(out_of_scope)}\nJudge whether these changes belong to this packet's goal."
    )
    if not_allowed:
        text += (
            " Whatever your verdict, peerd will not integrate this packet with changes outside its "
            f"files that the person did not allow ({', '.join(not_allowed)}): an approval holds it back; "
            "ask for changes if they should be reverted."
        )
    else:
        text += " The person allowed changes outside the packet's files for this packet."
    return text


def reviewer_prompt(
    packet: PacketSpec,
    diff: str,
    verification: VerificationResult,
    out_of_scope: Sequence[str] = (),
    not_allowed: Sequence[str] = (),
) -> str:
    shown = diff if len(diff) <= MAX_DIFF_CHARS else diff[:MAX_DIFF_CHARS] + "\n… (diff truncated)"
    status = "passed" if verification.passed else f"failed ({verification.classification})"
    scope = out_of_scope_section(out_of_scope, not_allowed)
    return "\n\n".join(
        [
            "You are the reviewer of one work packet that another coding agent implemented. Do not edit "
            "files. Judge the diff against the packet's goal and constraints.",
            f"Packet {packet.id}\n\nGoal:\n{packet.goal}",
            f"Files in scope:\n{_bullets(packet.files)}",
            *([scope] if scope else []),
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


# --- the scripted reviewer ----------------------------------------------------------------------

_REVIEW_BLOCK = re.compile(r"^```peerd-review[ \t]*\r?\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SCRIPTED_APPROVAL: dict[str, Any] = {
    "verdict": "approve",
    "evidence": [],
    "summary": "Scripted review: the packet's verification passed and its goal scripts no other verdict.",
}


def scripted_review(packet: PacketSpec, round_n: int) -> str:
    """The scripted reviewer's whole reply for review round `round_n` (1-based)."""
    found = _REVIEW_BLOCK.search(packet.goal)
    if found is None:
        return json.dumps(SCRIPTED_APPROVAL)
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return found.group(1).strip()  # as written: read (and refused) like any other reply
    if isinstance(value, list) and value:
        value = value[min(max(round_n, 1), len(value)) - 1]
    return value if isinstance(value, str) else json.dumps(value)


def scripted_reviewer_prompt(
    packet: PacketSpec,
    diff: str,
    verification: VerificationResult,
    round_n: int,
    out_of_scope: Sequence[str] = (),
    not_allowed: Sequence[str] = (),
) -> str:
    """The reviewer prompt for `script`: its own script first (the scripted coder runs the first
    script of its prompt), then the same prompt any reviewer gets."""
    script = {"steps": [{"reply": scripted_review(packet, round_n)}]}
    body = reviewer_prompt(packet, diff, verification, out_of_scope, not_allowed)
    return f"```peerd-script\n{json.dumps(script)}\n```\n\n{body}"
