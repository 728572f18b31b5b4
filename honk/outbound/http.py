"""HTTP CONNECT nodes: ``http://`` (plain) and ``https://`` (TLS to the proxy).

Plain: the CONNECT request goes out, the response head is read by peeking, so
exactly the head is consumed and any tunnel bytes the proxy sent right after
it (a target that speaks first) stay in the socket for the relay. The socket
is then a plain stream.

TLS: stdlib ``ssl`` over the server connection (SNI from the ``sni`` parameter
or the node's host; verification on unless ``allowInsecure``/``allow_insecure``/
``insecure`` says otherwise; the system trust store, which honours
``SSL_CERT_FILE``). The tunnel lives in an asyncio transport, so the relay gets
it through :func:`~honk.outbound.bridge.bridge_stream`.

Failures: TLS errors are phase ``tls``; ``407``/``401`` are :class:`ProxyAuthFailed`;
other refusals are :class:`TargetRefused` (see :mod:`honk.proto.http_connect`).
HTTP proxies carry no UDP.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.core.net import Address
from honk.outbound.base import Capabilities, DialedStream
from honk.outbound.bridge import bridged
from honk.outbound.proxy import ProxyLeaf, ServerClosed, handshake_scope, recv_some, wait_readable
from honk.outbound.tls import ca_path, client_context, tls_connect, tls_verification
from honk.proto.http_connect import MAX_RESPONSE_HEAD, check_status, connect_request, parse_connect_response

__all__ = ["HttpOutbound"]

_CAPABILITIES = Capabilities(tcp=True, udp=False)
_PEEK_LIMIT = MAX_RESPONSE_HEAD + 4


class HttpOutbound(ProxyLeaf):
    def __init__(self, node: NodeSpec, glob: GlobalSpec, clock: Clock) -> None:
        super().__init__(node, glob, clock)
        self.protocol = node.protocol  # "http" or "https"
        self._username = node.username if node.username else None
        self._password = node.password
        self._tls = node.protocol == "https"
        params = dict(node.params)
        self._sni = params.get("sni") or params.get("peer") or node.host

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        request = connect_request(target, self._username, self._password)
        context = self._tls_context() if self._tls else None  # a bad CA file refuses before any connect
        sock = await self.connect_server(deadline)
        try:
            if context is not None:
                dialed = await self._tunnel_over_tls(sock, context, request, deadline)  # owns sock from here
            else:
                try:
                    await self._tunnel(sock, request, deadline)
                except BaseException:
                    sock.close()
                    raise
                dialed = DialedStream(sock)
        except HonkError as exc:
            self.count(exc)
            raise
        self.count(None)
        return dialed

    async def _tunnel(self, sock: socket.socket, request: bytes, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        async with handshake_scope(self.clock, deadline, self.name, "HTTP proxy"):
            await loop.sock_sendall(sock, request)
            head = bytearray()
            while True:
                await wait_readable(sock)
                peeked = sock.recv(_PEEK_LIMIT - len(head), socket.MSG_PEEK)
                if not peeked:
                    raise ServerClosed()
                response = parse_connect_response(bytes(head + peeked), self.name)
                if response is None:
                    head += await recv_some(sock, len(peeked))  # all of it is head: take it
                    continue
                rest = response.head_length - len(head)
                while rest:  # exactly the head; tunnel bytes stay queued
                    rest -= len(await recv_some(sock, rest))
                check_status(response, self.name)
                return

    async def _tunnel_over_tls(
        self, sock: socket.socket, context: ssl.SSLContext, request: bytes, deadline: float
    ) -> DialedStream:
        conn = await tls_connect(sock, context, self._sni, self.clock, deadline, self.name)
        try:
            async with handshake_scope(self.clock, deadline, self.name, "HTTP proxy"):
                conn.write(request)
                head = b""
                while (response := parse_connect_response(head, self.name)) is None:
                    data = await conn.receive()
                    if not data:
                        raise ServerClosed()
                    head += data
                check_status(response, self.name)
                if len(head) > response.head_length:
                    conn.unread(head[response.head_length :])  # the target's first bytes
        except BaseException:
            conn.abort()
            raise
        return bridged(conn, self.name)

    def _tls_context(self) -> ssl.SSLContext:
        return client_context(
            tls_verification(self.node.params), (), ca_path(self.node.params), self.name, self.clock.now()
        )
