"""The exception tree (peerd/errors.py): one class per code, every class registered and defined in
peerd/errors.py, every one of them back as itself over the wire, and what is computed from the
registry (statuses, the transient codes, the docs) agrees with the classes."""

from __future__ import annotations

import ast
import gc
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from peerd import contracts, errors
from peerd.errors import (
    HTTP_STATUS,
    REGISTRY,
    PeerdError,
    classify,
    from_body,
    from_wire,
    http_status,
    is_transient,
)

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> list[type[PeerdError]]:
    """Every class of the tree as Python knows it (not as the registry does), the root included."""
    gc.collect()  # a class refused while it was defined (the tests below) is gone for good
    found: list[type[PeerdError]] = [PeerdError]
    for cls in found:
        found.extend(sub for sub in cls.__subclasses__() if sub not in found)
    return found


TREE = _tree()


def _sample(cls: type[PeerdError], pick: int = 0) -> PeerdError:
    """An instance with every typed field the wire carries set (the `pick`-th value each may take)."""
    fields = {name: values[pick % len(values)] for name, values in cls.wire_fields.items()}
    return cls(f'a {cls.code} for the test: it\'s "quoted", naïve and\nmultiline.', **fields)


@pytest.mark.parametrize("cls", TREE, ids=lambda cls: cls.code)
def test_every_class_comes_back_as_itself_over_the_wire(cls: type[PeerdError]) -> None:
    for pick in range(max([1, *(len(v) for v in cls.wire_fields.values())])):
        sent = _sample(cls, pick)
        wire = json.loads(json.dumps(sent.to_wire()))  # as the bytes carry it
        back = from_body(wire)
        assert type(back) is cls, f"{cls.code} came back as {type(back).__name__}"
        assert (back.code, back.message) == (sent.code, sent.message)
        for name in cls.wire_fields:
            assert getattr(back, name) == getattr(sent, name), name
        assert back.details() == sent.details() == {n: getattr(sent, n) for n in cls.wire_fields}
        assert back.to_wire() == wire


@pytest.mark.parametrize("cls", TREE, ids=lambda cls: cls.code)
def test_every_class_is_registered_once_with_its_own_code_and_status(cls: type[PeerdError]) -> None:
    assert REGISTRY.get(cls.code) is cls, f"{cls.__qualname__} is not what from_wire rebuilds"
    assert cls.__module__ == "peerd.errors", f"{cls.__qualname__}: define it in peerd/errors.py"
    assert "code" in vars(cls), "a class declares its own code"
    assert HTTP_STATUS[cls.code] == http_status(cls.code) == cls.http_status
    assert 400 <= cls.http_status <= 599
    if cls.wire_fields:  # a typed field is carried only as a value its class knows
        assert all(values for values in cls.wire_fields.values())


def test_the_registry_is_the_tree() -> None:
    assert set(REGISTRY.values()) == set(TREE)
    assert len(REGISTRY) == len(TREE) == len(HTTP_STATUS)


@pytest.mark.slow
def test_no_module_but_peerd_errors_defines_an_error_class() -> None:
    """So `from_wire` knows every code whatever was imported first: read from the source, so a
    module nothing imported here is checked too."""
    names = {cls.__name__ for cls in TREE}
    elsewhere = []
    for path in sorted((ROOT / "peerd").rglob("*.py")):
        if path == ROOT / "peerd" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if bases & names:
                    elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not elsewhere


def test_a_class_without_its_own_code_or_with_another_s_is_refused() -> None:
    before = dict(REGISTRY)
    with pytest.raises(TypeError, match="declares no code"):

        class Quiet(errors.NotFound):
            pass

    with pytest.raises(TypeError, match="ThreadNotFound's already"):

        class Twin(errors.NotFound):
            code = "thread_not_found"

    assert before == REGISTRY


def test_a_code_is_raised_as_its_class_and_an_unknown_one_kept_as_sent() -> None:
    with pytest.raises(TypeError, match="raise PeerUnreachable"):
        PeerdError("down", code="unreachable")
    newer = from_wire("a_code_from_a_newer_peerd", "what it said", {"reason": "x"})
    assert type(newer) is PeerdError
    assert (newer.code, newer.message, newer.to_wire()) == (
        "a_code_from_a_newer_peerd",
        "what it said",
        {"code": "a_code_from_a_newer_peerd", "message": "what it said"},
    )
    assert http_status("a_code_from_a_newer_peerd") == 500
    assert classify("a_code_from_a_newer_peerd") == "task" and not is_transient("a_code_from_a_newer_peerd")


def test_typed_fields_keep_only_the_values_their_class_knows() -> None:
    kept = from_wire("pairing_rejected", "no", {"reason": "expired", "other": "x"})
    assert isinstance(kept, errors.PairingRejected) and kept.reason == "expired"
    for details in ({"reason": "a newer reason"}, {"reason": 3}, ["expired"], None):
        dropped = from_wire("pairing_rejected", "no", details)
        assert isinstance(dropped, errors.PairingRejected) and dropped.reason is None
        assert "details" not in dropped.to_wire()
    assert "details" not in errors.AccessExceedsCode("too wide").to_wire()
    assert errors.RefreshRejected("no", reason="reused", client_id="cli_1").details() == {"reason": "reused"}


def test_the_typed_values_are_the_contract_s() -> None:
    assert errors.ACCESS_LEVELS == contracts.RUNTIME_MODES
    assert get_args(errors.PairingReason) == errors.PAIRING_REASONS
    assert get_args(errors.RefreshReason) == errors.REFRESH_REASONS


def test_the_transient_and_link_codes() -> None:
    """One definition, used by the follower and delegation (`tasks/rules.py`) and by a thread's move
    (`handoff/machine.py`). Before it they differed: the follower also waited out `clock_skew` and
    `version_skew`; a move also retried `rate_limited` and `internal_error`. Now both wait out all
    but `internal_error` (a bug; a box's 5xx arrives as `unreachable`)."""
    assert {
        "unreachable",
        "unavailable",
        "storage_unavailable",
        "shutting_down",
        "clock_skew",
        "version_skew",
        "rate_limited",
    } == {code for code in REGISTRY if is_transient(code)}
    assert {
        "capability_denied",
        "link_revoked",
        "not_linked",
        "pin_mismatch",
        "not_a_peerd",
        "wrong_environment",
        "incompatible",
    } == {code for code in REGISTRY if classify(code) == "link"}
    # The flags are each class's own: a narrower failure is not its parent's kind by inheritance.
    assert errors.Unavailable.transient and not errors.PeerdError.transient
    assert errors.CapabilityDenied.ends_link and not errors.ParentNotActive.ends_link


def test_importing_peerd_errors_loads_only_the_standard_library() -> None:
    """The CLI imports it at start-up (bench/cli_start.py)."""
    code = (
        "import sys; before = set(sys.modules); import peerd.errors; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names | {"peerd"}]
    assert not foreign
    assert {m for m in loaded if m.startswith("peerd")} == {"peerd", "peerd.errors"}


def test_the_user_guide_names_only_codes_that_exist() -> None:
    guide = (ROOT / "docs" / "user" / "guide.md").read_text(encoding="utf-8")
    table = guide.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    named = {code for row in table.splitlines() if row.startswith("| `") for code in re.findall(
        r"`([a-z_]+)`", row.split("|")[1])}  # fmt: skip
    assert named <= set(REGISTRY), named - set(REGISTRY)


def test_the_exit_codes_each_class_declares() -> None:
    """What the CLI exits with (peerd/cli/common.py:fail): 1 unless a class says else, inherited.
    These are the exit codes of the release before the registry had them: they never change."""
    by_exit = {code: cls.exit_code for code, cls in REGISTRY.items() if cls.exit_code != 1}
    assert by_exit == {
        "usage_error": 2,
        "config_invalid": 2,
        "store_refused": 2,
        "home_newer": 2,
        "daemon_unavailable": 3,
        "timeout": 4,
    }
    assert errors.exit_code_of(errors.StoreRefused("no")) == 2
    assert errors.exit_code_of(from_wire("a_code_from_a_newer_peerd", "?")) == 1
    assert errors.exit_code_of(ValueError("a bug")) == 1


def test_the_oauth_answer_of_each_class() -> None:
    """The OAuth endpoints answer RFC 6749's `error` each class declares (inherited), with peerd's
    `peerd_reason` (the typed reason, else the code) where the class names one."""
    declared = {
        code: cls.oauth_error
        for code, cls in REGISTRY.items()
        if cls.oauth_error and "oauth_error" in vars(cls)
    }
    assert declared == {
        "invalid_request": "invalid_request",
        "unsupported_grant_type": "unsupported_grant_type",
        "invalid_scope": "invalid_scope",
        "access_exceeds_code": "invalid_scope",
        "pairing_rejected": "invalid_grant",
        "invalid_grant": "invalid_grant",
        "rate_limited": "slow_down",
        "authorization_code_rejected": "invalid_grant",
        "invalid_client": "invalid_client",
    }
    assert set(errors.OAUTH_STATUS) == set(get_args(errors.OAuthErrorCode))
    oauth = errors.oauth_error_of
    assert oauth(errors.PairingRejected("no", reason="used")) == ("invalid_grant", 400, "used")
    assert oauth(errors.PairingRejected("no")) == ("invalid_grant", 400, None)
    assert oauth(errors.RefreshRejected("no", reason="reused")) == ("invalid_grant", 400, "reused")
    assert oauth(errors.AccessExceedsCode("wide")) == ("invalid_scope", 400, "access_exceeds_code")
    assert oauth(errors.RateLimited("wait")) == ("slow_down", 429, None)
    assert oauth(errors.AuthCodeRejected("no", reason="pkce")) == ("invalid_grant", 400, "pkce")
    assert oauth(errors.InvalidClient("no")) == ("invalid_client", 401, "invalid_client")
    assert oauth(errors.UsageError("x")) == ("invalid_request", 400, None)  # inherited
    assert oauth(errors.ScopeInvalid("x")) == ("invalid_scope", 400, None)


def _literal_codes(path: Path) -> list[str]:
    """Where `path` spells an error or item code as a string: `{"code": "x"}`, `code="x"`, a
    refusal's code (`Refused("x", ...)`), or a comparison of a code with a string."""
    found: list[str] = []

    def spelled(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return "<f-string>" if isinstance(node, ast.JoinedStr) else None

    def is_code(node: ast.AST) -> bool:
        return (
            (isinstance(node, ast.Attribute) and node.attr == "code")
            or (isinstance(node, ast.Subscript) and spelled(node.slice) == "code")
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and bool(node.args)
                and spelled(node.args[0]) == "code"
            )
        )

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        values: list[ast.AST | None] = []
        if isinstance(node, ast.Dict):
            values += [v for k, v in zip(node.keys, node.values, strict=True) if spelled(k) == "code"]
        elif isinstance(node, ast.Call):
            values += [k.value for k in node.keywords if k.arg == "code"]
            if isinstance(node.func, ast.Name) and node.func.id == "Refused" and node.args:
                values.append(node.args[0])
        elif isinstance(node, ast.Compare) and (
            is_code(node.left) or any(is_code(c) for c in node.comparators)
        ):
            values += [node.left, *node.comparators]
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {text!r}" for v in values if (text := spelled(v))]
    return found


@pytest.mark.slow
def test_no_module_spells_a_code_it_could_take_from_the_registry() -> None:
    """Every code peerd puts on a wire or in an item is declared once, in peerd/errors.py: a class
    of the registry, or the table of item codes (`ITEM_CODES`); elsewhere it is named through
    them (`Unavailable.code`, `errors.CONFINED`), so a code that is not declared cannot be
    written, and each shows in the generated docs (docs/reference/api.md)."""
    found = []
    for path in sorted((ROOT / "peerd").rglob("*.py")):
        if path != ROOT / "peerd" / "errors.py":
            found += _literal_codes(path)
    assert not found
    assert not set(errors.ITEM_CODES) & set(REGISTRY), "an item code is not also an error's"
    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    assert all(f"| `{code}` |" in api for code in [*REGISTRY, *errors.ITEM_CODES])
