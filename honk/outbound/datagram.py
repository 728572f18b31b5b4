"""What the UDP endpoints of proxy leaves share: one connected, marked UDP socket.

A :class:`ProxyDatagramEndpoint` sends every datagram to one address on the
proxy's side (a SOCKS5 relay address, a Shadowsocks server), so its socket is
connected: the kernel drops datagrams from anyone else. The socket carries the
node's bypass mark like its TCP dials. A subclass says how a payload is wrapped
for a target (:meth:`wrap`) and how a reply is unwrapped (:meth:`unwrap`, which
delivers it with :meth:`deliver` or counts it as dropped).

UDP has no connection to lose: ICMP errors are counted (``send_errors``), a
datagram that cannot be wrapped is counted, and only a failing socket ends the
endpoint, reported once through ``on_lost``.
"""

from __future__ import annotations

import asyncio

from honk.core.errors import HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost
from honk.outbound.direct import DirectOutbound

__all__ = ["ProxyDatagramEndpoint"]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, endpoint: ProxyDatagramEndpoint) -> None:
        self.endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if not self.endpoint.closed:
            self.endpoint.unwrap(data)

    def error_received(self, exc: Exception) -> None:
        self.endpoint.send_errors += 1  # ICMP (the port closed, for one): counted, not fatal

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.endpoint._finish(UpstreamFailed(f"{self.endpoint.outbound}: UDP socket failed: {exc}"))


class ProxyDatagramEndpoint:
    """Base of a proxy leaf's :class:`~honk.outbound.base.PacketEndpoint` (see the module docstring)."""

    def __init__(self, outbound: str, receive: DatagramSink, on_lost: EndpointLost | None) -> None:
        self.outbound = outbound
        self._receive = receive
        self._on_lost = on_lost
        self._transport: asyncio.DatagramTransport | None = None
        self._closed = False
        self.dropped = 0  # replies that were not valid datagrams of the protocol
        self.send_errors = 0  # datagrams that could not be wrapped or sent, and ICMP errors

    async def open(self, host: str, port: int, connector: DirectOutbound) -> None:
        """The socket: marked like the node's TCP dials, connected to ``host:port``."""
        loop = asyncio.get_running_loop()
        sock = connector.connected_udp(host, port)
        try:
            self._transport, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self), sock=sock)
        except BaseException:
            sock.close()
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, payload: bytes, target: Address) -> None:
        transport = self._transport
        if self._closed or transport is None:
            return
        try:
            packet = self.wrap(payload, target)
        except ValueError:  # the target does not fit the protocol's address (a name over 255 bytes)
            self.send_errors += 1
            return
        transport.sendto(packet)

    def close(self) -> None:
        self._finish(None)

    # -- for subclasses ------------------------------------------------------------------

    def wrap(self, payload: bytes, target: Address) -> bytes:
        raise NotImplementedError

    def unwrap(self, data: bytes) -> None:
        raise NotImplementedError

    def deliver(self, payload: bytes, source: Address) -> None:
        self._receive(payload, source)

    def _closing(self) -> None:
        """Release what the subclass holds besides the socket (called once, at the end)."""

    def _finish(self, error: HonkError | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        self._closing()
        if self._on_lost is not None:
            self._on_lost(error)
