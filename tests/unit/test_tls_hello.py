"""Which certificate a ClientHello gets (peerd/core/tls_hello.py): real hellos made by Python's
OpenSSL (the links' and agents' TLS), a browser's shape (no Ed25519 offered), every prefix of them,
and whatever bytes a stranger sends."""

from __future__ import annotations

import contextlib
import ssl
import struct

from hypothesis import given
from hypothesis import strategies as st

from peerd.core.tls_hello import ED25519, MAX_RECORD, Cert, Sniffed, sniff


def openssl_client_hello(*, alpn: list[str] | None = None, server_name: str | None = None) -> bytes:
    """The first flight of a real TLS client (this Python's OpenSSL), never sent anywhere."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def hello_with(schemes: list[int] | None, *, extra_extensions: bytes = b"") -> bytes:
    """A minimal ClientHello offering `schemes` (None: no signature_algorithms extension)."""
    extensions = extra_extensions
    if schemes is not None:
        listed = struct.pack(f">H{len(schemes)}H", 2 * len(schemes), *schemes)
        extensions += struct.pack(">HH", 13, len(listed)) + listed
    body = (
        b"\x03\x03"
        + bytes(32)
        + b"\x00"  # no session id
        + struct.pack(">HH", 2, 0x1301)  # one cipher suite
        + b"\x01\x00"  # null compression
        + struct.pack(">H", len(extensions))
        + extensions
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(handshake)) + handshake


CHROMIUM_SCHEMES = [0x0904, 0x0905, 0x0906, 0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601]


def test_peerds_own_tls_client_gets_the_identity_certificate() -> None:
    """aiohttp's and httpx's hellos are OpenSSL's: with or without ALPN and SNI they offer Ed25519."""
    for hello in (
        openssl_client_hello(),
        openssl_client_hello(alpn=["http/1.1"]),
        openssl_client_hello(alpn=["h2", "http/1.1"], server_name="box.example"),
    ):
        assert sniff(hello) == Sniffed(Cert.IDENTITY)


def test_a_browser_that_offers_no_ed25519_gets_the_web_certificate() -> None:
    assert sniff(hello_with(CHROMIUM_SCHEMES)) == Sniffed(Cert.WEB)
    assert sniff(hello_with([*CHROMIUM_SCHEMES, ED25519])) == Sniffed(Cert.IDENTITY)
    assert sniff(hello_with(None)) == Sniffed(Cert.WEB)  # offers nothing: cannot verify Ed25519
    # other extensions before it are skipped whole
    sni = struct.pack(">HH", 0, 9) + struct.pack(">HBH", 7, 0, 4) + b"host"
    assert sniff(hello_with(CHROMIUM_SCHEMES, extra_extensions=sni)) == Sniffed(Cert.WEB)


def test_every_prefix_asks_for_the_whole_first_record_and_nothing_more() -> None:
    for hello in (openssl_client_hello(alpn=["http/1.1"]), hello_with(CHROMIUM_SCHEMES)):
        for cut in range(len(hello)):
            verdict = sniff(hello[:cut])
            assert verdict.cert is None, cut
            assert verdict.need == (5 if cut < 5 else len(hello)), cut
        assert sniff(hello + b"more records").cert is not None


def test_what_is_not_a_readable_hello_gets_the_identity_certificate() -> None:
    """As before this change: the TLS handshake itself refuses it, or goes on as it always did."""
    assert sniff(b"GET / HTTP/1.1\r\n") == Sniffed(Cert.IDENTITY)
    assert sniff(b"G") == Sniffed(Cert.IDENTITY)
    assert sniff(b"\x16\x03\x01\x00\x00") == Sniffed(Cert.IDENTITY)  # an empty record
    assert sniff(b"\x16\x03\x01\x40\x01") == Sniffed(Cert.IDENTITY)  # past the 2^14 a record may hold
    browser = hello_with(CHROMIUM_SCHEMES)
    # a hello continued in a second record cannot be read whole from the first: identity
    first = browser[5:40]
    fragmented = b"\x16\x03\x01" + struct.pack(">H", len(first)) + first
    assert sniff(fragmented) == Sniffed(Cert.IDENTITY)
    # a length that runs past its vector
    broken = bytearray(browser)
    broken[5 + 4 + 2 + 32] = 200  # the session id claims 200 bytes
    assert sniff(bytes(broken)) == Sniffed(Cert.IDENTITY)


@given(st.binary(max_size=600))
def test_any_bytes_get_an_answer_and_never_an_exception(data: bytes) -> None:
    verdict = sniff(data)
    if verdict.cert is None:
        assert len(data) < verdict.need <= MAX_RECORD


@given(st.lists(st.integers(min_value=0, max_value=0xFFFF), max_size=40))
def test_the_verdict_is_whether_ed25519_is_offered(schemes: list[int]) -> None:
    expected = Cert.IDENTITY if ED25519 in schemes else Cert.WEB
    assert sniff(hello_with(schemes)) == Sniffed(expected)
