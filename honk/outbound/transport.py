"""The stream under a v2ray-family protocol: TCP, TLS, WebSocket, from the node's link.

:class:`TransportSpec` reads the dial-shaping parameters of a share link
(``type`` tcp|ws, ``security`` none|tls, ``sni``, ``host``, ``path``, ``alpn``,
the verification booleans and the node's own ``ca`` file); :func:`open_transport`
dials the node's server through its leaf and stacks TLS and the WebSocket upgrade
on it, under the dial deadline. The result is a :class:`~honk.outbound.channel.Channel` the protocol's
codec stacks on next. :func:`open_tls` is the TCP + TLS transport without a channel: the
handshake over memory BIOs (:func:`~honk.outbound.tls.tls_handshake`) whose ``SSLObject``
the relay engine then drives (:mod:`honk.proto.tls_framing`).

Failures keep their phases: ``resolve``/``connect`` from the leaf's connector,
``tls`` from :mod:`honk.outbound.tls`, ``handshake`` for a refused or foreign
WebSocket upgrade (the server's status or a wrong accept value).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from honk.core.errors import ConfigRefused, DialError, UpstreamFailed
from honk.outbound.channel import Channel, WsChannel
from honk.outbound.proxy import ProxyLeaf, ServerClosed, handshake_scope
from honk.outbound.tls import (
    TlsConnection,
    ca_path,
    client_context,
    tls_connect,
    tls_handshake,
    tls_verification,
)
from honk.proto.websocket import (
    WebSocketError,
    WsDecoder,
    WsEncoder,
    client_handshake,
    parse_handshake_response,
)
from honk.relay.stream import StreamConn

__all__ = ["TransportSpec", "open_tls", "open_transport", "upgrade_relayed"]


@dataclass(frozen=True, slots=True)
class TransportSpec:
    network: str = "tcp"  # "tcp" or "ws"
    tls: bool = False
    server_name: str = ""  # SNI; the node's host when empty
    ws_host: str = ""  # the upgrade's Host header; the server name or host when empty
    ws_path: str = "/"
    alpn: tuple[str, ...] = ()
    verify: bool = True
    ca: str = ""  # path of a PEM CA file trusted instead of the system store; read at each dial

    @property
    def plain(self) -> bool:
        """TCP with nothing stacked on it: a protocol framed by the relay engine can run on the socket itself."""
        return self.network == "tcp" and not self.tls

    @property
    def tls_only(self) -> bool:
        """TCP with TLS and nothing else: the relay engine can carry the records itself (:func:`open_tls`)."""
        return self.network == "tcp" and self.tls

    @property
    def tls_relayed(self) -> bool:
        """TLS, or WebSocket over TLS: after :func:`open_tls` (and :func:`upgrade_relayed`) the
        relay engine carries the records, and the frames inside them, itself."""
        return self.tls and self.network in ("tcp", "ws")

    @classmethod
    def from_params(
        cls, params: tuple[tuple[str, str], ...], host: str, *, tls_default: bool = False
    ) -> TransportSpec:
        """The transport a link describes; ConfigRefused for one honk does not speak."""
        p = dict(params)
        network = (p.get("type") or p.get("net") or "tcp").lower()
        if network not in ("tcp", "ws"):
            raise ConfigRefused(f"transport {network!r} is not supported (tcp, ws)")
        security = (p.get("security") or ("tls" if tls_default else "none")).lower()
        if security not in ("none", "tls", ""):
            raise ConfigRefused(f"security {security!r} is not supported (none, tls)")
        alpn = tuple(a.strip() for a in p.get("alpn", "").split(",") if a.strip())
        return cls(
            network=network,
            tls=security == "tls",
            server_name=p.get("sni") or p.get("peer") or "",
            ws_host=p.get("host", ""),
            ws_path=p.get("path") or "/",
            alpn=alpn,
            verify=tls_verification(params),
            ca=ca_path(params),
        )


async def open_transport(leaf: ProxyLeaf, spec: TransportSpec, deadline: float) -> Channel:
    """The node's server reached, TLS and the WebSocket upgrade done; ready for the protocol."""
    # the context first: a node whose CA file is unusable is refused before anything is dialled
    context = (
        client_context(spec.verify, spec.alpn, spec.ca, leaf.name, leaf.clock.now()) if spec.tls else None
    )
    sock = await leaf.connect_server(deadline)
    host = leaf.server.host
    if context is not None:
        conn = await tls_connect(sock, context, spec.server_name or host, leaf.clock, deadline, leaf.name)
    else:
        conn = StreamConn(UpstreamFailed)
        try:
            await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock)
        except BaseException:
            sock.close()
            raise
    if spec.network != "ws":
        return conn
    try:
        await _upgrade(conn, leaf, spec.ws_host or spec.server_name or host, spec.ws_path, deadline)
    except BaseException:
        conn.abort()
        raise
    return WsChannel(conn)


async def open_tls(leaf: ProxyLeaf, spec: TransportSpec, deadline: float) -> TlsConnection:
    """The node's server reached and TLS done over memory BIOs, for a transport that is
    :attr:`TransportSpec.tls_relayed`: no asyncio transport, the relay engine drives the records."""
    context = client_context(
        spec.verify, spec.alpn, spec.ca, leaf.name, leaf.clock.now()
    )  # refused before any connect
    sock = await leaf.connect_server(deadline)
    return await tls_handshake(
        sock, context, spec.server_name or leaf.server.host, leaf.clock, deadline, leaf.name
    )


async def _upgrade(conn: StreamConn, leaf: ProxyLeaf, host: str, path: str, deadline: float) -> None:
    request, key = client_handshake(host, path)
    async with handshake_scope(leaf.clock, deadline, leaf.name, "WebSocket"):
        conn.write(request)
        rest = await _upgrade_answer(conn.receive, key, leaf)
        if rest:
            conn.unread(rest)  # the first frames arrived with the answer


async def upgrade_relayed(
    connection: TlsConnection, leaf: ProxyLeaf, spec: TransportSpec, deadline: float, encoder: WsEncoder
) -> None:
    """The WebSocket upgrade through a TLS connection the relay engine will carry (a
    ``TlsFraming`` with ``websocket``). The server may not send data before the protocol's
    request, so what came with its answer is answered here (pongs) or refused; the engine
    starts at a frame boundary with nothing left in the ``SSLObject``."""
    request, key = client_handshake(spec.ws_host or spec.server_name or leaf.server.host, spec.ws_path)
    async with handshake_scope(leaf.clock, deadline, leaf.name, "WebSocket"):
        await connection.send(request)
        rest = await _upgrade_answer(connection.receive, key, leaf)
        decoder = WsDecoder()
        while True:
            try:
                events = decoder.feed(rest)
            except WebSocketError as exc:
                raise DialError(leaf.name, "handshake", str(exc)) from None
            if events.data:
                raise DialError(leaf.name, "handshake", "WebSocket: data before the request")
            if events.closed is not None:
                raise ServerClosed()
            for payload in events.pongs:
                await connection.send(encoder.pong(payload))
            if not decoder.partial:
                return
            rest = await connection.receive()  # a frame cut by its record: the rest comes next
            if not rest:
                raise ServerClosed()


async def _upgrade_answer(receive: Callable[[], Awaitable[bytes]], key: str, leaf: ProxyLeaf) -> bytes:
    """Read the server's answer to the upgrade; what followed it (the first frames)."""
    head = b""
    try:
        while (length := parse_handshake_response(head, key)) is None:
            data = await receive()
            if not data:
                raise ServerClosed()
            head += data
    except WebSocketError as exc:
        raise DialError(leaf.name, "handshake", str(exc)) from None
    return head[length:]
