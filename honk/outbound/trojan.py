"""Trojan nodes: the password's SHA-224 and the target, then the stream, over TLS.

The header goes out right after the TLS handshake; Trojan has no response, so
a wrong password is not reported by the protocol: the server falls back to its
decoy (or closes), which the client sees as bytes that are not the target's or
an early EOF. The link's ``security``/``type``/``sni``/``path``/``host`` shape
the transport (TLS by default).

UDP: one stream with the UDP ASSOCIATE command carries datagrams to any target,
each framed with its address; replies carry their source. Like v2ray's
client, the request header names the first datagram's target (the server
reads every datagram's own address) and goes out with that datagram.
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, EndpointLost
from honk.outbound.stacked import StackedLeaf, Stream
from honk.outbound.stream_datagram import StreamDatagramEndpoint
from honk.proto.trojan import TrojanClient, TrojanCommand, TrojanUdpDecoder, encode_udp_packet

__all__ = ["TrojanOutbound", "TrojanUdpCodec"]

_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="trojan-udp")


class TrojanOutbound(StackedLeaf):
    protocol = "trojan"
    tls_default = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def _password(self) -> str:
        if not self.node.password:
            raise ConfigRefused(f"{self.name}: a Trojan node needs a password")
        return self.node.password

    def stream(self, target: Address) -> Stream:
        return Stream(TrojanClient(self._password(), TrojanCommand.CONNECT, target).request_header())

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> StreamDatagramEndpoint:
        codec = TrojanUdpCodec(self._password())
        endpoint = StreamDatagramEndpoint(self.name, codec, receive, on_lost)
        channel = await self.open_channel(deadline)
        endpoint.attach(channel)
        return endpoint  # it belongs to the association that asked for it, not to the node


class TrojanUdpCodec:
    """Trojan's UDP ASSOCIATE framing: the request header before the first datagram, then addressed packets."""

    def __init__(self, password: str) -> None:
        self._password: str | None = password  # dropped once the header is built
        self._decoder = TrojanUdpDecoder()

    def encode(self, payload: bytes, target: Address) -> bytes:
        packet = encode_udp_packet(target, payload)  # ValueError: too long, or a name that does not fit
        if self._password is None:
            return packet
        header = TrojanClient(self._password, TrojanCommand.UDP_ASSOCIATE, target).request_header()
        self._password = None
        return header + packet

    def decode(self, data: bytes) -> list[tuple[bytes, Address]]:
        return [(payload, source) for source, payload in self._decoder.feed(data)]  # TrojanProtocolError
