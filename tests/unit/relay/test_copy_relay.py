"""CopyRelay over real loopback TCP socket pairs, on asyncio and uvloop.

Layout of every test: ``lan`` is the test's client socket, whose peer is
wrapped in a StreamConn the way an inbound hands it over; ``remote`` is the
test's origin socket, whose peer is the "dialed" upstream socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from helpers.sockets import reset, tcp_pair
from helpers.tls_rig import handshake

from honk.core.clock import FakeClock
from honk.core.errors import ClientGone, FlowClosed, HonkError, IdleTimeout, UpstreamFailed
from honk.proto.tls_framing import TlsFraming
from honk.proto.trojan import TrojanError, TrojanStreamWatch
from honk.relay import relay_engine
from honk.relay.copy import WRITE_HIGH_WATER, CopyRelay
from honk.relay.stream import StreamConn


class Rig:
    def __init__(self) -> None:
        self.lan, lan_peer = tcp_pair()
        self.remote, self.upstream = tcp_pair()
        self._lan_peer = lan_peer
        self.client: StreamConn | None = None
        self.clock = FakeClock()

    async def client_conn(self) -> StreamConn:
        conn = StreamConn(ClientGone)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=self._lan_peer)
        self.client = conn
        return conn

    def close(self) -> None:
        for sock in (self.lan, self.remote):
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
async def rig():
    r = Rig()
    yield r
    r.close()


async def _recv_until_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while chunk := await loop.sock_recv(sock, 65536):
        out += chunk
    return bytes(out)


async def test_relay_half_close_forwards_eof_and_keeps_the_other_direction(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))

    await loop.sock_sendall(rig.lan, b"question")
    rig.lan.shutdown(socket.SHUT_WR)
    assert await _recv_until_eof(rig.remote) == b"question"  # EOF reached the origin
    await loop.sock_sendall(rig.remote, b"the answer")
    rig.remote.shutdown(socket.SHUT_WR)

    assert await _recv_until_eof(rig.lan) == b"the answer"
    await asyncio.wait_for(run, 2)
    assert (relay.bytes_up, relay.bytes_down) == (8, 10)


async def test_relay_forwards_bytes_buffered_during_handshake_first(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    client = await rig.client_conn()
    await loop.sock_sendall(rig.lan, b"pipelined")
    assert await client.receive() == b"pipelined"
    client.unread(b"pipelined")  # what an inbound does with a codec's trailing bytes
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))

    await loop.sock_sendall(rig.lan, b"+more")
    rig.lan.shutdown(socket.SHUT_WR)
    received = await _recv_until_eof(rig.remote)
    rig.remote.shutdown(socket.SHUT_WR)
    await asyncio.wait_for(run, 2)

    assert received == b"pipelined+more"
    assert relay.bytes_up == len(received)


async def test_relay_propagates_client_eof_seen_before_takeover(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    client = await rig.client_conn()
    await loop.sock_sendall(rig.lan, b"early")
    rig.lan.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := await client.receive():  # read through to the EOF, as a slow handshake might
        data += chunk
    client.unread(data)
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))

    assert await _recv_until_eof(rig.remote) == b"early"
    rig.remote.shutdown(socket.SHUT_WR)
    await asyncio.wait_for(run, 2)


async def test_relay_counts_bytes_and_last_activity_on_the_clock(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    start = rig.clock.now()
    run = asyncio.ensure_future(relay.run(client, rig.upstream))
    rig.clock.advance(7)

    await loop.sock_sendall(rig.remote, b"x" * 1000)
    got = 0
    while got < 1000:
        got += len(await loop.sock_recv(rig.lan, 65536))

    assert relay.bytes_down == 1000
    assert relay.last_activity == start + 7
    relay.close()
    with pytest.raises(FlowClosed):
        await asyncio.wait_for(run, 2)


async def test_relay_reports_lan_reset_as_client_gone(rig: Rig) -> None:
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))
    await asyncio.sleep(0)

    reset(rig.lan)

    with pytest.raises(ClientGone):
        await asyncio.wait_for(run, 2)
    assert relay.bytes_up == relay.bytes_down == 0


async def test_relay_reports_upstream_reset_as_upstream_failed(rig: Rig) -> None:
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))
    await asyncio.sleep(0)

    reset(rig.remote)

    with pytest.raises(UpstreamFailed):
        await asyncio.wait_for(run, 2)
    # the client side is torn down too (an abort: EOF or reset, never more data)
    with contextlib.suppress(ConnectionResetError):
        assert await _recv_until_eof(rig.lan) == b""


@pytest.mark.parametrize("answered", [False, True], ids=["before-any-answer", "after-an-answer"])
async def test_a_tls_upstreams_reset_before_any_answer_is_the_refusal(rig: Rig, contexts, answered) -> None:
    """Trojan and VLESS servers reset when they refuse with bytes unread: before any plaintext that
    is the protocol's refusal (as the engines read it), after some an upstream failure."""
    client_obj, c_in, c_out, server, s_in, s_out = handshake(contexts)
    framing = TlsFraming(client_obj, c_in, c_out, TrojanStreamWatch())
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream, framing))
    loop = asyncio.get_running_loop()
    if answered:
        server.write(b"hi")
        await loop.sock_sendall(rig.remote, s_out.read())
        assert await asyncio.wait_for(loop.sock_recv(rig.lan, 2), 2) == b"hi"
    await loop.sock_sendall(rig.lan, b"request")  # reaches the server, which leaves it unread
    await asyncio.wait_for(loop.sock_recv(rig.remote, 1), 2)
    reset(rig.remote)
    with pytest.raises(HonkError) as info:
        await asyncio.wait_for(run, 2)
    if answered:
        assert isinstance(info.value, UpstreamFailed)
    else:
        assert isinstance(info.value, TrojanError) and info.value.reason == "closed-before-data"


async def test_relay_close_with_idle_timeout_ends_with_that_reason(rig: Rig) -> None:
    client = await rig.client_conn()
    relay = relay_engine(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))
    await asyncio.sleep(0)

    relay.close(IdleTimeout("quiet"))
    relay.close()  # idempotent; the first reason wins

    with pytest.raises(IdleTimeout):
        await asyncio.wait_for(run, 2)


async def test_relay_closed_before_it_runs_ends_at_once(rig: Rig) -> None:
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    relay.close()

    with pytest.raises(FlowClosed):
        await asyncio.wait_for(relay.run(client, rig.upstream), 2)


async def test_relay_client_gone_before_takeover_is_client_gone(rig: Rig) -> None:
    client = await rig.client_conn()
    reset(rig.lan)
    with contextlib.suppress(ClientGone):
        while await client.receive():
            pass
    relay = CopyRelay(rig.clock)

    with pytest.raises(ClientGone):
        await asyncio.wait_for(relay.run(client, rig.upstream), 2)


async def test_relay_backpressure_pauses_the_client_while_upstream_is_full(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    rig.remote.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    client = await rig.client_conn()
    relay = CopyRelay(rig.clock)
    run = asyncio.ensure_future(relay.run(client, rig.upstream))
    total = 16 * 1024 * 1024
    chunk = b"z" * (256 * 1024)

    async def blast() -> None:
        for _ in range(total // len(chunk)):
            await loop.sock_sendall(rig.lan, chunk)
        rig.lan.shutdown(socket.SHUT_WR)

    sender = asyncio.ensure_future(blast())
    # the origin does not read yet: the relay must stop reading the client
    for _ in range(50):
        await asyncio.sleep(0.01)
    transport = relay._upstream.transport  # noqa: SLF001 - observing the reference engine's buffer
    assert transport.get_write_buffer_size() <= WRITE_HIGH_WATER + 512 * 1024
    assert not sender.done()

    received = len(await _recv_until_eof(rig.remote))
    rig.remote.shutdown(socket.SHUT_WR)
    await asyncio.wait_for(sender, 5)
    await asyncio.wait_for(run, 5)
    assert received == total == relay.bytes_up
