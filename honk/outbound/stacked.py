"""Leaves whose protocol runs in Python over a transport: VMess, VLESS and Trojan.

A :class:`StackedLeaf` opens the node's transport (TCP, TLS, WebSocket from its
link, :mod:`honk.outbound.transport`), sends the protocol's request header at
once (neither protocol waits for the server before the payload), stacks the
protocol's framing as a :class:`~honk.outbound.channel.CodecChannel`, and hands
the relay a plain socket through :func:`~honk.outbound.bridge.bridge_stream`.
A subclass says what the header is and how the server's bytes are opened.

Trojan, VLESS and VMess over TCP + TLS, or WebSocket over TLS (no mux), skip the
channel and the bridge: the TLS handshake (and the WebSocket upgrade) runs over memory
BIOs, the header goes out through it, and the dialed stream is the server's socket with a
:class:`~honk.proto.tls_framing.TlsFraming`, whose records (and frames, and VMess's
chunks) the relay engine moves itself (two descriptors per flow, no Python per chunk).
On the SOCKS fast path the engine does the dial of TCP + TLS nodes too
(:meth:`StackedLeaf.engine_plan`): it connects, makes the handshake on an ``SSLObject``
prepared here (offering the server's session to resume) and sends the header itself.
Plain WebSocket, mux carriers and UDP keep the channel path, as does every node
when the relay engine cannot drive this Python's SSLObjects
(:func:`honk._fast.relay.tls_supported`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from honk._fast.relay import TLS_13, TLS_RESUMED, tls_supported
from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock
from honk.core.errors import ConfigRefused, HonkError
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, DialedStream, EndpointLost, EnginePlan
from honk.outbound.bridge import bridged
from honk.outbound.channel import Channel, CodecChannel
from honk.outbound.mux import mux_requested, pool_for
from honk.outbound.mux_udp import MuxDatagramEndpoint
from honk.outbound.proxy import ProxyLeaf, handshake_scope
from honk.outbound.tls import client_context, relayed_handshake
from honk.outbound.transport import TransportSpec, open_tls, open_transport, upgrade_relayed
from honk.proto.mux import MUX_COOL_TARGET
from honk.proto.tls_framing import TlsFraming

__all__ = ["StackedLeaf", "Stream"]

_TCP_ONLY = Capabilities(tcp=True, udp=False)


class Stream:
    """One flow's framing: the header to send, and how to open and close the server's side."""

    def __init__(
        self,
        header: bytes,
        decode: Callable[[bytes], bytes] = bytes,
        at_eof: Callable[[], None] | None = None,
        encode: Callable[[bytes], bytes] = bytes,
        eof: Callable[[], bytes] | None = None,
        response: Any = None,
    ) -> None:
        self.header = header
        self.decode = decode
        self.at_eof = at_eof
        self.encode = encode
        self.eof = eof  # what the protocol sends when the client is done (VMess's empty chunk)
        # the object behind ``decode`` when the body is the target's bytes as they are after an
        # optional response header (Trojan's TrojanStreamWatch, VLESS's VlessResponseDecoder):
        # such a stream can ride a TlsFraming. None: the body is framed (VMess)
        self.response = response


class StackedLeaf(ProxyLeaf):
    tls_default = False  # Trojan runs over TLS unless its link says otherwise
    mux_capable = False  # VMess and VLESS carry Mux.Cool (honk.outbound.mux) when the node asks

    def __init__(self, node: NodeSpec, glob: GlobalSpec, clock: Clock) -> None:
        super().__init__(node, glob, clock)
        try:
            self._transport: TransportSpec | ConfigRefused = TransportSpec.from_params(
                node.params, node.host, tls_default=self.tls_default
            )
        except ConfigRefused as exc:
            self._transport = exc  # refused at dial time, so the rest of the config still loads

    @property
    def capabilities(self) -> Capabilities:
        return _TCP_ONLY

    def stream(self, target: Address) -> Stream:
        raise NotImplementedError

    def transport(self) -> TransportSpec:
        """The node's transport; its ConfigRefused when the link asked for one honk does not speak."""
        if isinstance(self._transport, ConfigRefused):
            raise self._transport
        return self._transport

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        transport = self.transport()
        if self.mux:
            return await pool_for(self).dial(self.open_mux_carrier, target, deadline)
        if transport.tls_relayed and tls_supported():
            header, response = self.relayed(target)  # a bad credential fails here, before any connect
            return await self._dial_tls(transport, header, response, deadline)
        return bridged(await self._framed(self.stream(target), deadline), self.name)

    def relayed(self, target: Address) -> tuple[bytes, Any]:
        """The request header for ``target`` and the ``response`` of the TlsFraming that carries
        the flow (see :class:`~honk.proto.tls_framing.TlsFraming`)."""
        stream = self.stream(target)
        if stream.response is None:
            raise NotImplementedError(f"{self.protocol}: a framed body needs its own relayed()")
        return stream.header, stream.response

    def engine_plan(self, target: Address) -> EnginePlan | None:
        """Trojan, VLESS and VMess on TCP + TLS: the relay engine connects, shakes hands and sends
        the header itself (``Engine.hs_connect``); None for anything :meth:`_dial_tls` does not carry."""
        server = self.server
        if server.ip is None or not self.connector.engine_dials or not tls_supported():
            return None
        try:
            transport = self.transport()
            if self.mux or not transport.tls_only:
                return None
            header, response = self.relayed(target)
            context = client_context(
                transport.verify, transport.alpn, transport.ca, self.name, self.clock.now()
            )
            shake = relayed_handshake(
                context, (str(server.ip), server.port), transport.server_name or server.host, self.clock
            )
        except (HonkError, ssl.SSLError, ValueError):  # Python's dial says why, with its error
            return None
        framing = TlsFraming(shake.sslobj, shake.incoming, shake.outgoing, response)

        def opened(facts: int) -> None:
            shake.opened(bool(facts & TLS_RESUMED), bool(facts & TLS_13), framing.when_released)

        return self.connector.engine_plan(server, framing, header, opened)

    async def _dial_tls(
        self, transport: TransportSpec, header: bytes, response: Any, deadline: float
    ) -> DialedStream:
        """TCP + TLS (and the WebSocket upgrade) with ``header`` sent, for the relay engine to
        carry (no channel, no bridge)."""
        websocket = transport.network == "ws"
        try:
            connection = await open_tls(self, transport, deadline)
            framing = TlsFraming(
                connection.sslobj,
                connection.incoming,
                connection.outgoing,
                response,
                connection.on_release,
                websocket=websocket,
            )
            try:
                if framing.ws_encoder is not None:
                    await upgrade_relayed(connection, self, transport, deadline, framing.ws_encoder)
                    header = framing.ws_encoder.binary(header)
                async with handshake_scope(self.clock, deadline, self.name, self.protocol):
                    await connection.send(header)
            except BaseException:
                connection.sock.close()
                raise
        except HonkError as exc:
            self.count(exc)
            raise
        self.count(None)
        return DialedStream(connection.sock, framing)

    async def open_channel(self, deadline: float) -> Channel:
        """The node's transport up, for a stream the subclass frames itself (UDP); the dial is counted."""
        transport = self.transport()
        try:
            channel = await open_transport(self, transport, deadline)
        except HonkError as exc:
            self.count(exc)
            raise
        self.count(None)
        return channel

    async def _framed(self, stream: Stream, deadline: float) -> CodecChannel:
        """The transport with ``stream``'s header sent and its framing stacked on."""
        channel = await self.open_channel(deadline)
        channel.write(stream.header)
        return CodecChannel(channel, stream.encode, stream.decode, eof=stream.eof, at_eof=stream.at_eof)

    def udp_deadline(self) -> float:
        """The deadline for opening a UDP stream after the dial (VMess/VLESS open one per target)."""
        return self.clock.now() + self.connector.connect_timeout

    # -- Mux.Cool (honk.outbound.mux) ----------------------------------------------

    @property
    def mux(self) -> bool:
        """Whether TCP flows go as logical streams on a shared carrier (``mux`` in the node's params)."""
        return self.mux_capable and mux_requested(self.node.params)

    def mux_stream(self) -> Stream:
        """The carrier's framing: the protocol's stream to v1.mux.cool (a subclass may use its mux command)."""
        return self.stream(MUX_COOL_TARGET)

    async def open_mux_carrier(self, deadline: float) -> Channel:
        """A new carrier: the node's transport with the protocol's mux stream stacked on it."""
        return await self._framed(self.mux_stream(), deadline)

    async def dial_mux_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None
    ) -> MuxDatagramEndpoint:
        """A mux node's UDP path: UDP sessions on its carriers, one of which is there (opened
        now if none has room) when this returns (:mod:`honk.outbound.mux_udp`)."""
        endpoint = MuxDatagramEndpoint(
            self.name, pool_for(self), self.open_mux_carrier, self.udp_deadline, receive, on_lost
        )
        try:
            await endpoint.prepare(deadline)
        except HonkError:
            self.udp_setup_failed()  # the carrier's dial itself was counted where it failed
            raise
        return endpoint
