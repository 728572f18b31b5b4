"""The test's TLS server end of a relayed TLS flow (``TlsFraming``), and handshakes made in memory."""

from __future__ import annotations

import asyncio
import socket
import ssl

import trustme

from helpers.engines import FramedServer
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

    def __init__(self, sock: socket.socket, sslobj: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
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


def tls_maker(contexts, response_type=TrojanStreamWatch, *, websocket: bool = False, server_type=TlsServer):
    """``make(srv)`` for a framed rig: a handshake done in memory, the client's ``TlsFraming``
    (``websocket``: with WebSocket inside) and the test's ``server_type`` end on ``srv``."""

    def make(srv: socket.socket):
        client, c_in, c_out, server, s_in, s_out = handshake(contexts)
        framing = TlsFraming(client, c_in, c_out, response_type(), websocket=websocket)
        rig_server = server_type(srv, server, s_in, s_out)
        tickets = s_out.read()
        if tickets:  # the server's tickets go first, as on a real connection
            srv.setblocking(True)
            srv.sendall(tickets)
            srv.setblocking(False)
        return rig_server, framing

    return make
