"""SOCKS5 nodes: CONNECT for TCP, UDP ASSOCIATE for UDP (RFC 1928, RFC 1929).

TCP: connect to the server, run :class:`~honk.proto.socks5_client.Socks5ClientHandshake`
reading exactly what each message needs, and hand the socket to the relay as
a plain stream (it splices).

UDP: one association per endpoint. A TCP control connection asks for UDP
ASSOCIATE; the server answers with its relay address (an unspecified address
means "the address you reached me at"). Datagrams go to that relay address
wrapped in the SOCKS5 UDP header (RSV RSV FRAG ATYP ADDR PORT), replies come
back the same way. The association lives exactly as long as its control
connection (RFC 1928 section 7): when the server closes it, the endpoint ends
and reports :class:`~honk.core.errors.UpstreamFailed`. Fragmented datagrams
(FRAG ≠ 0) are dropped, as most servers do.
"""

from __future__ import annotations

import asyncio
import socket

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock
from honk.core.errors import ClientProtocolError, HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.base import Capabilities, DatagramSink, DialedStream, EndpointLost
from honk.outbound.datagram import ProxyDatagramEndpoint
from honk.outbound.direct import DirectOutbound
from honk.outbound.proxy import ProxyLeaf, handshake_scope, recv_some
from honk.proto.socks5 import Command, build_udp_datagram, parse_udp_datagram
from honk.proto.socks5_client import Socks5ClientHandshake

__all__ = ["Socks5Outbound", "Socks5UdpEndpoint"]

_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="socks5-associate")
_ANY = Address("0.0.0.0", 0)  # DST of UDP ASSOCIATE: the client's datagram source is not known yet


class Socks5Outbound(ProxyLeaf):
    protocol = "socks5"

    def __init__(self, node: NodeSpec, glob: GlobalSpec, clock: Clock) -> None:
        super().__init__(node, glob, clock)
        self._username = node.username if node.username else None
        self._password = node.password

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        sock = await self.connect_server(deadline)
        try:
            await self._handshake(sock, Command.CONNECT, target, deadline)
        except BaseException:
            sock.close()
            raise
        return DialedStream(sock)

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> Socks5UdpEndpoint:
        control = await self.connect_server(deadline)
        try:
            handshake = await self._handshake(control, Command.UDP_ASSOCIATE, _ANY, deadline)
            relay = _relay_address(handshake.bound, control)
            endpoint = Socks5UdpEndpoint(self.name, control, relay, receive, on_lost)
            await endpoint.start(self.connector)
        except BaseException:
            control.close()
            raise
        return endpoint  # it belongs to the association that asked for it, not to the node

    async def _handshake(
        self, sock: socket.socket, command: Command, target: Address, deadline: float
    ) -> Socks5ClientHandshake:
        handshake = Socks5ClientHandshake(self.name, command, target, self._username, self._password)
        loop = asyncio.get_running_loop()
        try:
            async with handshake_scope(self.clock, deadline, self.name, "SOCKS5"):
                out = handshake.initial()
                while True:
                    if out:
                        await loop.sock_sendall(sock, out)
                    if handshake.done:
                        break
                    out = handshake.feed(await recv_some(sock, handshake.wanted))
        except HonkError as exc:
            self.count(exc)
            raise
        self.count(None)
        return handshake


def _relay_address(bound: Address | None, control: socket.socket) -> Address:
    """Where datagrams go: BND of the reply, or the server's address when BND is unspecified."""
    server_ip = control.getpeername()[0]
    if bound is None or bound.ip is None:
        return Address(server_ip, bound.port if bound else 0)
    if bound.ip.is_unspecified:
        return Address(server_ip, bound.port)
    return bound


class Socks5UdpEndpoint(ProxyDatagramEndpoint):
    """One UDP association through a SOCKS5 server (see the module docstring)."""

    def __init__(
        self,
        outbound: str,
        control: socket.socket,
        relay: Address,
        receive: DatagramSink,
        on_lost: EndpointLost | None,
    ) -> None:
        super().__init__(outbound, receive, on_lost)
        self.relay = relay
        self._control = control
        self._watch: asyncio.Task[None] | None = None

    async def start(self, connector: DirectOutbound) -> None:
        await self.open(self.relay.host, self.relay.port, connector)
        self._watch = asyncio.get_running_loop().create_task(self._watch_control())

    def wrap(self, payload: bytes, target: Address) -> bytes:
        return build_udp_datagram(target, payload)

    def unwrap(self, data: bytes) -> None:
        try:
            datagram = parse_udp_datagram(data)
        except ClientProtocolError:
            self.dropped += 1
            return
        if datagram.frag != 0:
            self.dropped += 1
            return
        self.deliver(datagram.payload, datagram.address)

    async def _watch_control(self) -> None:
        """The association ends with its control connection (RFC 1928 section 7)."""
        loop = asyncio.get_running_loop()
        try:
            while await loop.sock_recv(self._control, 512):
                pass  # nothing is expected on it; anything is ignored
            error: HonkError = UpstreamFailed(f"{self.outbound}: the SOCKS5 server ended the UDP association")
        except OSError as exc:
            error = UpstreamFailed(
                f"{self.outbound}: the SOCKS5 control connection failed: {exc.strerror or exc}"
            )
        self._finish(error)

    def _closing(self) -> None:
        watch = self._watch
        if watch is not None and not watch.done() and watch is not asyncio.current_task():
            # close the socket only once the watcher's pending read is gone
            watch.add_done_callback(lambda _: self._control.close())
            watch.cancel()
        else:
            self._control.close()
