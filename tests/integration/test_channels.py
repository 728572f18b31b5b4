"""Channels stacked under the relay bridge, over real loopback sockets.

The far end plays a WebSocket server by hand (unmasked frames, RFC 6455) and a
toy framing (length-prefixed, XOR-ed) stands for a proxy protocol's codec, so
what is tested is the stacking: order, EOF, pings, close, and the bridge to a
plain socket the relay engine can drive.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import struct

import pytest
from helpers.descriptors import descriptors_exhausted
from helpers.sockets import tcp_pair

from honk.core.errors import CapacityRefused, ClientGone, HonkError, UpstreamFailed
from honk.outbound.bridge import BridgeEnd, bridge_stream, relay_end, upstream_failure
from honk.outbound.channel import CodecChannel, WsChannel
from honk.relay.stream import StreamConn

STEP = 5.0


class _Truncated(HonkError):
    pass


class ToyCodec:
    """Length-prefixed chunks, each byte XOR 0x5A: just enough framing to see stacking."""

    def __init__(self) -> None:
        self._buf = bytearray()

    @staticmethod
    def encode(data: bytes) -> bytes:
        return struct.pack("!I", len(data)) + bytes(b ^ 0x5A for b in data)

    def decode(self, data: bytes) -> bytes:
        self._buf += data
        out = bytearray()
        while len(self._buf) >= 4:
            (n,) = struct.unpack_from("!I", self._buf)
            if len(self._buf) < 4 + n:
                break
            out += bytes(b ^ 0x5A for b in self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
        return bytes(out)

    def at_eof(self) -> None:
        if self._buf:
            raise _Truncated("stopped inside a chunk")


def _unmask_client_frames(data: bytes) -> tuple[bytes, list[int], int]:
    """Payload bytes of complete client frames, their opcodes, and how many bytes were used."""
    out, ops, pos = bytearray(), [], 0
    while len(data) - pos >= 2:
        op, n = data[pos] & 0x0F, data[pos + 1] & 0x7F
        head = 2
        if n == 126:
            if len(data) - pos < 4:
                break
            n, head = struct.unpack_from("!H", data, pos + 2)[0], 4
        elif n == 127:
            if len(data) - pos < 10:
                break
            n, head = struct.unpack_from("!Q", data, pos + 2)[0], 10
        if len(data) - pos < head + 4 + n:
            break
        mask = data[pos + head : pos + head + 4]
        body = data[pos + head + 4 : pos + head + 4 + n]
        out += bytes(b ^ mask[i % 4] for i, b in enumerate(body))
        ops.append(op)
        pos += head + 4 + n
    return bytes(out), ops, pos


def _server_frame(op: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", 0x80 | op, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", 0x80 | op, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | op, 127, n) + payload


async def _stream_conn(sock: socket.socket) -> StreamConn:
    conn = StreamConn(UpstreamFailed)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=sock)
    return conn


def test_codec_over_websocket_bridged_to_a_plain_socket_carries_both_ways(run) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        near, far = tcp_pair()
        codec = ToyCodec()
        channel = CodecChannel(
            WsChannel(await _stream_conn(near)), ToyCodec.encode, codec.decode, at_eof=codec.at_eof
        )
        plain = bridge_stream(channel)
        payload = os.urandom(300_000)
        await loop.sock_sendall(plain, payload)
        got, used, wire = b"", 0, b""
        while len(got) < 4 + len(payload) + 16:  # the toy framing's bytes, inside WebSocket frames
            wire += await asyncio.wait_for(loop.sock_recv(far, 65536), STEP)
            got_now, ops, used = _unmask_client_frames(wire)
            got = got_now
            if ToyCodec().decode(got) == payload:
                break
        assert set(ops) == {0x2}  # binary messages only
        assert ToyCodec().decode(got) == payload
        # the server answers with a ping, then data split over two frames, then a close
        answer = os.urandom(70_000)
        framed = ToyCodec.encode(answer)
        await loop.sock_sendall(
            far,
            _server_frame(0x9, b"hi")
            + _server_frame(0x2, framed[:1000])
            + _server_frame(0x0, framed[1000:])
            + _server_frame(0x8, struct.pack("!H", 1000)),
        )
        back = bytearray()
        while chunk := await asyncio.wait_for(loop.sock_recv(plain, 65536), STEP):
            back += chunk
        assert hashlib.sha256(back).digest() == hashlib.sha256(answer).digest()  # then EOF at the close
        rest = wire[used:] + await asyncio.wait_for(loop.sock_recv(far, 65536), STEP)
        pong, ops, _ = _unmask_client_frames(rest)
        assert ops[0] == 0xA and pong.startswith(b"hi")  # the ping was answered
        plain.close()
        far.close()

    run(main())


def test_a_server_stopping_inside_a_frame_ends_the_bridge_with_a_logged_typed_error(run, caplog) -> None:
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        near, far = tcp_pair()
        codec = ToyCodec()
        plain = bridge_stream(
            CodecChannel(await _stream_conn(near), ToyCodec.encode, codec.decode, at_eof=codec.at_eof)
        )
        await loop.sock_sendall(far, ToyCodec.encode(b"complete") + ToyCodec.encode(b"cut short")[:6])
        far.shutdown(socket.SHUT_WR)
        got = bytearray()
        while chunk := await asyncio.wait_for(loop.sock_recv(plain, 65536), STEP):
            got += chunk
        plain.close()
        far.close()
        return bytes(got)

    with caplog.at_level(logging.INFO, logger="honk.outbound.bridge"):
        assert run(main()) == b"complete"  # the whole chunk arrives, the cut one never does
    assert "bridged stream failed error=_Truncated" in caplog.text


def test_the_bridge_keeps_the_server_sides_typed_failure_behind_the_relays_clean_eof(run) -> None:
    """The relay's end of the pair only sees EOF; the verdict says why the server's side ended."""

    async def main() -> tuple[bytes, BridgeEnd]:
        loop = asyncio.get_running_loop()
        near, far = tcp_pair()
        codec = ToyCodec()
        end = BridgeEnd()
        plain = bridge_stream(
            CodecChannel(await _stream_conn(near), ToyCodec.encode, codec.decode, at_eof=codec.at_eof),
            end=end,
        )
        await loop.sock_sendall(far, ToyCodec.encode(b"cut short")[:6])
        far.shutdown(socket.SHUT_WR)
        got = await asyncio.wait_for(loop.sock_recv(plain, 65536), STEP)
        plain.close()
        far.close()
        return got, end

    got, end = run(main())
    assert got == b""  # a clean EOF is all the relay gets ...
    assert isinstance(end.failure, _Truncated)  # ... the verdict names the codec's typed error
    # the relay's own view of the socketpair (a clean end, or its reset) yields to the verdict;
    # a client-side end stays the relay's
    assert relay_end(None, end) is end.failure and relay_end(UpstreamFailed("x"), end) is end.failure
    gone = ClientGone("the client reset")
    assert relay_end(gone, end) is gone


def test_a_bridge_whose_server_side_ends_cleanly_or_whose_relay_side_goes_first_has_no_failure(run) -> None:
    async def main() -> tuple[BridgeEnd, BridgeEnd]:
        loop = asyncio.get_running_loop()
        verdicts = []
        for server_first in (True, False):
            near, far = tcp_pair()
            end = BridgeEnd()
            plain = bridge_stream(await _stream_conn(near), end=end)
            if server_first:  # the server answers and closes: a clean end
                await loop.sock_sendall(far, b"answer")
                far.shutdown(socket.SHUT_WR)
                assert await asyncio.wait_for(loop.sock_recv(plain, 65536), STEP) == b"answer"
                assert await asyncio.wait_for(loop.sock_recv(plain, 65536), STEP) == b""
            else:  # the relay's side resets first (its client went away): not the server's failure
                plain.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            plain.close()
            await asyncio.wait_for(loop.sock_recv(far, 65536), STEP)  # the server side sees the end
            far.close()
            verdicts.append(end)
        return verdicts[0], verdicts[1]

    clean, relay_gone = run(main())
    assert clean.failure is None and relay_gone.failure is None


def test_a_non_honk_error_becomes_an_upstream_failure_caused_by_that_one_object() -> None:
    shared = ConnectionResetError(104, "reset")  # one carrier's loss, raised to many streams
    first, second = upstream_failure(shared), upstream_failure(shared)
    assert isinstance(first, UpstreamFailed) and first.__cause__ is shared and second.__cause__ is shared
    typed = _Truncated("stopped")
    assert upstream_failure(typed) is typed


def test_a_bridge_with_no_descriptor_left_is_a_capacity_refusal_and_closes_the_server_side(run) -> None:
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        near, far = tcp_pair()
        conn = await _stream_conn(near)
        with descriptors_exhausted():
            with pytest.raises(CapacityRefused) as refused:
                bridge_stream(conn, "n1")
        assert "n1: no socketpair" in str(refused.value)  # a local refusal: no node is charged for it
        try:
            return await asyncio.wait_for(loop.sock_recv(far, 65536), STEP)  # the server sees the end
        finally:
            far.close()

    assert run(main()) == b""


def test_a_bridge_whose_relay_flow_ended_lets_go_of_a_server_that_holds_its_side(run) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        near, far = tcp_pair()
        end = BridgeEnd()
        plain = bridge_stream(await _stream_conn(near), end=end)
        await loop.sock_sendall(plain, b"request")
        plain.shutdown(socket.SHUT_WR)  # the client is done: its EOF reaches the server
        assert await asyncio.wait_for(_recv_until_eof(loop, far), STEP) == b"request"
        plain.close()  # the relay's flow is over (its half-close timeout, say); the server stays
        for _ in range(20):
            await asyncio.sleep(0)
        assert end.pump is not None and not end.pump.done()  # an EOF alone cannot tell it apart
        end.relay_ended()
        await asyncio.wait([end.pump], timeout=STEP)
        assert end.pump.done()
        with pytest.raises(OSError):  # the server's side was closed under the server
            for _ in range(100):
                await loop.sock_sendall(far, b"x" * 65536)
        far.close()
        assert end.failure is None  # the flow was not the server's failure

    run(main())


async def _recv_until_eof(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    out = b""
    while chunk := await loop.sock_recv(sock, 65536):
        out += chunk
    return out
