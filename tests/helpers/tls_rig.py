"""The test's TLS server end of a relayed TLS flow (``TlsFraming``), with or without WebSocket inside,
and handshakes made in memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator

import trustme

from helpers.engines import SOCKS_CONNECT_LOOPBACK_80, STEP, FramedServer, engine_dialled, poll
from honk.proto import websocket
from honk.proto.tls_framing import TlsFraming
from honk.proto.trojan import TrojanStreamWatch


def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A client context and a server context for ``localhost`` under a CA made here."""
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    return client, server


class TlsServer(FramedServer):
    """The test's TLS server end of one flow: ``take`` opens records, ``seal`` makes them."""

    def __init__(
        self, sock: socket.socket, sslobj: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
    ) -> None:
        self.sock = sock
        self.ssl = sslobj
        self.incoming = incoming
        self.outgoing = outgoing
        self.close_notify = False  # the client's close_notify arrived

    def take(self, data: bytes) -> bytes:
        self.incoming.write(data)
        out = bytearray()
        while True:
            try:
                chunk = self.ssl.read(1 << 20)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.close_notify = True
                break
            if not chunk:
                self.close_notify = True
                break
            out += chunk
        return bytes(out)

    def seal(self, data: bytes) -> bytes:
        self.ssl.write(data)
        return self.outgoing.read()

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, self.seal(data))

    async def send_records(self, *parts: bytes) -> None:
        """One record per part, sent apart (so the engine reads them one by one)."""
        for part in parts:
            await self.send(part)
            await asyncio.sleep(0.01)

    async def close_notify_and_fin(self) -> None:
        try:
            self.ssl.unwrap()
        except ssl.SSLWantReadError:
            pass
        await asyncio.get_running_loop().sock_sendall(self.sock, self.outgoing.read())
        self.sock.shutdown(socket.SHUT_WR)


def server_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bytes = b"") -> bytes:
    """A frame as a server sends it (unmasked unless ``mask``), any length form."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv << 4 | opcode
    m = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", b0, m | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, m | 126, n)
    else:
        head = struct.pack("!BBQ", b0, m | 127, n)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + payload


class WsServer(TlsServer):
    """The server's TLS end with WebSocket inside: ``take`` returns the client's payload and
    keeps each frame's (opcode, length) in ``frames``."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._plain = bytearray()
        self.frames: list[tuple[int, int]] = []
        self.pongs: list[bytes] = []

    def take(self, data: bytes) -> bytes:
        self._plain += super().take(data)
        out = bytearray()
        buf = self._plain
        while len(buf) >= 2:
            b0, b1 = buf[0], buf[1]
            assert b1 & 0x80, "a client frame must be masked"
            size, at = b1 & 0x7F, 2
            if size == 126:
                if len(buf) < 4:
                    break
                size, at = struct.unpack_from("!H", buf, 2)[0], 4
            elif size == 127:
                if len(buf) < 10:
                    break
                size, at = struct.unpack_from("!Q", buf, 2)[0], 10
            if len(buf) < at + 4 + size:
                break
            mask = buf[at : at + 4]
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buf[at + 4 : at + 4 + size]))
            self.frames.append((b0 & 0x0F, size))
            if b0 & 0x0F == websocket.OP_BINARY:
                out += payload
            else:
                self.control = payload
                if b0 & 0x0F == websocket.OP_PONG:
                    self.pongs.append(payload)
            del buf[: at + 4 + size]
        return bytes(out)

    async def send_frames(self, *frames: bytes) -> None:
        """Each frame in a record of its own."""
        for frame in frames:
            await self.send(frame)


def handshake(contexts: tuple[ssl.SSLContext, ssl.SSLContext]):
    """A finished handshake in memory: (client SSLObject, its BIOs, server SSLObject, its BIOs, the
    server's bytes still owed to the client: TLS 1.3 session tickets)."""
    client_ctx, server_ctx = contexts
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    while not all(done):
        for i, (obj, out, peer_in) in enumerate(((client, c_out, s_in), (server, s_out, c_in))):
            if not done[i]:
                try:
                    obj.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
            if i == 0:
                peer_in.write(out.read())
            elif not all(done):
                peer_in.write(out.read())
    return client, c_in, c_out, server, s_in, s_out


def tls_maker(
    contexts, response_type=TrojanStreamWatch, *, websocket: bool = False, server_type=TlsServer, ready=None
):
    """``make(srv)`` for a framed rig: a handshake done in memory, the client's ``TlsFraming``
    (``websocket``: with WebSocket inside) and the test's ``server_type`` end on ``srv``, which
    ``ready(server, framing)`` may complete (an inner protocol's server end)."""

    def make(srv: socket.socket):
        client, c_in, c_out, server, s_in, s_out = handshake(contexts)
        framing = TlsFraming(client, c_in, c_out, response_type(), websocket=websocket)
        rig_server = server_type(srv, server, s_in, s_out)
        if ready is not None:
            ready(rig_server, framing)
        tickets = s_out.read()
        if tickets:  # the server's tickets go first, as on a real connection
            srv.setblocking(True)
            srv.sendall(tickets)
            srv.setblocking(False)
        return rig_server, framing

    return make


class _Holder:
    """A listener that keeps the engine's SOCKS5 requests unanswered (their tokens in ``tokens``)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def socks_request(self, token: int, *_: object) -> None:
        self.tokens.append(token)

    def socks_handover(self, fd: int, *_: object) -> None:
        os.close(fd)

    def socks_dropped(self) -> None:
        pass


@contextlib.asynccontextmanager
async def held_request(engine) -> AsyncIterator[tuple[int, socket.socket]]:  # noqa: ANN001
    """A SOCKS5 CONNECT the engine's listener took and holds unanswered: (its token, the client)."""
    holder = _Holder()
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listening:
        lid = engine.listen(listening.fileno(), holder)
        sock = socket.create_connection(listening.getsockname())
        sock.setblocking(False)
        try:
            await loop.sock_sendall(sock, SOCKS_CONNECT_LOOPBACK_80)
            await poll(lambda: bool(holder.tokens), "the request")
            yield holder.tokens[0], sock
        finally:
            engine.unlisten(lid)
            sock.close()


# --- listener mode: the engine makes the handshake itself (hs_connect) ----------------------------


async def server_handshake(sock: socket.socket, server_ctx: ssl.SSLContext, server_type=TlsServer):  # noqa: ANN201
    """The test's side of the handshake over ``sock`` (the engine's upstream), as a ``server_type``."""
    loop = asyncio.get_running_loop()
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    while True:
        try:
            server.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        if out := s_out.read():
            await loop.sock_sendall(sock, out)
        if done:
            return server_type(sock, server, s_in, s_out)
        data = await asyncio.wait_for(loop.sock_recv(sock, 65536), STEP)
        assert data, "the engine closed during the handshake"
        s_in.write(data)


async def dial_through_engine(
    engine,
    client_ctx: ssl.SSLContext,
    server_name: str,
    early: bytes,  # noqa: ANN001, ANN201
    response=None,
    head: bytes = b"HEADER\r\n",
):  # noqa: ANN001
    """A SOCKS5 client whose request the engine answers by dialling a node the test plays (TLS on
    its side is the caller's) with ``head`` and a fresh TLS framing over ``response`` (a Trojan
    watch by default): (client, the node's accepted end, the framing, the recorder, lid)."""
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    framing = TlsFraming(
        client_ctx.wrap_bio(c_in, c_out, server_hostname=server_name),
        c_in,
        c_out,
        TrojanStreamWatch() if response is None else response,
    )
    client, srv, rec, lid = await engine_dialled(engine, framing, head, early)
    return client, srv, framing, rec, lid
