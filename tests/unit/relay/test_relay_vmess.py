"""VMess bodies through the relay engines and relays, on real socket pairs.

The test plays the VMess server with the codec's own primitives: it opens the
request chunks the engine seals (masked lengths, counter nonces) and writes a
response header and chunks for the engine to open. The dial already sent the
request header, so the flow starts at the body. Interop with a real v2ray is in
tests/integration/test_v2_outbounds.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.engines import (
    ENGINES,
    RELAYS,
    STEP,
    FramedRig,
    Recorder,
    engine_class,
    framed_rig,
    recv_exactly,
    recv_until_eof,
    relay_flow,
    upstream_failure,
)
from helpers.sockets import tcp_pair, unix_pair
from helpers.vmess_rig import VmessServer, vmess_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk._fast import relay_py
from honk.core.errors import ClientGone
from honk.proto.vmess import (
    MAX_PAYLOAD,
    VmessAuthError,
    VmessFraming,
    VmessProtocolError,
)
from honk.relay.stream import StreamConn

MiB = 1024**2
SECURITIES = ["aes-128-gcm", "chacha20-poly1305", "none"]
LARGEST_CHUNK = 0xFFFF  # a chunk's 2-byte length bounds what a server may send at once


@contextlib.contextmanager
def rig(engine: Any, security: str = "aes-128-gcm", **kwargs: Any) -> Iterator[FramedRig]:
    """A VMess flow whose request header is already sent."""
    client = vmess_client(security)
    with framed_rig(engine, lambda srv: (VmessServer(srv, client), VmessFraming(client)), **kwargs) as r:
        yield r


# --- data both ways ---------------------------------------------------------------------


@pytest.mark.parametrize("security", SECURITIES)
async def test_four_mib_each_way_arrive_intact_at_the_same_time(engine, security) -> None:
    up, down = os.urandom(4 * MiB), os.urandom(4 * MiB)
    loop = asyncio.get_running_loop()
    with rig(engine, security, pair=tcp_pair) as r:
        send_up = loop.create_task(loop.sock_sendall(r.lan, up))
        send_down = loop.create_task(r.server.send(r.server.header() + r.server.chunks(down)))
        got_up, got_down = await asyncio.gather(r.server.recv_plain(len(up)), recv_exactly(r.lan, len(down)))
        await asyncio.wait_for(asyncio.gather(send_up, send_down), STEP)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()
        assert engine.counters(r.id)[0] == len(up)


@pytest.mark.parametrize("size", [1, MAX_PAYLOAD, LARGEST_CHUNK - 16])
async def test_server_chunks_up_to_the_largest_length_are_opened(engine, size) -> None:
    data = os.urandom(3 * size + 5)
    with rig(engine) as r:
        await r.server.send(r.server.header() + r.server.chunks(data, size))
        assert await recv_exactly(r.lan, len(data)) == data


async def test_preamble_is_the_first_chunk_of_the_body(engine) -> None:
    with rig(engine, preamble=b"GET / HTTP/1.1\r\n") as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"\r\n")
        assert await r.server.recv_plain(18) == b"GET / HTTP/1.1\r\n\r\n"


@pytest.mark.parametrize("security", SECURITIES)
async def test_client_eof_sends_the_ending_chunk_before_the_fin(engine, security) -> None:
    with rig(engine, security) as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"last words")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == b"last words"
        assert r.server.ended
        # the server's direction is still open: its answer and end arrive after the client's EOF
        await r.server.send(r.server.header() + r.server.chunks(b"answer") + r.server.response.seal(b""))
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"answer"
        assert (await r.rec.end())[0] == relay_py.END_CLEAN


# --- what the server sends wrong ------------------------------------------------------------


async def test_a_response_to_another_request_is_an_auth_failure(engine) -> None:
    with rig(engine) as bad, rig(engine) as good:
        await bad.server.send(bad.server.header(check=(bad.framing.encryptor.response_check + 1) % 256))
        assert await bad.rec.end() == upstream_failure(relay_py.FRAMING_AUTH)
        assert engine.framing_errors() == (1, 0)
        await good.server.send(good.server.header() + good.server.chunks(b"unaffected"))
        assert await recv_exactly(good.lan, 10) == b"unaffected"


@pytest.mark.parametrize("where", ["header-length", "header", "chunk", "chunk-tag"])
async def test_a_flipped_byte_is_an_auth_failure_and_reaches_novmess_client(engine, where) -> None:
    with rig(engine) as r:
        wire = bytearray(r.server.header() + r.server.chunks(b"forged payload"))
        offset = {"header-length": 3, "header": 20, "chunk": 18 + 20 + 2 + 1, "chunk-tag": len(wire) - 1}[
            where
        ]
        wire[offset] ^= 0x01
        await r.server.send(bytes(wire))
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_AUTH)
        assert await recv_until_eof(r.lan) == b""


async def test_a_chunk_shorter_than_its_tag_is_a_protocol_failure(engine) -> None:
    with rig(engine) as r:
        masked = 5 ^ r.server.response.mask.next()
        await r.server.send(r.server.header() + struct.pack("!H", masked))
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        assert engine.framing_errors() == (0, 1)


async def test_a_server_that_closes_without_answering_is_silent_not_clean(engine) -> None:
    with rig(engine) as r:
        r.srv.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_SILENT)
        assert r.framing.error_for(relay_py.FRAMING_SILENT).reason == "no-response"


@pytest.mark.parametrize("cut", [5, 18 + 3, 18 + 20 + 1])
async def test_eof_inside_the_header_or_a_chunk_is_a_truncation(engine, cut) -> None:
    with rig(engine) as r:
        await r.server.send((r.server.header() + r.server.chunks(b"cut short"))[:cut])
        r.srv.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_TRUNCATED)


async def test_bytes_after_the_ending_chunk_are_a_protocol_failure(engine) -> None:
    with rig(engine) as r:
        await r.server.send(
            r.server.header() + r.server.chunks(b"done") + r.server.response.seal(b"") + b"more"
        )
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)


async def test_a_body_already_begun_is_refused_by_the_engine(engine) -> None:
    client = vmess_client("aes-128-gcm")
    client.encrypt(b"sent in python")
    a, b = unix_pair()
    c, d = unix_pair()
    try:
        with pytest.raises(ValueError, match="already begun"):
            engine.add(b.fileno(), d.fileno(), Recorder(), b"", framing=VmessFraming(client))
    finally:
        for s in (a, b, c, d):
            s.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    engine_name=st.sampled_from(ENGINES),
    security=st.sampled_from(SECURITIES),
    sizes=st.lists(st.integers(min_value=1, max_value=LARGEST_CHUNK - 16), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=70_000), min_size=1, max_size=6),
)
def test_any_split_of_the_server_stream_opens_to_the_same_bytes(engine_name, security, sizes, cuts) -> None:
    async def main() -> None:
        engine = engine_class(engine_name)(asyncio.get_running_loop())
        try:
            with rig(engine, security) as r:
                pieces = [os.urandom(n) for n in sizes]
                payload = b"".join(pieces)
                wire = r.server.header() + b"".join(r.server.response.seal(piece) for piece in pieces)
                pos = 0
                for cut in cuts:
                    await r.server.send(wire[pos : pos + cut])
                    pos += cut
                await r.server.send(wire[pos:])
                assert await recv_exactly(r.lan, len(payload)) == payload
        finally:
            engine.close()

    asyncio.run(main())


# --- the relays over a VMess upstream ---------------------------------------------------------


async def _relay_rig(relay: Any):
    lan, lan_peer = tcp_pair()
    srv, upstream = tcp_pair()
    client = vmess_client("aes-128-gcm")
    server = VmessServer(srv, client)
    conn = StreamConn(ClientGone)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=lan_peer)
    return lan, server, asyncio.ensure_future(relay.run(conn, upstream, VmessFraming(client)))


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_carry_a_vmess_body_and_finish_cleanly(kind) -> None:
    loop = asyncio.get_running_loop()
    async with relay_flow(kind, _relay_rig) as (relay, lan, server, task):
        await loop.sock_sendall(lan, b"request" * 1000)
        lan.shutdown(socket.SHUT_WR)
        assert await server.recv_until_eof() == b"request" * 1000
        assert server.ended
        await server.send(server.header() + server.chunks(b"reply" * 9000) + server.response.seal(b""))
        server.sock.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(lan) == b"reply" * 9000
        await asyncio.wait_for(task, STEP)


@pytest.mark.parametrize("kind", RELAYS)
@pytest.mark.parametrize(
    ("wrong", "error", "reason"),
    [("silence", VmessProtocolError, "no-response"), ("forged", VmessAuthError, None)],
)
async def test_relays_end_with_the_vmess_error_for_what_the_server_did(kind, wrong, error, reason) -> None:
    """A server that closes without answering (a refused id), and one whose chunk does not verify."""
    async with relay_flow(kind, _relay_rig) as (relay, lan, server, task):
        if wrong == "silence":
            server.sock.shutdown(socket.SHUT_WR)
        else:
            wire = bytearray(server.header() + server.chunks(b"forged"))
            wire[-1] ^= 0x80
            await server.send(bytes(wire))
        with pytest.raises(error) as info:
            await asyncio.wait_for(task, STEP)
        assert reason is None or info.value.reason == reason  # an auth failure's reason names the seal


def test_the_engines_bound_on_a_response_header_is_the_codecs() -> None:
    from honk.proto import vmess

    assert (
        relay_py.VMESS_HEADER_MAX == vmess._MAX_RESPONSE_HEADER
    )  # the compiled engine asserts its own at import
