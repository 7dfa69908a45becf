"""The console starts and stops with the daemon: a live stream ends at shutdown within a second
or so, requests while it stops are answered 503, and a console with its own certificate serves
HTTPS (also the only way off loopback)."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from peerd.config import Config, ConsoleConfig
from peerd.daemon import Daemon, DaemonConfig
from peerd.errors import InvalidRequest
from tests.helpers import client_for, make_repo, running_daemon, script
from tests.realcli import signal_dir
from tests.support.console import console_settings, login_url


async def signed_in_session(daemon: Daemon, trust: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """An HTTP client holding a console session (the cookie as a plain one: aiohttp would keep a
    `Secure` cookie for https only)."""
    connector = aiohttp.TCPConnector(ssl=trust) if trust is not None else None
    async with aiohttp.ClientSession(connector=connector) as once, once.get(await login_url(daemon)) as resp:
        assert resp.status == 200
        cookies = {name: morsel.value for name, morsel in resp.cookies.items()}
    assert cookies
    connector = aiohttp.TCPConnector(ssl=trust) if trust is not None else None
    return aiohttp.ClientSession(cookies=cookies, connector=connector)


async def test_a_live_stream_ends_when_the_daemon_stops(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with signal_dir() as signals:
        daemon = Daemon(
            DaemonConfig(home=tmp_path / "home", label="laptop", listen=None, settings=console_settings())
        )
        await daemon.start()
        stopped = False
        try:
            async with client_for(daemon.paths.home) as client:
                project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
                prompt = script({"reply": "hello"}, {"wait_for_file": str(signals / "never")})
                launched = await client.call(
                    "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt}
                )
            assert daemon.console is not None and daemon.console.url is not None
            url = f"{daemon.console.url}/threads/here/{launched['threadId']}/stream?after=-1"
            http = await signed_in_session(daemon)
            try:
                async with http.get(url) as stream:
                    assert stream.status == 200
                    assert stream.headers["Content-Type"].startswith("text/event-stream")
                    first = await asyncio.wait_for(stream.content.readuntil(b"event: item"), 10)
                    assert b"retry:" in first
                    loop = asyncio.get_running_loop()
                    started = loop.time()
                    shutdown = asyncio.create_task(daemon.shutdown())
                    await asyncio.wait_for(stream.content.read(), 5)  # the stream ends
                    ended = loop.time() - started
                    await asyncio.wait_for(shutdown, 15)
                    stopped = True
                    assert ended < 3.0, f"the stream outlived the shutdown by {ended:.1f} s"
            finally:
                await http.close()
        finally:
            if not stopped:
                await daemon.shutdown()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "console.crt", tmp_path / "console.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


async def test_a_console_with_a_certificate_serves_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls = Config(console=ConsoleConfig(listen="127.0.0.1:0", tls_cert=str(cert), tls_key=str(key)))
    async with running_daemon(tmp_path / "home", settings=tls) as daemon:
        assert daemon.console is not None and daemon.console.url is not None
        assert daemon.console.url.startswith("https://127.0.0.1:")
        trust = ssl.create_default_context(cafile=str(cert))
        trust.check_hostname = False
        http = await signed_in_session(daemon, trust)
        try:
            async with http.get(daemon.console.url + "/tasks") as resp:
                assert resp.status == 200 and "<h1>Tasks</h1>" in await resp.text()
        finally:
            await http.close()


async def test_a_console_off_loopback_without_tls_stops_the_start(tmp_path: Path) -> None:
    wide = Config(console=ConsoleConfig(listen="0.0.0.0:0"))
    with pytest.raises(InvalidRequest, match="without TLS"):
        async with running_daemon(tmp_path / "home", settings=wide):
            pass


async def test_requests_while_it_stops_are_answered_503(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home", settings=console_settings()) as daemon:
        http = await signed_in_session(daemon)
        try:
            await daemon.gate.close(grace=0.0)
            assert daemon.console is not None and daemon.console.url is not None
            async with http.get(daemon.console.url + "/threads") as resp:
                assert resp.status == 503
                assert "shutting down" in await resp.text()
        finally:
            await http.close()
