"""VMess nodes with the AEAD header (alterId 0) over TCP, TLS or WebSocket.

The request header (sealed with the UUID's command key and the wall-clock
time, which the server checks within two minutes) goes out right after the
transport is up; the body is sealed in chunks with the node's security
(aes-128-gcm, chacha20-poly1305, or none) by the relay engine: on plain TCP as a
:class:`~honk.proto.vmess.VmessFraming`, over TLS (and WebSocket over TLS) inside the
records of a :class:`~honk.proto.tls_framing.TlsFraming`; over plain WebSocket or
Mux.Cool in Python through the bridge. The server's first bytes are its
sealed response header, checked against the request: another UUID shows as a
server that closes without answering, a forged response as an authentication
error. The legacy MD5 header (alterId > 0) is refused when the node is dialled.

UDP: a request with the UDP command carries datagrams for its one target, one
sealed chunk each, both ways; the endpoint keeps one such stream per target
(:class:`~honk.outbound.stream_datagram.PerTargetDatagramEndpoint`). A mux node
sends UDP as Mux.Cool UDP sessions on its carriers instead (:mod:`honk.outbound.mux_udp`).
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, DialedStream, EndpointLost, EnginePlan
from honk.outbound.mux_udp import MuxDatagramEndpoint
from honk.outbound.stacked import StackedLeaf, Stream
from honk.outbound.stream_datagram import PerTargetDatagramEndpoint
from honk.proto.vmess import COMMAND_TCP, COMMAND_UDP, VmessClient, VmessFraming, VmessProtocolError

__all__ = ["VmessOutbound", "VmessUdpCodec"]

_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="vmess-udp")


class VmessOutbound(StackedLeaf):
    protocol = "vmess"
    mux_capable = (
        True  # the carrier is a TCP request to v1.mux.cool, which v2ray's inbound hands to its mux server
    )

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def _client(self, command: int, target: Address) -> VmessClient:
        params = dict(self.node.params)
        if params.get("aid", "0") not in ("", "0"):
            raise ConfigRefused(f"{self.name}: VMess alterId > 0 (the legacy MD5 header) is not supported")
        security = self.node.encryption or "auto"
        try:
            return VmessClient(self.node.username or "", security, command, target, self.clock.wall())
        except ValueError as exc:
            raise ConfigRefused(f"{self.name}: {exc}") from None

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        if self.transport().plain and not self.mux:
            # on plain TCP the relay engine frames the body itself: no bridge, no Python per chunk
            head, framing = self._sealed(target)
            return await self.open_framed(head, framing, deadline, "VMess")
        return await super().dial_tcp(target, deadline)

    def relayed(self, target: Address) -> tuple[bytes, VmessFraming]:
        """Over TLS the body's chunks ride inside the records the relay engine moves (TlsFraming)."""
        return self._sealed(target)

    def engine_plan(self, target: Address) -> EnginePlan | None:
        try:
            if self.mux:
                return None
            if not self.transport().plain:  # TCP + TLS: the engine shakes hands, then frames inside
                return super().engine_plan(target)
            return self.framed_plan(lambda: self._sealed(target))
        except ConfigRefused:  # a refused transport, id or alterId: dial_tcp says why
            return None

    def _sealed(self, target: Address) -> tuple[bytes, VmessFraming]:
        """The sealed request header and the framing of the body after it."""
        client = self._client(COMMAND_TCP, target)
        return client.request_header(), VmessFraming(client)

    def stream(self, target: Address) -> Stream:
        client = self._client(COMMAND_TCP, target)
        decoder = client.response_decoder()

        def at_eof() -> None:
            if not decoder.header_received:
                raise VmessProtocolError("no-response", "the server closed before answering (wrong id?)")

        return Stream(client.request_header(), decoder.feed, at_eof, client.encrypt, client.eof)

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> PerTargetDatagramEndpoint | MuxDatagramEndpoint:
        self.transport()  # refused at the dial, as for TCP
        self._client(COMMAND_UDP, self.server)  # a bad id or alterId is refused here, not later
        if self.mux:  # UDP sessions on the node's shared carriers
            return await self.dial_mux_udp(receive, deadline, on_lost)
        return PerTargetDatagramEndpoint(
            self.name,
            lambda: self.open_channel(self.udp_deadline()),
            lambda target: VmessUdpCodec(self._client(COMMAND_UDP, target)),
            receive,
            on_lost,
        )


class VmessUdpCodec:
    """One VMess UDP stream's framing: one sealed chunk per datagram; replies come from the request's target."""

    def __init__(self, client: VmessClient) -> None:
        self._client = client
        self._header: bytes | None = client.request_header()
        self._decoder = client.response_decoder()

    def encode(self, payload: bytes, target: Address) -> bytes:
        chunk = self._client.encrypt(payload)  # ValueError: empty or above one chunk
        header, self._header = self._header, None
        return header + chunk if header is not None else chunk

    def decode(self, data: bytes) -> list[tuple[bytes, Address]]:
        if not data and not self._decoder.header_received:
            raise VmessProtocolError("no-response", "the server closed before answering (wrong id?)")
        target = self._client.target
        return [(payload, target) for payload in self._decoder.feed_packets(data)]
