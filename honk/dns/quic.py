"""DNS over QUIC (RFC 9250) and DNS over HTTP/3 (RFC 8484 on RFC 9114): one QUIC
connection per upstream, one stream per query.

QUIC already multiplexes, so each query is its own bidirectional stream: DoQ
writes the message with message id 0 and the two-octet length prefix, then
ends the stream (RFC 9250 §4.2); DoH3 POSTs it as ``application/dns-message``
exactly as DoH on HTTP/2 does. The exchange's own id is put back on the reply.

aioquic's sans-I/O :class:`QuicConnection` is driven by hand, as the QUIC
health probe (``honk.alive.probe_quic``) drives it: datagrams it wants sent go
out through a :class:`_Path`, datagrams from the server go in, and its timers
run on the injected clock, whose ``now`` is the connection's time. The path is
the routed leaf's: a direct leaf sends from a local UDP socket carrying the
bypass mark (honk's own traffic never comes back through interception), a
proxy leaf through its UDP endpoint (``leaf.dial_udp``: SOCKS5 UDP ASSOCIATE,
Shadowsocks UDP, ...). A leaf without UDP fails the dial as unsupported.

The server's certificate is checked against the upstream's ``tls_server_name``
or host, with the system's trust store (``SSL_CERT_FILE`` honoured), as the
probe does. The handshake must pick ALPN ``doq`` (RFC 9250 §4.1.1) or ``h3``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from honk.alive.traffic import traffic_of
from honk.config import dns_endpoint as endpoint
from honk.connection import scoring
from honk.core.clock import Clock, TimerHandle, timeout_at
from honk.core.errors import DialError, HonkError, NotSupported
from honk.core.net import Address
from honk.dns.encrypted import (
    HTTP_OK,
    MAX_MESSAGE,
    Connection,
    LengthPrefixed,
    _retrieve,
    authority_of,
    doh_request_headers,
    length_prefixed,
    with_id,
)
from honk.dns.failure import ExchangeFailed

if TYPE_CHECKING:  # aioquic loads with the first QUIC upstream: ~10 MB a router without one never pays
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

__all__ = ["ALPN_DOQ", "ALPN_H3", "QuicDnsConnection", "connect_quic", "doq_query"]

log = logging.getLogger("honk.dns")

ALPN_DOQ = "doq"  # RFC 9250 §4.1.1
ALPN_H3 = "h3"  # RFC 9114 §3.1
DOQ_NO_ERROR = 0x0  # RFC 9250 §4.3: DOQ_NO_ERROR closes a connection cleanly
DOQ_REQUEST_CANCELLED = 0x3  # RFC 9250 §4.3: a query the client gave up on (§4.5)
H3_REQUEST_CANCELLED = 0x10C  # RFC 9114 §8.1
MAX_DATAGRAM = 65535


def doq_query(query: bytes) -> bytes:
    """What a DoQ stream carries for ``query``: message id 0 (RFC 9250 §4.2.1), length-prefixed."""
    return length_prefixed(with_id(query, 0))


def _configuration(alpn: str, server_name: str) -> QuicConfiguration:
    from aioquic.quic.configuration import QuicConfiguration

    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=[alpn],
        verify_mode=ssl.CERT_REQUIRED,
        server_name=server_name,
        max_datagram_frame_size=None,
    )
    paths = ssl.get_default_verify_paths()  # honours SSL_CERT_FILE / SSL_CERT_DIR
    if paths.cafile or paths.capath:  # else aioquic's own default bundle
        config.cafile, config.capath = paths.cafile, paths.capath
    return config


# --- the datagram path ----------------------------------------------------------------------


class _Path:
    """Where the connection's datagrams go: ``send``; replies reach the sink given at open."""

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SocketPath(_Path, asyncio.DatagramProtocol):
    """A direct leaf's: a connected, marked local UDP socket."""

    def __init__(self, sink: Callable[[bytes], None], lost: Callable[[HonkError | None], None]) -> None:
        self._sink = sink
        self._lost = lost
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._sink(data)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable: nobody serves QUIC there, so fail now rather than at the
        # handshake's deadline; any other ICMP error is left to QUIC's own timers
        if isinstance(exc, ConnectionRefusedError):
            self._lost(DialError("direct", "connect", "the server's UDP port is closed"))

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._lost(DialError("direct", "udp", str(exc)))

    def send(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _EndpointPath(_Path):
    """A proxy leaf's UDP endpoint, every datagram addressed to the server."""

    def __init__(self, server: Address) -> None:
        self._server = server
        self.endpoint: Any = None

    def send(self, data: bytes) -> None:
        if self.endpoint is not None:
            self.endpoint.send(data, self._server)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()


# --- the connection -------------------------------------------------------------------------


class _Query:
    __slots__ = ("body", "frames", "future", "status")

    def __init__(self, future: asyncio.Future[bytes]) -> None:
        self.future = future
        self.frames = LengthPrefixed()  # DoQ
        self.body = bytearray()  # DoH3
        self.status: int | None = None


class QuicDnsConnection(Connection):
    """DoQ or DoH3 over one client QUIC connection."""

    def __init__(
        self,
        quic: QuicConnection,
        server: Address,
        clock: Clock,
        kind: str,
        authority: str,
        path: str,
        reporter: Any = None,
    ) -> None:
        super().__init__(clock, reporter)
        self._quic = quic
        self._server = server
        self._addr = (str(server.host), server.port)
        self._kind = kind
        self._authority = authority
        self._path = path
        self._h3: Any = None
        self._route: _Path | None = None
        self._timer: TimerHandle | None = None
        self._queries: dict[int, _Query] = {}
        self.heard = False  # a datagram came back from the server through a node's path
        self.handshake: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.handshake.add_done_callback(_retrieve)
        if kind == endpoint.H3:
            # before the handshake: the server's control stream may come in the same flight
            from aioquic.h3.connection import H3Connection

            self._h3 = H3Connection(quic)

    @property
    def in_flight(self) -> int:
        return len(self._queries)

    # the datagram side

    def start(self, route: _Path) -> None:
        self._route = route
        self._quic.connect(self._addr, now=self._clock.now())
        self._pump()

    def datagram(self, data: bytes) -> None:
        if self.closed:
            return
        self._step(lambda now: self._quic.receive_datagram(data, self._addr, now))

    def datagram_from(self, data: bytes, source: Address) -> None:
        if source == self._server:
            self.heard = True  # the node carried something back (its health: see _node_health)
            self.datagram(data)

    def path_lost(self, error: HonkError | None) -> None:
        if error is not None:
            self._fail(ExchangeFailed("closed", f"the UDP path ended: {error}"))

    def _on_timer(self) -> None:
        self._timer = None
        if not self.closed:
            self._step(self._quic.handle_timer)

    def _step(self, action: Callable[[float], object]) -> None:
        try:
            action(self._clock.now())
            self._pump()
        except Exception as exc:  # noqa: BLE001 - a fault in the QUIC stack ends this connection, not the service
            log.exception("dns quic connection: the QUIC stack raised")
            self._fail(ExchangeFailed("closed", f"QUIC: {exc}"))

    def _pump(self) -> None:
        from aioquic.quic.events import (
            ConnectionTerminated,
            HandshakeCompleted,
            StreamDataReceived,
            StreamReset,
        )

        while (event := self._quic.next_event()) is not None:
            if isinstance(event, HandshakeCompleted):
                if not self.handshake.done():
                    self.handshake.set_result(event.alpn_protocol)
            elif isinstance(event, ConnectionTerminated):
                self._terminated(event.error_code, event.reason_phrase)
                return
            elif isinstance(event, StreamReset):
                self._finish(event.stream_id, ExchangeFailed("reset", f"stream reset ({event.error_code})"))
            elif isinstance(event, StreamDataReceived):
                if self._h3 is not None:
                    for h3_event in self._h3.handle_event(event):
                        self._h3_event(h3_event)
                else:
                    self._doq_data(event.stream_id, event.data, event.end_stream)
        self._transmit()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self._quic.get_timer()
        if at is not None and not self.closed:
            self._timer = self._clock.call_later(max(0.0, at - self._clock.now()), self._on_timer)

    def _transmit(self) -> None:
        if self._route is None:
            return
        for data, _ in self._quic.datagrams_to_send(now=self._clock.now()):
            self._route.send(data)

    def _terminated(self, code: int, phrase: str) -> None:
        failure = ExchangeFailed("closed", f"QUIC connection closed ({code}: {phrase})")
        if not self.handshake.done():
            self.handshake.set_exception(failure)
        self._fail(failure)

    # queries

    async def exchange(self, query: bytes) -> bytes:
        own = self._query_id(query)
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(_retrieve)
        stream_id = self._quic.get_next_available_stream_id()
        self._queries[stream_id] = _Query(reply)
        try:
            if self._h3 is not None:
                body = with_id(query, 0)
                headers = [
                    (k.encode(), v.encode())
                    for k, v in doh_request_headers(self._authority, self._path, len(body))
                ]
                self._h3.send_headers(stream_id, headers)
                self._h3.send_data(stream_id, body, end_stream=True)
                self._sent(len(body))
            else:
                data = doq_query(query)
                self._quic.send_stream_data(stream_id, data, end_stream=True)
                self._sent(len(data))
            self._pump()
            return with_id(await reply, own)
        finally:
            if self._queries.pop(stream_id, None) is not None and not self.closed:
                try:
                    code = H3_REQUEST_CANCELLED if self._h3 is not None else DOQ_REQUEST_CANCELLED
                    self._quic.reset_stream(stream_id, code)  # the query was given up on
                    self._pump()
                except Exception:  # noqa: BLE001, S110 - a stream already finished both ways
                    pass
            self._arm_idle()

    def _doq_data(self, stream_id: int, data: bytes, ended: bool) -> None:
        pending = self._queries.get(stream_id)
        if pending is None:
            return
        messages = pending.frames.feed(data)
        if messages:
            self._answer(stream_id, messages[0])
        elif ended:
            self._finish(
                stream_id, ExchangeFailed("bad-reply", "the DoQ stream ended without a whole message")
            )

    def _h3_event(self, event: Any) -> None:
        from aioquic.h3.events import DataReceived, HeadersReceived

        pending = self._queries.get(getattr(event, "stream_id", -1))
        if pending is None:
            return
        if isinstance(event, HeadersReceived):
            for name, value in event.headers:
                if name == b":status":
                    pending.status = int(value) if value.isdigit() else None
        elif isinstance(event, DataReceived):
            pending.body += event.data
            if len(pending.body) > MAX_MESSAGE:
                self._finish(event.stream_id, ExchangeFailed("too-large", "the DoH3 reply is too large"))
                return
        if getattr(event, "stream_ended", False):
            if pending.status != HTTP_OK:
                self._finish(event.stream_id, ExchangeFailed("http-status", f"HTTP status {pending.status}"))
            else:
                self._answer(event.stream_id, bytes(pending.body))

    def _answer(self, stream_id: int, message: bytes) -> None:
        pending = self._queries.pop(stream_id, None)
        if pending is not None and not pending.future.done():
            self._answered_once(len(message))
            pending.future.set_result(message)

    def _finish(self, stream_id: int, failure: ExchangeFailed) -> None:
        pending = self._queries.pop(stream_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_exception(failure)

    def _fail(self, failure: ExchangeFailed, *, ours: bool = False) -> None:
        super()._fail(failure, ours=ours)
        for stream_id in list(self._queries):
            self._finish(stream_id, self.failure or failure)
        if not self.handshake.done():
            self.handshake.set_exception(self.failure or failure)

    def _abort(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._route is not None:
            try:
                self._quic.close(error_code=DOQ_NO_ERROR)
                self._transmit()
            except Exception:  # noqa: BLE001, S110 - closing a connection that already ended
                pass
            self._route.close()
            self._route = None


# --- dialling -------------------------------------------------------------------------------


async def connect_quic(
    dispatcher: Any,
    clock: Clock,
    routed: Any,
    server: Address,
    transport: endpoint.Transport,
    name: str,
    timeout: float,
) -> QuicDnsConnection:
    """A handshaken DoQ or DoH3 connection to ``server`` along ``routed``'s leaf."""
    from aioquic.quic.connection import QuicConnection

    deadline = clock.now() + timeout
    leaf = routed.leaf
    ip = await _resolve(dispatcher, clock, leaf, server, deadline)
    pinned = Address(str(ip), server.port)
    alpn = ALPN_DOQ if transport.kind == endpoint.QUIC else ALPN_H3
    server_name = transport.server_name or server.host
    connection = QuicDnsConnection(
        QuicConnection(configuration=_configuration(alpn, server_name)),
        pinned,
        clock,
        transport.kind,
        authority_of(server_name, server.port, endpoint.DOH_PORT),
        transport.path,
    )
    guard = scoring.begin(routed.score, clock)
    try:
        route = await _open_path(leaf, pinned, connection, deadline)
    except BaseException as exc:
        scoring.report_setup(guard, clock, leaf, exc)
        if isinstance(exc, DialError):  # the node's UDP association failed: its health hears it
            _node_health(leaf, answered=False)
        raise
    connection._reporter = scoring.report_setup(guard, clock, leaf, None)
    try:
        connection.start(route)
        async with timeout_at(clock, deadline):
            chosen = await asyncio.shield(connection.handshake)
        if chosen != alpn:
            raise ExchangeFailed("alpn", f"the server chose {chosen or 'no ALPN protocol'}, not {alpn}")
    except BaseException as exc:
        failure = (
            exc
            if isinstance(exc, ExchangeFailed)
            else ExchangeFailed("dial-timeout" if isinstance(exc, TimeoutError) else "dial-quic", str(exc))
        )
        if isinstance(exc, TimeoutError) and not connection.heard:
            _node_health(leaf, answered=False)  # nothing came back through the node at all
        connection._fail(failure)
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise failure from None
    _node_health(leaf, answered=True)
    connection.leaf = leaf  # type: ignore[attr-defined]
    connection._arm_idle()
    return connection


def _node_health(leaf: Any, *, answered: bool) -> None:
    """A QUIC dial through a proxy node, told to the node's health as its UDP relaying is judged
    elsewhere (honk.connection.udp): packets answered once the handshake came back through it;
    failed when its association could not open, or nothing at all came back before the
    deadline. A handshake the server refused (datagrams came back) says nothing of the node."""
    traffic = traffic_of(leaf)
    if traffic is None:  # direct: no node
        return
    family = getattr(leaf, "health_family", 4)
    if answered:
        traffic.packets_answered(family)
    else:
        traffic.packets_failed(family)


async def _resolve(dispatcher: Any, clock: Clock, leaf: Any, server: Address, deadline: float) -> Any:
    if server.ip is not None:
        return server.ip
    resolve = getattr(leaf, "resolve", None)
    async with timeout_at(clock, deadline):
        addresses = await (
            resolve(server.host, deadline) if resolve is not None else dispatcher.resolver(server.host)
        )
    if not addresses:
        raise ExchangeFailed("resolve", "no address")
    return addresses[0]


async def _open_path(leaf: Any, server: Address, connection: QuicDnsConnection, deadline: float) -> _Path:
    if leaf.protocol == "direct":
        sock = leaf.connected_udp(str(server.ip), server.port)
        try:
            route = _SocketPath(connection.datagram, connection.path_lost)
            await asyncio.get_running_loop().create_datagram_endpoint(lambda: route, sock=sock)
        except BaseException:
            sock.close()
            raise
        return route
    dial_udp = getattr(leaf, "dial_udp", None)
    if dial_udp is None:
        raise NotSupported(f"{leaf.name} carries no UDP, so no QUIC")
    route = _EndpointPath(server)
    route.endpoint = await dial_udp(connection.datagram_from, deadline, connection.path_lost)
    return route
