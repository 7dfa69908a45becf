"""The console's pure rules: where it may listen, Host and Origin, login tokens, sessions, CSRF,
the packet graph's layout, the stream's resume point."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd import config
from peerd.console import rules
from peerd.console.auth import Sessions, csrf_ok
from peerd.console.graph import depths, layout
from peerd.console.stream import resume_point, sse
from peerd.core import console_bind
from tests.fakeclock import FakeClock

# --- where it listens ---------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["127.0.0.1:7434", "localhost:0", "[::1]:7434", "127.8.9.1:1"])
def test_loopback_binds_need_no_tls(listen: str) -> None:
    assert console_bind.bind_problem(listen, tls=False) is None


@pytest.mark.parametrize("listen", ["0.0.0.0:7434", "[::]:7434", "192.168.1.4:7434", "box.lan:7434"])
def test_a_bind_off_loopback_without_tls_is_refused(listen: str) -> None:
    problem = console_bind.bind_problem(listen, tls=False)
    assert problem is not None and "without TLS" in problem and "tailscale serve" in problem
    assert console_bind.bind_problem(listen, tls=True) is None


@pytest.mark.parametrize("listen", ["7434", ":7434", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:x"])
def test_a_malformed_bind_is_refused(listen: str) -> None:
    assert console_bind.bind_problem(listen, tls=False) is not None


def test_the_config_file_refuses_a_console_off_loopback_without_tls(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[console]\nlisten = "0.0.0.0:7434"\n')
    with pytest.raises(config.ConfigInvalid, match="without TLS"):
        config.load(path)
    path.write_text('[console]\nlisten = "0.0.0.0:7434"\ntls_cert = "c.pem"\n')
    with pytest.raises(config.ConfigInvalid, match="both tls_cert and tls_key"):
        config.load(path)
    path.write_text('[console]\npublic_url = "https://box.ts.net/console"\n')
    with pytest.raises(config.ConfigInvalid, match="no path"):
        config.load(path)
    path.write_text('[console]\nenabled = false\nlisten = "127.0.0.1:9000"\n')
    loaded = config.load(path)
    assert loaded.console.enabled is False and loaded.console.listen == "127.0.0.1:9000"


# --- Host and Origin ----------------------------------------------------------------------------


def test_a_loopback_console_answers_its_loopback_names_on_its_port_only() -> None:
    site = rules.site_for("127.0.0.1", 7434, tls=False)
    assert site.base_url == "http://127.0.0.1:7434"
    for host in ("127.0.0.1:7434", "localhost:7434", "[::1]:7434", "LOCALHOST:7434"):
        assert rules.check_host(site, host) is None, host
    for host in ("127.0.0.1:7435", "evil.example:7434", "127.0.0.1", None):
        refusal = rules.check_host(site, host)
        assert refusal is not None and refusal.status == 421, host


def test_the_public_url_is_where_people_open_it() -> None:
    site = rules.site_for("127.0.0.1", 7434, tls=False, public_url="https://Box.tailnet.ts.net/")
    assert site.base_url == "https://box.tailnet.ts.net"
    assert rules.check_host(site, "box.tailnet.ts.net") is None
    assert rules.check_change(site, "POST", "https://box.tailnet.ts.net", "same-origin") is None
    assert rules.check_change(site, "POST", "http://box.tailnet.ts.net", None) is not None


def test_a_change_needs_the_consoles_own_origin() -> None:
    site = rules.site_for("127.0.0.1", 7434, tls=False)
    assert rules.check_change(site, "GET", None, "cross-site") is None  # reading is not a change
    assert rules.check_change(site, "POST", "http://127.0.0.1:7434", "same-origin") is None
    assert rules.check_change(site, "POST", "http://localhost:7434", None) is None
    for origin, fetch_site in (
        (None, None),  # every browser sends Origin on a POST: none means not a browser page of ours
        ("null", None),
        ("http://127.0.0.1:8000", "same-site"),  # another port is the same site, not the same origin
        ("https://127.0.0.1:7434", None),
        ("http://127.0.0.1:7434", "cross-site"),
        ("http://evil.example", "cross-site"),
    ):
        refusal = rules.check_change(site, "POST", origin, fetch_site)
        assert refusal is not None and refusal.status == 403, (origin, fetch_site)
    assert rules.check_change(site, "DELETE", None, None) is not None


# --- login tokens and sessions ------------------------------------------------------------------


def test_a_login_token_works_once_and_expires() -> None:
    clock = FakeClock(wall=1000.0)
    sessions = Sessions(now=clock, token_ttl_s=300)
    token, expires = sessions.issue_token()
    assert expires == 1300.0 and len(token) >= 40
    found = sessions.exchange(token)
    assert found is not None
    assert sessions.exchange(token) is None, "a token works once"
    late, _ = sessions.issue_token()
    clock.advance(301)
    assert sessions.exchange(late) is None, "an expired token is refused"
    assert sessions.exchange("") is None and sessions.exchange("guess") is None


def test_sessions_end_when_idle_too_long_at_their_age_and_on_logout() -> None:
    clock = FakeClock(wall=1000.0)
    sessions = Sessions(now=clock, idle_s=100, max_age_s=250)
    sid, session = sessions.exchange(sessions.issue_token()[0]) or ("", None)
    assert session is not None and sessions.get(sid) is session
    clock.advance(90)
    assert sessions.get(sid) is session  # used: its idle time starts again
    clock.advance(90)
    assert sessions.get(sid) is session
    clock.advance(90)  # 270 s after the login: past the maximum age although it was used
    assert sessions.get(sid) is None
    sid2, _ = sessions.exchange(sessions.issue_token()[0]) or ("", None)
    clock.advance(101)
    assert sessions.get(sid2) is None, "idle for longer than idle_s"
    sid3, _ = sessions.exchange(sessions.issue_token()[0]) or ("", None)
    sessions.end(sid3)
    assert sessions.get(sid3) is None
    assert sessions.get(None) is None and sessions.get("forged") is None


def test_only_hashes_are_kept() -> None:
    sessions = Sessions()
    token, _ = sessions.issue_token()
    sid, _ = sessions.exchange(sessions.issue_token()[0]) or ("", None)
    kept = repr(sessions.__dict__)
    assert token not in kept and sid not in kept


def test_the_csrf_token_must_match() -> None:
    sessions = Sessions()
    _, session = sessions.exchange(sessions.issue_token()[0]) or ("", None)
    assert session is not None
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, None) and not csrf_ok(session, "") and not csrf_ok(session, session.csrf[:-1])


# --- the packet graph ---------------------------------------------------------------------------


def test_packets_are_laid_out_by_dependency_depth() -> None:
    packets = [
        {"id": "a", "state": "integrated"},
        {"id": "b", "state": "reviewing", "dependsOn": ["a"]},
        {"id": "c", "state": "queued", "dependsOn": ["a", "b"]},
        {"id": "d", "state": "parked"},
    ]
    graph = layout(packets)
    by_id = {n.id: n for n in graph.nodes}
    assert [by_id[p].depth for p in "abcd"] == [0, 1, 2, 0]
    assert by_id["a"].x == by_id["d"].x < by_id["b"].x < by_id["c"].x
    assert by_id["d"].y > by_id["a"].y
    assert {(e.source, e.target) for e in graph.edges} == {("a", "b"), ("a", "c"), ("b", "c")}
    assert all(e.x1 < e.x2 for e in graph.edges), "edges go left to right"
    assert graph.width > by_id["c"].x and graph.height > by_id["d"].y


def test_a_cycle_or_an_unknown_dependency_does_not_loop() -> None:
    assert depths({"a": ["b"], "b": ["a"]}) == {"a": 2, "b": 2}  # bounded by the packet count
    graph = layout([{"id": "x", "dependsOn": ["nope", "x"]}])
    assert [n.depth for n in graph.nodes] == [0] and graph.edges == []
    assert layout([]).nodes == []


# --- the stream ---------------------------------------------------------------------------------


def test_the_resume_point_comes_from_the_last_event_id_first() -> None:
    assert resume_point("12.345", "3") == (12, 345)
    assert resume_point("-1.0", None) == (-1, 0)
    assert resume_point(None, "7") == (7, None)
    assert resume_point("garbage", "7") == (7, None)
    assert resume_point(None, None) == (-1, None)
    assert resume_point("-9.-4", None) == (-1, 0)


def test_an_event_with_newlines_is_one_event() -> None:
    raw = sse("item", "3.9", "<li>\r\nline one\nline two\r</li>")
    assert raw == b"event: item\nid: 3.9\ndata: <li>\ndata: line one\ndata: line two\ndata: </li>\n\n"
