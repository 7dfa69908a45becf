"""peerd <-> A2A, pure (peerd/a2a/mapping.py): states, idempotency keys, the push address rule."""

from __future__ import annotations

import pytest

from peerd.a2a import mapping as m
from peerd.config import A2AConfig
from peerd.errors import BadPageToken, InvalidRequest, PushAddressRefused

NONE: m.Networks = ()


@pytest.mark.parametrize(
    ("status", "waiting", "state"),
    [
        ("queued", False, "submitted"),
        ("starting", False, "working"),
        ("running", False, "working"),
        ("running", True, "input-required"),
        ("completed", True, "completed"),
        ("failed", False, "failed"),
        ("cancelled", False, "canceled"),
        ("interrupted", False, "canceled"),
    ],
)
def test_run_status_maps_to_task_state(status: m.RunStatus, waiting: bool, state: str) -> None:
    assert m.task_state(status, approval_waiting=waiting) == state


def test_message_id_is_the_idempotency_key() -> None:
    assert m.client_request_id("abc") == "a2a:abc"
    with pytest.raises(InvalidRequest):
        m.client_request_id("")
    with pytest.raises(InvalidRequest):
        m.client_request_id("x" * (m.MAX_MESSAGE_ID_CHARS + 1))


def test_prompt_joins_text_and_refuses_none() -> None:
    assert m.prompt_of(["a", " ", "b"]) == "a\n\nb"
    with pytest.raises(InvalidRequest):
        m.prompt_of([" "])


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",
        "224.0.0.1",
        "0.0.0.0",  # noqa: S104
        "fe80::1",
        "fd00::1",
        "100.64.0.1",
        "::ffff:127.0.0.1",
        "ff02::1",
        "255.255.255.255",
    ],
)
def test_non_public_addresses_are_refused_by_default(address: str) -> None:
    assert not m.allowed_push_address(address, NONE)
    with pytest.raises(PushAddressRefused):
        m.check_resolved("hook.example", [address], NONE)


@pytest.mark.parametrize("address", ["::1", "::", "2001:0:4136:e378:8000:63bf:80ff:fffe"])
def test_v6_loopback_unspecified_and_teredo_are_refused(address: str) -> None:
    """Refused twice over: not global, and inside the transition ranges (::/96, Teredo)."""
    assert not m.allowed_push_address(address, NONE)


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::a00:1",  # local-use NAT64 of 10.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "::127.0.0.1",  # IPv4-compatible
    ],
)
def test_ipv6_carrying_an_ipv4_address_is_refused(address: str) -> None:
    """Python calls these global; a gateway may translate them to a private IPv4 address."""
    assert not m.allowed_push_address(address, NONE)
    assert m.allowed_push_address(address, m.networks(["::/0"]))


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860:4860::8888", "93.184.216.34"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert m.allowed_push_address(address, NONE)


def test_the_owner_allows_a_network() -> None:
    allowed = m.networks(["127.0.0.1/32"])
    assert m.allowed_push_address("127.0.0.1", allowed)
    assert m.allowed_push_address("::ffff:127.0.0.1", allowed)
    assert not m.allowed_push_address("127.0.0.2", allowed)
    assert not m.allowed_push_address("10.0.0.1", allowed)


def test_one_bad_address_among_many_refuses_the_name() -> None:
    with pytest.raises(PushAddressRefused):
        m.check_resolved("rebind.example", ["8.8.8.8", "127.0.0.1"], NONE)
    with pytest.raises(PushAddressRefused):
        m.check_resolved("nothing.example", [], NONE)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://8.8.8.8/x", InvalidRequest),
        ("https://user:pw@8.8.8.8/x", InvalidRequest),
        ("http://127.0.0.1:9/hook", PushAddressRefused),
        ("http://[::1]/hook", PushAddressRefused),
        ("http://169.254.169.254/latest/meta-data", PushAddressRefused),
        ("http://10.0.0.1/hook", PushAddressRefused),
    ],
)
def test_push_urls_refused_from_the_url_alone(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        m.push_url(url, NONE)


def test_push_url_with_a_name_is_left_to_resolution() -> None:
    assert m.push_url("https://hooks.example.com/a2a", NONE) == ("hooks.example.com", 443)
    assert m.push_url("http://127.0.0.1:8123/h", m.networks(["127.0.0.1/32"])) == ("127.0.0.1", 8123)


def test_the_config_takes_networks_only() -> None:
    assert A2AConfig(allow_private_push=["127.0.0.1/32", "fd00::/8"]).allow_private_push == [
        "127.0.0.1/32",
        "fd00::/8",
    ]
    with pytest.raises(ValueError, match="not a network"):
        A2AConfig(allow_private_push=["localhost"])


# --- ListTasks: the page token and the merge --------------------------------------------------------


def test_a_page_token_names_its_position_and_nothing_else_reads_as_one() -> None:
    last = m.Position(1_796_240_824.255424, "run_8fcf92c820e7365dad17")
    assert m.read_page_token(m.page_token(last)) == last
    for bad in ["", "x", "e30", "WzEsMl0", m.page_token(last)[:-3], "W251bGwsInJ1bl8xIl0", "WyIxIiwicnVuIl0"]:
        with pytest.raises(BadPageToken) as refused:
            m.read_page_token(bad)
        assert refused.value.code == "invalid_page_token"
        assert "list again without it" in refused.value.message


def test_the_page_size_is_from_1_to_100_and_50_unless_asked() -> None:
    assert (m.page_size(None), m.page_size(1), m.page_size(100)) == (50, 1, 100)
    for bad in (0, -1, 101):
        with pytest.raises(InvalidRequest):
            m.page_size(bad)


def test_two_lists_merge_newest_first_and_the_next_page_starts_after_the_last_shown() -> None:
    here = [(m.Position(5.0, "b"), "b"), (m.Position(5.0, "a"), "a"), (m.Position(1.0, "z"), "z")]
    there = [(m.Position(6.0, "r"), "r"), (m.Position(3.0, "q"), "q")]
    page, last = m.merge_page([here, there], 3)
    assert [entry for _, entry in page] == ["r", "b", "a"]
    assert last == m.Position(5.0, "a")
    page, last = m.merge_page([here[2:], there[1:]], 3)
    assert [entry for _, entry in page] == ["q", "z"] and last is None
