"""VLESS nodes (no flow): UUID and target, then the stream; the server's answer starts with a short header.

VLESS carries no encryption of its own, so links normally put it over TLS
(``security=tls``). A server that refuses the UUID closes the connection
without answering: the client sees EOF before the response header, a
``truncated-header`` protocol error.

UDP: a request with the UDP command carries datagrams for its one target,
each with a 2-byte length, after the same response header; the endpoint keeps
one such stream per target (:class:`~honk.outbound.stream_datagram.PerTargetDatagramEndpoint`).
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, EndpointLost
from honk.outbound.stacked import StackedLeaf, Stream
from honk.outbound.stream_datagram import PerTargetDatagramEndpoint
from honk.proto.vless import VlessClient, VlessCommand, VlessUdpDecoder, encode_udp_packet

__all__ = ["VlessOutbound", "VlessUdpCodec"]

_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="vless-udp")


class VlessOutbound(StackedLeaf):
    protocol = "vless"
    mux_capable = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def _client(self, command: VlessCommand, target: Address) -> VlessClient:
        try:
            return VlessClient(self.node.username or "", command, target)
        except ValueError:
            raise ConfigRefused(f"{self.name}: the VLESS id is not a UUID") from None

    def stream(self, target: Address) -> Stream:
        client = self._client(VlessCommand.TCP, target)
        decoder = client.response_decoder()

        def at_eof() -> None:
            if not decoder.header_done:
                decoder.feed(b"")  # raises truncated-header

        return Stream(client.request_header(), decoder.feed, at_eof)

    def mux_stream(self) -> Stream:
        """A Mux.Cool carrier: VLESS's mux command, whose header names no target."""
        try:
            client = VlessClient(self.node.username or "", VlessCommand.MUX, None)
        except ValueError:
            raise ConfigRefused(f"{self.name}: the VLESS id is not a UUID") from None
        decoder = client.response_decoder()

        def at_eof() -> None:
            if not decoder.header_done:
                decoder.feed(b"")  # raises truncated-header

        return Stream(client.request_header(), decoder.feed, at_eof)

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> PerTargetDatagramEndpoint:
        if isinstance(self._transport, ConfigRefused):  # refused at the dial, as for TCP
            raise self._transport
        self._client(VlessCommand.UDP, self.server)  # a bad id is refused now, not at the first datagram
        return PerTargetDatagramEndpoint(
            self.name,
            lambda: self.open_channel(self.udp_deadline()),
            lambda target: VlessUdpCodec(self._client(VlessCommand.UDP, target)),
            receive,
            on_lost,
        )


class VlessUdpCodec:
    """One VLESS UDP stream's framing: the request header before the first datagram; replies come from its target."""

    def __init__(self, client: VlessClient) -> None:
        assert client.target is not None
        self._target = client.target
        self._header: bytes | None = client.request_header()
        self._response = client.response_decoder()
        self._packets = VlessUdpDecoder()

    def encode(self, payload: bytes, target: Address) -> bytes:
        packet = encode_udp_packet(payload)  # ValueError above 65535 bytes
        header, self._header = self._header, None
        return header + packet if header is not None else packet

    def decode(self, data: bytes) -> list[tuple[bytes, Address]]:
        if not self._response.header_done:
            data = self._response.feed(data)  # EOF here raises truncated-header
            if not data:
                return []
        return [(payload, self._target) for payload in self._packets.feed(data)]
