"""The pure core of `peerd orchestrate`: specs, plans, coder resolution and assignment, verdicts, prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.errors import ConfigInvalid, InvalidRequest
from peerd.orchestrate.coders import (
    CoderSpec,
    OrchestrateConfig,
    assign,
    check_project_config,
    choose_reviewer,
    load_project_config,
    packet_nature,
    parse_coder_spec,
    resolve_coders,
)
from peerd.orchestrate.models import (
    CoderChoice,
    PacketSpec,
    ReviewEvidence,
    VerificationResult,
    dependency_order,
    validate_plan,
)
from peerd.orchestrate.states import can_transition
from peerd.orchestrate.verdicts import (
    classify_verification,
    implementer_prompt,
    load_plan_dir,
    parse_plan_reply,
    parse_review_reply,
    planner_prompt,
    reviewer_prompt,
    verification_result,
)

ENVS = ("box", "laptop")
ALL_AVAILABLE = {"codex": True, "claude": True, "gemini": True, "script": True}


def packet(pid: str, **kw: Any) -> PacketSpec:
    data: dict[str, Any] = {"id": pid, "goal": f"do {pid}", "files": ["peerd/x.py"], "verify": "pytest"}
    data.update(kw)
    return PacketSpec.model_validate(data)


# --- coder specs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "backend", "model", "environment", "canonical"),
    [
        ("codex", "codex", None, None, "codex"),
        ("  claude:opus ", "claude", "opus", None, "claude:opus"),
        ("box/codex:gpt-5.5", "codex", "gpt-5.5", "box", "box/codex:gpt-5.5"),
        (
            "gemini:Gemini 3.1 Pro (High)",
            "gemini",
            "Gemini 3.1 Pro (High)",
            None,
            "gemini:Gemini 3.1 Pro (High)",
        ),
        ("laptop/gemini:Gemini 3.1 Pro (High)", "gemini", "Gemini 3.1 Pro (High)", "laptop", None),
        ("codex:openai/gpt:5:mini", "codex", "openai/gpt:5:mini", None, "codex:openai/gpt:5:mini"),
        ("my-coder", "my-coder", None, None, "my-coder"),
    ],
)
def test_coder_specs_parse(
    text: str, backend: str, model: str | None, environment: str | None, canonical: str | None
) -> None:
    spec = parse_coder_spec(text, known_environments=ENVS)
    assert (spec.backend, spec.model, spec.environment) == (backend, model, environment)
    if canonical:
        assert spec.text == canonical
    choice = spec.choice("because")
    assert (choice.spec, choice.backend, choice.model, choice.reason) == (
        spec.text,
        backend,
        model,
        "because",
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "it is empty"),
        ("codex:", "nothing follows ':'"),
        ("gemini Gemini 3", "must be quoted"),
        ("/codex", "environment before '/'"),
        ("a/b/codex", "environment before '/'"),
        ("nowhere/codex", "no linked environment named 'nowhere'"),
        ("co dex", "not a backend name"),
    ],
)
def test_bad_coder_specs_say_how_to_write_one(text: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_coder_spec(text, known_environments=ENVS)
    assert fragment in caught.value.message
    assert caught.value.code == "invalid_request"


# --- plans --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("packets", "fragment"),
    [
        ([packet("a"), packet("a")], "'a' is used twice"),
        ([packet("a", depends_on=["zz"])], "depends on 'zz', which is not a packet"),
        ([packet("a", depends_on=["a"])], "depends on itself"),
        (
            [packet("a", depends_on=["c"]), packet("b", depends_on=["a"]), packet("c", depends_on=["b"])],
            "Dependency cycle: a -> c -> b -> a.",
        ),
        ([packet("a", files=["/etc/passwd"])], "is absolute"),
        ([packet("a", files=["~/notes.md"])], "is absolute"),
        ([packet("a", files=["src/../../secret"])], "contains '..'"),
        ([packet("a", files=["C:\\x.py"])], "relative to the repository root"),
        ([packet("a", goal="   ")], "the goal is empty"),
        ([packet("a", verify=" ")], "verification command is empty"),
        ([], "no packets"),
    ],
)
def test_plan_validation(packets: list[PacketSpec], fragment: str) -> None:
    errors = validate_plan(packets)
    assert any(fragment in e for e in errors), errors


def test_a_sound_plan_has_no_errors_and_an_order() -> None:
    plan = [packet("b", depends_on=["a"]), packet("a"), packet("c", files=["docs/", "peerd/y.py"])]
    assert validate_plan(plan) == []
    assert dependency_order(plan) == ["a", "b", "c"]


def test_packet_schema_is_strict_and_camel_case_on_the_wire() -> None:
    spec = PacketSpec.model_validate(
        {"id": "a", "goal": "g", "files": ["f"], "verify": "v", "dependsOn": ["b"]}
    )
    assert spec.depends_on == ["b"]
    assert spec.wire()["dependsOn"] == ["b"]
    bad: dict[str, Any]
    for bad in ({"id": "A_B"}, {"files": []}, {"extra": 1}):
        with pytest.raises(ValueError, match="validation error"):
            PacketSpec.model_validate({"id": "a", "goal": "g", "files": ["f"], "verify": "v", **bad})


def test_state_transitions() -> None:
    assert can_transition("queued", "implementing")
    assert can_transition("reviewing", "implementing"), "request_changes goes back to the coder"
    assert can_transition("verifying", "implementing"), "a content failure goes back to the coder"
    assert can_transition("approved", "parked"), "a merge conflict parks an approved packet"
    assert not can_transition("integrated", "implementing")
    assert not can_transition("queued", "approved"), "no hop is skipped"
    assert not can_transition("parked", "approved")


# --- the project's config -----------------------------------------------------------------------


def test_project_config_missing_is_empty_and_keys_are_strict(tmp_path: Path) -> None:
    assert load_project_config(tmp_path) == OrchestrateConfig()
    (tmp_path / ".peerd").mkdir()
    path = tmp_path / ".peerd" / "orchestrate.toml"
    path.write_text(
        'default_coder = "codex"\nverify = "make check"\nsandbox_workarounds = ["w1"]\n'
        'coders = ["codex", "claude:opus", { name = "my-coder", command = "my-coder {SPEC}" }]\n'
    )
    config = load_project_config(tmp_path)
    assert (config.default_coder, config.verify, config.sandbox_workarounds) == (
        "codex",
        "make check",
        ["w1"],
    )
    assert config.custom == {"my-coder": "my-coder {SPEC}"}
    assert config.source == str(path)
    path.write_text('default_coder = "codex"\ndefualt_reviewer = "claude"\n')
    with pytest.raises(ConfigInvalid, match=r"orchestrate\.toml: defualt_reviewer: Extra inputs"):
        load_project_config(tmp_path)
    path.write_text("coders = [")
    with pytest.raises(ConfigInvalid, match="not valid TOML"):
        load_project_config(tmp_path)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"default_coder": "codex:"}, "nothing follows"),
        ({"coders": [{"name": "codex", "command": "x"}]}, "cannot name a custom command"),
        ({"coders": [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]}, "defined twice"),
        ({"coders": [{"name": "a"}]}, "command"),
    ],
)
def test_project_config_problems_name_the_file(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        check_project_config(raw, "/p/.peerd/orchestrate.toml")
    assert caught.value.message.startswith("/p/.peerd/orchestrate.toml: ")
    assert fragment in caught.value.message


# --- resolution ---------------------------------------------------------------------------------


def resolve(
    flags: list[str] | None = None,
    config: dict[str, Any] | None = None,
    available: dict[str, bool] | None = None,
    **kw: Any,
) -> Any:
    options: dict[str, Any] = {
        "interactive": False,
        "allow_commands": [],
        "custom_commands": {},
        "approved": [],
        "on": [],
        "known_environments": ENVS,
    }
    options.update(kw)
    cfg = check_project_config(config or {}, "proj/.peerd/orchestrate.toml")
    return resolve_coders(flags or [], cfg, ALL_AVAILABLE if available is None else available, **options)


def specs(resolution: Any) -> list[str]:
    return [c.spec for c in resolution.coders]


def test_flags_override_the_config_default() -> None:
    got = resolve(["claude:opus", "box/codex"], {"default_coder": "gemini"})
    assert specs(got) == ["claude:opus", "box/codex"]
    assert all(c.reason == "--coder" for c in got.coders)


def test_config_default_is_used_without_flags() -> None:
    got = resolve([], {"default_coder": "gemini"})
    assert specs(got) == ["gemini"]
    assert "default_coder in proj/.peerd/orchestrate.toml" in got.coders[0].reason


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ({"codex": True, "claude": True, "gemini": True}, "codex"),
        ({"codex": False, "claude": True, "gemini": True}, "claude"),
        ({"codex": False, "claude": False, "gemini": True, "script": True}, "gemini"),
    ],
)
def test_non_interactive_fallback_follows_the_probe_order(available: dict[str, bool], expected: str) -> None:
    got = resolve([], {}, available)
    assert specs(got) == [expected]
    assert any("No --coder and no default_coder" in line for line in got.log)
    assert any(line.startswith(f"Falling back to {expected}") for line in got.log)
    assert got.default_options == []


def test_script_is_a_fallback_only_when_configured() -> None:
    none = {"codex": False, "claude": False, "gemini": False, "script": True}
    with pytest.raises(InvalidRequest, match="No coder can run: tried codex, claude, gemini;"):
        resolve([], {}, none)
    assert specs(resolve([], {"coders": ["script"]}, none)) == ["script"]


def test_interactive_without_a_default_offers_options() -> None:
    got = resolve([], {}, {"codex": False, "claude": True, "gemini": True}, interactive=True)
    assert got.default_options == ["claude", "gemini"]
    assert specs(got) == ["claude"]


def test_unknown_coders_are_skipped_non_interactively_and_stop_an_interactive_run() -> None:
    got = resolve(["nosuch", "claude"])
    assert specs(got) == ["claude"]
    assert got.skipped and got.skipped[0].startswith("nosuch: 'nosuch' is neither a peerd provider")
    assert any(line.startswith("Skipped nosuch") for line in got.log)
    with pytest.raises(InvalidRequest, match="Coder nosuch: 'nosuch' is neither"):
        resolve(["nosuch"], interactive=True)


def test_unavailable_flagged_coder_is_skipped_then_fallback_logged() -> None:
    got = resolve(["gemini"], {}, {"codex": True, "claude": False, "gemini": False})
    assert specs(got) == ["codex"]
    assert any("gemini: not runnable here" in s for s in got.skipped)


CUSTOM = {"coders": [{"name": "my-coder", "command": "my-coder run {SPEC}"}]}


def test_custom_command_skipped_without_allow_command() -> None:
    got = resolve(["my-coder"], CUSTOM)
    assert specs(got) == ["codex"], "falls back"
    assert any("`my-coder run {SPEC}`" in s and "--allow-command my-coder" in s for s in got.skipped)
    assert any("`my-coder run {SPEC}`" in line for line in got.log), "the exact command is in the log"


def test_custom_command_allowed_or_approved() -> None:
    allowed = resolve(["my-coder"], CUSTOM, allow_commands=["my-coder"])
    assert specs(allowed) == ["my-coder"]
    assert allowed.commands == {"my-coder": "my-coder run {SPEC}"}
    assert any("allowed by --allow-command" in line for line in allowed.log)
    approved = resolve(["my-coder"], CUSTOM, approved=["my-coder"])
    assert specs(approved) == ["my-coder"] and approved.needs_confirmation == []


def test_custom_command_needs_confirmation_when_interactive() -> None:
    got = resolve(["my-coder"], CUSTOM, interactive=True)
    assert specs(got) == ["my-coder"]
    assert got.needs_confirmation == [("my-coder", "my-coder run {SPEC}")]


def test_custom_commands_of_peerd_config_must_be_listed_for_non_interactive_runs() -> None:
    peerd_custom = {"cao": "scripts/cao-coder.sh {SPEC} {WORKTREE}"}
    got = resolve(["cao"], {}, custom_commands=peerd_custom, allow_commands=["cao"])
    assert specs(got) == ["codex"]
    assert any("not in `coders`" in s for s in got.skipped)
    listed = resolve(["cao"], {"coders": ["cao"]}, custom_commands=peerd_custom, allow_commands=["cao"])
    assert specs(listed) == ["cao"]
    clash = {"coders": [{"name": "cao", "command": "other"}]}
    got = resolve(["cao"], clash, custom_commands=peerd_custom, allow_commands=["cao"])
    assert any("make them agree" in s for s in got.skipped)


@pytest.mark.parametrize(
    ("flags", "on", "expected"),
    [
        (["codex"], ["box"], ["box/codex"]),
        (["codex", "claude"], ["box"], ["box/codex", "box/claude"]),
        (["codex"], ["box", "laptop"], ["box/codex", "laptop/codex"]),
        (["codex", "claude", "gemini"], ["box", "laptop"], ["box/codex", "laptop/claude", "box/gemini"]),
        (["laptop/gemini", "codex"], ["box"], ["laptop/gemini", "box/codex"]),
    ],
)
def test_on_places_unplaced_coders_round_robin(flags: list[str], on: list[str], expected: list[str]) -> None:
    got = resolve(flags, {}, {"codex": False, "claude": False, "gemini": False}, on=on)
    assert specs(got) == expected, "availability here does not matter for placed coders"
    assert any(line.startswith("Placed by --on") for line in got.log)


def test_on_an_unknown_environment_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="--on mars: no linked environment"):
        resolve(["codex"], on=["mars"])


def test_nothing_left_says_what_was_tried() -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve(["claude", "nosuch"], {}, {"codex": False, "claude": False, "gemini": False})
    message = caught.value.message
    assert "tried claude, nosuch, codex, claude, gemini" in message
    assert "claude: not runnable here" in message and "nosuch" in message


# --- assignment ---------------------------------------------------------------------------------

CODEX, CLAUDE = CoderSpec(backend="codex"), CoderSpec(backend="claude", model="opus")


def test_round_robin_over_two_coders_across_three_packets() -> None:
    plan = [packet("a"), packet("b"), packet("c")]
    got = assign(plan, [CODEX, CLAUDE])
    assert [got[p].spec for p in "abc"] == ["codex", "claude:opus", "codex"]
    assert got["b"].reason == "round-robin (coder 2 of 2)"


def test_assignment_accepts_the_resolutions_choices() -> None:
    choices = [CODEX.choice("--coder"), CLAUDE.choice("--coder")]
    got = assign([packet("a"), packet("b")], choices, reviewer_flag="claude")
    assert [got["a"].spec, got["b"].spec] == ["codex", "claude:opus"]
    assert got["b"].reason.endswith("; same backend as --reviewer")


@pytest.mark.parametrize(
    ("override", "expected", "reason"),
    [
        ("claude", "claude:opus", "packet override (claude)"),
        ("claude:opus", "claude:opus", "packet override (claude:opus)"),
        ("gemini", "codex", "packet asks for gemini, which is not among the resolved coders; round-robin"),
    ],
)
def test_packet_override(override: str, expected: str, reason: str) -> None:
    got = assign([packet("a", coder=override)], [CODEX, CLAUDE])
    assert got["a"].spec == expected
    assert got["a"].reason.startswith(reason)


@pytest.mark.parametrize(
    ("files", "nature", "expected"),
    [
        (["README.md", "docs/"], "docs", "claude:opus"),
        (["tests/unit/test_x.py", "web/a.test.ts"], "tests", "codex"),
        (["peerd/x.py", "README.md"], None, "codex"),
    ],
)
def test_nature_hint(files: list[str], nature: str | None, expected: str) -> None:
    p = packet("a", files=files)
    assert packet_nature(p) == nature
    got = assign([packet("first"), p], [CLAUDE, CODEX])
    if nature is None:
        assert got["a"].reason.startswith("round-robin")
    else:
        assert got["a"].spec == expected
        assert got["a"].reason.startswith(f"nature hint: {nature}-only packet prefers")
    assert assign([p], [CODEX])["a"].spec == "codex", "one coder: no hint needed"


def test_reviewer_differs_from_the_implementer() -> None:
    impl = CODEX.choice("round-robin")
    got = choose_reviewer(impl, [CODEX, CLAUDE], None)
    assert got.backend == "claude" and "different backend" in got.reason
    alone = choose_reviewer(impl, [CODEX], None, available={"codex": True, "claude": False, "gemini": True})
    assert alone.backend == "gemini" and "first runnable" in alone.reason
    nobody = choose_reviewer(impl, [CODEX], None, available={})
    assert nobody.backend == "codex" and "no other backend" in nobody.reason
    flagged = choose_reviewer(impl, [CODEX, CLAUDE], CoderSpec(backend="codex", model="o3"))
    assert (flagged.spec, flagged.reason) == ("codex:o3", "--reviewer")
    configured = choose_reviewer(impl, [CODEX, CLAUDE], None, configured="gemini")
    assert configured.reason == "reviewer in the project config"


# --- verification -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "timed_out", "output", "expected"),
    [
        (0, False, "ok", "passed"),
        (0, False, "Permission denied (ignored: it passed)", "passed"),
        (None, True, "", "timeout"),
        (1, False, "AssertionError: 2 != 3", "content"),
        # Words in the output never make a failure environmental (a test's own assertion message may
        # say them): only peerd's re-run or the coder's structured events do (review.verifying).
        (1, False, "open('/home/u/.cache/x'): Permission denied", "content"),
        (1, False, "Error: EACCES: permission denied, mkdir", "content"),
        (1, False, "OSError: [Errno 30] Read-only file system: '/root/.npm'", "content"),
        (128, False, "fatal: Could not resolve host: github.com", "content"),
        (1, False, "blocked by the sandbox", "content"),
        (1, False, "FAILED tests/test_sandbox_rules.py::test_x", "content"),
    ],
)
def test_classify_verification(exit_code: int | None, timed_out: bool, output: str, expected: str) -> None:
    assert classify_verification(exit_code, timed_out, output) == expected


def test_verification_result_keeps_the_tail() -> None:
    result = verification_result("pytest", 1, False, "x" * 10_000 + "END")
    assert result.classification == "content" and not result.passed
    assert len(result.output_tail) == 4_000 and result.output_tail.endswith("END")


# --- replies ------------------------------------------------------------------------------------

PLAN = '{"packets": [{"id": "a", "goal": "g", "files": ["x.py"], "verify": "pytest"}]}'


@pytest.mark.parametrize(
    "reply",
    [
        f"Here is the plan:\n```json\n{PLAN}\n```\nDone.",
        f"Thinking {{not json}} ... final answer: {PLAN}",
        f'```json\n{{"notes": 1}}\n```\n```JSON\n{PLAN}\n```',
        f'draft: {{"packets": "nope"}} then {PLAN}',
    ],
)
def test_plan_reply_is_found(reply: str) -> None:
    packets, errors = parse_plan_reply(reply)
    assert errors == []
    assert packets is not None and [p.id for p in packets] == ["a"]


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        ("I could not make a plan.", "No JSON object with a 'packets' key"),
        ("```json\n{packets: [}\n```", "is not valid JSON"),
        ('{"packets": {}}', "`packets` must be a list"),
        ('{"packets": [{"id": "a", "goal": "g", "files": [], "verify": "v"}]}', "packets[0] ('a').files"),
        ('{"packets": [{"id": "a", "goal": "g", "files": ["/x"], "verify": "v"}]}', "is absolute"),
        (
            '{"packets": [{"id": "a", "goal": "g", "files": ["x"]}]}',
            "packets[0] ('a').verify: Field required",
        ),
    ],
)
def test_bad_plan_replies_explain_themselves(reply: str, fragment: str) -> None:
    packets, errors = parse_plan_reply(reply)
    assert packets is None
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize(
    ("reply", "verdict", "evidence"),
    [
        ('```json\n{"verdict": "approve", "summary": "fine"}\n```', "approve", 0),
        (
            'Review: {"verdict": "request_changes", "evidence": [{"file": "a.py", "line": 3, "reason": "r"}], '
            '"summary": "s"}',
            "request_changes",
            1,
        ),
        (
            '{"verdict": "Request changes", "evidence": [{"file": "a.py", "reason": "r"}], "summary": "s"}',
            None,
            1,
        ),
    ],
)
def test_review_replies(reply: str, verdict: str | None, evidence: int) -> None:
    got, errors = parse_review_reply(reply)
    assert errors == [] and got is not None
    assert got.verdict == (verdict or "request_changes")
    assert len(got.evidence) == evidence


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        ("Looks good to me!", "No JSON object with a 'verdict' key"),
        ('{"verdict": "lgtm", "summary": "s"}', "review.verdict"),
        ('{"verdict": "reject", "summary": "s"}', "A reject verdict needs at least one evidence entry"),
        ('{"verdict": "request_changes", "evidence": [], "summary": "s"}', "needs at least one evidence"),
        ('{"verdict": "approve"}', "review.summary: Field required"),
    ],
)
def test_bad_review_replies(reply: str, fragment: str) -> None:
    got, errors = parse_review_reply(reply)
    assert got is None
    assert any(fragment in e for e in errors), errors


# --- prompts ------------------------------------------------------------------------------------


def test_implementer_prompt_states_the_contract() -> None:
    spec = packet("a", constraints=["no new deps"], verify="make check")
    text = implementer_prompt(
        spec,
        workspace_root="/wt/a",
        base_commit="abc123",
        branch="orchestrate/r1/a",
        workarounds=["dprint: x"],
    )
    for needed in (
        "You are a delegated implementation agent",
        "Your workspace root is /wt/a",
        "Make edits only under /wt/a",
        "do a",
        "- peerd/x.py",
        "- no new deps",
        "- dprint: x",
        "make check",
        "short final report: the files you changed, and the verification status",
    ):
        assert needed in text
    assert "retry" not in text
    retry = implementer_prompt(
        spec,
        workspace_root="/wt/a",
        base_commit="abc123",
        branch="b",
        workarounds=[],
        previous_failure="AssertionError: boom",
        review_changes=[ReviewEvidence(file="x.py", line=4, reason="off by one")],
    )
    assert "AssertionError: boom" in retry and "x.py:4: off by one" in retry


def test_planner_and_reviewer_prompts() -> None:
    first = planner_prompt("add a flag", verify_default="make check", workarounds=["w"], errors=None)
    assert "```json" in first and '"packets"' in first and "make check" in first and "add a flag" in first
    again = planner_prompt("add a flag", verify_default=None, workarounds=[], errors=["Packet 'a': bad"])
    assert "Your previous plan was rejected" in again and "- Packet 'a': bad" in again
    check = VerificationResult(
        command="pytest",
        exit_code=0,
        passed=True,
        timed_out=False,
        output_tail="1 passed",
        classification="passed",
    )
    review = reviewer_prompt(packet("a"), "diff --git a/x b/x", check)
    for needed in ("approve", "reject", "request_changes", "JSON only", "evidence", "diff --git a/x b/x"):
        assert needed in review


# --- plan directories ---------------------------------------------------------------------------


def test_plan_dir_of_markdown_packets(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# The plan\n")
    (tmp_path / "01-models.md").write_text('+++\nfiles = ["peerd/m.py"]\n+++\n# Models\nWrite them.\n')
    (tmp_path / "02-cli.md").write_text(
        '+++\nfiles = ["peerd/cli.py"]\ndepends_on = ["01-models"]\nverify = "pytest tests/cli"\n+++\nThe CLI.\n'
    )
    packets, notes = load_plan_dir(tmp_path, default_verify="make check")
    assert [(p.id, p.verify, p.depends_on) for p in packets] == [
        ("01-models", "make check", []),
        ("02-cli", "pytest tests/cli", ["01-models"]),
    ]
    assert packets[0].goal == "# Models\nWrite them."
    assert notes == ["README.md: no +++ front matter; not a packet."]


def test_plan_dir_json_and_errors(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(PLAN)
    packets, _ = load_plan_dir(tmp_path, default_verify=None)
    assert [p.id for p in packets] == ["a"]
    (tmp_path / "plan.json").unlink()
    (tmp_path / "a.md").write_text('+++\nfiles = ["x"]\n+++\nGoal.\n')
    with pytest.raises(InvalidRequest, match=r"verify: Field required"):
        load_plan_dir(tmp_path, default_verify=None)
    with pytest.raises(InvalidRequest, match="not a directory"):
        load_plan_dir(tmp_path / "nope", default_verify=None)


def test_choice_round_trips_on_the_wire() -> None:
    choice = CoderChoice(spec="box/codex", backend="codex", environment="box", reason="r")
    assert choice.wire() == {
        "spec": "box/codex",
        "backend": "codex",
        "model": None,
        "environment": "box",
        "reason": "r",
    }
