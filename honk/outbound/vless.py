"""VLESS nodes (no flow): UUID and target, then the stream; the server's answer starts with a short header.

VLESS carries no encryption of its own, so links normally put it over TLS
(``security=tls``).

Failures after the dial end the flow through the bridge
(:mod:`honk.outbound.bridge`), which logs them with their reason, or, over
TCP + TLS, where the relay engine strips the response header itself
(:class:`~honk.proto.tls_framing.TlsFraming`), as the flow's end:

* a server that refuses the UUID closes without answering (v2ray 4.34 does
  so as soon as it has read the header): ``no-response``;
* a server speaking another protocol answers bytes that are not a VLESS
  header: ``bad-version`` (over TLS such a server fails the handshake first,
  a :class:`~honk.outbound.tls.TlsFailed` at the dial);
* a server that stays silent is not an error: the target may simply have
  nothing to say yet. The relay's idle timeout ends such a flow; there is no
  separate first-response deadline.

UDP: a request with the UDP command carries datagrams for its one target,
each with a 2-byte length, after the same response header; the endpoint keeps
one such stream per target (:class:`~honk.outbound.stream_datagram.PerTargetDatagramEndpoint`).
A mux node sends UDP as Mux.Cool UDP sessions on its carriers instead (:mod:`honk.outbound.mux_udp`).
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, EndpointLost
from honk.outbound.mux_udp import MuxDatagramEndpoint
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

    def _client(self, command: VlessCommand, target: Address | None) -> VlessClient:
        try:
            return VlessClient(self.node.username or "", command, target)
        except ValueError:
            raise ConfigRefused(f"{self.name}: the VLESS id is not a UUID") from None

    def stream(self, target: Address) -> Stream:
        return _response_stream(self._client(VlessCommand.TCP, target))

    def mux_stream(self) -> Stream:
        """A Mux.Cool carrier: VLESS's mux command, whose header names no target."""
        return _response_stream(self._client(VlessCommand.MUX, None))

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> PerTargetDatagramEndpoint | MuxDatagramEndpoint:
        self.transport()  # refused at the dial, as for TCP
        self._client(VlessCommand.UDP, self.server)  # a bad id is refused now, not at the first datagram
        if self.mux:  # UDP sessions on the node's shared carriers
            return await self.dial_mux_udp(receive, deadline, on_lost)
        return PerTargetDatagramEndpoint(
            self.name,
            lambda: self.open_channel(self.udp_deadline()),
            lambda target: VlessUdpCodec(self._client(VlessCommand.UDP, target)),
            receive,
            on_lost,
        )


def _response_stream(client: VlessClient) -> Stream:
    """``client``'s request, and the server's side opened by its response decoder."""
    decoder = client.response_decoder()

    def at_eof() -> None:
        if not decoder.header_done:
            decoder.feed(b"")  # raises no-response or truncated-header

    return Stream(client.request_header(), decoder.feed, at_eof, response=decoder)


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
            data = self._response.feed(data)  # EOF here raises no-response or truncated-header
            if not data:
                return []
        return [(payload, self._target) for payload in self._packets.feed(data)]
