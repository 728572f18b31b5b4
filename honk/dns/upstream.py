"""One exchange with an upstream DNS server, through honk's routing.

Without ``-> tag`` the upstream's address is routed like any flow to it
(:meth:`Dispatcher.route`, inbound ``dns``, network UDP for a UDP upstream,
TCP for a TCP one); with ``-> tag`` the named node or group decides, as the
Clash modes do. Then by the leaf:

* ``direct`` and a UDP upstream: one datagram from a local socket carrying the
  bypass mark (so honk's own query never comes back through interception); a
  reply with TC set is asked again over TCP;
* ``block``: the exchange fails;
* anything else, or a TCP upstream: TCP DNS (RFC 1035 §4.2.2's two-octet
  length prefix) over a stream :meth:`Dispatcher.dial_routed` opens, which
  takes a dial permit and reports the dial to the node's health. A proxy
  carries a UDP upstream's query this way too: every proxy protocol carries
  TCP, and one stream per query needs no UDP association.

The encrypted upstreams (``honk.config.dns_endpoint`` says which, from the
protocol string) keep one connection per upstream, reused and multiplexed
(``encrypted.py``, ``quic.py``):

* DoT (``tls://``) and DoH (``https://``, HTTP/2) are TCP: routed and dialled
  exactly as a TCP upstream (``-> tag`` or the rules; a node or group carries
  the stream, :meth:`Dispatcher.dial_routed` takes the permit and reports the
  dial), and TLS runs over whatever socket that dial returns, end to end with
  the DNS server. The certificate is checked against ``tls_server_name`` or
  else the upstream's host (an IP literal against the certificate's IP
  addresses), with the system's trust store.
* DoQ (``quic://``) and DoH3 (``h3://``) are QUIC, so UDP: routed as UDP; a
  direct leaf sends from a marked local socket, a proxy leaf through its UDP
  endpoint (``leaf.dial_udp``) when it has one. A leaf that carries no UDP
  fails the exchange (``dial-unsupported``).

A DoH server offering HTTP/3 on the same host (``Alt-Svc``) has its queries
moved to DoH3 while the offer is fresh and the route carries UDP; HTTP/3 that
fails (within :data:`ALT_SVC_HANDSHAKE_TIMEOUT` for the handshake) sends the
query back to HTTP/2, and HTTP/2 stays for :data:`ALT_SVC_RETRY`.

A connection that ends under a query it was reused for (a server closing an
idle connection, RFC 7858 §3.4) gets that query asked once more on a new one.
A new route (another node of the group, a reload) retires the old connection.

The query goes out with a fresh random id; only a reply with that id and the
same question is taken (a forged or stray datagram is ignored). The whole
exchange runs under one deadline on the injected clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rrset

from honk.config import dns_endpoint as endpoint
from honk.config.validate import DNS_INBOUND  # honk's own exchanges route as the DNS listener's tag
from honk.connection import scoring
from honk.connection.dispatch import Dispatcher, Routed
from honk.connection.plane import score_target
from honk.core.clock import Clock, timeout_at
from honk.core.errors import HonkError
from honk.core.logs import kv
from honk.core.net import Address, FlowMeta, Network
from honk.dns.encrypted import (
    ALPN_H2,
    ALT_SVC_CLEAR,
    Connection,
    ConnectionPool,
    DohConnection,
    DotConnection,
    authority_of,
    h3_alternative,
)
from honk.dns.failure import ExchangeFailed, reason_of
from honk.dns.wire import FLAG_QR, FLAG_TC, QUERY_ID, TCP_LENGTH, parse_response, response_header
from honk.group.score.attempt import Result, ScoreReporter, classify_relay_end
from honk.outbound.bridge import relay_end

__all__ = ["DNS_INBOUND", "EXCHANGE_TIMEOUT", "Destination", "ExchangeFailed", "Exchanger"]

log = logging.getLogger("honk.dns")

# A stub resolver (glibc's resolv.conf `timeout`) gives a server 5 s before it asks again;
# an answer later than that reaches nobody, so an exchange waits no longer.
EXCHANGE_TIMEOUT = 5.0  # seconds
# A lost datagram should cost about a second, not the whole exchange: one resend after this.
UDP_RESEND_AFTER = 1.0  # seconds
MAX_DATAGRAM = 65535
UNKNOWN_SOURCE = Address("0.0.0.0", 0)  # routing's source for a query without a known client
QUIC_KINDS = frozenset({endpoint.QUIC, endpoint.H3})  # the upstreams whose connection is QUIC (UDP)
# A DoH server's HTTP/3 offer gets this long to shake hands (UDP blocked on the way costs no more
# than this once); a failed one is left alone for ALT_SVC_RETRY before it is tried again.
ALT_SVC_HANDSHAKE_TIMEOUT = 1.0  # seconds
ALT_SVC_RETRY = 300.0  # seconds


@dataclass(frozen=True, slots=True)
class Destination:
    """Where one exchange goes: a configured upstream, or an intercepted destination (asis)."""

    label: str  # the upstream name, or "asis" (logs)
    protocol: str  # "udp" (TCP retry when TC is set), "tcp", or an encrypted one (honk.config.dns_endpoint)
    address: Address
    outbound: str | None = None  # the forced node or group; None: routed


def _matches(reply: dns.message.Message, qid: int, question: dns.rrset.RRset) -> bool:
    """Whether ``reply`` answers our query: our id, a response, and our question (an error
    reply may omit the question, RFC 1035 leaves that open)."""
    if reply.id != qid or not reply.flags & dns.flags.QR or reply.opcode() != dns.opcode.QUERY:
        return False
    if not reply.question:
        return reply.rcode() != dns.rcode.NOERROR
    asked = reply.question[0]
    return (
        len(reply.question) == 1
        and asked.name == question.name
        and asked.rdtype == question.rdtype
        and asked.rdclass == question.rdclass
    )


class Exchanger:
    """Runs exchanges through the dispatcher's current plane."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, timeout: float = EXCHANGE_TIMEOUT) -> None:
        self._dispatcher = dispatcher
        self._clock = clock
        self.timeout = timeout
        self.pool = ConnectionPool()  # the encrypted upstreams' connections, one per upstream
        self._h3_offers: dict[object, tuple[int, float]] = {}  # DoH upstream -> (HTTP/3 port, fresh until)
        self._h3_broken: dict[object, float] = {}  # DoH upstream -> when its HTTP/3 may be tried again

    async def aclose(self) -> None:
        """Close the encrypted upstreams' connections (their queries in flight fail)."""
        await self.pool.aclose()

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        """The reply to ``wire`` (the client's query, sent under a fresh id) from ``destination``;
        ``tcp`` asks over TCP from the start. Raises :class:`ExchangeFailed`."""
        qid = secrets.randbits(16)
        out = QUERY_ID.pack(qid) + wire[2:]
        question = query.question[0]
        reporters: list[ScoreReporter] = []  # Score: one per carrier used (GH-K-24), settled below
        try:
            transport = endpoint.decode(destination.protocol)
        except ValueError as exc:
            raise ExchangeFailed("bad-protocol", str(exc)) from None
        try:
            async with timeout_at(self._clock, self._clock.now() + self.timeout):
                routed = await self._route(destination, client, transport.kind)
                leaf = routed.leaf
                if leaf.protocol == "block":
                    raise ExchangeFailed("blocked")
                if transport.encrypted:
                    data = await self._encrypted(routed, destination, transport, out, client)
                    reply = parse_response(data)
                    if reply is None or not _matches(reply, qid, question):
                        raise ExchangeFailed(
                            "bad-reply", f"the {transport.kind} reply does not answer the query"
                        )
                    return reply
                if leaf.protocol == "direct" and transport.kind == endpoint.UDP and not tcp:
                    reply = await self._udp(routed, destination.address, out, qid, question, reporters)
                    if reply is not None:
                        return reply
                reply = await self._tcp(routed, out, qid, question, reporters)
                self._settle(reporters, Result.success())
                return reply
        except ExchangeFailed:
            self._settle(reporters, Result.failure())
            raise
        except TimeoutError:
            self._settle(reporters, Result.failure())
            raise ExchangeFailed("timeout") from None
        except (HonkError, OSError) as exc:
            self._settle(reporters, Result.failure())
            raise ExchangeFailed(reason_of(exc), str(exc)) from None
        finally:
            self._settle(reporters, Result.neutral())  # cancelled: nothing recorded

    def _settle(self, reporters: list[ScoreReporter], result: Result) -> None:
        now = self._clock.now()
        for reporter in reporters:
            reporter.settle(now, result)  # at most once each: a settled reporter ignores it

    async def _route(self, destination: Destination, client: Address | None, kind: str) -> Routed:
        source = client or UNKNOWN_SOURCE
        quic = kind in QUIC_KINDS
        if destination.outbound is not None:
            plane = self._dispatcher.plane
            carrier = Network.UDP if quic else Network.TCP
            meta = FlowMeta(carrier, source, destination.address, DNS_INBOUND)
            # plain DNS is chosen for TCP (what a proxy carries it over); a direct leaf asked over
            # UDP uses UDP, so that is the carrier Score hears of. QUIC is UDP all the way.
            selection = plane.groups.resolve(
                destination.outbound,
                carrier,  # type: ignore[attr-defined]
                target=score_target(meta),
            )
            if kind == endpoint.UDP and selection.leaf.protocol == "direct":
                meta = dataclasses.replace(meta, network=Network.UDP)
            return self._dispatcher.rescore(
                Routed(
                    meta,
                    destination.outbound,
                    f"dns({destination.label})",
                    tuple(selection.chain),
                    selection.leaf,
                    plane.generation,
                )
            )
        network = Network.UDP if kind == endpoint.UDP or quic else Network.TCP
        return await self._dispatcher.route(FlowMeta(network, source, destination.address, DNS_INBOUND))

    # --- encrypted upstreams ------------------------------------------------------------------

    async def _encrypted(
        self,
        routed: Routed,
        destination: Destination,
        transport: endpoint.Transport,
        out: bytes,
        client: Address | None,
    ) -> bytes:
        """The reply's wire from the upstream's pooled connection (dialled on first use, or again
        when it ended or its route changed); a DoH upstream whose server offered HTTP/3 asks
        over DoH3 while that works."""
        key = (destination.label, destination.protocol, destination.address, destination.outbound)
        if transport.kind == endpoint.HTTPS:
            port = self._h3_offer(key)
            if port is not None:
                try:
                    return await self._over_h3(key, port, destination, transport, out, client)
                except ExchangeFailed as exc:
                    self._h3_broken[key] = self._clock.now() + ALT_SVC_RETRY
                    log.debug(
                        "dns upstream stays on HTTP/2 %s",
                        kv(upstream=destination.label, port=port, reason=exc.reason),
                    )
        connection, data = await self._pooled(
            key, routed, lambda: self._connect(routed, destination, transport), out
        )
        if transport.kind == endpoint.HTTPS:
            self._learn_h3(key, getattr(connection, "alt_svc", None))
        return data

    async def _pooled(
        self, key: object, routed: Routed, open_: Callable[[], Awaitable[Connection]], out: bytes
    ) -> tuple[Connection, bytes]:
        current = self.pool.live(key)
        if current is not None and getattr(current, "leaf", None) is not routed.leaf:
            self.pool.retire(key)  # another node of the group now, or a reloaded plane
        for attempt in range(2):
            connection, fresh = await self.pool.connection(key, open_)
            try:
                return connection, await connection.exchange(out)
            except ExchangeFailed as exc:
                if fresh or attempt or exc.reason != "closed":
                    raise
                # a reused connection ended under this query (a server closing it idle): once more, anew
        raise AssertionError("unreachable")

    # HTTP/3 offered by a DoH server (Alt-Svc, RFC 7838)

    def _learn_h3(self, key: object, alt_svc: str | None) -> None:
        if alt_svc is None:
            return
        offer = h3_alternative(alt_svc)
        if offer == ALT_SVC_CLEAR:
            self._h3_offers.pop(key, None)
        elif isinstance(offer, tuple):
            port, max_age = offer
            self._h3_offers[key] = (port, self._clock.now() + max_age)

    def _h3_offer(self, key: object) -> int | None:
        """The HTTP/3 port ``key``'s server offered, while fresh and not recently failed."""
        offer = self._h3_offers.get(key)
        if offer is None:
            return None
        now = self._clock.now()
        if now >= offer[1]:
            del self._h3_offers[key]
            return None
        if self._h3_broken.get(key, now) > now:
            return None
        return offer[0]

    async def _over_h3(
        self,
        key: object,
        port: int,
        destination: Destination,
        transport: endpoint.Transport,
        out: bytes,
        client: Address | None,
    ) -> bytes:
        from honk.dns.quic import connect_quic

        alternative = dataclasses.replace(destination, address=Address(destination.address.host, port))
        routed = await self._route(alternative, client, endpoint.H3)
        if routed.leaf.protocol != "direct" and getattr(routed.leaf, "dial_udp", None) is None:
            raise ExchangeFailed("dial-unsupported", "the route carries no UDP")
        h3 = endpoint.Transport(
            endpoint.H3, transport.path, transport.server_name or destination.address.host
        )

        async def open_() -> Connection:
            return await connect_quic(
                self._dispatcher,
                self._clock,
                routed,
                alternative.address,
                h3,
                self._name(destination),
                ALT_SVC_HANDSHAKE_TIMEOUT,
            )

        _, data = await self._pooled((key, endpoint.H3, port), routed, open_, out)
        return data

    async def _connect(
        self, routed: Routed, destination: Destination, transport: endpoint.Transport
    ) -> Connection:
        if transport.kind in QUIC_KINDS:
            from honk.dns.quic import connect_quic

            return await connect_quic(
                self._dispatcher,
                self._clock,
                routed,
                destination.address,
                transport,
                self._name(destination),
                self.timeout,
            )
        tcp = self._dispatcher.rescore(
            dataclasses.replace(routed, meta=dataclasses.replace(routed.meta, network=Network.TCP))
        )
        served, dialed = await self._dispatcher.dial_routed(tcp)
        reporter = served.reporter
        try:
            connection = await self._over_tls(dialed, destination, transport, reporter)
        except BaseException as exc:
            if reporter is not None:
                result = Result.failure() if isinstance(exc, HonkError | OSError) else Result.neutral()
                reporter.settle(self._clock.now(), result)
            raise
        connection.leaf = served.leaf  # type: ignore[attr-defined]
        return connection

    async def _over_tls(
        self,
        dialed,
        destination: Destination,
        transport: endpoint.Transport,  # noqa: ANN001
        reporter: ScoreReporter | None,
    ) -> Connection:
        """TLS over the dialled stream, then the transport's connection over TLS."""
        from honk.outbound.tls import client_context, tls_connect

        sock = dialed.sock
        if dialed.framing is not None:
            from honk.relay.native import framed_socket

            sock = framed_socket(sock, dialed.framing)
        sock.setblocking(False)
        name = self._name(destination)
        doh = transport.kind == endpoint.HTTPS
        now = self._clock.now()
        try:
            context = client_context(True, (ALPN_H2,) if doh else (), "", name, now)
        except BaseException:
            sock.close()
            raise
        server_name = transport.server_name or destination.address.host
        stream = await tls_connect(sock, context, server_name, self._clock, now + self.timeout, name)
        if not doh:
            return DotConnection(stream, self._clock, reporter)
        ssl_object = stream.transport.get_extra_info("ssl_object") if stream.transport is not None else None
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if alpn != ALPN_H2:
            stream.abort()
            raise ExchangeFailed("alpn", f"the server speaks {alpn or 'no ALPN protocol'}, not HTTP/2")
        authority = authority_of(server_name, destination.address.port, endpoint.DOH_PORT)
        return DohConnection(stream, self._clock, authority, transport.path, reporter)

    @staticmethod
    def _name(destination: Destination) -> str:
        return f"dns({destination.label})"

    async def _udp(
        self,
        routed: Routed,
        address: Address,
        out: bytes,
        qid: int,
        question: dns.rrset.RRset,
        reporters: list[ScoreReporter],
    ) -> dns.message.Message | None:
        """The reply over UDP from a local, marked socket; None when it came truncated (TC)."""
        leaf = routed.leaf
        guard = scoring.begin(routed.score, self._clock)
        try:
            sock = await self._udp_socket(leaf, address)
        except BaseException as exc:
            scoring.report_setup(guard, self._clock, leaf, exc)
            raise
        reporter = scoring.report_setup(guard, self._clock, leaf, None)
        if reporter is not None:
            reporters.append(reporter)
        try:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, out)
            if reporter is not None:  # the query went out: its reply can count for the cohort
                reporter.tx(self._clock.now(), len(out))
            resend = self._clock.call_later(UDP_RESEND_AFTER, lambda: _send_quietly(sock, out))
            try:
                while True:
                    data = await loop.sock_recv(sock, MAX_DATAGRAM)
                    header = response_header(data)
                    if header is None or header[0] != qid or not header[1] & FLAG_QR:
                        continue  # not ours: a late reply to another query, or noise
                    if reporter is not None:  # an answer, even a truncated one: this carrier works
                        reporter.rx(self._clock.now(), len(data))
                        reporter.settle(self._clock.now(), Result.success())
                    if header[1] & FLAG_TC:
                        return None
                    reply = parse_response(data)
                    if reply is not None and _matches(reply, qid, question):
                        return reply
            finally:
                resend.cancel()
        finally:
            sock.close()

    async def _udp_socket(self, leaf, address: Address) -> socket.socket:  # noqa: ANN001 - the direct leaf
        """A connected, marked, non-blocking UDP socket to ``address`` (a name resolved first)."""
        ip = address.ip
        if ip is None:
            resolve = getattr(leaf, "resolve", None)
            if resolve is not None:
                addresses = await resolve(address.host, self._clock.now() + self.timeout)
            else:
                addresses = await self._dispatcher.resolver(address.host)
            if not addresses:
                raise ExchangeFailed("resolve", "no address")
            ip = addresses[0]
        return leaf.connected_udp(str(ip), address.port)

    async def _tcp(
        self, routed: Routed, out: bytes, qid: int, question: dns.rrset.RRset, reporters: list[ScoreReporter]
    ) -> dns.message.Message:
        """The reply over a TCP stream the routed leaf opens (direct, or through the proxy);
        Score hears of it on the TCP carrier, whatever network routed it."""
        tcp = self._dispatcher.rescore(
            dataclasses.replace(routed, meta=dataclasses.replace(routed.meta, network=Network.TCP))
        )
        served, dialed = await self._dispatcher.dial_routed(tcp)
        reporter = served.reporter
        if reporter is not None:
            reporters.append(reporter)
        sock = dialed.sock
        try:
            if dialed.framing is not None:
                from honk.relay.native import framed_socket

                sock = framed_socket(sock, dialed.framing)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, TCP_LENGTH.pack(len(out)) + out)
            if reporter is not None:
                reporter.tx(self._clock.now(), len(out) + TCP_LENGTH.size)
            (length,) = TCP_LENGTH.unpack(await _recv_exact(loop, sock, TCP_LENGTH.size))
            body = await _recv_exact(loop, sock, length)
            if reporter is not None:
                reporter.rx(self._clock.now(), length + TCP_LENGTH.size)
        except ExchangeFailed:
            # a bridged stream only closes: its server side's end says why (a lost mux carrier
            # is the node's failure, one episode with every flow it cut)
            failure = relay_end(None, dialed.bridge)
            if failure is not None and reporter is not None:
                reporter.settle(self._clock.now(), classify_relay_end(failure))
            raise
        finally:
            sock.close()
        reply = parse_response(body)
        if reply is None or not _matches(reply, qid, question):
            raise ExchangeFailed("bad-reply", "the TCP reply does not answer the query")
        return reply


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass  # the first send went out; a failed resend changes nothing


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            raise ExchangeFailed("closed", f"the server closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
