"""TLS flows (Trojan or VLESS over TLS, a ``TlsFraming``) through the relay engines, on socket pairs.

Engines: ``compiled`` (relay_c, which drives the SSLObject's ``SSL*`` from its worker) and
``twin`` (relay_py, through the framing's encryptor/decryptor); every test runs on asyncio
and uvloop. The handshake is done in memory before the flow starts (as ``tls_handshake``
leaves it); the test then plays the server with its own server-side SSLObject over ``srv``,
the engine's upstream. Certificates come from a CA made here (trustme).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import ssl

import pytest
from helpers.engines import (
    STEP,
    framed_rig,
    poll,
    recv_exactly,
    recv_until_eof,
    upstream_failure,
)
from helpers.sockets import reset, tcp_pair, unix_pair
from helpers.tls_rig import dial_through_engine, handshake, held_request, server_handshake, tls_maker

from honk._fast import relay_py
from honk.proto.tls_framing import TlsFraming, TlsStreamError
from honk.proto.trojan import TrojanError, TrojanStreamWatch
from honk.proto.vless import VlessProtocolError, VlessResponseDecoder

MiB = 1024**2
RECORD = 16384  # TLS's largest plaintext per record


async def test_bytes_move_both_ways_small_and_bulk(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts), pair=tcp_pair) as r:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(r.lan, b"ping")
        assert await r.server.recv_plain(4) == b"ping"
        await r.server.send(b"pong")
        assert await recv_exactly(r.lan, 4) == b"pong"
        up, down = os.urandom(5 * MiB + 7), os.urandom(3 * MiB + 11)
        sender = asyncio.ensure_future(loop.sock_sendall(r.lan, up))
        assert await asyncio.wait_for(r.server.recv_plain(len(up)), 4 * STEP) == up
        await sender
        sender = asyncio.ensure_future(r.server.send(down))
        assert await asyncio.wait_for(recv_exactly(r.lan, len(down)), 4 * STEP) == down
        await sender
        assert engine.counters(r.id)[0] == 4 + len(up)  # plaintext from the client
        assert engine.counters(r.id)[1] > 4 + len(down)  # wire bytes (records, tickets) from the upstream


async def test_the_preamble_is_sealed_before_later_client_bytes(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts), preamble=b"early|") as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"later")
        assert await r.server.recv_plain(11) == b"early|later"


async def test_client_eof_sends_close_notify_and_the_server_may_still_answer(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts)) as r:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(r.lan, b"request")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == b"request"
        assert r.server.close_notify  # before the FIN
        await poll(lambda: (relay_py.EV_HALF_CLOSE, 0, 0) in r.rec.events, "the client's half-close")
        await r.server.send(b"late answer")
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"late answer"
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)


@pytest.mark.parametrize("close_notify", [True, False], ids=["close-notify", "fin-only"])
async def test_server_eof_reaches_the_client_and_the_client_may_still_send(
    engine, contexts, close_notify
) -> None:
    with framed_rig(engine, tls_maker(contexts)) as r:
        loop = asyncio.get_running_loop()
        await r.server.send(b"bye")
        if close_notify:
            await r.server.close_notify_and_fin()
        else:
            r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"bye"
        await poll(lambda: (relay_py.EV_HALF_CLOSE, 1, 0) in r.rec.events, "the upstream's half-close")
        await loop.sock_sendall(r.lan, b"after")
        assert await r.server.recv_plain(5) == b"after"
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x17\x03\x03\x00\x20" + bytes(32),  # an application record that does not decrypt
        b"HTTP/1.1 400 Bad Request\r\n\r\n",  # not TLS at all
    ],
    ids=["bad-mac", "not-tls"],
)
async def test_a_broken_record_ends_the_flow_upstream_as_a_framing_error(engine, contexts, garbage) -> None:
    with framed_rig(engine, tls_maker(contexts)) as r:
        await r.server.send(b"fine")
        assert await recv_exactly(r.lan, 4) == b"fine"
        await asyncio.get_running_loop().sock_sendall(r.srv, garbage)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        error = r.framing.error_for(relay_py.FRAMING_PROTOCOL)
        assert isinstance(error, TlsStreamError) and error.reason == "bad-record"
        assert str(error)  # OpenSSL's words on it
        assert engine.framing_errors()[1] == 1


@pytest.mark.parametrize("close_notify", [True, False], ids=["close-notify", "fin-only"])
async def test_trojan_eof_before_any_byte_is_closed_before_data(engine, contexts, close_notify) -> None:
    with framed_rig(engine, tls_maker(contexts)) as r:
        if close_notify:
            await r.server.close_notify_and_fin()
        else:
            r.srv.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_SILENT)
        error = r.framing.error_for(relay_py.FRAMING_SILENT)
        assert isinstance(error, TrojanError) and error.reason == "closed-before-data"
        assert not any(kind == relay_py.EV_FIRST_BYTE for kind, _, _ in r.rec.events)  # tickets are no answer


@pytest.mark.parametrize("answered", [False, True], ids=["before-any-answer", "after-an-answer"])
async def test_a_reset_before_any_answer_is_the_refusal_and_after_one_an_error(
    engine, contexts, answered
) -> None:
    with framed_rig(engine, tls_maker(contexts), pair=tcp_pair) as r:
        loop = asyncio.get_running_loop()
        if answered:
            await r.server.send(b"hi")
            assert await recv_exactly(r.lan, 2) == b"hi"
        await loop.sock_sendall(r.lan, b"request")  # the server leaves it unread
        await poll(lambda: select.select([r.srv], [], [], 0)[0] != [], "the request at the server")
        reset(r.srv)  # what a server does when it closes with bytes left unread
        with contextlib.suppress(OSError):
            await loop.sock_sendall(r.lan, b"more")
        cause, detail = await r.rec.end()
        if answered:
            assert cause == relay_py.END_ERROR and detail >> 16 == relay_py.SIDE_UPSTREAM
            assert detail & 0xFFFF in (errno.ECONNRESET, errno.EPIPE)
        else:
            assert (cause, detail) == upstream_failure(relay_py.FRAMING_SILENT)
            error = r.framing.error_for(relay_py.FRAMING_SILENT)
            assert isinstance(error, TrojanError) and error.reason == "closed-before-data"


def test_the_twins_refusal_check_reads_a_reset_as_the_servers_close(contexts) -> None:
    """The order the rig above cannot force: the write fails first, the reset waits on the socket."""
    client, c_in, c_out, _, _, _ = handshake(contexts)
    ours, theirs = tcp_pair()
    with ours:
        theirs.sendall(b"x")  # unread by us: its close is a reset
        ours.sendall(b"y")  # unread by them
        reset(theirs)
        flow = relay_py._Flow(1, (-1, ours.fileno()), None, True)
        flow.framing = TlsFraming(client, c_in, c_out, TrojanStreamWatch())
        ours.setblocking(False)
        assert relay_py._tls_refused(flow)


async def test_vless_response_header_is_stripped_across_records(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts, VlessResponseDecoder)) as r:
        # version, addons length 3, addons split over records, then the payload
        await r.server.send_records(b"\x00", b"\x03a", b"bc" + b"hel", b"lo")
        assert await recv_exactly(r.lan, 5) == b"hello"
        await r.server.send(b"\x00 not a header any more")
        assert await recv_exactly(r.lan, 23) == b"\x00 not a header any more"
        assert [a for kind, a, _ in r.rec.events if kind == relay_py.EV_FIRST_BYTE] == [
            0
        ]  # once; the client sent nothing


async def test_vless_header_and_payload_in_one_record(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts, VlessResponseDecoder)) as r:
        await r.server.send(b"\x00\x00payload")
        assert await recv_exactly(r.lan, 7) == b"payload"


@pytest.mark.parametrize(
    ("sent", "err", "reason"),
    [
        (b"", relay_py.FRAMING_SILENT, "no-response"),
        (b"\x00\x05ab", relay_py.FRAMING_TRUNCATED, "truncated-header"),
    ],
    ids=["nothing", "half-header"],
)
async def test_vless_eof_without_a_whole_header(engine, contexts, sent, err, reason) -> None:
    with framed_rig(engine, tls_maker(contexts, VlessResponseDecoder)) as r:
        if sent:
            await r.server.send(sent)
        await r.server.close_notify_and_fin()
        assert await r.rec.end() == upstream_failure(err)
        error = r.framing.error_for(err)
        assert isinstance(error, VlessProtocolError) and error.reason == reason


async def test_vless_bad_version_is_a_protocol_error(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts, VlessResponseDecoder)) as r:
        await r.server.send(b"\x05\x00hello")
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        error = r.framing.error_for(relay_py.FRAMING_PROTOCOL)
        assert isinstance(error, VlessProtocolError) and error.reason == "bad-version"
        assert "5" in str(error)
        assert await recv_until_eof(r.lan) == b""  # nothing of the refused answer reached the client


async def test_a_client_that_does_not_read_holds_the_server_back(engine, contexts) -> None:
    """Backpressure: the engine reads no more records while the client owes it room."""
    with framed_rig(engine, tls_maker(contexts), pair=unix_pair) as r:
        loop = asyncio.get_running_loop()
        chunk = r.server.seal(os.urandom(RECORD * 4))
        sent = 0
        stalled = 0
        while stalled < 20:  # the server's writes stop being taken: everything in between is full
            try:
                n = r.srv.send(chunk)
            except BlockingIOError:
                stalled += 1
                await asyncio.sleep(0.01)
                continue
            sent += n
            if n < len(chunk):
                chunk = chunk[n:]
            else:
                chunk = r.server.seal(os.urandom(RECORD * 4))
            assert sent < 32 * MiB, "the engine kept reading records the client did not take"
        # two socket buffers, one read of records and its plaintext: far below what was offered
        assert sent < 8 * MiB
        more = asyncio.ensure_future(loop.sock_sendall(r.srv, chunk + r.server.seal(os.urandom(4 * MiB))))
        got = 0
        # and it moves again once the client reads: the server's 4 MiB go through. The client
        # reads until they did; stopping at 4 MiB could strand the rest of the last sealed chunk
        # when the buffers in between hold fewer bytes now than while they filled (their
        # accounting is per write, and the writes are sized by how the engine was woken).
        while not (more.done() and got >= 4 * MiB):
            got += len(await asyncio.wait_for(loop.sock_recv(r.lan, 1 << 20), STEP))
        await more


async def test_a_framing_is_relayed_once(engine, contexts) -> None:
    with framed_rig(engine, tls_maker(contexts)) as r:
        a, b = unix_pair()
        try:
            with pytest.raises(ValueError):
                engine.add(a.fileno(), b.fileno(), r.rec, framing=r.framing)
        finally:
            a.close()
            b.close()
        await r.server.send(b"still")
        assert await recv_exactly(r.lan, 5) == b"still"


async def test_the_framing_is_given_back_after_the_end(engine, contexts) -> None:
    released = []
    with framed_rig(engine, tls_maker(contexts)) as r:
        r.framing._on_release = lambda: released.append(r.framing.claimed)
        await r.server.send(b"x")
        assert await recv_exactly(r.lan, 1) == b"x"
        assert r.framing.claimed
        engine.cancel(r.id)
        assert (await r.rec.end())[0] == relay_py.END_CANCELLED
        assert released == [False]
        r.framing.sslobj.session  # noqa: B018 - Python may read the connection again


# --- listener mode: the engine makes the handshake itself (hs_connect) --------------------------------


async def test_hs_connect_shakes_hands_then_seals_the_head_and_the_early_bytes(engine, contexts) -> None:
    client_ctx, server_ctx = contexts
    client, srv, framing, rec, lid = await dial_through_engine(engine, client_ctx, "localhost", b"early")
    try:
        greeting = await recv_exactly(client, 2)
        assert greeting == b"\x05\x00"
        server = await server_handshake(srv, server_ctx)
        plain = server.take(b"")  # the records that came with the client's Finished
        plain += await server.recv_plain(len(b"HEADER\r\nearly") - len(plain)) if len(plain) < 13 else b""
        assert plain == b"HEADER\r\nearly"
        reply = await recv_exactly(client, 10)  # only once the handshake is done
        assert reply[:2] == b"\x05\x00"
        assert rec.events[0][0] == relay_py.EV_OPEN and rec.events[0][2] & relay_py.TLS_13
        assert not rec.events[0][2] & relay_py.TLS_RESUMED
        await server.send(b"answer")
        assert await recv_exactly(client, 6) == b"answer"
        client.shutdown(socket.SHUT_WR)
        assert await server.recv_until_eof() == b""
        assert server.close_notify
        await server.close_notify_and_fin()
        assert await recv_until_eof(client) == b""
        await rec.end()
        report = framing.handshake
        assert report is not None and report.started and report.finished and report.verify_code == 0
    finally:
        engine.unlisten(lid)
        client.close()
        srv.close()


@pytest.mark.parametrize("how", ["wrong-name", "server-closes"])
async def test_a_failed_handshake_replies_1_and_reports_how_far_it_got(engine, contexts, how) -> None:
    client_ctx, server_ctx = contexts
    name = "elsewhere.test" if how == "wrong-name" else "localhost"
    client, srv, framing, rec, lid = await dial_through_engine(engine, client_ctx, name, b"")
    try:
        assert await recv_exactly(client, 2) == b"\x05\x00"
        if how == "wrong-name":
            with pytest.raises(AssertionError, match="closed during the handshake"):
                await server_handshake(srv, server_ctx)
        else:
            assert await asyncio.wait_for(
                asyncio.get_running_loop().sock_recv(srv, 65536), STEP
            )  # ClientHello
            srv.close()
        reply = await recv_exactly(client, 10)
        assert reply[1] == 0x01
        assert await recv_until_eof(client) == b""
        cause, detail = await rec.end()
        assert cause == relay_py.END_ERROR and detail >> 16 == relay_py.SIDE_UPSTREAM
        assert not any(kind == relay_py.EV_OPEN for kind, _, _ in rec.events)
        report = framing.handshake
        assert report is not None and report.started and not report.finished
        if how == "wrong-name":
            assert report.verify_code == 62  # X509_V_ERR_HOSTNAME_MISMATCH
            assert detail & 0xFFFF == errno.EPROTO
        else:
            assert report.verify_code == 0
            assert detail & 0xFFFF in (errno.ECONNRESET, errno.EPIPE)
        await poll(lambda: not framing.claimed, "the framing given back")
    finally:
        engine.unlisten(lid)
        client.close()
        srv.close()


@pytest.mark.parametrize("framing_kind", ["handshake-begun", "websocket"])
async def test_hs_connect_refuses_a_tls_framing_it_cannot_dial_and_keeps_the_request(
    engine, contexts, framing_kind
) -> None:
    """A handshake already made, and WebSocket inside TLS (upgraded in Python first, then relayed)."""
    if framing_kind == "handshake-begun":
        client, c_in, c_out, *_ = handshake(contexts)
        framing = TlsFraming(client, c_in, c_out, TrojanStreamWatch())
        refusal = "handshake has already begun"
    else:
        c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        framing = TlsFraming(
            contexts[0].wrap_bio(c_in, c_out, server_hostname="localhost"),
            c_in,
            c_out,
            TrojanStreamWatch(),
            websocket=True,
        )
        refusal = "upgraded before"
    async with held_request(engine) as (token, sock):
        with pytest.raises(ValueError, match=refusal):
            engine.hs_connect(token, "127.0.0.1", 9, -1, None, framing, b"")
        assert not framing.claimed
        engine.hs_reject(token, 0x01)  # the request is still the caller's to answer
        assert (await recv_exactly(sock, 2 + 10))[2:4] == b"\x05\x01"
