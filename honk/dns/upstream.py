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
from honk.connection.dispatch import Dispatcher, Routed
from honk.core.clock import Clock, timeout_at
from honk.core.errors import Blocked, DialError, DialTimeout, HonkError, NoRoute
from honk.core.net import Address, FlowMeta, Network
from honk.dns.wire import FLAG_QR, FLAG_TC, QUERY_ID, TCP_LENGTH, parse_response, response_header

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
        try:
            async with timeout_at(self._clock, self._clock.now() + self.timeout):
                routed = await self._route(destination, client)
                leaf = routed.leaf
                if leaf.protocol == "block":
                    raise ExchangeFailed("blocked")
                if leaf.protocol == "direct" and destination.protocol == "udp" and not tcp:
                    reply = await self._udp(leaf, destination.address, out, qid, question)
                    if reply is not None:
                        return reply
                return await self._tcp(routed, out, qid, question)
        except ExchangeFailed:
            raise
        except TimeoutError:
            raise ExchangeFailed("timeout") from None
        except (HonkError, OSError) as exc:
            raise ExchangeFailed(_reason(exc), str(exc)) from None

    async def _route(self, destination: Destination, client: Address | None) -> Routed:
        source = client or UNKNOWN_SOURCE
        if destination.outbound is not None:
            plane = self._dispatcher.plane
            meta = FlowMeta(Network.TCP, source, destination.address, DNS_INBOUND)
            selection = plane.groups.resolve(destination.outbound, Network.TCP)  # type: ignore[attr-defined]
            return Routed(meta, destination.outbound, f"dns({destination.label})", tuple(selection.chain),
                          selection.leaf, plane.generation)
        network = Network.UDP if destination.protocol == "udp" else Network.TCP
        return await self._dispatcher.route(FlowMeta(network, source, destination.address, DNS_INBOUND))

    async def _udp(self, leaf, address: Address, out: bytes, qid: int,  # noqa: ANN001 - the direct leaf
                   question: dns.rrset.RRset) -> dns.message.Message | None:
        """The reply over UDP from a local, marked socket; None when it came truncated (TC)."""
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
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, out)
            resend = self._clock.call_later(UDP_RESEND_AFTER, lambda: _send_quietly(sock, out))
            try:
                while True:
                    data = await loop.sock_recv(sock, MAX_DATAGRAM)
                    header = response_header(data)
                    if header is None or header[0] != qid or not header[1] & FLAG_QR:
                        continue  # not ours: a late reply to another query, or noise
                    if header[1] & FLAG_TC:
                        return None
                    reply = parse_response(data)
                    if reply is not None and _matches(reply, qid, question):
                        return reply
            finally:
                resend.cancel()
        finally:
            sock.close()

    async def _tcp(self, routed: Routed, out: bytes, qid: int, question: dns.rrset.RRset) -> dns.message.Message:
        """The reply over a TCP stream the routed leaf opens (direct, or through the proxy)."""
        tcp = dataclasses.replace(routed, meta=dataclasses.replace(routed.meta, network=Network.TCP))
        _, dialed = await self._dispatcher.dial_routed(tcp)
        sock = dialed.sock
        try:
            if dialed.framing is not None:
                from honk.relay.native import framed_socket

                sock = framed_socket(sock, dialed.framing)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, TCP_LENGTH.pack(len(out)) + out)
            (length,) = TCP_LENGTH.unpack(await _recv_exact(loop, sock, TCP_LENGTH.size))
            body = await _recv_exact(loop, sock, length)
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
