"""Shadowsocks nodes against shadowsocks-libev's ss-server, for every AEAD cipher, on asyncio and uvloop.

The outbound dials and sends the target header; the test then plays the relay:
it seals and opens the rest of the stream with the framing the dial returned.
Behaviour no packaged server shows on demand (a forged UDP reply, the exact
first bytes on the wire) is checked against small loopback sockets here.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import select
import socket
import time

import pytest
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.peerservers import SS_METHODS, ss_server
from helpers.servers import EchoServer

from honk.config.links import parse_node_link
from honk.config.spec import GlobalSpec, NodeSpec, Spec
from honk.core.clock import MonotonicClock
from honk.core.errors import ConfigRefused, DialError, DialTimeout, HonkError
from honk.core.net import Address
from honk.outbound.base import DialedStream
from honk.outbound.registry import build_outbounds
from honk.outbound.runtime import NodeRuntime
from honk.outbound.shadowsocks import HEADER_CACHE_SIZE, ShadowsocksOutbound
from honk.proto.shadowsocks import (
    CIPHERS,
    StreamDecryptor,
    encode_address,
    master_key,
    open_packet,
    seal_packet,
)

STEP = 5.0  # seconds any single wait may take
QUIET = 0.5  # seconds a silent server is watched for a byte that must not come
PASSWORD = "honk-test-pw"
DNS_NAME = "ss.honk.test"
DNS_ANSWER = "192.0.2.66"
MIB = 1 << 20


def _leaf(method: str, host: str, port: int, password: str = PASSWORD) -> ShadowsocksOutbound:
    node = NodeSpec("ss-node", "ss", host, port, password=password, encryption=method)
    leaf = ShadowsocksOutbound(node, GlobalSpec(connect_timeout=2.0), MonotonicClock())
    leaf.runtime = NodeRuntime(node.id, node.name)
    return leaf


async def _read_plain(dialed: DialedStream, size: int) -> bytes:
    """Open the server's direction until ``size`` plaintext bytes arrived (or EOF)."""
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < size:
        data = await asyncio.wait_for(loop.sock_recv(dialed.sock, 256 * 1024), STEP)
        if not data:
            break
        out += dialed.framing.decryptor.feed(data)
    return bytes(out)


async def _echo(dialed: DialedStream, payload: bytes) -> bytes:
    """Send ``payload`` sealed and read the echo, concurrently (a large payload would fill the buffers)."""
    loop = asyncio.get_running_loop()
    wire = dialed.framing.encryptor.encrypt(payload)
    sending = loop.create_task(loop.sock_sendall(dialed.sock, wire))
    try:
        return await _read_plain(dialed, len(payload))
    finally:
        await asyncio.wait_for(sending, STEP)


# --- TCP through ss-server ---------------------------------------------------------------


@pytest.mark.parametrize("method", SS_METHODS)
def test_dial_tcp_echoes_through_ss_server_including_one_mib(run, method) -> None:
    async def scenario(leaf: ShadowsocksOutbound, echo: EchoServer) -> None:
        clock = MonotonicClock()
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), clock.now() + STEP)
        with dialed.sock:
            framing = dialed.framing
            # the salt and the one header chunk (length + payload) are spent; nothing read yet
            assert framing.cipher == method and framing.encryptor.salt_sent and framing.encryptor.nonce == 2
            assert framing.decryptor.nonce == 0 and framing.decryptor.salt is None
            assert await _echo(dialed, b"hello through shadowsocks") == b"hello through shadowsocks"
            big = os.urandom(MIB)
            echoed = await _echo(dialed, big)
            assert hashlib.sha256(echoed).digest() == hashlib.sha256(big).digest()
        assert leaf.runtime.dials["ok"] == 1

    with ss_server(method, PASSWORD, udp=False) as peer, EchoServer() as echo:
        run(scenario(_leaf(method, peer.host, peer.port), echo))


def test_dial_reaches_a_domain_target_through_ss_server(run) -> None:
    async def scenario(leaf: ShadowsocksOutbound, echo: EchoServer) -> None:
        dialed = await leaf.dial_tcp(Address("localhost", echo.port), time.monotonic() + STEP)
        with dialed.sock:
            assert await _echo(dialed, b"by name") == b"by name"

    # ss-server resolves the name itself, IPv4 first unless started with -6
    with ss_server("aes-128-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
        run(scenario(_leaf("aes-128-gcm", peer.host, peer.port), echo))


def test_a_node_from_a_share_link_is_built_by_the_registry_and_dials(run) -> None:
    async def scenario(leaf, echo: EchoServer) -> None:
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        with dialed.sock:
            assert await _echo(dialed, b"registry") == b"registry"

    with ss_server("chacha20-ietf-poly1305", "p@ss:w/rd", udp=False) as peer, EchoServer() as echo:
        link = f"ss://chacha20-ietf-poly1305:p%40ss%3Aw%2Frd@{peer.host}:{peer.port}#hk"
        spec = Spec(nodes=(parse_node_link(link),))
        outbounds, _ = build_outbounds(spec, MonotonicClock())
        leaf = outbounds["hk"]
        assert isinstance(leaf, ShadowsocksOutbound)
        assert leaf.capabilities.tcp and leaf.capabilities.udp and leaf.supports_udp
        run(scenario(leaf, echo))


def test_wrong_password_gets_silence_and_then_eof_never_bytes_or_an_auth_error(run) -> None:
    """Pinned ss-server 3.3.5 behaviour: after a tag fails it neither answers nor
    closes (probe resistance) until the client half-closes; then it closes at
    once. honk therefore sees EOF, never data it could fail to authenticate."""

    async def scenario(leaf: ShadowsocksOutbound, echo: EchoServer) -> None:
        loop = asyncio.get_running_loop()
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        with dialed.sock:
            await loop.sock_sendall(dialed.sock, dialed.framing.encryptor.encrypt(b"knock knock"))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(loop.sock_recv(dialed.sock, 1024), QUIET)
            dialed.sock.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(loop.sock_recv(dialed.sock, 1024), STEP) == b""
            assert dialed.framing.decryptor.nonce == 0  # nothing was ever opened
        assert leaf.runtime.dials["ok"] == 1  # Shadowsocks cannot tell at dial time

    with ss_server("aes-256-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
        run(scenario(_leaf("aes-256-gcm", peer.host, peer.port, password="not-the-password"), echo))


def test_dial_sends_the_salt_and_one_header_chunk_at_once(run) -> None:
    async def scenario(leaf: ShadowsocksOutbound, server: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        target = Address("example.com", 443)
        dialed = await leaf.dial_tcp(target, time.monotonic() + STEP)
        peer, _ = await asyncio.wait_for(loop.sock_accept(server), STEP)
        with dialed.sock, peer:
            header = encode_address(target)
            spec = CIPHERS["aes-128-gcm"]
            expected = spec.salt_size + (2 + spec.tag_size) + (len(header) + spec.tag_size)
            wire = b""
            while len(wire) < expected:
                wire += await asyncio.wait_for(loop.sock_recv(peer, 4096), STEP)
            assert len(wire) == expected  # nothing beyond the header chunk
            server_side = StreamDecryptor("aes-128-gcm", master_key(PASSWORD, spec.key_size))
            assert server_side.feed(wire) == header and server_side.nonce == 2
            assert wire[: spec.salt_size] == dialed.framing.encryptor.salt

    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        run(scenario(_leaf("aes-128-gcm", "127.0.0.1", server.getsockname()[1]), server))


def test_server_down_is_a_typed_connect_error_within_the_deadline(run) -> None:
    async def scenario(leaf: ShadowsocksOutbound) -> None:
        start = time.monotonic()
        with pytest.raises(DialError) as info:
            await leaf.dial_tcp(Address("127.0.0.1", 9), start + STEP)
        assert time.monotonic() - start < STEP
        assert info.value.phase == "connect" and not isinstance(info.value, DialTimeout)
        assert PASSWORD not in str(info.value)
        assert leaf.runtime.dials["connect"] == 1

    with socket.socket() as hole:  # bound, never listening: connecting is refused
        hole.bind(("127.0.0.1", 0))
        run(scenario(_leaf("aes-256-gcm", "127.0.0.1", hole.getsockname()[1])))


def test_a_node_with_an_unsupported_cipher_refuses_to_dial(run) -> None:
    async def scenario(leaf: ShadowsocksOutbound) -> None:
        with pytest.raises(ConfigRefused):
            await leaf.dial_tcp(Address("127.0.0.1", 1), time.monotonic() + STEP)
        with pytest.raises(ConfigRefused):
            await leaf.dial_udp(lambda payload, source: None, time.monotonic() + STEP)

    with socket.create_server(("127.0.0.1", 0)) as server:
        leaf = _leaf("rc4-md5", "127.0.0.1", server.getsockname()[1])
        run(scenario(leaf))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing even tried to connect
            server.accept()


def test_engine_plans_carry_each_targets_header_and_a_fresh_framing_with_a_bounded_cache() -> None:
    """The engine's dial of a flow: the server, the target's address header (encoded once per
    target and kept, at most HEADER_CACHE_SIZE of them) and a framing of its own per flow."""
    leaf = _leaf("aes-256-gcm", "127.0.0.1", 8388)
    first = leaf.engine_plan(Address("example.com", 443))
    again = leaf.engine_plan(Address("EXAMPLE.com.", 443))  # the same target, as normalised
    other = leaf.engine_plan(Address("192.0.2.7", 80))
    assert (first.ip, first.port) == ("127.0.0.1", 8388)
    assert first.head == again.head == encode_address(Address("example.com", 443))
    assert other.head == encode_address(Address("192.0.2.7", 80))
    assert first.framing is not again.framing and first.framing.fresh and again.framing.fresh
    for port in range(1, HEADER_CACHE_SIZE + 10):
        plan = leaf.engine_plan(Address("10.0.0.1", port))
        assert plan.head == encode_address(Address("10.0.0.1", port))
        assert len(leaf._headers) <= HEADER_CACHE_SIZE
    with pytest.raises(DialError):  # a name a Shadowsocks header cannot hold: Python's dial says why
        leaf._opening(Address("a" * 256, 80))
    assert leaf.engine_plan(Address("a" * 256, 80)) is None


# --- UDP -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", SS_METHODS)
def test_dial_udp_carries_a_dns_query_through_ss_server(run, method) -> None:
    async def scenario(leaf: ShadowsocksOutbound, dns: UdpDnsResponder) -> None:
        answers: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue()
        endpoint = await leaf.dial_udp(lambda p, s: answers.put_nowait((p, s)), time.monotonic() + STEP)
        try:
            endpoint.send(build_query(DNS_NAME, 0x5151), Address(dns.host, dns.port))
            payload, source = await asyncio.wait_for(answers.get(), STEP)
        finally:
            endpoint.close()
        assert source == Address(dns.host, dns.port)
        assert parse_answer(payload) == (0x5151, 0, [DNS_ANSWER])
        assert endpoint.auth_failures == 0 and endpoint.dropped == 0

    with ss_server(method, PASSWORD, udp=True) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(scenario(_leaf(method, peer.host, peer.port), dns))


def test_udp_replies_that_fail_authentication_are_dropped_and_counted(run) -> None:
    """A loopback socket plays the server: it checks what the endpoint sealed, then
    answers with a forged reply, a malformed one and a good one, in that order."""
    method = "aes-256-gcm"
    master = master_key(PASSWORD, CIPHERS[method].key_size)
    source = Address("198.51.100.7", 5353)

    async def scenario(leaf: ShadowsocksOutbound, server: socket.socket) -> None:
        got: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue()
        lost: list[HonkError | None] = []
        endpoint = await leaf.dial_udp(
            lambda p, s: got.put_nowait((p, s)), time.monotonic() + STEP, lost.append
        )
        try:
            endpoint.send(b"question", Address("203.0.113.9", 53))
            # in a thread: uvloop has no sock_recvfrom (the socket's own timeout bounds it)
            packet, client = await asyncio.to_thread(server.recvfrom, 2048)
            assert (
                open_packet(method, master, packet)
                == encode_address(Address("203.0.113.9", 53)) + b"question"
            )
            forged = seal_packet(method, master_key("guess", 32), encode_address(source) + b"forged")
            malformed = seal_packet(method, master, b"\x09garbage")
            good = seal_packet(method, master, encode_address(source) + b"answer")
            for reply in (forged, malformed, good):
                server.sendto(reply, client)
            assert await asyncio.wait_for(got.get(), STEP) == (b"answer", source)
            assert got.empty()
            assert (endpoint.auth_failures, endpoint.dropped) == (1, 1)
        finally:
            endpoint.close()
        assert endpoint.closed and lost == [None]  # closed by its owner
        endpoint.send(b"after close", source)  # a no-op, not an error

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(STEP)
        run(scenario(_leaf(method, "127.0.0.1", server.getsockname()[1]), server))


def test_the_udp_endpoint_belongs_to_its_association_not_to_the_node_runtime(run) -> None:
    async def scenario(leaf: ShadowsocksOutbound) -> None:
        lost: list[HonkError | None] = []
        endpoint = await leaf.dial_udp(lambda p, s: None, time.monotonic() + STEP, lost.append)
        assert leaf.runtime.open_resources == 0
        leaf.runtime.close()  # retiring a node never cuts a live association
        assert not endpoint.closed and lost == []
        endpoint.close()
        assert endpoint.closed and lost == [None]

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        run(scenario(_leaf("aes-128-gcm", "127.0.0.1", server.getsockname()[1])))


def test_dial_udp_resolves_a_server_name_and_sends_there(run) -> None:
    """``localhost`` goes through the node's resolver; a socket on each loopback that
    ``localhost`` names catches the packet, whichever address comes first."""
    method = "chacha20-ietf-poly1305"
    master = master_key(PASSWORD, CIPHERS[method].key_size)
    names = {info[4][0] for info in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}
    sockets = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as v4:
        v4.bind(("127.0.0.1", 0))
        port = v4.getsockname()[1]
        sockets.append(v4)
        if "::1" in names:
            v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            v6.bind(("::1", port))
            sockets.append(v6)

        async def scenario(leaf: ShadowsocksOutbound) -> bytes:
            endpoint = await leaf.dial_udp(lambda p, s: None, time.monotonic() + STEP)
            try:
                endpoint.send(b"ping", Address("192.0.2.1", 7))
                readable, _, _ = await asyncio.to_thread(select.select, sockets, [], [], STEP)
                assert readable, "no packet reached the server's address"
                return readable[0].recv(2048)
            finally:
                endpoint.close()

        try:
            packet = run(scenario(_leaf(method, "localhost", port)))
        finally:
            for s in sockets[1:]:
                s.close()
    assert open_packet(method, master, packet) == encode_address(Address("192.0.2.1", 7)) + b"ping"
