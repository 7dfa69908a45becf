"""The report of an orchestration, and its live progress lines: pure functions of the run as the API
shows it (`Orchestrations.info`), standard library only (the CLI imports this at command time, the
engine uses it as a pull request's body).

The report says everything the receipts hold: per packet, who implemented and who reviewed
(backend, model, environment) and why; every attempt with its hop, class, evidence and times; the
paths recovered from the user's checkout, the ones left there, and the user's own ones never
taken; the verification output verbatim when it failed (and the first run of a re-run); each
review round's verdict, evidence and times; the integration and its full check, and the delivery.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from peerd.core.usage import Usage, describe
from peerd.orchestrate import untilreport
from peerd.orchestrate.states import TERMINAL_RUN

TERMINAL = tuple(sorted(TERMINAL_RUN))
Info = Mapping[str, Any]
# The end states a person may not guess from their name, said beside it in the report's header.
END_WORDS = {
    "not_integrated": "nothing was integrated",
    "check_failed": "the full check failed on the integrated result",
}
# A coder whose environment is `auto` is placed when its hop starts (placing.py): until then it
# runs nowhere, and the report says so rather than "on auto".
AUTO = "auto"
# The progress's key for the planner (a packet id never starts with a space).
PLANNER = " planner"
# How `OrchestrationContext.outcome` quotes a run's notice item among its problems.
NOTICE = "notice: "


def clock(ts: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(ts))) if isinstance(ts, int | float) else "--:--:--"


def span(start: Any, end: Any) -> str:
    if not isinstance(start, int | float) or not isinstance(end, int | float):
        return ""
    return f"{clock(start)} -> {clock(end)} ({max(0.0, end - start):.1f} s)"


def who(choice: Mapping[str, Any] | None) -> str:
    """`spec (model M|default model, here|on ENV)`: where the hop ran (`auto` is no place: a coder
    not placed yet is `placed by auto when its hop starts`)."""
    if not choice:
        return "-"
    model = f"model {choice['model']}" if choice.get("model") else "its default model"
    spec = str(choice.get("spec") or choice.get("backend"))
    if choice.get("environment") == AUTO:
        return f"{spec.removeprefix(AUTO + '/')} ({model}, placed by auto when its hop starts)"
    where = f"on {choice['environment']}" if choice.get("environment") else "here"
    return f"{spec} ({model}, {where})"


def receipts(info: Info, kind: str, packet: str | None = None) -> list[dict[str, Any]]:
    return [r["body"] for r in info["receipts"] if r["kind"] == kind and r["packetId"] == packet]


def last(info: Info, kind: str, packet: str | None = None) -> dict[str, Any] | None:
    found = receipts(info, kind, packet)
    return found[-1] if found else None


def succeeded(info: Info) -> bool:
    if info["status"] != "completed":
        return False
    if any(p["state"] != "integrated" for p in info["packets"]):
        return False
    verification = (last(info, "integration") or {}).get("verification")
    return verification is None or bool(verification.get("passed"))


def spent(usage: Any) -> str:
    """A receipt's or a sum's usage for people; null is "not reported" (unknown, not zero)."""
    return describe(Usage.from_json(usage)) if isinstance(usage, Mapping) else "not reported"


def limits(budget: Any) -> str:
    if not isinstance(budget, Mapping):
        return "none"
    parts = [f"{budget['tokens']:,} tokens" if budget.get("tokens") is not None else ""]
    parts.append(f"${budget['usd']:,.4f}" if budget.get("usd") is not None else "")
    parts.append(f"{budget['seconds']:,g} seconds" if budget.get("seconds") is not None else "")
    return ", ".join(p for p in parts if p) or "none"


# Why a change in the user's checkout was left there (`CheckoutChange.reason`), for people.
LEFT_WHY = {
    "confined": "only confined coders ran: none could write there",
    "no_coder_write": "no run of the coder names it",
    "unverified": "the coder's run names it but not what it wrote",
    "content_differs": "not what the coder wrote",
}


def _indent(text: str, pad: str) -> list[str]:
    return [pad + line if line else "" for line in text.rstrip("\n").splitlines()] or [pad + "(no output)"]


def _verification(v: Mapping[str, Any], pad: str) -> list[str]:
    seconds = f", {v['seconds']:.1f} s" if isinstance(v.get("seconds"), int | float) else ""
    head = f"`{v['command']}`"
    if v.get("passed"):
        lines = [f"{pad}verification passed: {head} (exit 0{seconds})"]
    else:
        exit_text = "no exit" if v.get("exitCode") is None else f"exit {v['exitCode']}"
        lines = [f"{pad}verification {v.get('classification')}: {head} ({exit_text}{seconds})"]
    if v.get("evidence"):
        lines.append(f"{pad}  evidence: {v['evidence']}")
    first = v.get("firstRun")
    if first:
        exit_text = "no exit" if first.get("exitCode") is None else f"exit {first['exitCode']}"
        if first.get("outputTail") == v.get("outputTail") and not v.get("passed"):
            lines.append(f"{pad}  first run ({first.get('classification')}, {exit_text}): the same output")
        else:
            lines.append(f"{pad}  first run ({first.get('classification')}, {exit_text}), its output:")
            lines += _indent(first.get("outputTail") or "", pad + "    ")
    if not v.get("passed") and v.get("classification") in ("content", "timeout", "environmental"):
        lines.append(f"{pad}  output:")
        lines += _indent(v.get("outputTail") or "", pad + "    ")
    return lines


def _bullet(line: str, pad: str) -> list[str]:
    """`- line`, a line of several lines indented under its first."""
    first, *rest = line.rstrip("\n").split("\n") or [""]
    return [f"{pad}- {first}", *(f"{pad}  {more}" if more else "" for more in rest)]


def _unquoted(text: str, problems: Sequence[str]) -> str:
    """`text` (a hop's outcome, a park's reason: `steps.quoted`) without the problem lines the
    report shows elsewhere: each said once."""
    for problem in problems:
        text = text.replace(f"- {problem}\n", "").replace(f"\n- {problem}", "")
    return re.sub(r"(^|\n)Its run reported:(?=\n[^-]|$)", "", text).strip("\n")


def _shown_in(failure: str, printed: Sequence[tuple[str, str]]) -> str:
    """A park's reason with the outputs the attempts above printed said by reference, not again
    (`printed`: each attempt's name and output, in order; the latest of equal ones is named)."""
    order = {id(p): n for n, p in enumerate(printed)}
    for name, output in sorted(printed, key=lambda p: (-len(p[1]), -order[id(p)])):
        block = output.lstrip("…").strip()
        if block and block in failure:
            failure = failure.replace(block, f"as {name} above")
    return failure


def _attempt(
    r: Mapping[str, Any], pad: str, shown: set[str], printed: list[tuple[str, str]] | None = None
) -> list[str]:
    hop = f" ({r['hop']})" if r.get("hop") and r.get("hop") != "implement" else ""
    times = span(r.get("startedAt"), r.get("endedAt"))
    lines = [f"{pad}attempt {r['attempt']}{hop} by {who(r.get('coder'))}" + (f", {times}" if times else "")]
    inner = pad + "  "
    lines.append(f"{inner}usage: {spent(r.get('usage'))}")
    if r.get("filesChanged"):
        lines.append(f"{inner}changed: {', '.join(r['filesChanged'])}")
    if r.get("outOfScope"):
        lines.append(f"{inner}outside the packet's files: {', '.join(r['outOfScope'])}")
    if r.get("recoveredPaths"):
        lines.append(
            f"{inner}recovered from your checkout (the coder's own edits, proven by its run): "
            f"{', '.join(r['recoveredPaths'])}"
        )
    if r.get("notRecovered"):
        lines.append(
            f"{inner}the coder's edits left in your checkout: {', '.join(r['notRecovered'])}"
            f" ({r.get('recoveryProblem') or 'not moved'})"
        )
    if r.get("leftPaths"):
        reasons = {ch.get("path"): ch.get("reason") for ch in r.get("checkoutChanges") or []}
        left = [
            f"{path} ({LEFT_WHY.get(str(reasons.get(path)), 'not the coder')})" for path in r["leftPaths"]
        ]
        lines.append(f"{inner}changed in your checkout during the run, left as it is: {', '.join(left)}")
    if r.get("strayPaths"):
        lines.append(
            f"{inner}changed in your checkout during the run, outside this packet's files, left as it "
            f"is: {', '.join(r['strayPaths'])}"
        )
    if r.get("userPaths"):
        lines.append(
            f"{inner}your own files here, changed during the run, never taken: {', '.join(r['userPaths'])}"
        )
    problems = list(r.get("coderErrors") or [])
    # A line an earlier attempt of this packet reported is not repeated; a notice (the sandbox's)
    # is said once, at the top of the report.
    reported = [line for line in problems if line not in shown and not line.startswith(NOTICE)]
    again = [line for line in problems if line in shown and not line.startswith(NOTICE)]
    shown.update(reported)
    if reported:
        lines.append(f"{inner}the coder's run reported:")
        for line in reported:
            lines += _bullet(line, inner + "  ")
    if again:
        lines.append(f"{inner}the coder's run reported again {len(again)} problem(s) shown above")
    verification = r.get("verification") or {}
    attempt = f"attempt {r.get('attempt') or 1}{hop}"
    if verification.get("classification") in (
        "empty_diff",
        "coder_error",
        "environmental",
        "budget",
        "timeout",
    ) and not r.get("commit"):
        raw = str(verification.get("outputTail") or "")
        first, _, rest = _unquoted(raw, problems).partition("\n")
        lines.append(f"{inner}outcome {verification['classification']}: {first}")
        if verification.get("evidence") and verification["classification"] != "timeout":
            lines.append(f"{inner}  evidence: {verification['evidence']}")
        if rest.strip():
            lines += _indent(rest, inner + "  ")
        if printed is not None:
            printed.append((attempt, raw))
    elif verification:
        lines += _verification(verification, inner)
        if printed is not None and not verification.get("passed"):
            printed.append((attempt, str(verification.get("outputTail") or "")))
    return lines


def _review(r: Mapping[str, Any], pad: str) -> list[str]:
    times = span(r.get("startedAt"), r.get("endedAt"))
    lines = [
        f"{pad}review round {r.get('round', 1)} by {who(r.get('reviewer'))}"
        + (f", {times}" if times else ""),
        f"{pad}  verdict {r['verdict']}: {r.get('summary', '')}",
        f"{pad}  usage: {spent(r.get('usage'))}",
    ]
    if r.get("outOfScope"):
        lines.append(f"{pad}  shown outside the packet's files: {', '.join(r['outOfScope'])}")
    if r.get("held") == "out_of_scope":
        lines.append(
            f"{pad}  held: out_of_scope - not integrated (--allow-out-of-scope, or allow_out_of_scope in "
            "your plan, lets it in)"
        )
    for e in r.get("evidence") or []:
        lines.append(f"{pad}    - {e['file']}{':' + str(e['line']) if e.get('line') else ''}: {e['reason']}")
    return lines


def _packet(info: Info, packet: Mapping[str, Any]) -> list[str]:
    pid = packet["id"]
    lines = [f"{pid}: {packet['state']}"]
    coder = packet.get("coder") or {}
    lines.append(f"  implementer: {who(coder)}" + (f" - {coder['reason']}" if coder.get("reason") else ""))
    reviewer = packet.get("reviewer") or {}
    if reviewer:
        lines.append(
            f"  reviewer: {who(reviewer)}" + (f" - {reviewer['reason']}" if reviewer.get("reason") else "")
        )
    lines.append(f"  usage: {spent(packet.get('usage'))} (every run of this packet)")
    if info.get("packetBudget"):
        lines.append(f"  budget: {limits(info['packetBudget'])}")
    events = [(r, "impl") for r in receipts(info, "implementation", pid)] + [
        (r, "review") for r in receipts(info, "review", pid)
    ]
    events.sort(key=lambda e: e[0].get("endedAt") or 0)
    shown: set[str] = set()
    printed: list[tuple[str, str]] = []  # the outputs the attempts printed: a park's reason refers to them
    problems: list[str] = []
    for body, kind in events:
        if kind == "impl":
            lines += _attempt(body, "  ", shown, printed)
            problems += body.get("coderErrors") or []
        else:
            lines += _review(body, "  ")
    if packet["state"] in ("parked", "failed", "cancelled") and packet.get("failure"):
        failure = _unquoted(_shown_in(str(packet["failure"]), printed), problems)
        if "\n" in failure:
            lines.append(f"  {packet['state']}:")
            lines += _indent(failure, "    ")
        else:
            lines.append(f"  {packet['state']}: {failure}")
    return lines


def _notices(info: Info) -> list[str]:
    """The notices of the coders' runs (peerd's sandbox says what a confined run sees, at every
    run): each one once for the whole run, in the order first met."""
    found: dict[str, None] = {}
    for body in receipts_all(info, "implementation"):
        for line in body.get("coderErrors") or []:
            if line.startswith(NOTICE):
                found.setdefault(line.removeprefix(NOTICE), None)
    if not found:
        return []
    return ["notices of the coders' runs (each said once, not at every attempt):"] + [
        line for notice in found for line in _bullet(notice, "  ")
    ]


def receipts_all(info: Info, kind: str) -> list[dict[str, Any]]:
    return [r["body"] for r in info["receipts"] if r["kind"] == kind]


def _full_check(integration: Mapping[str, Any], verify_given: bool) -> list[str]:
    verification = integration.get("verification")
    if verification is None:
        if not integration.get("merged"):
            return [
                "full check: not run (nothing was merged)"
                if verify_given
                else "full check: not run (no --verify)"
            ]
        return ["full check: not run (no --verify, and no `verify` in the project config)"]
    if verification.get("passed"):
        return [f"full check: passed (`{verification['command']}`)"]
    head = f"full check: FAILED (exit {verification.get('exitCode')}, `{verification['command']}`):"
    return [head, *_indent(verification.get("outputTail") or "", "  ")]


def _delivery(d: Mapping[str, Any]) -> list[str]:
    lines = []
    if d.get("remote") or d.get("pushProblem"):
        if d.get("pushed"):
            lines.append(f"pushed: {d['branch']} to {d['remote']}")
        else:
            lines.append(f"not pushed: {d.get('pushProblem') or 'not asked'}")
    if d.get("prUrl"):
        lines.append(f"pull request: {d['prUrl']}" + (" (draft)" if d.get("prDraft") else ""))
    elif d.get("prProblem"):
        lines.append(f"no pull request: {d['prProblem']}")
    return lines


def render(info: Info) -> str:
    """The whole report, as text (also valid as the body of a pull request, in a fence)."""
    words = f" ({END_WORDS[info['status']]})" if info["status"] in END_WORDS else ""
    out = [
        f"Orchestration {info['id']}: {info['status']}{words}"
        + (f" - {info['reason']}" if info.get("reason") else "")
    ]
    out.append(f"task: {(info.get('task') or '(from a plan directory)').strip()}")
    base = f"base: {str(info.get('baseCommit'))[:12]}"
    if info.get("includeDirty"):
        base += " (your working state when the run started, --include-dirty)"
    out.append(base)
    if info.get("allowOutOfScope"):
        out.append("changes outside a packet's files: allowed (--allow-out-of-scope)")
    out.append(f"usage: {spent(info.get('usage'))} (every run: the planner's and each packet's)")
    if (plan := last(info, "plan")) and plan.get("source") == "planner":
        usage = spent(plan.get("usage") or info.get("plannerUsage"))
        out.append(f"  planner: {who(plan.get('planner'))}, usage {usage}")
    if info.get("budget") or info.get("packetBudget"):
        out.append(
            f"budget: {limits(info.get('budget'))} for the run, {limits(info.get('packetBudget'))} per packet"
        )
    out += _notices(info)
    for line in (last(info, "resolution") or {}).get("log", []):
        out.append(f"  choice: {line}")
    for line in (last(info, "resolution") or {}).get("warnings", []):
        out.append(f"  warning: {line}")
    warned = set((last(info, "resolution") or {}).get("warnings", []))
    for line in (last(info, "plan") or {}).get("notes", []):
        if line not in warned:
            out.append(f"  plan: {line}")
    rows = []
    for packet in info["packets"]:
        impl = last(info, "implementation", packet["id"]) or {}
        review = last(info, "review", packet["id"]) or {}
        v = impl.get("verification") or {}
        check = "passed" if v.get("passed") else (v.get("classification") or "-")
        used = packet.get("usage")
        tokens = f"{used['totalTokens']:,}" if isinstance(used, Mapping) else "-"
        rows.append(
            [
                packet["id"],
                packet["state"],
                who(packet.get("coder")),
                check,
                review.get("verdict", "-"),
                tokens,
            ]
        )
    if rows:
        out += ["", *_table(["packet", "outcome", "implementer", "verification", "review", "tokens"], rows)]
    for packet in info["packets"]:
        out += ["", *_packet(info, packet)]
    integration = last(info, "integration")
    if integration is not None:
        times = span(integration.get("startedAt"), integration.get("endedAt"))
        merged = ", ".join(integration["merged"]) or "nothing"
        out += [
            "",
            f"integration branch {integration['branch']}: merged {merged}" + (f", {times}" if times else ""),
        ]
        out += _full_check(integration, bool(info.get("verify")))
        out.append("integration usage: none (peerd's own git and the full check; no model)")
    delivery = last(info, "delivery")
    if delivery is not None:
        out += _delivery(delivery)
    out += untilreport.section(info)  # --until: the pull request's wait, or its final state
    return "\n".join(out) + "\n"


def pr_body(info: Info) -> str:
    text = render(info)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"Made by `peerd orchestrate` (run {info['id']}).\n\n{fence}text\n{text}{fence}\n"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*map(str, row)).rstrip() for row in rows)]


# --- live progress ------------------------------------------------------------------------------


def progress(info: Info, seen: dict[str, Any]) -> list[str]:
    """Lines for what changed since `seen` (updated in place): the run's status, and per packet its
    state and hop, attempt and coder (a re-dispatch), retries and reviewer, each with its time."""
    lines: list[str] = []
    if seen.get("") != info["status"]:
        seen[""] = info["status"]
        lines.append(f"{clock(info.get('updatedAt'))}  run {info['status']}")
    planner = next(
        (
            r["body"]["coder"]
            for r in info.get("receipts") or []
            if r["kind"] == "thread" and r["body"].get("role") == "planner" and r["body"].get("coder")
        ),
        None,
    )
    if planner is not None and seen.get(PLANNER) != planner.get("spec"):
        seen[PLANNER] = planner.get("spec")  # where the planner ran (placed, with --on auto)
        lines.append(f"{clock(info.get('updatedAt'))}  planner {who(planner)}")
    for packet in info["packets"]:
        coder = packet.get("coder") or {}
        reviewer = packet.get("reviewer") or {}
        retries = {
            k: v
            for k, v in (packet.get("retries") or {}).items()
            if k in ("content", "environmental", "redispatch", "changes") and v
        }
        key = (
            packet["state"],
            packet.get("hop"),
            packet.get("attempt"),
            coder.get("spec"),
            tuple(sorted(retries.items())),
            (reviewer.get("spec"), reviewer.get("environment")),  # placed (--on auto) as it starts
            (packet.get("awaitingApproval") or {}).get("approvalId"),
        )
        if seen.get(packet["id"]) == key:
            continue
        previous = seen.get(packet["id"])
        seen[packet["id"]] = key
        state = packet["state"] + (f" ({packet['hop']})" if packet.get("hop") in ("fix", "changes") else "")
        line = f"{clock(packet.get('updatedAt'))}  {packet['id']:<16} {state:<24}"
        if packet["state"] == "reviewing":
            line += f" reviewer {who(reviewer)}"
        elif packet["state"] not in ("queued",):
            line += f" attempt {packet.get('attempt') or 1}, {who(coder)}"
        if previous is not None and previous[2] and (packet.get("attempt") or 0) > previous[2]:
            line += f" - re-dispatched: {coder.get('reason', '')}"
        if retries:
            line += "  [retries: " + ", ".join(f"{k} {v}/1" for k, v in sorted(retries.items())) + "]"
        if waiting := packet.get("awaitingApproval"):
            line += f" - waiting for your approval: {waiting['summary']} (peerd approval show {waiting['approvalId']})"
        lines.append(line.rstrip())
    lines += untilreport.progress(info, seen)  # --until: the wait on the pull request
    return lines
