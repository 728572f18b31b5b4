"""Trojan nodes: the password's SHA-224 and the target, then the stream, over TLS.

The header goes out right after the TLS handshake. The link's
``security``/``type``/``sni``/``path``/``host`` shape the transport (TLS by
default).

Trojan has no response and no denial message, so a wrong password is not
reported by the protocol: a server with a fallback answers with its decoy
site (bytes honk cannot tell from the target's), one without closes at once
(v2ray 4.34: under a millisecond after the request, on loopback). That close
before any byte is the best signal there is: the flow ends with a
``closed-before-data`` :class:`~honk.proto.trojan.TrojanError`, logged by the
bridge (:mod:`honk.outbound.bridge`), or, over TCP + TLS, where the relay
engine carries the records itself (:class:`~honk.proto.tls_framing.TlsFraming`),
the flow's end. A target that accepts and closes
without a byte ends the same way; its client sees the same EOF either way.
A server that stays silent is not an error (the target may have nothing to
say yet): the relay's idle timeout ends such a flow, and there is no
first-response deadline.

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
from honk.proto.trojan import (
    TrojanClient,
    TrojanCommand,
    TrojanStreamWatch,
    TrojanUdpDecoder,
    encode_udp_packet,
)

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
        header = TrojanClient(self._password(), TrojanCommand.CONNECT, target).request_header()
        watch = TrojanStreamWatch()

        def at_eof() -> None:
            watch.feed(b"")  # raises closed-before-data if the server never sent a byte

        return Stream(header, watch.feed, at_eof, response=watch)

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
