"""Transports from a link's parameters: TCP, WebSocket, TLS + WebSocket, against real sockets.

The WebSocket server is a few lines here (upgrade, then echo binary messages); TLS
is haproxy in front of it with a trustme certificate (tests/helpers/peerservers.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import trustme
from helpers.peerservers import tls_front
from helpers.servers import EchoServer

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import MonotonicClock
from honk.core.errors import ConfigRefused, DialError
from honk.outbound.proxy import ProxyLeaf
from honk.outbound.transport import TransportSpec, open_tls, open_transport, upgrade_relayed
from honk.proto.tls_framing import TlsFraming
from honk.proto.trojan import TrojanStreamWatch
from honk.relay.native import framed_socket

STEP = 5.0
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WsEchoServer:
    """Upgrades one client per connection (or answers ``status``), then echoes its binary messages."""

    def __init__(self, status: int = 101, accept: str | None = None, after_upgrade: bytes = b"") -> None:
        self.status, self.accept = status, accept
        self.after_upgrade = after_upgrade  # frames sent with the 101, in the same write
        self.pongs: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            self.requests.append(head)
            key = [
                line.split(b":", 1)[1].strip()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key")
            ][0]
            accept = self.accept or base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
            if self.status != 101:
                conn.sendall(f"HTTP/1.1 {self.status} Nope\r\nContent-Length: 0\r\n\r\n".encode())
                return
            conn.sendall(
                (
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
                ).encode()
                + self.after_upgrade
            )
            buf = b""
            while data := conn.recv(65536):
                buf += data
                while len(buf) >= 2:
                    n, head_len = buf[1] & 0x7F, 2
                    if n == 126:
                        n, head_len = struct.unpack_from("!H", buf, 2)[0], 4
                    elif n == 127:
                        n, head_len = struct.unpack_from("!Q", buf, 2)[0], 10
                    if len(buf) < head_len + 4 + n:
                        break
                    mask = buf[head_len : head_len + 4]
                    body = bytes(b ^ mask[i % 4] for i, b in enumerate(buf[head_len + 4 : head_len + 4 + n]))
                    op = buf[0] & 0x0F
                    buf = buf[head_len + 4 + n :]
                    if op == 0x8:
                        return
                    if op == 0xA:
                        self.pongs.append(body)
                        continue
                    size = (
                        struct.pack("!BBH", 0x82, 126, len(body))
                        if len(body) > 125
                        else struct.pack("!BB", 0x82, len(body))
                    )
                    conn.sendall(size + body)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def ws_server(**kwargs) -> Iterator[WsEchoServer]:
    server = WsEchoServer(**kwargs)
    try:
        yield server
    finally:
        server.close()


def _leaf(port: int) -> ProxyLeaf:
    return ProxyLeaf(
        NodeSpec("node", "test", "127.0.0.1", port), GlobalSpec(connect_timeout=STEP), MonotonicClock()
    )


async def _echo(leaf: ProxyLeaf, spec: TransportSpec, payload: bytes) -> bytes:
    channel = await open_transport(leaf, spec, leaf.clock.now() + STEP)
    try:
        channel.write(payload)
        await channel.drain()
        got = b""
        while len(got) < len(payload):
            data = await asyncio.wait_for(channel.receive(), STEP)
            assert data, "EOF before the echo"
            got += data
        return got
    finally:
        channel.abort()


def test_plain_tcp_is_the_stream_itself(run) -> None:
    with EchoServer() as echo:
        payload = os.urandom(50_000)
        assert run(_echo(_leaf(echo.port), TransportSpec.from_params((), "127.0.0.1"), payload)) == payload


def test_websocket_upgrade_sends_host_and_path_and_carries_binary_messages(run) -> None:
    with ws_server() as server:
        spec = TransportSpec.from_params(
            (("type", "ws"), ("path", "/ray"), ("host", "cdn.example")), "127.0.0.1"
        )
        payload = os.urandom(40_000)
        assert run(_echo(_leaf(server.port), spec, payload)) == payload
        request = server.requests[0]
        assert request.startswith(b"GET /ray HTTP/1.1\r\n") and b"\r\nHost: cdn.example\r\n" in request


def test_websocket_over_tls_verifies_the_certificate_for_the_sni(run, tmp_path, monkeypatch) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    with ws_server() as server, tls_front(server.port, ca=ca, server_names=("edge.example",)) as front:
        params = (("type", "ws"), ("security", "tls"), ("sni", "edge.example"), ("path", "/x"))
        payload = os.urandom(30_000)
        assert (
            run(_echo(_leaf(front.port), TransportSpec.from_params(params, "127.0.0.1"), payload)) == payload
        )
        wrong_sni = (("type", "ws"), ("security", "tls"), ("sni", "other.example"))
        with pytest.raises(DialError) as info:
            run(_echo(_leaf(front.port), TransportSpec.from_params(wrong_sni, "127.0.0.1"), b"x"))
        assert info.value.phase == "tls" and info.value.reason == "certificate-name"


@pytest.mark.parametrize("server_kwargs", [{"status": 403}, {"accept": "bm90IHRoZSByaWdodCBhY2NlcHQ="}])
def test_a_refused_or_wrong_upgrade_is_a_handshake_error(run, server_kwargs) -> None:
    with ws_server(**server_kwargs) as server:
        with pytest.raises(DialError) as info:
            run(_echo(_leaf(server.port), TransportSpec.from_params((("type", "ws"),), "127.0.0.1"), b"x"))
        assert info.value.phase == "handshake"


@pytest.mark.parametrize("params", [(("type", "grpc"),), (("security", "reality"),)])
def test_transports_honk_does_not_speak_are_refused(params) -> None:
    with pytest.raises(ConfigRefused):
        TransportSpec.from_params(params, "h")


@pytest.mark.parametrize(
    ("after_upgrade", "refusal"),
    [
        (b"", ""),
        (b"\x89\x02hi", ""),  # a ping with the 101: answered before the handover
        (b"\x82\x04data", "data before the request"),
        (b"\x88\x02\x03\xe8", "closed"),
    ],
    ids=["plain", "ping", "data", "close"],
)
def test_an_upgrade_for_the_relay_engine_leaves_it_at_a_frame_boundary(
    run, tmp_path, monkeypatch, after_upgrade, refusal
) -> None:
    """WebSocket over TLS relayed by the engine: the upgrade runs through the SSLObject first."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    params = (("type", "ws"), ("security", "tls"), ("sni", "edge.example"), ("path", "/x"))

    async def main(port: int) -> bytes:
        leaf = _leaf(port)
        spec = TransportSpec.from_params(params, "127.0.0.1")
        connection = await open_tls(leaf, spec, leaf.clock.now() + STEP)
        framing = TlsFraming(
            connection.sslobj, connection.incoming, connection.outgoing, TrojanStreamWatch(), websocket=True
        )
        assert framing.ws_encoder is not None
        try:
            await upgrade_relayed(connection, leaf, spec, leaf.clock.now() + STEP, framing.ws_encoder)
        except BaseException:
            connection.sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=framed_socket(connection.sock, framing))
        writer.write(b"relayed by the engine")
        try:
            return await asyncio.wait_for(reader.readexactly(21), STEP)
        finally:
            writer.close()

    with (
        ws_server(after_upgrade=after_upgrade) as server,
        tls_front(server.port, ca=ca, server_names=("edge.example",)) as front,
    ):
        if refusal:
            with pytest.raises(DialError) as info:
                run(main(front.port))
            assert info.value.phase == "handshake" and refusal in str(info.value)
            return
        assert run(main(front.port)) == b"relayed by the engine"
        assert server.pongs == ([b"hi"] if after_upgrade else [])
