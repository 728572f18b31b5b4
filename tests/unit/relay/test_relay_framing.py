"""Framed (Shadowsocks AEAD) flows through the relay engines, on real socket pairs.

Engines: ``compiled`` (relay_c, absent under HONK_NO_EXTENSIONS or without a
build) and ``twin`` (relay_py); every async test runs on asyncio and uvloop.

Layout of every flow: ``lan`` is the test's client socket, whose peer is the
engine's client fd; ``srv`` is the test's Shadowsocks server end, whose peer is
the engine's upstream fd. The test plays the server with the codec of
:mod:`honk.proto.shadowsocks`: it already holds what ``dial_tcp`` sent (the
client's salt and address chunk), opens what the engine seals, and seals what
the engine must open.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from helpers.engines import (
    ENGINES,
    RELAYS,
    STEP,
    FramedRig,
    FramedServer,
    Recorder,
    engine_class,
    engine_dialled,
    framed_rig,
    poll,
    recv_exactly,
    recv_until_eof,
    relay_flow,
    upstream_failure,
)
from helpers.sockets import open_fds, tcp_pair, unix_pair
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk._fast import relay_py
from honk.core.errors import ClientGone
from honk.proto.shadowsocks import (
    CIPHERS,
    MAX_PAYLOAD,
    ShadowsocksAuthError,
    ShadowsocksFraming,
    ShadowsocksProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    derive_subkey,
    master_key,
)
from honk.relay.native import close_engines
from honk.relay.stream import StreamConn

MiB = 1024**2
ADDRESS = b"\x01\x7f\x00\x00\x01\x00\x50"  # the target header dial_tcp sent: 127.0.0.1:80
CHUNK_OVERHEAD = 2 + 16 + 16  # SIP004: sealed length (2 + tag) + the payload's tag
SWEEP = (1, MAX_PAYLOAD, MAX_PAYLOAD + 1, 3 * MAX_PAYLOAD + 7)


def _master(cipher: str) -> bytes:
    return master_key("framing test", CIPHERS[cipher].key_size)


class Server(FramedServer):
    """The test's Shadowsocks server end of one flow."""

    def __init__(self, sock: socket.socket, cipher: str, master: bytes, client_enc: StreamEncryptor) -> None:
        self.sock = sock
        self.cipher = cipher
        self.master = master
        self.dec = StreamDecryptor(cipher, master)
        self.enc = StreamEncryptor(cipher, master)
        # what dial_tcp sent before the engine took over: salt + the address chunk
        dialled = client_enc.encrypt(ADDRESS)
        assert self.dec.feed(dialled) == ADDRESS
        self.wire = bytearray(dialled)  # every byte of the client's direction, from the salt on

    def take(self, data: bytes) -> bytes:
        self.wire += data
        return self.dec.feed(data)

    async def send_plain(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, self.enc.encrypt(data))

    async def send_wire(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)


@contextlib.contextmanager
def rig(engine: Any, cipher: str = "aes-256-gcm", **kwargs: Any) -> Iterator[FramedRig]:
    """A Shadowsocks flow: dial_tcp already sent the salt and address chunk (see Server)."""
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)

    def make(srv: socket.socket) -> tuple[Server, ShadowsocksFraming]:
        return Server(srv, cipher, master, enc), ShadowsocksFraming(
            cipher, master, enc, StreamDecryptor(cipher, master)
        )

    with framed_rig(engine, make, **kwargs) as r:
        yield r


def chunk_lengths(cipher: str, master: bytes, wire: bytes) -> list[int]:
    """The payload length of every chunk in one direction's wire bytes (salt first), opened independently."""
    spec = CIPHERS[cipher]
    aead_class = ChaCha20Poly1305 if cipher.startswith("chacha") else AESGCM
    aead = aead_class(derive_subkey(cipher, master, wire[: spec.salt_size]))
    pos, nonce, out = spec.salt_size, 0, []
    while pos < len(wire):
        head = aead.decrypt(nonce.to_bytes(12, "little"), wire[pos : pos + 18], None)
        length = int.from_bytes(head, "big")
        out.append(length)
        pos += 18 + length + 16
        nonce += 2
    assert pos == len(wire)
    return out


# --- data both ways ---------------------------------------------------------------------


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
async def test_8_mib_each_way_arrive_intact_at_the_same_time(engine, cipher) -> None:
    up = os.urandom(8 * MiB)
    down = os.urandom(8 * MiB)
    loop = asyncio.get_running_loop()
    with rig(engine, cipher, pair=tcp_pair) as r:

        async def server_sends() -> None:
            for i in range(0, len(down), MiB):
                await r.server.send_plain(down[i : i + MiB])

        send_up = loop.create_task(loop.sock_sendall(r.lan, up))
        send_down = loop.create_task(server_sends())
        got_up, got_down = await asyncio.gather(r.server.recv_plain(len(up)), recv_exactly(r.lan, len(down)))
        await asyncio.wait_for(asyncio.gather(send_up, send_down), STEP)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()
        assert max(chunk_lengths(cipher, r.server.master, bytes(r.server.wire))) <= MAX_PAYLOAD
        assert engine.counters(r.id) == (
            len(up),
            r.server.enc.nonce // 2 * CHUNK_OVERHEAD + len(down) + len(r.server.enc.salt),
        )


@pytest.mark.parametrize("size", SWEEP)
async def test_chunk_boundary_sizes_cross_both_ways(engine, size) -> None:
    data = os.urandom(size)
    with rig(engine, "chacha20-ietf-poly1305") as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, data)
        assert await r.server.recv_plain(size) == data
        await r.server.send_plain(data)  # the server's chunks split at the same boundaries
        assert await recv_exactly(r.lan, size) == data


@pytest.mark.parametrize("size", SWEEP)
async def test_client_bytes_read_at_once_are_sealed_as_maximal_chunks(engine, size) -> None:
    data = os.urandom(size)
    with rig(engine, "aes-128-gcm", before_add=data) as r:
        assert await r.server.recv_plain(size) == data
        lengths = chunk_lengths("aes-128-gcm", r.server.master, bytes(r.server.wire))
        # the address chunk dial_tcp sent, then every payload chunk full but the last
        full, rest = divmod(size, MAX_PAYLOAD)
        assert lengths == [len(ADDRESS)] + [MAX_PAYLOAD] * full + ([rest] if rest else [])


async def test_preamble_is_sealed_and_precedes_later_client_bytes(engine) -> None:
    with rig(engine, preamble=b"pipelined:") as r:
        await asyncio.get_running_loop().sock_sendall(r.lan, b"later")
        assert await r.server.recv_plain(len(b"pipelined:later")) == b"pipelined:later"


async def test_server_salt_and_chunks_arriving_one_byte_at_a_time_are_opened(engine) -> None:
    with rig(engine, "aes-256-gcm") as r:
        wire = r.server.enc.encrypt(b"first") + r.server.enc.encrypt(b"second chunk")
        loop = asyncio.get_running_loop()
        for i in range(len(wire)):
            await loop.sock_sendall(r.srv, wire[i : i + 1])
            # the engine has read this byte before the next one is sent: every read is one byte
            await poll(lambda i=i: engine.counters(r.id)[1] == i + 1, f"byte {i} read")
        assert await recv_exactly(r.lan, len(b"firstsecond chunk")) == b"firstsecond chunk"


# --- what the upstream sends wrong --------------------------------------------------------


@pytest.mark.parametrize("where", ["salt", "length", "length-tag", "payload", "payload-tag"])
async def test_a_flipped_byte_ends_only_that_flow_as_an_upstream_auth_failure(engine, where) -> None:
    with rig(engine) as bad, rig(engine) as good:
        salt = 32
        wire = bytearray(bad.server.enc.encrypt(b"hello, client"))
        offset = {
            "salt": 5,
            "length": salt,
            "length-tag": salt + 2 + 3,
            "payload": salt + 18 + 4,
            "payload-tag": len(wire) - 1,
        }[where]
        wire[offset] ^= 0x01
        await bad.server.send_wire(bytes(wire))
        assert await bad.rec.end() == upstream_failure(relay_py.FRAMING_AUTH)
        assert engine.framing_errors() == (1, 0)
        assert await recv_until_eof(bad.lan) == b""  # nothing of the forged chunk reached the client
        # the other flow on the engine goes on
        await asyncio.get_running_loop().sock_sendall(good.lan, b"still here?")
        assert await good.server.recv_plain(11) == b"still here?"
        await good.server.send_plain(b"yes")
        assert await recv_exactly(good.lan, 3) == b"yes"
        assert not good.rec.ended.done()


async def test_an_oversized_chunk_length_is_an_upstream_protocol_error(engine) -> None:
    with rig(engine, "aes-128-gcm") as r:
        enc = r.server.enc
        await r.server.send_plain(b"fine")
        assert await recv_exactly(r.lan, 4) == b"fine"
        # a correctly sealed length of 0x4000: authentic, but over the SIP004 cap
        aead = AESGCM(enc.subkey)
        await r.server.send_wire(
            aead.encrypt(enc.nonce.to_bytes(12, "little"), (MAX_PAYLOAD + 1).to_bytes(2, "big"), None)
        )
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_PROTOCOL)
        assert engine.framing_errors() == (0, 1)
        assert await recv_until_eof(r.lan) == b""


@pytest.mark.parametrize("cut", ["salt", "length", "payload"])
async def test_upstream_eof_inside_the_salt_or_a_chunk_is_a_truncation(engine, cut) -> None:
    with rig(engine, "aes-128-gcm") as r:
        wire = r.server.enc.encrypt(b"complete") + r.server.enc.encrypt(b"cut short")
        first = 16 + 18 + len(b"complete") + 16
        keep = {"salt": 7, "length": first + 9, "payload": len(wire) - 3}[cut]
        await r.server.send_wire(wire[:keep])
        r.srv.shutdown(socket.SHUT_WR)
        assert await r.rec.end() == upstream_failure(relay_py.FRAMING_TRUNCATED)
        assert engine.framing_errors() == (0, 1)
        assert await recv_until_eof(r.lan) == (b"" if cut == "salt" else b"complete")


async def test_upstream_eof_before_any_byte_is_a_clean_half_close(engine) -> None:
    with rig(engine) as r:
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b""
        await asyncio.get_running_loop().sock_sendall(r.lan, b"bye")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == b"bye"
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)


# --- half-close -----------------------------------------------------------------------


async def test_client_eof_shuts_the_upstream_after_the_pending_chunks(engine) -> None:
    loop = asyncio.get_running_loop()
    with rig(engine) as r:
        question = os.urandom(3 * MAX_PAYLOAD + 7)
        await loop.sock_sendall(r.lan, question)
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == question
        await r.server.send_plain(b"the answer")  # the other direction still flows
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"the answer"
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)
        # the first EOF is told with a report a flow this short may not live to see; never the second
        assert [a for kind, a, _ in r.rec.events if kind == relay_py.EV_HALF_CLOSE] in ([], [0])


async def test_upstream_eof_after_whole_chunks_shuts_the_client_and_keeps_the_way_up(engine) -> None:
    loop = asyncio.get_running_loop()
    with rig(engine) as r:
        await r.server.send_plain(b"all of it")
        r.srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(r.lan) == b"all of it"
        await loop.sock_sendall(r.lan, b"late words")
        r.lan.shutdown(socket.SHUT_WR)
        assert await r.server.recv_until_eof() == b"late words"
        assert await r.rec.end() == (relay_py.END_CLEAN, 0)
        # the first EOF is told with a report a flow this short may not live to see; never the second
        assert [a for kind, a, _ in r.rec.events if kind == relay_py.EV_HALF_CLOSE] in ([], [1])


async def test_a_framing_the_engines_cannot_carry_is_refused_before_the_fds_are_taken(engine) -> None:
    master = _master("aes-128-gcm")
    fresh = StreamEncryptor("aes-128-gcm", master)  # its salt has not gone out: the engine cannot continue it
    framing = ShadowsocksFraming("aes-128-gcm", master, fresh, StreamDecryptor("aes-128-gcm", master))
    lan, lan_peer = unix_pair()
    srv, upstream = unix_pair()
    try:
        with pytest.raises(ValueError):
            engine.add(lan_peer.fileno(), upstream.fileno(), Recorder(), framing=framing)
        assert engine.active == 0
        lan.sendall(b"still mine")  # the caller still owns both fds
        assert lan_peer.recv(100) == b"still mine"
        upstream.sendall(b"mine too")
        assert srv.recv(100) == b"mine too"
    finally:
        for sock in (lan, lan_peer, srv, upstream):
            sock.close()


# --- resources ------------------------------------------------------------------------


async def test_no_fd_left_after_2000_framed_flows(engine) -> None:
    loop = asyncio.get_running_loop()
    master = _master("chacha20-ietf-poly1305")

    async def one() -> tuple[int, int]:
        lan, lan_peer = unix_pair()
        srv, upstream = unix_pair()
        enc = StreamEncryptor("chacha20-ietf-poly1305", master)
        enc.encrypt(b"")  # the salt went out with the dial
        rec = Recorder()
        framing = ShadowsocksFraming(
            "chacha20-ietf-poly1305", master, enc, StreamDecryptor("chacha20-ietf-poly1305", master)
        )
        try:
            engine.add(lan_peer.detach(), upstream.detach(), rec, framing=framing)
            await loop.sock_sendall(lan, b"ping")
            lan.shutdown(socket.SHUT_WR)
            assert len(await recv_until_eof(srv)) == 4 + CHUNK_OVERHEAD
            srv.shutdown(socket.SHUT_WR)
            assert await recv_until_eof(lan) == b""
            return await rec.end()
        finally:
            lan.close()
            srv.close()

    # Engines and sockets left by earlier tests would otherwise close (on GC) mid-count; one
    # flow first, so that the loop's own lazily created fds are there already.
    gc.collect()
    close_engines()
    await one()
    before = open_fds()
    for _ in range(20):
        ends = await asyncio.gather(*(one() for _ in range(100)))
        assert set(ends) == {(relay_py.END_CLEAN, 0)}
    assert engine.active == 0
    assert open_fds() == before


# --- listener mode: a Python-dialled framed upstream ---------------------------------------


class _FastListener:
    """Answers the engine's SOCKS5 request with hs_relay over a framed upstream."""

    def __init__(
        self, engine: Any, upstream: socket.socket, framing: ShadowsocksFraming, rec: Recorder
    ) -> None:
        self.engine, self.upstream, self.framing, self.rec = engine, upstream, framing, rec

    def socks_request(self, token: int, src_host: str, src_port: int, host: str, port: int) -> None:
        self.engine.hs_relay(token, self.upstream.detach(), self.rec, self.framing)

    def socks_handover(
        self, fd: int, data: bytes, answered: int, err: int, src_host: str, src_port: int
    ) -> None:
        os.close(fd)
        raise AssertionError("the handshake was handed over")

    def socks_dropped(self) -> None:
        pass


async def test_hs_relay_seals_the_early_payload_and_replies_in_clear(engine) -> None:
    loop = asyncio.get_running_loop()
    cipher = "aes-256-gcm"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    srv, upstream = unix_pair()
    server = Server(srv, cipher, master, enc)
    rec = Recorder()
    framing = ShadowsocksFraming(cipher, master, enc, StreamDecryptor(cipher, master))
    with socket.create_server(("127.0.0.1", 0)) as listening:
        lid = engine.listen(listening.fileno(), _FastListener(engine, upstream, framing, rec))
        client = socket.create_connection(listening.getsockname())
        client.setblocking(False)
        try:
            # greeting, CONNECT 127.0.0.1:80 and early payload in one write
            await loop.sock_sendall(client, b"\x05\x01\x00" + b"\x05\x01\x00" + ADDRESS + b"GET / early")
            reply = await recv_exactly(client, 2 + 10)
            assert reply[:2] == b"\x05\x00" and reply[2:4] == b"\x05\x00"
            assert await server.recv_plain(11) == b"GET / early"
            await server.send_plain(b"HTTP/1.0 200")
            assert await recv_exactly(client, 12) == b"HTTP/1.0 200"
            await _both_close_cleanly(client, server, rec)
        finally:
            engine.unlisten(lid)
            client.close()
            srv.close()


async def _both_close_cleanly(client: socket.socket, server: Server, rec: Recorder) -> None:
    """The client's EOF reaches the server, the server's the client, and the flow ends clean."""
    client.shutdown(socket.SHUT_WR)
    assert await server.recv_until_eof() == b""
    server.sock.shutdown(socket.SHUT_WR)
    assert await recv_until_eof(client) == b""
    assert await rec.end() == (relay_py.END_CLEAN, 0)


async def _engine_dialled(
    engine: Any, framing: Any, head: bytes, early: bytes
) -> tuple[socket.socket, socket.socket, Recorder, int]:
    """helpers.engines.engine_dialled, with the client's two replies read and checked."""
    client, srv, rec, lid = await engine_dialled(engine, framing, head, early)
    reply = await recv_exactly(client, 2 + 10)
    assert reply[:4] == b"\x05\x00\x05\x00"
    assert reply[8:10] != b"\x00\x00"  # the bound port of the engine's own upstream socket
    return client, srv, rec, lid


async def _server_reads(srv: socket.socket, dec: StreamDecryptor, want: int) -> tuple[bytearray, bytearray]:
    """What the server side reads until ``want`` plaintext bytes opened: the wire bytes and the plaintext."""
    wire = bytearray()
    plain = bytearray()
    while len(plain) < want:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(srv, 1 << 16), STEP)
        assert data
        wire += data
        plain += dec.feed(data)
    return wire, plain


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
async def test_hs_connect_sends_the_salt_and_seals_the_head_of_a_framing_that_sent_nothing(
    engine, cipher
) -> None:
    """The engine's own dial of a Shadowsocks node: the framing's salt, the address chunk on its
    own (as dial_tcp sends it), the early payload sealed after it, and the server's bytes opened."""
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    framing = ShadowsocksFraming(cipher, master, enc, StreamDecryptor(cipher, master))
    client, srv, rec, lid = await _engine_dialled(engine, framing, ADDRESS, b"GET / early")
    dec = StreamDecryptor(cipher, master)
    try:
        wire, plain = await _server_reads(srv, dec, len(ADDRESS) + 11)
        assert bytes(wire[: CIPHERS[cipher].salt_size]) == enc.salt
        assert bytes(plain) == ADDRESS + b"GET / early"
        assert chunk_lengths(cipher, master, bytes(wire)) == [len(ADDRESS), 11]
        server_enc = StreamEncryptor(cipher, master)
        await asyncio.get_running_loop().sock_sendall(srv, server_enc.encrypt(b"HTTP/1.0 200"))
        assert await recv_exactly(client, 12) == b"HTTP/1.0 200"
        client.shutdown(socket.SHUT_WR)
        assert dec.feed(await recv_until_eof(srv)) == b""
        srv.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(client) == b""
        assert await rec.end() == (relay_py.END_CLEAN, 0)
        assert rec.events[0][0] == relay_py.EV_OPEN
    finally:
        engine.unlisten(lid)
        client.close()
        srv.close()


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
async def test_hs_connect_of_a_fresh_framing_picks_a_new_salt_per_flow(engine, cipher) -> None:
    """A framing made without codecs (what ShadowsocksOutbound hands the engine's own dial): the
    engine picks the salt itself, a different one each flow, and the server opens the address
    chunk and the early payload under it. The compiled engine never makes the Python codecs."""
    master = _master(cipher)
    salts = []
    for _ in range(2):
        framing = ShadowsocksFraming(cipher, master)
        assert framing.fresh
        client, srv, rec, lid = await _engine_dialled(engine, framing, ADDRESS, b"early")
        try:
            wire, plain = await _server_reads(srv, StreamDecryptor(cipher, master), len(ADDRESS) + 5)
            assert bytes(plain) == ADDRESS + b"early"
            assert chunk_lengths(cipher, master, bytes(wire)) == [len(ADDRESS), 5]
            salts.append(bytes(wire[: CIPHERS[cipher].salt_size]))
            client.shutdown(socket.SHUT_WR)
            srv.shutdown(socket.SHUT_WR)
            assert await recv_until_eof(client) == b""
            assert await rec.end() == (relay_py.END_CLEAN, 0)
            if engine.implementation == "compiled":
                assert framing.fresh  # no StreamEncryptor/StreamDecryptor was made for the flow
        finally:
            engine.unlisten(lid)
            client.close()
            srv.close()
    assert salts[0] != salts[1]
    assert len(set(salts[0])) > 1  # random bytes, not a zeroed buffer


async def test_hs_connect_sends_a_head_as_it_is_after_a_framing_that_sent_its_salt(engine) -> None:
    cipher = "chacha20-ietf-poly1305"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    head = enc.encrypt(ADDRESS)  # sealed by the caller, as a VMess request header is
    framing = ShadowsocksFraming(cipher, master, enc, StreamDecryptor(cipher, master))
    client, srv, rec, lid = await _engine_dialled(engine, framing, head, b"")
    try:
        server = Server(srv, cipher, master, StreamEncryptor(cipher, master))
        server.dec = StreamDecryptor(cipher, master)  # this flow's client salt comes from the wire
        assert await server.recv_plain(len(ADDRESS)) == ADDRESS
        await asyncio.get_running_loop().sock_sendall(client, b"more")
        assert await server.recv_plain(4) == b"more"
        await _both_close_cleanly(client, server, rec)
    finally:
        engine.unlisten(lid)
        client.close()
        srv.close()


# --- properties ----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    engine_name=st.sampled_from(ENGINES),
    payloads=st.lists(st.integers(min_value=0, max_value=3 * MAX_PAYLOAD), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=8),
)
def test_any_split_of_the_server_stream_opens_to_the_same_bytes(engine_name, payloads, cuts) -> None:
    async def main() -> None:
        engine = engine_class(engine_name)(asyncio.get_running_loop())
        try:
            with rig(engine, "chacha20-ietf-poly1305") as r:
                plain = b"".join(os.urandom(n) for n in payloads)
                wire = b"".join(
                    r.server.enc.encrypt(plain[sum(payloads[:i]) : sum(payloads[: i + 1])])
                    for i in range(len(payloads))
                )
                pos, k = 0, 0
                while pos < len(wire):  # the wire in pieces of the drawn sizes, in turn
                    piece = wire[pos : pos + cuts[k % len(cuts)]]
                    await r.server.send_wire(piece)
                    pos += len(piece)
                    k += 1
                r.srv.shutdown(socket.SHUT_WR)
                assert await recv_until_eof(r.lan) == plain
        finally:
            engine.close()

    asyncio.run(main())


# --- the relays over a framed upstream ------------------------------------------------------


async def _relay_rig(relay: Any, cipher: str = "aes-128-gcm"):
    """A relay run over a framed upstream: (client socket, server end, run task)."""
    lan, lan_peer = tcp_pair()
    srv, upstream = tcp_pair()
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    server = Server(srv, cipher, master, enc)
    framing = ShadowsocksFraming(cipher, master, enc, StreamDecryptor(cipher, master))
    conn = StreamConn(ClientGone)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=lan_peer)
    task = asyncio.ensure_future(relay.run(conn, upstream, framing))
    return lan, server, task


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_carry_a_framed_upstream_and_finish_cleanly(kind) -> None:
    loop = asyncio.get_running_loop()
    async with relay_flow(kind, _relay_rig) as (relay, lan, server, task):
        payload = os.urandom(MiB)
        await loop.sock_sendall(lan, payload)
        lan.shutdown(socket.SHUT_WR)
        assert await server.recv_until_eof() == payload
        await server.send_plain(b"answer" * 5000)
        server.sock.shutdown(socket.SHUT_WR)
        assert await recv_until_eof(lan) == b"answer" * 5000
        await asyncio.wait_for(task, STEP)
        assert relay.bytes_up == MiB


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_end_with_shadowsocks_auth_error_on_a_bad_tag(kind) -> None:
    async with relay_flow(kind, _relay_rig) as (relay, lan, server, task):
        wire = bytearray(server.enc.encrypt(b"tampered"))
        wire[-1] ^= 0x80
        await server.send_wire(bytes(wire))
        with pytest.raises(ShadowsocksAuthError) as info:
            await asyncio.wait_for(task, STEP)
        assert info.value.reason == "bad-tag"


@pytest.mark.parametrize("kind", RELAYS)
async def test_relays_end_with_a_truncated_protocol_error_on_eof_inside_a_chunk(kind) -> None:
    async with relay_flow(kind, _relay_rig) as (relay, lan, server, task):
        await server.send_wire(server.enc.encrypt(b"never finished")[:-5])
        server.sock.shutdown(socket.SHUT_WR)
        with pytest.raises(ShadowsocksProtocolError) as info:
            await asyncio.wait_for(task, STEP)
        assert info.value.reason == "truncated"
