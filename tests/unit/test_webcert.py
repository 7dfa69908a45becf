"""The listener's certificate for browsers (peerd/peer/webcert.py): made once, kept, renewed near
its end; the owner's used as given; a wrong one refused at start in one sentence."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from peerd import config
from peerd.core.tls_hello import Cert
from peerd.errors import ConfigInvalid
from peerd.peer import webcert
from peerd.peer.identity import load_or_create_identity


def test_peerd_makes_one_ecdsa_certificate_and_keeps_it(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path)
    first = webcert.load_web_certificate(tmp_path, identity.env_id)
    assert not first.own
    assert stat.S_IMODE(first.key_path.stat().st_mode) == 0o600
    leaf = x509.load_pem_x509_certificate(first.cert_path.read_bytes())
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    assert leaf.not_valid_after_utc - datetime.now(UTC) <= webcert.WEB_CERT_VALIDITY
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    again = webcert.load_web_certificate(tmp_path, identity.env_id)
    assert again.fingerprint_text == first.fingerprint_text != identity.fingerprint_text
    tls = webcert.server_tls(identity, again)
    assert tls.web is not None
    assert tls.for_cert(Cert.WEB) is tls.web and tls.for_cert(Cert.IDENTITY) is tls.identity


def test_a_certificate_near_its_end_or_not_over_its_key_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = load_or_create_identity(tmp_path)
    monkeypatch.setattr(webcert, "WEB_CERT_VALIDITY", timedelta(days=20))
    short = webcert.load_web_certificate(tmp_path, identity.env_id)
    monkeypatch.undo()
    renewed = webcert.load_web_certificate(tmp_path, identity.env_id)
    assert renewed.fingerprint_text != short.fingerprint_text, "within 30 days of its end: renewed"
    renewed.key_path.write_bytes(identity.key_path.read_bytes())  # an Ed25519 key: not a web one
    rebuilt = webcert.load_web_certificate(tmp_path, identity.env_id)
    assert rebuilt.fingerprint_text != renewed.fingerprint_text


def test_the_owners_certificate_is_used_as_given_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path / "home")
    made = webcert.load_web_certificate(tmp_path / "made", identity.env_id)
    own = webcert.load_web_certificate(
        tmp_path / "home", identity.env_id, cert=str(made.cert_path), key=str(made.key_path)
    )
    assert own.own and own.fingerprint_text == made.fingerprint_text
    assert not (tmp_path / "home" / "identity" / "web-cert.pem").exists(), "nothing written"
    with pytest.raises(ConfigInvalid, match=r"web_cert .* cannot be read"):
        webcert.load_web_certificate(tmp_path, identity.env_id, cert=str(tmp_path / "none.crt"), key="k")
    mismatched = webcert.WebCertificate(made.cert_path, identity.key_path, made.fingerprint_text, own=True)
    with pytest.raises(ConfigInvalid, match="web certificate or its key cannot be loaded"):
        webcert.server_tls(identity, mismatched)


def test_config_takes_both_web_files_or_neither(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('web_cert = "/etc/box.crt"\n')
    with pytest.raises(ConfigInvalid, match="both web_cert and web_key"):
        config.load(path)
    path.write_text('web_cert = "/etc/box.crt"\nweb_key = "/etc/box.key"\n')
    assert config.load(path).web_key == "/etc/box.key"
