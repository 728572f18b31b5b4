"""The UDP health probe: one minimal DNS query through a node's packet path (GH-F-19).

Why DNS: a DNS server answers any well-formed query, whatever its rcode, so one
answer from the configured server proves that datagrams leave through the node
and come back. One query, no retry: the health layer counts failures over
cycles, and a retry would hide a lossy path.

The target is picked from ``udp_check_dns`` by :func:`dns_check_target`. A
name is resolved here once and the IP pinned for the probe (GH-F-25), so the
answer's source can be matched against it. While waiting, datagrams from any
other source and answers with another id are ignored; an answer with our id
that does not parse is remembered, and reported only if no valid answer
arrives before the stage ends (a stray datagram cannot fail the probe early).

The UDP endpoint helpers here (:func:`open_endpoint`, :func:`pin_address`) are
shared with the QUIC handshake probe.
"""

from __future__ import annotations

import asyncio
import socket

from honk.alive.outcome import ProbeError, ProbeSample
from honk.config.dnstarget import DEFAULT_DNS_TARGET, dns_check_target
from honk.core.clock import Clock, timeout_at
from honk.core.errors import CapacityRefused, ConfigRefused, DialError, DialTimeout, HonkError, NotSupported
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost, PacketEndpoint

__all__ = [
    "DEFAULT_DNS_TARGET",
    "DEFAULT_QUERY_NAME",
    "dns_check_target",
    "measure_dns",
    "open_endpoint",
    "pin_address",
]

DEFAULT_QUERY_NAME = "www.google.com"  # the name the minimal query asks for


# --- shared by the UDP probes --------------------------------------------------------------


async def pin_address(host: str, port: int, clock: Clock, stage_timeout: float) -> Address:
    """``host:port`` with ``host`` resolved once to the first address the system gives.

    An IP literal is returned as is. Raises :class:`TimeoutError` when the stage
    runs out and :class:`OSError` when the name does not resolve.
    """
    address = Address(host, port)
    if address.ip is not None:
        return address
    loop = asyncio.get_running_loop()
    async with timeout_at(clock, clock.now() + stage_timeout):
        infos = await loop.getaddrinfo(address.host, port, type=socket.SOCK_DGRAM, proto=socket.IPPROTO_UDP)
    if not infos:
        raise OSError(f"{address.host}: no address")
    return Address(str(infos[0][4][0]), port)


async def open_endpoint(
    leaf,
    receive: DatagramSink,
    clock: Clock,
    stage_timeout: float,
    phase: str,  # noqa: ANN001 - an Outbound
    on_lost: EndpointLost | None = None,
) -> PacketEndpoint:
    """``leaf.dial_udp`` within one stage; a failure is ``ProbeError(phase, <why>)``.

    The leaf and the probe share one clock (the daemon's), so the stage's end
    is also the leaf's dial deadline.
    """
    deadline = clock.now() + stage_timeout
    try:
        async with timeout_at(clock, deadline):
            return await leaf.dial_udp(receive, deadline, on_lost)
    except TimeoutError:
        raise ProbeError(phase, "timeout") from None
    except (HonkError, OSError) as exc:
        raise ProbeError(phase, _dial_reason(exc)) from None


def _dial_reason(exc: BaseException) -> str:
    if isinstance(exc, DialTimeout):
        return "timeout"
    if isinstance(exc, DialError):
        return exc.phase  # resolve, connect, handshake, auth, ...: static words
    if isinstance(exc, NotSupported):
        return "unsupported"
    if isinstance(exc, ConfigRefused):
        return "config"
    if isinstance(exc, CapacityRefused):
        return "capacity"
    return "failed"


# --- the probe -------------------------------------------------------------------------------


async def measure_dns(
    leaf,  # noqa: ANN001 - an Outbound
    server: Address,
    clock: Clock,
    *,
    stage_timeout: float,
    name: str = DEFAULT_QUERY_NAME,
) -> ProbeSample:
    """Send one ``A`` query for ``name`` to ``server`` through ``leaf``; the RTT from send to answer.

    Stages, each bounded by ``stage_timeout``: resolving a named ``server``
    (``ProbeError("resolve", ...)``), opening the leaf's UDP endpoint
    (``"dial"``), and waiting for the answer (``"reply"``: ``timeout``,
    ``malformed``, or ``lost`` when the endpoint ends). The endpoint is
    closed on every way out, cancellation included.
    """
    try:
        target = await pin_address(server.host, server.port, clock, stage_timeout)
    except TimeoutError:
        raise ProbeError("resolve", "timeout") from None
    except OSError:
        raise ProbeError("resolve", "failed") from None
    import dns.message  # on the first probe: a daemon without UDP nodes never loads dnspython

    query = dns.message.make_query(name, "A")  # a fresh random id per query
    wire = query.to_wire()
    waiter = _AnswerWaiter(query.id, target, clock)
    endpoint = await open_endpoint(leaf, waiter.receive, clock, stage_timeout, "dial", waiter.lost)
    try:
        sent_at = clock.now()
        endpoint.send(wire, target)
        try:
            async with timeout_at(clock, sent_at + stage_timeout):
                answered_at = await waiter.answered
        except TimeoutError:
            raise ProbeError("reply", "malformed" if waiter.malformed else "timeout") from None
        if answered_at is None:
            raise ProbeError("reply", "lost")
        return ProbeSample(rtt=answered_at - sent_at)
    finally:
        endpoint.close()


class _AnswerWaiter:
    """Matches datagrams against the query: the pinned source, the id, a parseable response."""

    def __init__(self, qid: int, source: Address, clock: Clock) -> None:
        self.qid = qid
        self.source = source
        self.clock = clock
        self.malformed = False
        # the clock's time at the answer; None: the endpoint ended first
        self.answered: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()

    def receive(self, payload: bytes, source: Address) -> None:
        if self.answered.done() or source != self.source:
            return
        if len(payload) < 2 or int.from_bytes(payload[:2], "big") != self.qid:
            return  # not an answer to this query
        at = self.clock.now()
        import dns.exception
        import dns.flags
        import dns.message

        try:
            message = dns.message.from_wire(payload)
        except (dns.exception.DNSException, ValueError, UnicodeError):
            self.malformed = True
            return
        if not message.flags & dns.flags.QR:
            self.malformed = True  # our id, but a query, not a response
            return
        self.answered.set_result(at)

    def lost(self, error: HonkError | None) -> None:
        if error is not None and not self.answered.done():
            self.answered.set_result(None)
