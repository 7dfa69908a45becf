"""Fetching a client ID metadata document for real (peerd/api/client_metadata.py): an https server on
127.0.0.1 with its own certificate, which the fetcher is told to trust; private addresses allowed
here only because the server has to run on this machine."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from peerd.api.client_metadata import MAX_METADATA_BYTES, MetadataFetcher, client_from_document
from peerd.errors import InvalidClient


def certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metadata test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class Served:
    base: str
    trust: ssl.SSLContext
    answers: dict[str, web.Response | Any] = field(default_factory=dict)

    def fetcher(self) -> MetadataFetcher:
        return MetadataFetcher(allow_private=True, trust=self.trust)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    cert_path, key_path = certificate(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)
    answers: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        made = answers[request.path]
        return made() if callable(made) else web.json_response(made)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Served(f"https://127.0.0.1:{port}", ssl.create_default_context(cafile=str(cert_path)), answers)
    finally:
        await runner.cleanup()


async def test_a_document_that_names_itself_is_a_client(served: Served) -> None:
    url = served.base + "/agent.json"
    served.answers["/agent.json"] = {
        "client_id": url,
        "client_name": "Outside agent",
        "redirect_uris": ["http://127.0.0.1:3000/callback"],
    }
    client = client_from_document(url, await served.fetcher().fetch(url))
    assert client.name == "Outside agent" and client.redirect_uris == ("http://127.0.0.1:3000/callback",)


async def test_a_redirect_a_big_body_an_error_or_not_json_is_refused(served: Served) -> None:
    served.answers["/moved"] = lambda: web.Response(status=302, headers={"Location": "/agent.json"})
    served.answers["/big"] = lambda: web.Response(body=b"{" + b" " * MAX_METADATA_BYTES + b"}")
    served.answers["/gone"] = lambda: web.Response(status=404)
    served.answers["/text"] = lambda: web.Response(text="hello")
    served.answers["/list"] = lambda: web.json_response([1, 2])
    for path, said in (
        ("/moved", "answered 302"),
        ("/big", "larger than"),
        ("/gone", "answered 404"),
        ("/text", "not JSON"),
        ("/list", "not a JSON object"),
    ):
        with pytest.raises(InvalidClient, match=said):
            await served.fetcher().fetch(served.base + path)


async def test_without_the_owners_leave_this_machine_is_not_fetched_from(served: Served) -> None:
    served.answers["/agent.json"] = {"client_id": "x", "redirect_uris": []}
    fetcher = MetadataFetcher(allow_private=False, trust=served.trust)
    with pytest.raises(InvalidClient, match="does not fetch from"):
        await fetcher.fetch(served.base + "/agent.json")


async def test_an_untrusted_certificate_is_refused(served: Served) -> None:
    served.answers["/agent.json"] = {"client_id": "x", "redirect_uris": []}
    with pytest.raises(InvalidClient, match="could not be fetched"):
        await MetadataFetcher(allow_private=True).fetch(served.base + "/agent.json")
