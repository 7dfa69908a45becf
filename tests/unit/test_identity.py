"""The Ed25519 identity: files on disk, env ids, fingerprints, and real TLS pinning with aiohttp."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID
from pytest_aiohttp import AiohttpServer

from peerd.core.envid import luhn32 as _luhn32
from peerd.core.envid import normalize_env_id
from peerd.core.fingerprint import format_fingerprint, parse_fingerprint
from peerd.errors import IdentityError, InvalidRequest, PeerdError
from peerd.peer.identity import (
    Identity,
    env_id_from_public_key,
    env_id_matches,
    load_or_create_identity,
    pinned_fingerprint,
    server_ssl_context,
)

ENV_ID_RE = re.compile(r"^[A-Z2-7]{6}-[A-Z2-7]{6}-[A-Z2-7]{6}-[A-Z2-7]{6}$")
B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def raw_key(seed: int) -> bytes:
    return hashlib.sha256(seed.to_bytes(4, "big")).digest()


# --- files on disk ---------------------------------------------------------------------------------


def test_creates_key_0600_in_dir_0700_without_leftovers(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path / "home")
    id_dir = tmp_path / "home" / "identity"
    assert ident.key_path == id_dir / "key.pem"
    assert ident.cert_path == id_dir / "cert.pem"
    assert mode(id_dir) == 0o700
    assert mode(ident.key_path) == 0o600
    assert sorted(p.name for p in id_dir.iterdir()) == ["cert.pem", "key.pem"]  # no temp files
    pem = ident.key_path.read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS8, unencrypted
    loaded = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(loaded, Ed25519PrivateKey)
    assert loaded.public_key().public_bytes_raw() == ident.public_key_raw


def test_identity_is_stable_across_loads(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path)
    second = load_or_create_identity(tmp_path)
    assert second.env_id == first.env_id
    assert second.public_key_raw == first.public_key_raw
    assert second.fingerprint == first.fingerprint  # the cert is reused, not rebuilt
    assert second == first


def test_repr_does_not_show_key_material(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    assert "PRIVATE" not in repr(ident)
    assert "private_key" not in repr(ident)


def test_wide_permissions_are_tightened(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    ident.key_path.chmod(0o644)
    ident.key_path.parent.chmod(0o755)
    again = load_or_create_identity(tmp_path)
    assert mode(again.key_path) == 0o600
    assert mode(again.key_path.parent) == 0o700
    assert again.env_id == ident.env_id


def test_cert_matches_key_and_names_the_env(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    cert = x509.load_pem_x509_certificate(ident.cert_path.read_bytes())
    assert cert.public_key().public_bytes_raw() == ident.public_key_raw  # type: ignore[union-attr]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == ident.env_id
    assert cert.issuer == cert.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    now = datetime.now(UTC)
    assert cert.not_valid_before_utc <= now - timedelta(hours=23)
    assert cert.not_valid_after_utc >= now + timedelta(days=20 * 365)
    assert ident.cert_der == cert.public_bytes(serialization.Encoding.DER)
    assert ident.cert_pem == ident.cert_path.read_bytes()
    assert ident.fingerprint == cert.fingerprint(hashes.SHA256())


def test_cert_is_rebuilt_when_deleted(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    ident.cert_path.unlink()
    again = load_or_create_identity(tmp_path)
    assert again.cert_path.exists()
    assert again.env_id == ident.env_id
    assert again.fingerprint != ident.fingerprint  # new serial and dates: a new pin


def test_cert_is_rebuilt_when_unparsable(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    ident.cert_path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot a cert\n")
    again = load_or_create_identity(tmp_path)
    cert = x509.load_pem_x509_certificate(again.cert_path.read_bytes())
    assert cert.public_key().public_bytes_raw() == ident.public_key_raw  # type: ignore[union-attr]


def test_cert_of_another_key_is_replaced(tmp_path: Path) -> None:
    mine = load_or_create_identity(tmp_path / "a")
    other = load_or_create_identity(tmp_path / "b")
    mine.cert_path.write_bytes(other.cert_pem)
    again = load_or_create_identity(tmp_path / "a")
    assert again.env_id == mine.env_id
    assert again.fingerprint != other.fingerprint
    cert = x509.load_pem_x509_certificate(again.cert_path.read_bytes())
    assert cert.public_key().public_bytes_raw() == mine.public_key_raw  # type: ignore[union-attr]


def test_unreadable_key_is_refused_not_replaced(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    ident.key_path.write_bytes(b"garbage")
    with pytest.raises(IdentityError, match="move it away") as info:
        load_or_create_identity(tmp_path)
    assert isinstance(info.value, PeerdError)
    assert ident.key_path.read_bytes() == b"garbage"


# --- environment ids -------------------------------------------------------------------------------


def test_luhn32_matches_syncthing_vectors() -> None:
    # From syncthing lib/protocol/deviceid_test.go: P56IOI7-MZJNU2Y-IQGDREY-DM2MGTI-...
    assert _luhn32("P56IOI7MZJNU2") == "Y"
    assert _luhn32("IQGDREYDM2MGT") == "I"
    assert _luhn32("MGL3BXNPQ6W5B") == "M"
    assert _luhn32("TBBZ4TJXZWICQ") == "2"


def test_env_id_format_and_check_chars(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    assert ident.env_id == env_id_from_public_key(ident.public_key_raw)
    for seed in range(50):
        raw = raw_key(seed)
        env_id = env_id_from_public_key(raw)
        assert ENV_ID_RE.match(env_id), env_id
        groups = env_id.split("-")
        body = base64.b32encode(hashlib.sha256(raw).digest()).decode()[:20]
        assert "".join(g[:5] for g in groups) == body
        assert all(g[5] == _luhn32(g[:5]) for g in groups)
        assert normalize_env_id(env_id) == env_id


def test_env_id_needs_a_32_byte_key() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        env_id_from_public_key(b"short")


def test_normalize_accepts_case_spacing_and_typos() -> None:
    # Find an id containing O, I and B so all three typo mappings are exercised.
    env_id = next(
        e for e in map(env_id_from_public_key, map(raw_key, range(10_000))) if {"O", "I", "B"} <= set(e)
    )
    typed = env_id.replace("O", "0").replace("I", "1").replace("B", "8")
    assert typed != env_id
    assert normalize_env_id(typed) == env_id
    assert normalize_env_id(env_id.lower()) == env_id
    assert normalize_env_id(env_id.replace("-", "")) == env_id
    assert normalize_env_id(f"  {env_id.replace('-', ' ').lower()}\n") == env_id


def test_normalize_rejects_every_single_changed_character() -> None:
    env_id = env_id_from_public_key(raw_key(7))
    compact = env_id.replace("-", "")
    for pos, ch in enumerate(compact):
        for replacement in (B32[(B32.index(ch) + 1) % 32], B32[(B32.index(ch) + 17) % 32]):
            broken = compact[:pos] + replacement + compact[pos + 1 :]
            with pytest.raises(InvalidRequest) as info:
                normalize_env_id(broken)
            group = pos // 6 + 1
            assert f"group {group}" in info.value.message
            assert "mistyped" in info.value.message


def test_invalid_env_id_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as info:
        normalize_env_id("ABCDEF")
    err = info.value
    assert isinstance(err, InvalidRequest)
    assert err.code == "invalid_request"
    assert err.to_wire()["code"] == "invalid_request"
    assert "expected 24" in err.message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("   - ", "empty"),
        ("ABCDEF-GHIJKL-MNOPQR-STUVW9", "'9'"),
        ("ABCDEF-GHIJKL-MNOPQR-STUV!X", "'!'"),
        ("ABCDEF-GHIJKL-MNOPQR-STUVWX-ABCDEF", "30 characters"),
    ],
)
def test_normalize_explains_malformed_ids(text: str, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(needle)):
        normalize_env_id(text)


def test_env_id_matches() -> None:
    raw = raw_key(1)
    env_id = env_id_from_public_key(raw)
    assert env_id_matches(env_id, raw)
    assert env_id_matches(env_id.lower().replace("-", ""), raw)
    assert not env_id_matches(env_id, raw_key(2))
    assert not env_id_matches("nonsense", raw)
    assert not env_id_matches(env_id, b"short")


# --- fingerprints ----------------------------------------------------------------------------------


def test_fingerprint_text_round_trip(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path)
    text = ident.fingerprint_text
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", text)
    assert text == format_fingerprint(ident.fingerprint)
    assert parse_fingerprint(text) == ident.fingerprint
    assert parse_fingerprint(f"  {text.upper()}  ") == ident.fingerprint
    plain = ident.fingerprint.hex()
    assert parse_fingerprint(plain) == ident.fingerprint
    assert parse_fingerprint(ident.fingerprint.hex(":").upper()) == ident.fingerprint  # openssl style
    assert parse_fingerprint("sha256:" + ident.fingerprint.hex(":")) == ident.fingerprint


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("sha1:" + "ab" * 20, "only sha256"),
        ("sha256:" + "ab" * 31, "64 hex"),
        ("ab" * 33, "64 hex"),
        ("zz" * 32, "64 hex"),
        ("", "64 hex"),
    ],
)
def test_parse_fingerprint_rejects_with_a_clear_message(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_fingerprint(text)


def test_pinned_fingerprint_is_cached_per_digest() -> None:
    fp = hashlib.sha256(b"peer").digest()
    pin = pinned_fingerprint(fp)
    assert isinstance(pin, aiohttp.Fingerprint)
    assert pinned_fingerprint(bytes(bytearray(fp))) is pin  # equal bytes, different object
    assert pinned_fingerprint(hashlib.sha256(b"other").digest()) is not pin
    with pytest.raises(ValueError, match="32 bytes"):
        pinned_fingerprint(b"\x00" * 20)


# --- real TLS ------------------------------------------------------------------------------------


def test_server_context_is_tls13_only(tmp_path: Path) -> None:
    ctx = server_ssl_context(load_or_create_identity(tmp_path))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def _whoami_app(ident: Identity) -> web.Application:
    async def whoami(request: web.Request) -> web.Response:
        assert request.transport is not None
        _, client_port = request.transport.get_extra_info("peername")[:2]
        return web.json_response({"env_id": ident.env_id, "client_port": client_port})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    return app


async def test_pinned_client_accepts_right_cert_and_rejects_wrong(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    server_id = load_or_create_identity(tmp_path / "server")
    other_id = load_or_create_identity(tmp_path / "other")
    server = await aiohttp_server(_whoami_app(server_id), ssl=server_ssl_context(server_id))
    url = server.make_url("/whoami")
    assert url.scheme == "https"

    async with aiohttp.ClientSession() as session:
        # The right pin: accepted without any CA, and one pooled connection serves both requests.
        ports = []
        for _ in range(2):
            async with session.get(url, ssl=pinned_fingerprint(server_id.fingerprint)) as resp:
                assert resp.status == 200
                body = await resp.json()
                assert body["env_id"] == server_id.env_id
                ports.append(body["client_port"])
        assert ports[0] == ports[1]

        # Another machine's pin: refused before any request is sent.
        with pytest.raises(aiohttp.ServerFingerprintMismatch) as info:
            async with session.get(url, ssl=pinned_fingerprint(other_id.fingerprint)):
                pass
        assert info.value.expected == other_id.fingerprint
        assert info.value.got == server_id.fingerprint


# --- the light reading (issue 33: a daemon without a network listener imports no cryptography) ---


def test_the_light_reading_is_the_full_one_and_reads_the_key_only_when_it_signs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    full = load_or_create_identity(home)
    light = load_or_create_identity(home, light=True)
    assert light == full  # env id, raw public key, the certificate's PEM and DER, the paths
    assert light.cert_pem == full.cert_pem and light.fingerprint == full.fingerprint
    assert light._key == []  # not parsed yet
    message = b"signed later"
    signature = light.private_key.sign(message)
    full.private_key.public_key().verify(signature, message)  # the same key, read on first use
    assert len(light._key) == 1


def test_the_light_reading_leaves_anything_else_to_the_full_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = load_or_create_identity(home, light=True)  # nothing there yet: made in full
    assert first._key, "a new identity is made by the full reading"
    first.cert_path.write_text("not a certificate\n")
    again = load_or_create_identity(home, light=True)  # rebuilt, as the full reading does
    assert again.env_id == first.env_id and again.cert_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    assert (
        x509.load_pem_x509_certificate(again.cert_path.read_bytes())
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        == again.public_key_raw
    )
    first.key_path.chmod(0o644)
    load_or_create_identity(home, light=True)
    assert mode(first.key_path) == 0o600  # tightened on the light path too
