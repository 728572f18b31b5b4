"""The outbound interface every leaf protocol implements.

A leaf dials the upstream side of one flow. A TCP dial returns a
:class:`DialedStream`: a connected, non-blocking ``socket.socket`` the relay
engine drives by its file descriptor, plus the framing the relay must apply to
the bytes (``None`` for plain streams, which splice; a Shadowsocks stream
carries its AEAD state, which the engine's copy path applies).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.proto.framing import Framing

# A UDP endpoint delivers each reply as (payload, the address that sent it).
DatagramSink = Callable[[bytes, Address], None]
# Called once when an endpoint stops for good (None: closed by its owner).
EndpointLost = Callable[[HonkError | None], None]


class PacketEndpoint(Protocol):
    """A UDP path through one leaf for one association: datagrams to any target,
    replies from any source. Sending never blocks; a datagram that cannot be
    sent is dropped (UDP semantics) and counted by the endpoint."""

    def send(self, payload: bytes, target: Address) -> None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a leaf can carry."""

    tcp: bool = True
    udp: bool = False
    # how UDP travels: "none", "direct" (plain datagrams), "socks5-associate",
    # "shadowsocks" (per-packet AEAD); later protocols add theirs
    udp_mode: str = "none"


@dataclass(slots=True)
class DialedStream:
    """The upstream of one TCP flow, connected and past the protocol's handshake."""

    sock: socket.socket
    # What the relay applies between the client's bytes and this socket; None: plain bytes.
    # Each framed protocol defines its own (honk.proto.shadowsocks.ShadowsocksFraming).
    framing: Framing | None = None
    # A stream bridged from a channel (honk.outbound.bridge.BridgeEnd): how the server's side
    # ended, which a clean end of the relay's socket does not show. None: a real socket.
    bridge: Any = None


# Not frozen, as FlowMeta (honk.core.net): built per flow, never mutated.
@dataclass(slots=True)
class EnginePlan:
    """A TCP dial the relay engine can make itself (``Engine.hs_connect``): connect to ``ip``:``port``
    with the bypass ``mark`` (-1: none), send ``head`` first, then relay through ``framing``.

    A leaf offers one (``engine_plan(target)``) only when its dial is exactly that: a direct
    connection to an IP literal, or a node whose server is an IP literal and whose handshake
    the engine can make: a header sealed ahead (Shadowsocks, VMess on plain TCP), or a TLS
    handshake and then the header (Trojan and VLESS on TCP + TLS). Resolving names, WebSocket,
    mux and ready connections stay with Python's dial."""

    ip: str
    port: int
    mark: int
    timeout: float  # seconds the connect may take (the connector's bound)
    framing: Framing | None = None
    head: bytes = b""
    # called on the loop's thread once the engine connected (and shook hands), with what EV_OPEN
    # told of the handshake (honk._fast.relay_py.TLS_RESUMED | TLS_13); None: nothing to learn
    opened: Callable[[int], None] | None = None


class Outbound(Protocol):
    """A leaf outbound: ``direct``, ``block``, or a proxy node."""

    name: str  # display name: the node tag, or "direct" / "block"
    protocol: str  # "direct", "block", "socks5", ...
    # The node's runtime (see honk.outbound.runtime); the registry sets it on proxy
    # leaves right after building them. None for direct and block.
    runtime: Any

    @property
    def capabilities(self) -> Capabilities:
        """TCP, UDP and the UDP mode."""

    @property
    def supports_udp(self) -> bool:
        """Whether this leaf can carry UDP flows at all."""

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        """Open a TCP connection to ``target`` through this leaf.

        ``deadline`` is an absolute time on the dialer's clock. Raises
        :class:`honk.core.errors.Blocked` for ``block``,
        :class:`honk.core.errors.DialTimeout` when the deadline passes,
        :class:`honk.core.errors.DialError` (with ``phase``) for other failures,
        :class:`honk.core.errors.NotSupported` if the protocol cannot dial yet.
        """

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> PacketEndpoint:
        """Open a UDP path through this leaf; replies go to ``receive``.

        Raises :class:`honk.core.errors.NotSupported` when the leaf cannot carry
        UDP, and the dial errors of :meth:`dial_tcp` for its setup (a SOCKS5
        association needs a TCP control connection, for example).
        """
