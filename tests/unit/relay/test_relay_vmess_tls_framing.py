"""VMess inside TLS (a ``TlsFraming`` whose ``response`` is a ``VmessFraming``), and inside
WebSocket inside TLS, through the relay engines and the copy relays.

The handshake is made in memory before the flow starts (as ``tls_handshake`` leaves it);
the test then plays a v2ray-style server over ``srv``: its own server-side SSLObject opens
the records (and, over WebSocket, unmasks the frames), and the VMess server codec of
``helpers.vmess_rig`` opens the request chunks inside and seals the response. The compiled
worker seals and opens the chunks in C between SSL_write/SSL_read and the sockets; the
twin and the copy relays go through the framing's encryptor and decryptor. Both engines
must give the same answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from typing import Any

import pytest
from helpers.engines import (
    ENGINES,
    RELAYS,
    STEP,
    Recorder,
    engine_class,
    framed_rig,
    recv_exactly,
    recv_until_eof,
    relay_flow,
    upstream_failure,
)
from helpers.sockets import tcp_pair
from helpers.tls_rig import (
    TlsServer,
    WsServer,
    dial_through_engine,
    handshake,
    server_frame,
    server_handshake,
    tls_maker,
)
from helpers.vmess_rig import VmessServer, vmess_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk._fast import relay_py
from honk.core.errors import ClientGone
from honk.proto import websocket
from honk.proto.tls_framing import TlsFraming, TlsStreamError
from honk.proto.vmess import MAX_PAYLOAD, VmessAuthError, VmessFraming, VmessProtocolError
from honk.relay.stream import StreamConn

MiB = 1024**2
SECURITIES = ["aes-128-gcm", "chacha20-poly1305", "none"]
CARRIERS = ["tls", "ws"]  # VMess over TLS, VMess over WebSocket over TLS


class _VmessInside:
    """The VMess server inside a TLS (or WebSocket) server end: ``take`` opens the client's
    chunks from the plaintext, ``send_vmess`` sends VMess wire bytes as the carrier's payload."""

    vmess: VmessServer
    websocket = False

    def take(self, data: bytes) -> bytes:
        return self.vmess.take(super().take(data))  # type: ignore[misc]

    async def send_vmess(self, wire: bytes, *, records: int = 1) -> None:
        """``wire`` in ``records`` records (cut evenly, anywhere: inside a chunk, its length, ...)."""
        step = max(1, -(-len(wire) // records))
        for i in range(0, len(wire), step):
            part = wire[i : i + step]
            await self.send(server_frame(websocket.OP_BINARY, part) if self.websocket else part)  # type: ignore[attr-defined]


class VmessTlsServer(_VmessInside, TlsServer):
    pass


class VmessWsServer(_VmessInside, WsServer):
    websocket = True


def vmess_maker(contexts, security: str = "aes-128-gcm", carrier: str = "tls"):
    """``make(srv)`` for a framed rig: the handshake done in memory, then a fresh VMess body."""

    def ready(server: Any, framing: TlsFraming) -> None:
        server.vmess = VmessServer(server.sock, framing.inner.encryptor)

    return tls_maker(
        contexts,
        lambda: VmessFraming(vmess_client(security)),
        websocket=carrier == "ws",
        server_type=VmessWsServer if carrier == "ws" else VmessTlsServer,
        ready=ready,
    )


def answer(server: Any, data: bytes, *, end: bool = False) -> bytes:
    """The server's VMess response: its header, ``data`` in chunks, and the ending chunk."""
    vmess = server.vmess
    return vmess.header() + vmess.chunks(data) + (vmess.response.seal(b"") if end else b"")


# --- data both ways ---------------------------------------------------------------------


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("security", SECURITIES)
async def test_a_vmess_body_moves_both_ways_inside_the_records(engine, contexts, security, carrier) -> None:
    up, down = os.urandom(3 * MiB + 7), os.urandom(2 * MiB + 11)
    loop = asyncio.get_running_loop()
    with framed_rig(engine, vmess_maker(contexts, security, carrier), pair=tcp_pair) as r:
        send_up = loop.create_task(loop.sock_sendall(r.lan, up))
        send_down = loop.create_task(r.server.send_vmess(answer(r.server, down), records=40))
        got_up, got_down = await asyncio.gather(
            r.server.recv_plain(len(up)), asyncio.wait_for(recv_exactly(r.lan, len(down)), 4 * STEP)
        )
        await asyncio.wait_for(asyncio.gather(send_up, send_down), STEP)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()
        assert engine.counters(r.id)[0] == len(up)  # plaintext from the client


@pytest.mark.parametrize("carrier", CARRIERS)
async def test_the_preamble_is_the_first_chunk_and_later_bytes_follow(engine, contexts, carrier) -> None:
    early = os.urandom(MAX_PAYLOAD + 100)  # two chunks
    with framed_rig(engine, vmess_maker(contexts, carrier=carrier), preamble=early) as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"later")
        assert await r.server.recv_plain(len(early) + 5) == early + b"later"


async def test_client_eof_sends_the_ending_chunk_then_close_notify_and_the_server_may_answer(
    engine, contexts
) -> None:
    with framed_rig(engine, vmess_maker(contexts)) as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"last words")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == b"last words"
        assert r.server.vmess.ended and r.server.close_notify
        await r.server.send_vmess(answer(r.server, b"answer", end=True))
        await r.server.close_notify_and_fin()
        assert await recv_until_eof(r.lan) == b"answer"
        assert (await r.rec.end())[0] == relay_py.END_CLEAN


async def test_over_websocket_client_eof_sends_the_ending_chunk_and_no_close(engine, contexts) -> None:
    loop = asyncio.get_running_loop()
    with framed_rig(engine, vmess_maker(contexts, carrier="ws")) as r:
        await loop.sock_sendall(r.lan, b"last words")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_plain(10) == b"last words"
        while not r.server.vmess.ended:  # the ending chunk comes in a frame of its own
            data = await asyncio.wait_for(loop.sock_recv(r.srv, 1 << 16), STEP)
            assert data, "the upstream was closed: WebSocket has no half-close"
            assert r.server.take(data) == b""
        assert not r.server.close_notify
        await r.server.send_vmess(answer(r.server, b"answer", end=True))
        await r.server.close_notify_and_fin()
        assert await recv_until_eof(r.lan) == b"answer"
        assert (await r.rec.end())[0] == relay_py.END_CLEAN


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    engine_name=st.sampled_from(ENGINES),
    sizes=st.lists(st.integers(min_value=1, max_value=0xFFFF - 16), min_size=1, max_size=3),
    records=st.integers(min_value=1, max_value=40),
    carrier=st.sampled_from(CARRIERS),
)
def test_any_cut_of_the_vmess_stream_across_records_opens_to_the_same_bytes(
    contexts, engine_name, sizes, records, carrier
) -> None:
    async def main() -> None:
        engine = engine_class(engine_name)(asyncio.get_running_loop())
        try:
            with framed_rig(engine, vmess_maker(contexts, carrier=carrier)) as r:
                pieces = [os.urandom(n) for n in sizes]
                vmess = r.server.vmess
                await r.server.send_vmess(
                    vmess.header() + b"".join(vmess.response.seal(p) for p in pieces), records=records
                )
                assert await recv_exactly(r.lan, sum(sizes)) == b"".join(pieces)
        finally:
            engine.close()

    asyncio.run(main())


# --- what the server sends wrong ------------------------------------------------------------


@pytest.mark.parametrize("carrier", CARRIERS)
async def test_a_response_to_another_request_is_an_auth_failure_that_reaches_no_client(
    engine, contexts, carrier
) -> None:
    with framed_rig(engine, vmess_maker(contexts, carrier=carrier)) as r:
        check = (r.framing.inner.encryptor.response_check + 1) % 256
        await r.server.send_vmess(r.server.vmess.header(check=check) + r.server.vmess.chunks(b"forged"))
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_AUTH)
        assert engine.framing_errors() == (1, 0)
        assert isinstance(r.framing.error_for(relay_py.FRAMING_AUTH), VmessAuthError)
        assert await recv_until_eof(r.lan) == b""


@pytest.mark.parametrize("close_notify", [True, False])
async def test_a_server_that_closes_without_answering_is_no_response(engine, contexts, close_notify) -> None:
    with framed_rig(engine, vmess_maker(contexts)) as r:
        if close_notify:
            await r.server.close_notify_and_fin()
        else:
            r.srv.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_SILENT)
        error = r.framing.error_for(relay_py.FRAMING_SILENT)
        assert isinstance(error, VmessProtocolError) and error.reason == "no-response"


@pytest.mark.parametrize("cut", [5, 18 + 3, 18 + 20 + 1])
async def test_a_close_inside_the_header_or_a_chunk_is_a_truncation(engine, contexts, cut) -> None:
    with framed_rig(engine, vmess_maker(contexts)) as r:
        await r.server.send_vmess(answer(r.server, b"cut short")[:cut])
        await r.server.close_notify_and_fin()
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_TRUNCATED)
        assert r.framing.error_for(relay_py.FRAMING_TRUNCATED).reason == "truncated"


async def test_bytes_after_the_ending_chunk_are_a_vmess_protocol_failure(engine, contexts) -> None:
    with framed_rig(engine, vmess_maker(contexts)) as r:
        await r.server.send_vmess(answer(r.server, b"done", end=True) + b"more")
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        assert isinstance(r.framing.error_for(relay_py.FRAMING_PROTOCOL), VmessProtocolError)


async def test_a_broken_record_is_a_tls_error_not_a_vmess_one(engine, contexts) -> None:
    with framed_rig(engine, vmess_maker(contexts)) as r:
        await r.server.send_vmess(answer(r.server, b"fine"))
        assert await recv_exactly(r.lan, 4) == b"fine"
        await asyncio.get_running_loop().sock_sendall(r.srv, b"\x17\x03\x03\x00\x20" + os.urandom(32))
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        error = r.framing.error_for(relay_py.FRAMING_PROTOCOL)
        assert isinstance(error, TlsStreamError) and error.reason == "bad-record"


async def test_a_vmess_body_already_begun_is_refused_and_the_connection_stays_unclaimed(
    engine, contexts
) -> None:
    client_obj, c_in, c_out, *_ = handshake(contexts)
    client = vmess_client("aes-128-gcm")
    client.encrypt(b"sent in python")
    framing = TlsFraming(client_obj, c_in, c_out, VmessFraming(client))
    a, b = tcp_pair()
    c, d = tcp_pair()
    try:
        with pytest.raises(ValueError, match="already begun"):
            engine.add(b.fileno(), d.fileno(), Recorder(), b"", framing=framing)
        assert not framing.claimed
    finally:
        for s in (a, b, c, d):
            s.close()


# --- the copy relays -------------------------------------------------------------------------


async def _relay_rig(relay: Any, contexts) -> Any:
    lan, lan_peer = tcp_pair()
    srv, upstream = tcp_pair()
    server, framing = vmess_maker(contexts)(srv)
    conn = StreamConn(ClientGone)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=lan_peer)
    return lan, server, asyncio.ensure_future(relay.run(conn, upstream, framing))


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_carry_vmess_over_tls_and_finish_cleanly(kind, contexts) -> None:
    loop = asyncio.get_running_loop()
    async with relay_flow(kind, lambda relay: _relay_rig(relay, contexts)) as (relay, lan, server, task):
        await loop.sock_sendall(lan, b"request" * 1000)
        lan.shutdown(socket.SHUT_WR)
        assert await server.recv_until_eof() == b"request" * 1000
        assert server.vmess.ended
        await server.send_vmess(answer(server, b"reply" * 9000, end=True))
        await server.close_notify_and_fin()
        assert await recv_until_eof(lan) == b"reply" * 9000
        await asyncio.wait_for(task, STEP)


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_end_with_vmess_no_response_for_a_silent_server(kind, contexts) -> None:
    async with relay_flow(kind, lambda relay: _relay_rig(relay, contexts)) as (relay, lan, server, task):
        await server.close_notify_and_fin()
        with pytest.raises(VmessProtocolError) as info:
            await asyncio.wait_for(task, STEP)
        assert info.value.reason == "no-response"


async def test_hs_connect_shakes_hands_then_writes_the_vmess_header_and_seals_the_early_bytes(
    engine, contexts
) -> None:
    """The fast path's own dial of VMess over TCP + TLS: once the handshake is done the sealed
    request header goes out as it is, the client's early bytes after it as the body's first chunk."""
    client_ctx, server_ctx = contexts
    vmess = vmess_client("aes-128-gcm")
    header = b"\x01SEALED-VMESS-REQUEST-HEADER"  # what the dial sealed: the engine must not touch it
    client, srv, framing, rec, lid = await dial_through_engine(
        engine, client_ctx, "localhost", b"early", VmessFraming(vmess), header
    )
    try:
        assert await recv_exactly(client, 2) == b"\x05\x00"
        server = await server_handshake(srv, server_ctx, VmessTlsServer)
        server.vmess = VmessServer(srv, vmess)
        plain = TlsServer.take(server, b"")  # the records that came with the client's Finished
        while len(plain) < len(header):
            plain += TlsServer.take(
                server, await asyncio.wait_for(asyncio.get_running_loop().sock_recv(srv, 65536), STEP)
            )
        assert plain[: len(header)] == header
        early = server.vmess.take(plain[len(header) :])
        early += await server.recv_plain(5 - len(early)) if len(early) < 5 else b""
        assert early == b"early"
        reply = await recv_exactly(client, 10)  # only once the handshake is done
        assert reply[:2] == b"\x05\x00"
        await server.send_vmess(answer(server, b"answer"))
        assert await recv_exactly(client, 6) == b"answer"
        client.shutdown(socket.SHUT_WR)
        assert await server.recv_until_eof() == b""
        assert server.vmess.ended and server.close_notify
        await server.close_notify_and_fin()
        assert await recv_until_eof(client) == b""
        assert (await rec.end())[0] == relay_py.END_CLEAN
    finally:
        engine.unlisten(lid)
        client.close()
        srv.close()
