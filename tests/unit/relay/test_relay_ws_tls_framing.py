"""WebSocket inside TLS (a ``TlsFraming`` with ``websocket``) through the relay engines.

As ``test_relay_tls_framing``: the handshake is done in memory before the flow starts, then
the test plays a v2ray-style WebSocket server over ``srv`` (the engine's upstream) with its
own server-side SSLObject: it unmasks the client's frames (RFC 6455 5.3) and sends its own
frames unmasked, cut wherever a test wants. Both engines must give the same answers: the
compiled worker unframes in C, the twin through honk.proto.websocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import ssl
import struct

import pytest
from helpers.engines import ENGINES, STEP, framed_rig, poll, recv_exactly, recv_until_eof, upstream_failure
from helpers.peers import require
from helpers.sockets import tcp_pair
from helpers.tls_rig import WsServer, server_frame, tls_maker

from honk._fast import relay_py
from honk.proto import websocket
from honk.proto.trojan import TrojanError, TrojanStreamWatch
from honk.proto.vless import VlessResponseDecoder
from honk.proto.websocket import WebSocketError

MiB = 1024**2


def ws_maker(contexts, response_type=TrojanStreamWatch):
    return tls_maker(contexts, response_type, websocket=True, server_type=WsServer)


async def test_bytes_move_both_ways_as_binary_frames(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts), pair=tcp_pair) as r:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(r.lan, b"ping")
        assert await r.server.recv_plain(4) == b"ping"
        await r.server.send(server_frame(websocket.OP_BINARY, b"pong"))
        assert await recv_exactly(r.lan, 4) == b"pong"
        up = os.urandom(3 * MiB + 7)
        sender = asyncio.ensure_future(loop.sock_sendall(r.lan, up))
        assert await asyncio.wait_for(r.server.recv_plain(len(up)), 4 * STEP) == up
        await sender
        assert {op for op, _ in r.server.frames} == {websocket.OP_BINARY}
        assert max(size for _, size in r.server.frames) <= websocket.SEND_FRAME
        # every length form, a text frame and a fragmented message count as data
        down = [os.urandom(n) for n in (0, 1, 125, 126, 65535, 65536, 300_000)]
        await r.server.send(b"".join(server_frame(websocket.OP_BINARY, part) for part in down))
        await r.server.send(
            server_frame(websocket.OP_TEXT, b"text", fin=False)
            + server_frame(websocket.OP_CONTINUATION, b"-cont")
        )
        assert await asyncio.wait_for(recv_exactly(r.lan, sum(map(len, down)) + 9), 4 * STEP) == (
            b"".join(down) + b"text-cont"
        )
        assert engine.counters(r.id)[0] == 4 + len(up)


async def test_a_frame_cut_anywhere_across_records_comes_out_whole(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts)) as r:
        frame = server_frame(websocket.OP_BINARY, b"x" * 300)  # a 2-byte extended length
        await r.server.send_records(*(frame[i : i + 1] for i in range(6)), frame[6:100], frame[100:])
        assert await recv_exactly(r.lan, 300) == b"x" * 300


async def test_a_preamble_longer_than_a_frame_goes_out_in_frames_before_later_bytes(engine, contexts) -> None:
    early = os.urandom(websocket.SEND_FRAME + 4321)  # two frames, their headers written apart
    with framed_rig(engine, ws_maker(contexts), pair=tcp_pair, preamble=early) as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"later")
        assert await r.server.recv_plain(len(early) + 5) == early + b"later"
        assert [size for _, size in r.server.frames] == [websocket.SEND_FRAME, 4321, 5]


async def test_a_ping_is_answered_with_a_pong_of_its_payload(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts)) as r:
        await r.server.send_frames(
            server_frame(websocket.OP_PING, b"are you there"), server_frame(websocket.OP_BINARY, b"data")
        )
        assert await recv_exactly(r.lan, 4) == b"data"  # the ping's payload is not the client's
        await asyncio.get_running_loop().sock_sendall(r.lan, b"x")
        assert await r.server.recv_plain(1) == b"x"
        assert (websocket.OP_PONG, 13) in r.server.frames and r.server.control == b"are you there"


async def test_a_close_frame_ends_the_servers_side_and_the_flow_ends_clean(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts)) as r:
        await r.server.send(
            server_frame(websocket.OP_BINARY, b"bye")
            + server_frame(websocket.OP_CLOSE, struct.pack("!H", 1000))
            + server_frame(websocket.OP_BINARY, b"ignored after the close")
        )
        assert await recv_until_eof(r.lan) == b"bye"
        await poll(lambda: (relay_py.EV_HALF_CLOSE, 1, 0) in r.rec.events, "the upstream's half-close")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)


async def test_a_last_answer_and_close_notify_in_one_read_reach_the_client(engine, contexts) -> None:
    """A server that answers and closes at once (a short HTTP response): the answer's frame and
    the close_notify come in one read, and the answer is delivered before the close counts."""
    with framed_rig(engine, ws_maker(contexts)) as r:
        wire = r.server.seal(server_frame(websocket.OP_BINARY, b"HTTP/1.1 204 No Content\r\n\r\n"))
        with contextlib.suppress(ssl.SSLWantReadError):  # the client's close_notify has not come
            r.server.ssl.unwrap()
        await asyncio.get_running_loop().sock_sendall(r.srv, wire + r.server.outgoing.read())
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"HTTP/1.1 204 No Content\r\n\r\n"
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)


async def test_the_clients_eof_sends_nothing_and_the_server_keeps_answering(engine, contexts) -> None:
    """WebSocket has no half-close: no close frame, no close_notify, no FIN before the server's."""
    with framed_rig(engine, ws_maker(contexts)) as r:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(r.lan, b"request")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_plain(7) == b"request"
        await poll(lambda: (relay_py.EV_HALF_CLOSE, 0, 0) in r.rec.events, "the client's half-close")
        r.srv.setblocking(False)
        with pytest.raises(BlockingIOError):  # the upstream's write side is still open
            r.srv.recv(1)
        assert not r.server.close_notify
        await r.server.send(server_frame(websocket.OP_BINARY, b"late answer"))
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"late answer"
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)
        assert [op for op, _ in r.server.frames] == [websocket.OP_BINARY]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (server_frame(websocket.OP_BINARY, b"x", rsv=4), "reserved-bits"),
        (server_frame(0x3, b"x"), "bad-opcode"),
        (server_frame(websocket.OP_BINARY, b"x", mask=b"abcd"), "masked-server-frame"),
        (server_frame(websocket.OP_PING, b"p" * 126), "bad-control-frame"),
        (server_frame(websocket.OP_PING, b"p", fin=False), "bad-control-frame"),
        (struct.pack("!BBQ", 0x82, 127, websocket.MAX_FRAME_PAYLOAD + 1), "frame-too-large"),
    ],
    ids=["reserved", "opcode", "masked", "long-control", "fragmented-control", "too-large"],
)
async def test_a_broken_frame_ends_the_flow_as_a_websocket_error(engine, contexts, frame, reason) -> None:
    with framed_rig(engine, ws_maker(contexts)) as r:
        await r.server.send(server_frame(websocket.OP_BINARY, b"fine"))
        assert await recv_exactly(r.lan, 4) == b"fine"
        await r.server.send(frame)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        error = r.framing.error_for(relay_py.FRAMING_PROTOCOL)
        assert isinstance(error, WebSocketError) and error.reason == reason
        assert engine.framing_errors()[1] == 1


async def test_a_close_before_any_payload_is_trojans_closed_before_data(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts)) as r:
        await r.server.send_frames(
            server_frame(websocket.OP_PING, b""), server_frame(websocket.OP_CLOSE, b"")
        )
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_SILENT)
        error = r.framing.error_for(relay_py.FRAMING_SILENT)
        assert isinstance(error, TrojanError) and error.reason == "closed-before-data"


async def test_the_vless_response_header_is_stripped_inside_the_frames(engine, contexts) -> None:
    with framed_rig(engine, ws_maker(contexts, VlessResponseDecoder)) as r:
        await r.server.send_frames(
            server_frame(websocket.OP_BINARY, b"\x00"),
            server_frame(websocket.OP_BINARY, b"\x02ab" + b"hel"),
            server_frame(websocket.OP_BINARY, b"lo"),
        )
        assert await recv_exactly(r.lan, 5) == b"hello"


@pytest.mark.skipif(
    bool(os.environ.get("HONK_NO_EXTENSIONS")), reason="HONK_NO_EXTENSIONS: only the twin runs"
)
def test_the_compiled_engine_holds_the_websocket_codecs_numbers() -> None:
    require("compiled" in ENGINES, "the compiled relay engine is not built")  # a build CI requires
    from honk._fast import relay_c

    assert relay_c.WS_LIMITS == (
        websocket.SEND_FRAME,
        websocket.MAX_FRAME_PAYLOAD,
        websocket.MAX_CONTROL_PAYLOAD,
    )
    assert relay_c.WS_OPCODES == (
        websocket.OP_BINARY,
        websocket.OP_CLOSE,
        websocket.OP_PING,
        websocket.OP_PONG,
    )
    assert relay_c.WS_ERRORS == {reason: i + 1 for i, reason in enumerate(websocket.ENGINE_ERRORS)}


@pytest.mark.parametrize("seed", range(4))
async def test_random_frames_cut_at_random_points_come_out_whole_and_in_order(engine, contexts, seed) -> None:
    """Data frames of every length form and pings, their bytes cut into records at random points:
    the client gets the data in order, and pongs answer pings in order, the last one surely (a
    read's earlier pings may go unanswered), on both engines alike."""
    rng = random.Random(seed)
    frames, data, pings = [], bytearray(), []
    for i in range(40):
        if rng.random() < 0.2:
            payload = rng.randbytes(rng.randrange(0, 126))
            frames.append(server_frame(websocket.OP_PING, payload))
            pings.append(payload)
        else:
            payload = rng.randbytes(rng.choice([0, 1, 125, 126, 4000, 65535, 65536, 90000]))
            frames.append(server_frame(websocket.OP_BINARY if i % 3 else websocket.OP_TEXT, payload))
            data += payload
    wire = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(wire)), 60))
    with framed_rig(engine, ws_maker(contexts), pair=tcp_pair) as r:
        for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            await r.server.send(wire[a:b])
        assert await asyncio.wait_for(recv_exactly(r.lan, len(data)), 4 * STEP) == bytes(data)
        await asyncio.get_running_loop().sock_sendall(r.lan, b"!")
        assert await r.server.recv_plain(1) == b"!"
        answered = iter(pings)
        assert all(pong in answered for pong in r.server.pongs)  # a subsequence of the pings
        assert r.server.pongs and r.server.pongs[-1] == pings[-1]


async def test_a_flood_of_pings_in_one_read_gets_one_pong(engine, contexts) -> None:
    """Only a read's last ping is answered (RFC 6455 5.5.3): a server that pings and never reads
    cannot make honk buffer a pong per ping."""
    with framed_rig(engine, ws_maker(contexts)) as r:
        pings = b"".join(server_frame(websocket.OP_PING, b"%d" % i) for i in range(1000))
        await r.server.send(pings + server_frame(websocket.OP_BINARY, b"after"))  # one record
        assert await recv_exactly(r.lan, 5) == b"after"
        await asyncio.get_running_loop().sock_sendall(r.lan, b"!")
        assert await r.server.recv_plain(1) == b"!"
        assert r.server.pongs == [b"999"]
