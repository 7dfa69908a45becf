"""schemathesis against a real daemon's two listeners, generated from the API's own document.

The box of a real linked pair (`harness.Fleet`) is called on its owner socket (over the Unix
socket itself), on its TLS network listener (its pinned certificate, the laptop's link token) and
on its agent socket (the token of a scripted run kept live for it).
Every operation of each listener gets `PEERD_FUZZ_EXAMPLES` generated requests (positive and
negative), plus its documented example. Checks on every answer:

- no 5xx (`not_a_server_error`), and the status, content type and body are what the document
  says for that operation (an error's `code` must be one the document lists for that status);
- no traceback text in any body;
- a rejected request (4xx) changes nothing: every table's row count and rows are the same before
  and after (`harness.Rows`; a link's last-seen time aside). Only a 2xx may change state, so the
  destructive routes (project remove, client revoke, pair cancel ...) need no exception.

Some requests name the seeded project, thread and run instead of generated ids (a deterministic
share), so handlers past the lookups are reached; destructive routes never get them. Long-poll
timeouts are cut to `MAX_WAIT_S` so a valid wait cannot stall the run; anything a 2xx started
(a scripted run) is let finish before the next request. `make fuzz` sets PEERD_FUZZ_EXAMPLES high.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from peerd.api.openapi import document
from tests.fuzz.harness import Fleet, Rows, Seeds, pinned_session, unix_session

EXAMPLES = int(os.environ.get("PEERD_FUZZ_EXAMPLES", "10"))
MAX_WAIT_S = 0.2
COVERAGE = os.environ.get("PEERD_FUZZ_COVERAGE", "0") == "1"  # boundary values per field: slow
QUIET_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 30.0
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "/', "site-packages/")
# Operations whose real ids would remove what later requests need (any id still may be generated).
DESTRUCTIVE = {"project_remove", "thread_archive", "client_revoke", "pair_cancel", "environment_unlink"}
SHARE_OF_SEEDED_IDS = 0.5
SHARE_OF_HOSTILE_VALUES = 0.15
DEEP_NESTING = 100_000  # past the body parser's limit (64) and Python's recursion limit
HUGE = 2**64  # SQLite integers are 64-bit


CREDENTIAL = {"owner": "ownerSocket", "agent": "runToken"}


def _view(listener: str) -> dict[str, Any]:
    """The document as one listener serves it: its operations, its credential alone."""
    if listener == "network":
        return json.loads(json.dumps(document("network")))
    doc = json.loads(json.dumps(document()))
    for path in list(doc["paths"]):
        item = doc["paths"][path]
        for method in list(item):
            if listener not in item[method]["x-peerd-listeners"]:
                del item[method]
            else:
                item[method]["security"] = [s for s in item[method]["security"] if CREDENTIAL[listener] in s]
        if not item:
            del doc["paths"][path]
    doc["servers"] = [s for s in doc["servers"] if s["x-peerd-listener"] == listener]
    return doc


def _config() -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": int(os.environ.get("PEERD_FUZZ_SEED", "16")),
            "generation": {"mode": "all", "max-examples": EXAMPLES},
            "phases": {"coverage": {"enabled": COVERAGE}, "stateful": {"enabled": False}},
        }
    )


OWNER = schemathesis.openapi.from_dict(_view("owner"), config=_config())
NETWORK = schemathesis.openapi.from_dict(_view("network"), config=_config())
AGENT = schemathesis.openapi.from_dict(_view("agent"), config=_config())
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class Fuzzer:
    """Sends a generated case to one listener and checks the answer and the store."""

    def __init__(
        self, fleet: Fleet, session: requests.Session, base_url: str, headers: Callable[[], dict[str, str]]
    ) -> None:
        self.fleet = fleet
        self.session = session
        self.base_url = base_url
        self.headers = headers
        self.rows = Rows(fleet.db_path)
        self.rng = random.Random(16)
        self.sent = 0
        assert fleet.seeds is not None
        self.held = fleet.seeds.agent_thread_id

    def exercise(self, case: schemathesis.Case) -> None:
        assert self.fleet.seeds is not None
        extra = steer(case, self.fleet.seeds, self.rng)
        before = self.rows.snapshot()
        headers = self.headers()
        response = case.call(
            base_url=self.base_url, session=self.session, headers=headers, timeout=REQUEST_TIMEOUT_S, **extra
        )
        self.sent += 1
        sent = {
            "session": self.session,
            "base_url": self.base_url,
            "headers": headers,
        }  # for probes the checks send
        case.validate_response(response, checks=CHECKS, headers=headers, transport_kwargs=sent)
        for marker in TRACEBACK_MARKERS:
            assert marker not in response.text, f"a traceback in the answer: {response.text[:2000]}"
        if 400 <= response.status_code < 500:
            after = self.rows.snapshot()
            changed = {
                t: (before.get(t), after.get(t))
                for t in set(before) | set(after)
                if before.get(t) != after.get(t)
            }
            assert not changed, (
                f"{case.method} {case.formatted_path} was refused ({response.status_code} {response.text[:300]}) "
                f"but changed the store: {changed}"
            )
        elif 200 <= response.status_code < 300:
            self.quiet()

    def quiet(self) -> None:
        """Wait until what a request started has ended and the store holds still."""
        deadline = time.monotonic() + QUIET_TIMEOUT_S
        last = self.rows.snapshot()
        while time.monotonic() < deadline:  # not eventually(): two looks alike, from a thread with no loop
            time.sleep(0.05)
            now = self.rows.snapshot()
            if now == last and self.rows.live_runs(held=self.held) == 0:
                return
            last = now
        raise AssertionError("what a request started did not end in time")


def steer(case: schemathesis.Case, seeds: Seeds, rng: random.Random) -> dict[str, Any]:
    """Name seeded ids in a share of the cases, put a hostile value in another share, and cut
    long-poll timeouts; returns extra arguments for the call."""
    op_id = case.operation.definition.raw.get("operationId", "")
    if op_id not in DESTRUCTIVE and rng.random() < SHARE_OF_SEEDED_IDS:
        ids = {"/v1/threads/": seeds.thread_id, "/v1/projects/": seeds.project_id}
        for prefix, real in ids.items():
            if (
                case.operation.path.startswith(prefix)
                and case.path_parameters
                and "id" in case.path_parameters
            ):
                case.path_parameters["id"] = real
        if isinstance(case.query, dict):
            for key, real in (
                ("projectId", seeds.project_id),
                ("run", seeds.run_id),
                ("runId", seeds.run_id),
            ):
                if key in case.query:
                    case.query[key] = real
        if isinstance(case.body, dict):
            for key, real in (("projectId", seeds.project_id), ("threadId", seeds.thread_id)):
                if key in case.body:
                    case.body[key] = real
    extra = hostile(case, rng) if rng.random() < SHARE_OF_HOSTILE_VALUES else {}
    for part in (case.query, case.body):
        if isinstance(part, dict):
            for key, cap in (("timeout", MAX_WAIT_S), ("timeoutMs", MAX_WAIT_S * 1000)):
                value = part.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
                    part[key] = cap
    return extra


def hostile(case: schemathesis.Case, rng: random.Random) -> dict[str, Any]:
    """One value schemathesis would not think of, in place of a generated one: JSON nested far past
    any sane depth (sent as raw bytes: no JSON encoder writes it), or an integer past 64 bits (a
    number in a body, text in a query). Returns extra arguments for the call."""
    if isinstance(case.body, dict) and case.body:
        key = rng.choice(sorted(case.body))
        if rng.random() < 0.5:
            case.body[key] = HUGE
            return {}
        raw = json.dumps(key) + ": " + "[" * DEEP_NESTING + "]" * DEEP_NESTING
        return {"data": ("{" + raw + "}").encode()}
    if isinstance(case.query, dict) and case.query:
        case.query[rng.choice(sorted(case.query))] = str(HUGE)
    return {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


@pytest.fixture(scope="module")
def owner(fleet: Fleet) -> Iterator[Fuzzer]:
    with unix_session(fleet.owner_socket) as session:
        yield Fuzzer(fleet, session, "http://localhost", dict)


@pytest.fixture(scope="module")
def network(fleet: Fleet) -> Iterator[Fuzzer]:
    with pinned_session(fleet.fingerprint) as session:
        yield Fuzzer(
            fleet, session, fleet.box_url, lambda: {"Authorization": f"Bearer {fleet.access_token()}"}
        )


@pytest.fixture(scope="module")
def agent(fleet: Fleet) -> Iterator[Fuzzer]:
    assert fleet.seeds is not None
    token = fleet.seeds.run_token
    with unix_session(fleet.box.box.paths.agent_socket) as session:
        yield Fuzzer(fleet, session, "http://localhost", lambda: {"Authorization": f"Bearer {token}"})


@OWNER.parametrize()
@FUZZ_SETTINGS
def test_owner_socket(case: schemathesis.Case, owner: Fuzzer) -> None:
    owner.exercise(case)


@NETWORK.parametrize()
@FUZZ_SETTINGS
def test_network_listener(case: schemathesis.Case, network: Fuzzer) -> None:
    network.exercise(case)


@AGENT.parametrize()
@FUZZ_SETTINGS
def test_agent_socket(case: schemathesis.Case, agent: Fuzzer) -> None:
    agent.exercise(case)


def test_the_fuzzers_reached_the_daemon(owner: Fuzzer, network: Fuzzer, agent: Fuzzer, fleet: Fleet) -> None:
    """Runs last in this module: the fuzz tests above really sent requests (not all skipped)."""
    assert owner.sent > 0 and network.sent > 0 and agent.sent > 0
    assert Path(fleet.db_path).exists()
