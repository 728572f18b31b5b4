"""VMess, Trojan and VLESS nodes against a real v2ray server (TCP, TLS, WebSocket).

Each test builds the node from a share link, dials an echo server through it and
moves a payload both ways with a SHA-256 check; honk's mixed port carries curl
through each. Bad credentials and wrong server names end in typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time

import pytest
from helpers.inprocess import honk_via, leaf_from_link
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer, HttpOrigin

from honk.core.errors import DialError, HonkError
from honk.core.net import Address

STEP = 10.0
MiB = 1024 * 1024


async def _echo_through(leaf, echo: EchoServer, payload: bytes, read_timeout: float = STEP) -> bytes:
    dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
    reader, writer = await asyncio.open_connection(sock=dialed.sock)
    try:
        writer.write(payload)
        got = await asyncio.wait_for(reader.readexactly(len(payload)), read_timeout)
        return got
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.fixture
def trust(monkeypatch):
    def use(peer) -> None:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))

    return use


@pytest.mark.parametrize(("protocol", "transport"), [("trojan", "tcp"), ("vless", "tcp"), ("trojan", "ws"),
                                                     ("vless", "ws")])
def test_a_payload_crosses_both_ways_through_v2ray(run, trust, protocol, transport) -> None:
    with EchoServer() as echo, v2ray_server(protocol, transport=transport, tls=True) as peer:
        trust(peer)
        payload = os.urandom(4 * MiB)
        got = run(_echo_through(leaf_from_link(peer.share_link()), echo, payload))
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


@pytest.mark.parametrize("security", ["aes-128-gcm", "chacha20-poly1305", "none"])
@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_vmess_carries_a_payload_both_ways_with_each_security(run, security, transport) -> None:
    with EchoServer() as echo, v2ray_server("vmess", transport=transport, security=security) as peer:
        payload = os.urandom(4 * MiB)
        got = run(_echo_through(leaf_from_link(peer.share_link(security=security)), echo, payload))
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


def test_vmess_over_tls_and_websocket(run, trust) -> None:
    with EchoServer() as echo, v2ray_server("vmess", transport="ws", tls=True) as peer:
        trust(peer)
        payload = os.urandom(MiB)
        assert run(_echo_through(leaf_from_link(peer.share_link()), echo, payload)) == payload


@pytest.mark.parametrize("protocol", ["trojan", "vless", "vmess"])
def test_wrong_credentials_never_reach_the_target(run, trust, protocol) -> None:
    """The servers answer a wrong id or password with silence or a close (no protocol says "denied"):
    nothing of the echo comes back."""
    with EchoServer() as echo, v2ray_server(protocol, transport="tcp", tls=protocol != "vmess") as peer:
        if peer.tls:
            trust(peer)
        link = peer.share_link(uuid="00000000-0000-4000-8000-000000000000", password="not-the-password")
        with pytest.raises((HonkError, asyncio.IncompleteReadError, TimeoutError)):
            run(_echo_through(leaf_from_link(link), echo, b"secret bytes", read_timeout=2.0))


@pytest.mark.parametrize("protocol", ["trojan", "vless"])
def test_a_wrong_server_name_is_a_tls_name_error(run, trust, protocol) -> None:
    with EchoServer() as echo, v2ray_server(protocol, transport="tcp", tls=True) as peer:
        trust(peer)
        with pytest.raises(DialError) as info:
            run(_echo_through(leaf_from_link(peer.share_link(sni="other.example")), echo, b"x"))
        assert info.value.phase == "tls" and info.value.reason == "certificate-name"


@pytest.mark.parametrize("protocol", ["trojan", "vless", "vmess"])
def test_curl_through_honk_reaches_the_origin_via_v2ray(run, trust, protocol) -> None:
    async def main(link: str, origin: HttpOrigin) -> None:
        async with honk_via(link) as port:
            proc = await asyncio.create_subprocess_exec(
                "curl", "-sS", "--max-time", "10", "--socks5-hostname", f"127.0.0.1:{port}", origin.url("/v2"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            assert (proc.returncode, out) == (0, HttpOrigin.body_for("/v2")), err

    with HttpOrigin() as origin, v2ray_server(protocol, transport="tcp", tls=protocol != "vmess") as peer:
        if peer.tls:
            trust(peer)
        run(main(peer.share_link(), origin))
