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
from honk.outbound.transport import TransportSpec, open_transport

STEP = 5.0
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WsEchoServer:
    """Upgrades one client per connection (or answers ``status``), then echoes its binary messages."""

    def __init__(self, status: int = 101, accept: str | None = None) -> None:
        self.status, self.accept = status, accept
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
            key = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key")][0]
            accept = self.accept or base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
            if self.status != 101:
                conn.sendall(f"HTTP/1.1 {self.status} Nope\r\nContent-Length: 0\r\n\r\n".encode())
                return
            conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
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
                    size = struct.pack("!BBH", 0x82, 126, len(body)) if len(body) > 125 else struct.pack("!BB", 0x82, len(body))
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
    return ProxyLeaf(NodeSpec("node", "test", "127.0.0.1", port), GlobalSpec(connect_timeout=STEP), MonotonicClock())


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
        spec = TransportSpec.from_params((("type", "ws"), ("path", "/ray"), ("host", "cdn.example")), "127.0.0.1")
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
        assert run(_echo(_leaf(front.port), TransportSpec.from_params(params, "127.0.0.1"), payload)) == payload
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
