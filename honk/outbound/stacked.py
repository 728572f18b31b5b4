"""Leaves whose protocol runs in Python over a transport: VMess, VLESS and Trojan.

A :class:`StackedLeaf` opens the node's transport (TCP, TLS, WebSocket from its
link, :mod:`honk.outbound.transport`), sends the protocol's request header at
once (neither protocol waits for the server before the payload), stacks the
protocol's framing as a :class:`~honk.outbound.channel.CodecChannel`, and hands
the relay a plain socket through :func:`~honk.outbound.bridge.bridge_stream`.
A subclass says what the header is and how the server's bytes are opened.
"""

from __future__ import annotations

from collections.abc import Callable

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock
from honk.core.errors import ConfigRefused, HonkError
from honk.core.net import Address
from honk.outbound.base import Capabilities, DialedStream
from honk.outbound.bridge import bridge_stream
from honk.outbound.channel import CodecChannel
from honk.outbound.proxy import ProxyLeaf
from honk.outbound.transport import TransportSpec, open_transport

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
    ) -> None:
        self.header = header
        self.decode = decode
        self.at_eof = at_eof
        self.encode = encode
        self.eof = eof  # what the protocol sends when the client is done (VMess's empty chunk)


class StackedLeaf(ProxyLeaf):
    tls_default = False  # Trojan runs over TLS unless its link says otherwise

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

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        if isinstance(self._transport, ConfigRefused):
            raise self._transport
        stream = self.stream(target)  # a bad credential fails here, before any connect
        try:
            channel = await open_transport(self, self._transport, deadline)
        except HonkError as exc:
            self.count(exc)
            raise
        channel.write(stream.header)
        self.count(None)
        framed = CodecChannel(channel, stream.encode, stream.decode, eof=stream.eof, at_eof=stream.at_eof)
        return DialedStream(bridge_stream(framed))
