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

The query goes out with a fresh random id; only a reply with that id and the
same question is taken (a forged or stray datagram is ignored). The whole
exchange runs under one deadline on the injected clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import socket
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rrset

from honk.config.validate import DNS_INBOUND  # honk's own exchanges route as the DNS listener's tag
from honk.connection import scoring
from honk.connection.dispatch import Dispatcher, Routed
from honk.connection.plane import score_target
from honk.core.clock import Clock, timeout_at
from honk.core.errors import Blocked, DialError, DialTimeout, HonkError, NoRoute
from honk.core.net import Address, FlowMeta, Network
from honk.dns.wire import FLAG_QR, FLAG_TC, QUERY_ID, TCP_LENGTH, parse_response, response_header
from honk.group.score.attempt import Result, ScoreReporter, classify_relay_end
from honk.outbound.bridge import relay_end

__all__ = ["DNS_INBOUND", "EXCHANGE_TIMEOUT", "Destination", "ExchangeFailed", "Exchanger"]

# A stub resolver (glibc's resolv.conf `timeout`) gives a server 5 s before it asks again;
# an answer later than that reaches nobody, so an exchange waits no longer.
EXCHANGE_TIMEOUT = 5.0  # seconds
# A lost datagram should cost about a second, not the whole exchange: one resend after this.
UDP_RESEND_AFTER = 1.0  # seconds
MAX_DATAGRAM = 65535
UNKNOWN_SOURCE = Address("0.0.0.0", 0)  # routing's source for a query without a known client


@dataclass(frozen=True, slots=True)
class Destination:
    """Where one exchange goes: a configured upstream, or an intercepted destination (asis)."""

    label: str  # the upstream name, or "asis" (logs)
    protocol: str  # "udp" (TCP retry when TC is set) or "tcp"
    address: Address
    outbound: str | None = None  # the forced node or group; None: routed


class ExchangeFailed(HonkError):
    """An exchange ended without a usable reply; ``reason`` is a short stable slug."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f" ({detail})" if detail else ""))
        self.reason = reason


def _matches(reply: dns.message.Message, qid: int, question: dns.rrset.RRset) -> bool:
    """Whether ``reply`` answers our query: our id, a response, and our question (an error
    reply may omit the question, RFC 1035 leaves that open)."""
    if reply.id != qid or not reply.flags & dns.flags.QR or reply.opcode() != dns.opcode.QUERY:
        return False
    if not reply.question:
        return reply.rcode() != dns.rcode.NOERROR
    asked = reply.question[0]
    return (len(reply.question) == 1 and asked.name == question.name and asked.rdtype == question.rdtype
            and asked.rdclass == question.rdclass)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, Blocked):
        return "blocked"
    if isinstance(exc, NoRoute):
        return "no-route"
    if isinstance(exc, DialTimeout):
        return "dial-timeout"
    if isinstance(exc, DialError):
        return f"dial-{exc.phase}"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, OSError):
        return "socket-error"
    return type(exc).__name__


class Exchanger:
    """Runs exchanges through the dispatcher's current plane."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, timeout: float = EXCHANGE_TIMEOUT) -> None:
        self._dispatcher = dispatcher
        self._clock = clock
        self.timeout = timeout

    async def exchange(self, destination: Destination, query: dns.message.Message, wire: bytes,
                       client: Address | None, *, tcp: bool = False) -> dns.message.Message:
        """The reply to ``wire`` (the client's query, sent under a fresh id) from ``destination``;
        ``tcp`` asks over TCP from the start. Raises :class:`ExchangeFailed`."""
        qid = secrets.randbits(16)
        out = QUERY_ID.pack(qid) + wire[2:]
        question = query.question[0]
        reporters: list[ScoreReporter] = []  # Score: one per carrier used (GH-K-24), settled below
        try:
            async with timeout_at(self._clock, self._clock.now() + self.timeout):
                routed = await self._route(destination, client)
                leaf = routed.leaf
                if leaf.protocol == "block":
                    raise ExchangeFailed("blocked")
                if leaf.protocol == "direct" and destination.protocol == "udp" and not tcp:
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
            raise ExchangeFailed(_reason(exc), str(exc)) from None
        finally:
            self._settle(reporters, Result.neutral())  # cancelled: nothing recorded

    def _settle(self, reporters: list[ScoreReporter], result: Result) -> None:
        now = self._clock.now()
        for reporter in reporters:
            reporter.settle(now, result)  # at most once each: a settled reporter ignores it

    async def _route(self, destination: Destination, client: Address | None) -> Routed:
        source = client or UNKNOWN_SOURCE
        if destination.outbound is not None:
            plane = self._dispatcher.plane
            meta = FlowMeta(Network.TCP, source, destination.address, DNS_INBOUND)
            # chosen for TCP (what a proxy carries DNS over); a direct leaf asked over UDP uses UDP,
            # so that is the carrier Score hears of
            selection = plane.groups.resolve(destination.outbound, Network.TCP,  # type: ignore[attr-defined]
                                             target=score_target(meta))
            if destination.protocol == "udp" and selection.leaf.protocol == "direct":
                meta = dataclasses.replace(meta, network=Network.UDP)
            return self._dispatcher.rescore(Routed(meta, destination.outbound, f"dns({destination.label})",
                                                   tuple(selection.chain), selection.leaf, plane.generation))
        network = Network.UDP if destination.protocol == "udp" else Network.TCP
        return await self._dispatcher.route(FlowMeta(network, source, destination.address, DNS_INBOUND))

    async def _udp(self, routed: Routed, address: Address, out: bytes, qid: int, question: dns.rrset.RRset,
                   reporters: list[ScoreReporter]) -> dns.message.Message | None:
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
        sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            mark = getattr(leaf, "mark_socket", None)
            if mark is not None:
                mark(sock)
            sock.connect((str(ip), address.port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _tcp(self, routed: Routed, out: bytes, qid: int, question: dns.rrset.RRset,
                   reporters: list[ScoreReporter]) -> dns.message.Message:
        """The reply over a TCP stream the routed leaf opens (direct, or through the proxy);
        Score hears of it on the TCP carrier, whatever network routed it."""
        tcp = self._dispatcher.rescore(dataclasses.replace(routed, meta=dataclasses.replace(routed.meta,
                                                                                             network=Network.TCP)))
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
