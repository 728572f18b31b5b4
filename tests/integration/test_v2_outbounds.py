"""VMess, VLESS and Trojan nodes against a real v2ray server: every protocol x transport.

Each case runs honk's mixed port in the test's loop with one node from the peer's
share link: a SOCKS5 client moves 10 MiB up to an echo server and reads the same
10 MiB back (checked by SHA-256), and a SOCKS5 UDP client asks a local DNS
responder through the same node. curl fetches a page through each protocol.
Typed failures (credentials, certificates, foreign servers) are in
test_v2_failures.py; Mux.Cool's carrier behaviour in test_v2_mux.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest
from helpers.aio import close_writer, socks5_open
from helpers.dns import UdpDnsResponder
from helpers.inprocess import dns_through_honk, honk_via, leaf_from_link, open_through
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer, HttpOrigin

from honk.core.net import Address

STEP = 10.0
MiB = 1024 * 1024
PAYLOAD = 10 * MiB  # the interop payload, each way
DNS_NAME = "interop.honk.test"
DNS_ANSWER = "192.0.2.77"
MUX = (("mux", "1"),)

# (protocol, transport, TLS, Mux.Cool, VMess security): every combination v2ray serves.
CASES = [
    pytest.param("vmess", "tcp", False, False, "aes-128-gcm", id="vmess-tcp-aes128gcm"),
    pytest.param("vmess", "tcp", False, False, "chacha20-poly1305", id="vmess-tcp-chacha20"),
    pytest.param("vmess", "tcp", False, False, "none", id="vmess-tcp-none"),
    pytest.param("vmess", "tcp", True, False, "aes-128-gcm", id="vmess-tls"),
    pytest.param("vmess", "ws", False, False, "aes-128-gcm", id="vmess-ws"),
    pytest.param("vmess", "ws", True, False, "chacha20-poly1305", id="vmess-ws-tls"),
    pytest.param("vmess", "tcp", False, True, "aes-128-gcm", id="vmess-tcp-mux"),
    pytest.param("vless", "tcp", True, False, "", id="vless-tls"),
    pytest.param("vless", "ws", True, False, "", id="vless-ws-tls"),
    pytest.param("vless", "tcp", True, True, "", id="vless-tls-mux"),
    pytest.param("trojan", "tcp", True, False, "", id="trojan-tls"),
    pytest.param("trojan", "ws", True, False, "", id="trojan-ws-tls"),
]


@pytest.fixture
def trust(monkeypatch):
    def use(peer) -> None:
        if peer.tls:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))

    return use


def _server(protocol: str, transport: str, tls: bool, mux: bool, security: str):
    return v2ray_server(protocol, transport=transport, tls=tls, mux=mux, security=security or "aes-128-gcm")


async def _echo_via_honk(port: int, echo: EchoServer, payload: bytes) -> bytes:
    """``payload`` up through a SOCKS5 CONNECT to the echo server while reading its echo back."""
    reader, writer, code, _ = await socks5_open(port, "127.0.0.1", echo.port)
    assert code == 0

    async def upload() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    try:
        sending = asyncio.ensure_future(upload())
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 6 * STEP)
        await sending
        return got
    finally:
        await close_writer(writer)


async def _connections_for_two_flows(port: int, echo: EchoServer, peer) -> int:  # noqa: ANN001
    """How many connections to the v2ray server two open flows through honk hold (one carrier with mux)."""
    flows = [await socks5_open(port, "127.0.0.1", echo.port) for _ in range(2)]
    try:
        for reader, writer, code, _ in flows:
            assert code == 0
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"ping"
        return peer.carriers()
    finally:
        for _, writer, _, _ in flows:
            await close_writer(writer)


@pytest.mark.parametrize(("protocol", "transport", "tls", "mux", "security"), CASES)
def test_ten_mib_each_way_and_a_dns_query_cross_honk_through_v2ray(
    run, trust, protocol, transport, tls, mux, security
) -> None:
    payload = os.urandom(PAYLOAD)
    params = MUX if mux else ()

    async def main(link: str, echo: EchoServer, dns: UdpDnsResponder) -> None:
        async with honk_via(link, params=params) as port:
            assert await _connections_for_two_flows(port, echo, peer) == (1 if mux else 2)
            got = await _echo_via_honk(port, echo, payload)
        assert len(got) == len(payload)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload).hexdigest()
        assert await dns_through_honk(link, dns.address, DNS_NAME, 21, params=params) == (21, 0, [DNS_ANSWER])

    with (
        EchoServer() as echo,
        UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns,
        _server(protocol, transport, tls, mux, security) as peer,
    ):
        trust(peer)
        run(main(peer.share_link(), echo, dns))
        assert peer.accepted()  # the flows went through this v2ray, not around it


@pytest.mark.parametrize("security", ["aes-128-gcm", "chacha20-poly1305", "none"])
def test_vmess_on_plain_tcp_is_framed_by_the_relay_engine(run, security) -> None:
    """No bridge on plain TCP: the dial hands the relay the server's own socket and the VMess body framing."""

    async def main(link: str, echo: EchoServer) -> None:
        leaf = leaf_from_link(link)
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        try:
            assert dialed.framing is not None and dialed.framing.kind == "vmess"
            assert dialed.sock.getpeername()[1] == peer.port
        finally:
            dialed.sock.close()
        sock = await open_through(leaf, Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"hello over a framed socket")
        writer.write_eof()  # the empty chunk, then the FIN: v2ray half-closes toward the echo server
        assert await asyncio.wait_for(reader.read(), STEP) == b"hello over a framed socket"
        await close_writer(writer)

    with EchoServer() as echo, v2ray_server("vmess", security=security) as peer:
        run(main(peer.share_link(), echo))


@pytest.mark.parametrize("protocol", ["trojan", "vless", "vmess"])
def test_curl_through_honk_reaches_the_origin_via_v2ray(run, trust, protocol) -> None:
    async def main(link: str, origin: HttpOrigin) -> None:
        async with honk_via(link) as port:
            proc = await asyncio.create_subprocess_exec(
                "curl",
                "-sS",
                "--max-time",
                "10",
                "--socks5-hostname",
                f"127.0.0.1:{port}",
                origin.url("/v2"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            assert (proc.returncode, out) == (0, HttpOrigin.body_for("/v2")), err

    with HttpOrigin() as origin, v2ray_server(protocol, transport="tcp", tls=protocol != "vmess") as peer:
        trust(peer)
        run(main(peer.share_link(), origin))
