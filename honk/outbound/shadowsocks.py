"""Shadowsocks nodes (AEAD ciphers, SIP004): TCP streams and UDP packets.

TCP: connect to the server (Happy Eyeballs and the bypass mark, through the
node's :class:`~honk.outbound.direct.DirectOutbound`), then send the salt and
the first chunk, which holds only the target address, at once. Shadowsocks has
no server reply: a wrong password or an unreachable target shows up only while
relaying (the server closes, or its bytes fail authentication). The dialed
stream carries a :class:`~honk.proto.shadowsocks.ShadowsocksFraming`; the relay
continues the client's direction from its encryptor's nonce and feeds the
server's bytes, salt first, to its fresh decryptor.

UDP: one marked UDP socket connected to the server per endpoint. Each datagram
is sealed on its own (salt + AEAD(address + payload)); replies carry their
source address in the same header. A reply that fails authentication is
dropped and counted (``auth_failures``), never raised: anyone can send a
datagram to an open port.
"""

from __future__ import annotations

import logging

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock
from honk.core.errors import ConfigRefused, DialError, HonkError
from honk.core.net import Address, IPAddress
from honk.outbound.base import Capabilities, DatagramSink, DialedStream, EndpointLost, EnginePlan
from honk.outbound.datagram import ProxyDatagramEndpoint
from honk.outbound.direct import DirectOutbound
from honk.outbound.proxy import ProxyLeaf
from honk.proto.shadowsocks import (
    CIPHERS,
    ShadowsocksAuthError,
    ShadowsocksFraming,
    ShadowsocksProtocolError,
    decode_address,
    encode_address,
    master_key,
    open_packet,
    seal_packet,
)

__all__ = ["ShadowsocksOutbound", "ShadowsocksUdpEndpoint"]

log = logging.getLogger("honk.outbound.shadowsocks")

_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="shadowsocks")

# Address headers a node keeps encoded (cleared when full): flows repeat a few targets, and
# encoding one shows in the loop thread's cost per Shadowsocks flow.
HEADER_CACHE_SIZE = 1024


class ShadowsocksOutbound(ProxyLeaf):
    """A ``ss`` node: ``node.encryption`` is the cipher, ``node.password`` the password."""

    protocol = "ss"

    def __init__(self, node: NodeSpec, glob: GlobalSpec, clock: Clock) -> None:
        super().__init__(node, glob, clock)
        cipher = (node.encryption or "").lower()
        # Share links refuse other ciphers; a node built some other way fails at dial time.
        self._cipher: str | None = cipher if cipher in CIPHERS else None
        self._master = (
            master_key(node.password or "", CIPHERS[cipher].key_size) if self._cipher is not None else b""
        )
        self._headers: dict[tuple[str, int], bytes] = {}  # (host, port) -> its address header

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def _usable_cipher(self) -> str:
        if self._cipher is None:
            raise ConfigRefused(f"{self.name}: the node's Shadowsocks cipher is not supported")
        return self._cipher

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        header, framing = self._opening(target)
        return await self.open_framed(framing.encryptor.encrypt(header), framing, deadline, "Shadowsocks")

    def engine_plan(self, target: Address) -> EnginePlan | None:
        # the engine sends the salt and seals the address chunk itself (Engine.hs_connect)
        try:
            return self.framed_plan(lambda: self._opening(target))
        except HonkError:  # a cipher or a target Shadowsocks cannot carry: dial_tcp says why
            return None

    def _opening(self, target: Address) -> tuple[bytes, ShadowsocksFraming]:
        """The first chunk's plaintext (the target address) and a framing that has sent nothing."""
        cipher = self._usable_cipher()
        key = (target.host, target.port)
        header = self._headers.get(key)
        if header is None:
            header = _address_header(self.name, target)
            if len(self._headers) >= HEADER_CACHE_SIZE:
                self._headers.clear()
            self._headers[key] = header
        return header, ShadowsocksFraming(cipher, self._master)  # fresh: its codecs are made when first used

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> ShadowsocksUdpEndpoint:
        cipher = self._usable_cipher()
        try:
            server = await _server_ip(self.connector, self.server, deadline, self.clock.now())
        except HonkError as exc:
            self.count(exc, udp=True)
            raise
        endpoint = ShadowsocksUdpEndpoint(self.name, cipher, self._master, receive, on_lost)
        try:
            await endpoint.start(server, self.server.port, self.connector)
        except OSError as exc:
            error = DialError(self.name, "connect", f"UDP socket: {exc.strerror or type(exc).__name__}")
            self.count(error, udp=True)
            raise error from None
        return endpoint  # it belongs to the association that asked for it, not to the node


def _address_header(outbound: str, target: Address) -> bytes:
    try:
        return encode_address(target)
    except ValueError:  # a name longer than the 255 bytes a SOCKS5 address can hold
        raise DialError(outbound, "handshake", "the target name does not fit a Shadowsocks address") from None


async def _server_ip(connector: DirectOutbound, server: Address, deadline: float, now: float) -> IPAddress:
    """The server's IP for UDP: the literal, or the first address the node's resolver gives."""
    if server.ip is not None:
        return server.ip
    # The node's DirectOutbound resolves with the same bounds and typed errors as a TCP dial.
    addresses = await connector.resolve(server.host, min(deadline, now + connector.connect_timeout))
    return addresses[0]


class ShadowsocksUdpEndpoint(ProxyDatagramEndpoint):
    """One UDP path through a Shadowsocks server (see the module docstring).

    Counters: ``auth_failures`` (replies whose tag did not verify), ``dropped``
    (replies that verified but were malformed), ``send_errors`` (datagrams that
    could not be sealed or sent, and ICMP errors).
    """

    def __init__(
        self,
        outbound: str,
        cipher: str,
        master: bytes,
        receive: DatagramSink,
        on_lost: EndpointLost | None,
    ) -> None:
        super().__init__(outbound, receive, on_lost)
        self._cipher = cipher
        self._master = master
        self.auth_failures = 0

    async def start(self, server: IPAddress, port: int, connector: DirectOutbound) -> None:
        await self.open(str(server), port, connector)

    def wrap(self, payload: bytes, target: Address) -> bytes:
        return seal_packet(self._cipher, self._master, encode_address(target) + payload)

    def unwrap(self, data: bytes) -> None:
        try:
            plain = open_packet(self._cipher, self._master, data)
            source, end = decode_address(plain)
        except ShadowsocksAuthError:
            self.auth_failures += 1
            log.debug("udp reply failed authentication outbound=%s", self.outbound)
            return
        except ShadowsocksProtocolError as exc:
            self.dropped += 1
            log.debug("udp reply dropped outbound=%s reason=%s", self.outbound, exc.reason)
            return
        self.deliver(plain[end:], source)
