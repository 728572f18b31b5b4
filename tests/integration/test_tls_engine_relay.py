"""Trojan, VLESS and VMess over TCP + TLS, and over WebSocket + TLS, relayed by the relay engine
itself: no socketpair, no bridge.

Against a real v2ray server (Trojan, VLESS and VMess, on TLS and on WebSocket over TLS): a SOCKS5 CONNECT through honk's
mixed port carries 16 MiB each way intact while the bridge runs no pump, a dial costs
exactly one descriptor (the server's socket; the client's is the other one of the flow),
and a refused credential ends the flow with the protocol's typed error. Against a Python
TLS 1.3 server that issues tickets: the second dial resumes the session the first flow's
connection learnt once the engine gave it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import ssl
import threading
import time

import pytest
import trustme
from helpers.aio import close_writer, socks5_open
from helpers.inprocess import honk_via, leaf_from_link, open_through
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer
from helpers.sockets import open_fds

from honk._fast import relay as fast_relay
from honk.core.net import Address
from honk.outbound import bridge
from honk.proto.tls_framing import TlsFraming
from honk.proto.trojan import password_hash
from honk.relay.native import NativeRelay, framed_socket
from honk.relay.stream import StreamConn

STEP = 10.0
MiB = 1024 * 1024
PAYLOAD = 16 * MiB


@pytest.fixture
def trust(monkeypatch):
    def use(peer) -> None:  # noqa: ANN001
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))

    return use


ENGINE_TRANSPORTS = [
    pytest.param(protocol, transport, id=f"{protocol}-{transport}-tls")
    for protocol in ("trojan", "vless", "vmess")
    for transport in ("tcp", "ws")
]


@pytest.mark.parametrize(("protocol", "transport"), ENGINE_TRANSPORTS)
def test_socks5_through_honk_is_relayed_by_the_engine_not_bridged(run, trust, protocol, transport) -> None:
    payload = os.urandom(PAYLOAD)

    async def main(link: str, echo: EchoServer) -> bytes:
        async with honk_via(link) as port:
            reader, writer, code, _ = await socks5_open(port, "127.0.0.1", echo.port)
            assert code == 0

            async def upload() -> None:
                writer.write(payload)
                await writer.drain()
                writer.write_eof()

            try:
                sending = asyncio.ensure_future(upload())
                first = await asyncio.wait_for(reader.readexactly(MiB), STEP)
                assert not bridge._pumps  # mid-flow: nothing pumps a socketpair for it
                rest = await asyncio.wait_for(reader.readexactly(len(payload) - MiB), 6 * STEP)
                await sending
                if transport == "tcp":  # (WebSocket has no half-close to pass on)
                    assert (
                        await asyncio.wait_for(reader.read(), STEP) == b""
                    )  # v2ray passes the half-close back
                return first + rest
            finally:
                await close_writer(writer)

    with EchoServer() as echo, v2ray_server(protocol, transport=transport, tls=True) as peer:
        trust(peer)
        got = run(main(peer.share_link(), echo))
        assert peer.accepted()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


@pytest.mark.parametrize(("protocol", "transport"), ENGINE_TRANSPORTS)
def test_a_dial_holds_one_descriptor_and_hands_the_engine_a_tls_framing(
    run, trust, protocol, transport
) -> None:
    async def main(link: str, echo: EchoServer) -> None:
        leaf = leaf_from_link(link)
        leaf.runtime = None  # no warm-up connections opened ahead: only the dial's own descriptors count
        # a target outside this process (the echo server's accepted sockets are in it); nothing listens
        # there, which the dial does not wait to learn
        elsewhere = Address("127.0.0.1", 9)
        warm = await leaf.dial_tcp(elsewhere, time.monotonic() + STEP)
        warm.sock.close()  # the loop's and the context's one-time descriptors are made by now
        before = open_fds()
        dialed = await leaf.dial_tcp(elsewhere, time.monotonic() + STEP)
        try:
            assert open_fds() - before == 1  # the server's socket: no socketpair
            assert isinstance(dialed.framing, TlsFraming) and dialed.bridge is None
            assert dialed.framing.websocket == (transport == "ws")
            assert (dialed.framing.inner is not None) == (
                protocol == "vmess"
            )  # VMess's chunks inside the records
            assert dialed.sock.getpeername()[1] == peer.port
            assert not bridge._pumps
        finally:
            dialed.sock.close()
        # a socket of the relay's own (HTTP forwarder, DNS, probes) over the same framing
        sock = await open_through(leaf, Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        reader, writer = await asyncio.open_connection(sock=sock)
        hello = b"hello over TLS relayed by the engine"
        writer.write(hello)
        if transport == "tcp":
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), STEP) == hello
        else:
            assert await asyncio.wait_for(reader.readexactly(len(hello)), STEP) == hello
        await close_writer(writer)

    with EchoServer() as echo, v2ray_server(protocol, transport=transport, tls=True) as peer:
        trust(peer)
        run(main(peer.share_link(), echo))


@pytest.mark.parametrize("transport", ["tcp", "ws"])
@pytest.mark.parametrize(("protocol", "reason"), [("trojan", "closed-before-data"), ("vless", "no-response")])
def test_a_refused_credential_ends_the_flow_with_the_protocols_typed_error(
    run, trust, protocol, reason, transport
) -> None:
    async def main(link: str, echo: EchoServer) -> None:
        leaf = leaf_from_link(link)
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        client, lan = socket.socketpair()
        relay = NativeRelay(leaf.clock)
        conn = StreamConn(ConnectionError)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, client)
        lan.sendall(b"anybody there?")
        with pytest.raises(Exception) as info:
            await asyncio.wait_for(relay.run(conn, dialed.sock, dialed.framing), STEP)
        lan.close()
        assert getattr(info.value, "reason", None) == reason, info.value

    with EchoServer() as echo, v2ray_server(protocol, transport=transport, tls=True) as peer:
        trust(peer)
        run(main(peer.share_link(uuid="0b9a3a6f-2b43-4b7e-9d07-3c1d0e7c2a11", password="wrong"), echo))


# --- resumption -------------------------------------------------------------------------------------


class TicketingTrojanServer:
    """A TLS 1.3 server issuing session tickets that answers a Trojan request by echoing its payload."""

    def __init__(self, ca: trustme.CA) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        ca.issue_cert("localhost").configure_cert(self.context)
        self.reused: list[bool] = []
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> TicketingTrojanServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reused.append(writer.get_extra_info("ssl_object").session_reused)
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n")
            assert head[:-2] == password_hash("secret")
            await reader.readuntil(b"\r\n")  # command and address
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()


def test_tls13_resumption_survives_the_engine_owning_the_connection(run, tmp_path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def flow(leaf) -> bool:  # noqa: ANN001 - one relayed flow; whether its handshake resumed
        dialed = await leaf.dial_tcp(Address("127.0.0.1", 9), time.monotonic() + STEP)
        resumed = dialed.framing.sslobj.session_reused
        plain = framed_socket(dialed.sock, dialed.framing)
        reader, writer = await asyncio.open_connection(sock=plain)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"ping"
        writer.write_eof()
        await close_writer(writer)
        await _released(dialed.framing)
        return resumed

    async def main() -> list[bool]:
        async with TicketingTrojanServer(ca) as server:
            link = f"trojan://secret@127.0.0.1:{server.port}?security=tls&sni=localhost&ca={ca_file}#node"
            leaf = leaf_from_link(link)
            return [await flow(leaf) for _ in range(3)]

    assert run(main()) == [False, True, True]


@pytest.mark.compiled
@pytest.mark.skipif(
    fast_relay.IMPLEMENTATION != "compiled",
    reason="the compiled engine drives the SSL itself (the twin through Python's ssl)",
)
def test_a_bulk_tls_flow_keeps_its_record_buffers_and_a_quiet_one_gives_them_back(run, trust) -> None:
    """CPython's contexts make OpenSSL free a record buffer whenever it empties (a malloc and a
    free per 16 KiB moved); the engine turns that off while a direction moves bulk and back on
    when its reads are small again, so an idle flow holds no record buffers."""
    from honk._fast.relay_c import _releases_buffers

    async def main(link: str, echo: EchoServer) -> None:
        dialed = await leaf_from_link(link).dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        sslobj = dialed.framing.sslobj
        assert _releases_buffers(sslobj)  # CPython's default, before the engine moved a byte
        reader, writer = await asyncio.open_connection(sock=framed_socket(dialed.sock, dialed.framing))
        try:
            payload = os.urandom(PAYLOAD)
            writer.write(payload)
            got, bulk_seen = 0, False
            while got < len(payload):
                chunk = await asyncio.wait_for(reader.read(256 * 1024), STEP)
                assert chunk, "the echo ended early"
                got += len(chunk)
                bulk_seen = bulk_seen or not _releases_buffers(sslobj)
            await writer.drain()
            assert bulk_seen, "the buffers were given back after every record of a 16 MiB echo"
            writer.write(b"quiet")
            assert await asyncio.wait_for(reader.readexactly(5), STEP) == b"quiet"
            assert _releases_buffers(sslobj), "a quiet flow still holds its record buffers"
        finally:
            await close_writer(writer)

    with EchoServer() as echo, v2ray_server("trojan", transport="tcp", tls=True) as peer:
        trust(peer)
        run(main(peer.share_link(), echo))


async def _released(framing: TlsFraming) -> None:
    """Wait until the engine gave the connection back (its flow's END was delivered)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP
    while framing.claimed:
        assert loop.time() < deadline, "the engine never gave the connection back"
        await asyncio.sleep(0.005)


def test_the_engine_in_use_can_relay_tls() -> None:
    assert fast_relay.tls_supported()


def test_a_python_dialled_handshake_takes_the_servers_flight_off_the_loops_thread(
    run, tmp_path, monkeypatch
) -> None:
    """The ClientHello is made on the loop's thread; the server's flight (key exchange, the
    certificate chain: nearly all of a handshake's CPU) in one of tls.HANDSHAKE_THREADS."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    threads: list[str] = []
    shake = ssl.SSLObject.do_handshake

    def watched(self: ssl.SSLObject) -> None:
        if not self.server_side:  # the test's server shakes hands in this process too
            threads.append(threading.current_thread().name)
        shake(self)

    monkeypatch.setattr(ssl.SSLObject, "do_handshake", watched)

    async def main() -> None:
        async with TicketingTrojanServer(ca) as server:
            link = f"trojan://secret@127.0.0.1:{server.port}?security=tls&sni=localhost&ca={ca_file}#node"
            dialed = await leaf_from_link(link).dial_tcp(Address("127.0.0.1", 9), time.monotonic() + STEP)
            dialed.sock.close()

    run(main())
    assert threads[0] == threading.current_thread().name  # asyncio runs the test's loop on this thread
    assert threads[1:] and all(name.startswith("honk-tls") for name in threads[1:]), threads
