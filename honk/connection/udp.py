"""UDP flows: the routing/NAT/sub-link core, and SOCKS5 UDP ASSOCIATE on top of it.

:class:`UdpNat` is the core every UDP client side shares: per-target routing on the
current plane, the NAT sockets of ``direct`` targets, the sub-links of proxy leaves, the
tracker entry, drains and the end. A client side subclasses it, hands each client datagram
to :meth:`UdpNat._forward` with its target, and delivers replies in :meth:`UdpNat._deliver`.
:class:`UdpAssociation` is the SOCKS5 one (the header parsed and wrapped here); the
transparent inbound (:mod:`honk.inbound.tproxy`) has its own, whose routing meta and dial
target come from the sniffed name (hooks :meth:`UdpNat._route_meta`, :meth:`UdpNat._dial_target`).

Theory of operation:
  * :meth:`UdpAssociation.start` binds a UDP socket on the inbound's listen IP
    (ephemeral port); the SOCKS5 reply carries it. Datagrams are accepted only
    from the IP of the client that owns the TCP control connection; replies go
    to the client address that last sent one.
  * NAT: one outbound UDP socket per (association, address family), created on
    first use. The association remembers every (IP, port) it sent to; a reply
    from anywhere else is dropped. Replies are wrapped in the SOCKS5 UDP
    header carrying the replying address.
  * Every datagram reads the dispatcher's current plane: a target's decision is
    reused only while the plane that made it is still current, so after a reload
    the next datagram follows the new plane (established sub-links are not moved
    or closed by it). Within one plane a target is routed once (a LoadBalance
    group would otherwise scatter one target's datagrams over its members).
    ``block`` drops its datagrams (debug log), and so does a leaf whose
    capabilities have no UDP (``NotSupported``: dropped, logged). ``direct``
    targets go out of the association's own sockets; domain targets are
    resolved once per association and cached. Any other leaf carries UDP on its
    own endpoint (a sub-link: ``leaf.dial_udp``, a SOCKS5 association,
    Shadowsocks packets), one per leaf version (``outbound_id``, never the
    leaf object) per association, dialled on first use under the plan's one
    absolute preparation deadline, ``max(10 s, 4 × connect_timeout)`` as a cold
    race's (GH-G-09); the proxy resolves
    domain targets itself and its replies are accepted as it reports them. An
    endpoint that ends (its server went away) drops the routes through it, so
    the next datagram routes and dials afresh. Datagrams that arrive while a
    target is being routed wait in a small queue.
  * Cold preparation: when a target's rule points at a URLTest none of whose
    members has a usable UDP measurement, and the association has no sub-link of
    the picked leaf yet, the members' leaves race their endpoint dials
    (:mod:`honk.connection.stagger`: staggered starts, at most three at once, one
    deadline); the first eligible success becomes the sub-link, every other is
    closed unpublished.
  * A drain of an outbound version (:meth:`UdpAssociation.close_version`)
    closes the association's sub-link of that version and forgets the routes
    through it; the association goes on and the next datagram routes again.
  * The association is one tracker entry with network ``udp`` (its target,
    rule and outbound version are those of the first routed datagram, or of the
    first one routed after that version was drained). It ends when its control
    connection closes (the inbound calls :meth:`UdpAssociation.close`) or when
    the tracker's sweeper finds it silent for ``udp_idle_timeout``. Only the
    association's own callbacks and tasks touch its state.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass, field

from honk.connection import scoring
from honk.connection.dispatch import Dispatcher, Routed, format_chain, outbound_version
from honk.connection.flowlog import log_flow_opened
from honk.connection.stagger import preparation_deadline, prepare_first
from honk.connection.tracker import TrackedFlow
from honk.core.clock import timeout_at
from honk.core.errors import (
    Blocked,
    ClientProtocolError,
    DialTimeout,
    FlowClosed,
    HonkError,
    IdleTimeout,
    NotSupported,
    OutboundDrained,
)
from honk.core.logs import kv
from honk.core.net import Address, FlowMeta, Network
from honk.group.score.attempt import Episode, Result, ScoreReporter
from honk.outbound.base import PacketEndpoint
from honk.proto.socks5 import build_udp_datagram, parse_udp_datagram

__all__ = ["MAX_PENDING_DATAGRAMS", "UdpAssociation", "UdpNat"]

log = logging.getLogger("honk.connection.udp")

# Datagrams held per target while its route is being decided; more are dropped.
MAX_PENDING_DATAGRAMS = 32
_UNPUBLISHED = object()  # an endpoint lost before its dial returned: never the association's


@dataclass(frozen=True, slots=True)
class _Route:
    sockaddr: tuple[str, int] | None  # None: drop datagrams to this target (unless proxied)
    endpoint: PacketEndpoint | None = None  # a proxy leaf's endpoint, with the target as routed
    target: Address | None = None
    health: _EndpointHealth | None = None  # what the proxy leaf's endpoint tells its node's health
    plane: int = -1  # the dispatcher's plane_serial when decided: stale once another plane serves
    version: str = ""  # the leaf's outbound version; "" for a dropped target
    rule: str = ""  # the rule that matched, and the chain to the leaf (for the tracker entry)
    chain: tuple[str, ...] = ()
    # Score: this target's reporter (a route through a Score group); settled when the route ends
    reporter: ScoreReporter | None = field(default=None, compare=False)
    mark: int | None = None  # a direct route's socket mark (a rule's `direct(mark: N)`, else the bypass mark)


class _EndpointHealth:
    """What one proxy endpoint of the association tells its node's health: a reply is a
    success; a terminal error, or idling out without any reply, is one DataUdp failure.
    Idling out after a reply, and the association's own close, say nothing."""

    __slots__ = ("leaf", "sent", "answered")

    def __init__(self, leaf) -> None:  # noqa: ANN001 - an Outbound
        self.leaf = leaf
        self.sent = False
        self.answered = False

    def _traffic(self):  # noqa: ANN202 - TrafficReporter | None
        runtime = getattr(self.leaf, "runtime", None)
        return runtime.traffic if runtime is not None else None

    def answer(self) -> None:
        if not self.answered:
            self.answered = True
            if (traffic := self._traffic()) is not None:
                traffic.packets_answered(self.leaf.health_family)

    def failed(self) -> None:
        if (traffic := self._traffic()) is not None:
            traffic.packets_failed(self.leaf.health_family)


class _ClientSide(asyncio.DatagramProtocol):
    def __init__(self, assoc: UdpAssociation) -> None:
        self.assoc = assoc

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.assoc._from_client(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("udp client socket error association=%s error=%r", self.assoc.id, exc)


class _RemoteSide(asyncio.DatagramProtocol):
    def __init__(self, assoc: UdpNat) -> None:
        self.assoc = assoc

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.assoc._from_remote(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("udp remote socket error association=%s error=%r", self.assoc.id, exc)


def _norm_ip(host: str) -> str:
    return str(ipaddress.ip_address(host.split("%", 1)[0]))


class UdpNat:
    """The routing, NAT and sub-links of one UDP client; also the tracker's :class:`FlowHandle`.

    Subclasses own the client side: they call :meth:`_open_flow` once, :meth:`_forward` for
    every client datagram, and implement :meth:`_deliver` (and :meth:`_can_deliver`)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        inbound: str,
        client: Address,
        user: str | None = None,
        session: object | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._clock = dispatcher.clock
        self.inbound = inbound
        self.client = client
        self.user = user
        self.session = session  # the client's inbound session (identity only)
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = self._clock.now()
        # direct sockets by (family, socket mark): a rule's `direct(mark: N)` gets its own
        self._remotes: dict[tuple[int, int | None], asyncio.DatagramTransport] = {}
        # sub-links, keyed by the leaf's outbound version (tag@vN): two versions of one tag
        # coexist while one drains, and an object's id() may be reused
        self._endpoints: dict[str, PacketEndpoint] = {}  # outbound version → its endpoint
        self._health: dict[str, _EndpointHealth] = {}  # outbound version → what it reports
        self._dialing: dict[str, asyncio.Future[PacketEndpoint]] = {}
        self._routes: dict[Address, _Route] = {}
        self._pending: dict[Address, list[bytes]] = {}
        self._resolved: dict[str, str] = {}  # domain → IP, cached per association
        self._sent: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flow: TrackedFlow | None = None
        self._retarget = False  # the flow's recorded version was drained: record the next route
        self._drained: set[str] = set()  # versions drained while this association lived
        # Score: one failure episode per sub-link dial, shared by every target that waited on it
        self._dial_episodes: dict[str, Episode] = {}
        self._direct_reporters: dict[tuple[str, int], ScoreReporter] = {}  # direct routes': by sockaddr
        self._closed = asyncio.Event()
        self.error: HonkError | None = None

    @property
    def id(self) -> str:
        return self._flow.id if self._flow is not None else "-"

    def _open_flow(self, target: Address) -> None:
        """The tracker entry (shown with ``target`` until a datagram is routed)."""
        self._flow = self._dispatcher.tracker.open(
            self,
            network=Network.UDP,
            inbound=self.inbound,
            source=self.client,
            target=target,
            rule="",
            chain=(),
            plane_generation=self._dispatcher.plane.generation,
            user=self.user,
            session=self.session,
        )

    # -- the client side's hooks ------------------------------------------------------

    def _route_meta(self, target: Address) -> FlowMeta:
        """What routing sees for datagrams to ``target``."""
        return FlowMeta(
            Network.UDP,
            source=self.client,
            target=target,
            inbound=self.inbound,
            user=self.user,
            session=self.session,
        )

    def _dial_target(self, target: Address, routed: Routed) -> Address:
        """Where datagrams to ``target`` go through ``routed``'s leaf (direct: resolved here)."""
        return target

    def _can_deliver(self) -> bool:
        """Whether a reply can reach the client now (else it is dropped uncounted)."""
        return True

    def _deliver(self, source: Address, data: bytes) -> None:
        """Send a reply from ``source`` to the client."""
        raise NotImplementedError

    def _close_client_side(self) -> None:
        """Release the client side's sockets (the association is ending)."""

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self, reason: HonkError | None = None) -> None:
        """End the association: sockets closed, routing tasks cancelled, entry released."""
        if self._closed.is_set():
            return
        self.error = reason if reason is not None else FlowClosed("closed by request")
        for route in self._routes.values():
            self._retire(route, Result.idle() if isinstance(reason, IdleTimeout) else None)
        if isinstance(reason, IdleTimeout):
            for health in self._health.values():
                if health.sent and not health.answered:
                    health.failed()  # nothing ever came back through that node
        self._health.clear()
        for task in self._tasks:
            task.cancel()
        self._close_client_side()
        for transport in self._remotes.values():
            transport.close()
        self._remotes.clear()
        for endpoint in list(self._endpoints.values()):
            endpoint.close()
        self._endpoints.clear()
        self._pending.clear()
        if self._flow is not None:
            self._flow.release()
        self._closed.set()

    # -- client → remote --------------------------------------------------------------

    def _forward(self, target: Address, payload: bytes) -> None:
        """One client datagram to ``target``: counted, then sent on the target's route for the
        current plane (routed first when it has none: it waits in a small queue meanwhile)."""
        if self._closed.is_set():
            return
        self.last_activity = self._clock.now()
        self.bytes_up += len(payload)
        route = self._routes.get(target)
        if route is not None and route.plane == self._dispatcher.plane_serial:
            self._send(route, payload)
            return
        queue = self._pending.get(target)
        if queue is not None:
            if len(queue) < MAX_PENDING_DATAGRAMS:
                queue.append(payload)
            return
        self._pending[target] = [payload]
        task = asyncio.get_running_loop().create_task(self._route_target(target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, route: _Route, payload: bytes) -> None:
        if route.reporter is not None:
            route.reporter.tx(self._clock.now(), len(payload))
        if route.endpoint is not None:
            assert route.target is not None
            if route.health is not None:
                route.health.sent = True
            route.endpoint.send(payload, route.target)
            return
        if route.sockaddr is None:
            return
        family = socket.AF_INET6 if ":" in route.sockaddr[0] else socket.AF_INET
        transport = self._remotes.get((family, route.mark))
        if transport is None or transport.is_closing():
            return
        self._sent.add(route.sockaddr)
        transport.sendto(payload, route.sockaddr)

    async def _route_target(self, target: Address) -> None:
        plane = self._dispatcher.plane_serial  # read with the plane route() reads, before any await
        try:
            route = await self._decide(target, plane)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a routing failure must not outlive as an unhandled task error
            log.info(
                "udp target dropped association=%s target=%s error=%s", self.id, target, type(exc).__name__
            )
            route = _Route(None, plane=plane)
        if self._closed.is_set():
            self._retire(route)
            return
        replaced = self._routes.get(target)
        if replaced is not None:  # decided on an older plane: retired
            self._retire(replaced)
        self._routes[target] = route
        if route.sockaddr is not None and route.reporter is not None:
            self._direct_reporters[route.sockaddr] = route.reporter
        for payload in self._pending.pop(target, []):
            self._send(route, payload)

    async def _decide(self, target: Address, plane: int) -> _Route:
        meta = self._route_meta(target)
        drop = _Route(None, plane=plane)
        try:
            routed = await self._dispatcher.route(meta)
        except Blocked:
            log.debug("udp target blocked association=%s target=%s", self.id, target)
            return drop
        except HonkError as exc:
            log.info(
                "udp target dropped association=%s target=%s error=%s", self.id, target, type(exc).__name__
            )
            return drop
        leaf = routed.leaf
        if leaf.protocol == "block":
            log.debug("udp target blocked association=%s target=%s rule=%s", self.id, target, routed.rule)
            return drop
        if not leaf.capabilities.udp:
            error = NotSupported(f"outbound {leaf.name} cannot carry UDP")
            log.info(
                "udp target dropped association=%s target=%s chain=%s error=%s",
                self.id,
                target,
                format_chain(routed.chain),
                type(error).__name__,
            )
            return drop
        version = outbound_version(leaf)
        cold = (
            []
            if leaf.protocol == "direct" or self._has_endpoint(version)
            else self._dispatcher.cold_udp_candidates(routed)
        )
        prepared = next((c for c in cold if self._has_endpoint(outbound_version(c.leaf))), None)
        if prepared is not None:  # a candidate this association already prepared (an earlier race won)
            routed, leaf, version = prepared, prepared.leaf, outbound_version(prepared.leaf)
        elif cold:  # a top-level URLTest with no UDP measurement: its candidates race (GH-G-01)
            routed = await self._prepare_cold(cold)  # the winner's sub-link, committed: _endpoint finds it
            leaf, version = routed.leaf, outbound_version(routed.leaf)
        dial = self._dial_target(target, routed)
        guard = scoring.begin(routed.score, self._clock)
        try:
            if leaf.protocol != "direct":
                endpoint = await self._endpoint(leaf)
            else:
                ip = await self._resolve(dial)
                family = socket.AF_INET6 if ":" in ip else socket.AF_INET
                await self._remote_socket(family, leaf)
        except BaseException as exc:
            scoring.report_setup(guard, self._clock, leaf, exc, episode=self._dial_episodes.get(version))
            raise
        reporter = scoring.report_setup(guard, self._clock, leaf, None)
        self._note_route(meta.target, routed)
        # a target's route is the UDP flow a line is written for (mihomo: one per NAT entry)
        log_flow_opened(
            Network.UDP,
            self.inbound,
            self.client,
            meta.target,
            routed.rule,
            routed.chain,
            getattr(self._dispatcher.plane, "spec", None),
        )
        if leaf.protocol != "direct":
            return _Route(
                None,
                endpoint,
                dial,
                self._health.get(version),
                plane,
                version,
                routed.rule,
                routed.chain,
                reporter,
            )
        return _Route(
            (ip, target.port),
            plane=plane,
            version=version,
            rule=routed.rule,
            chain=routed.chain,
            reporter=reporter,
            mark=getattr(leaf, "mark", None),
        )

    def _has_endpoint(self, version: str) -> bool:
        """A sub-link of ``version`` is open or being dialled: a target through it is not cold."""
        endpoint = self._endpoints.get(version)
        return (endpoint is not None and not endpoint.closed) or version in self._dialing

    async def _prepare_cold(self, candidates: list[Routed]) -> Routed:
        """Race the candidates' endpoint dials (honk.connection.stagger) under one preparation
        deadline; the winner's endpoint is published as the association's sub-link of its
        version only once every loser is drained and the winner rechecked. A loser's endpoint
        is closed unpublished; its dial error, if it had one, was counted by its leaf (the
        only health event: cancellation and a drained success are neutral)."""
        deadline = self._clock.now() + preparation_deadline(self._dispatcher.global_spec.connect_timeout)

        async def prepare(routed: Routed) -> tuple[_EndpointHealth, PacketEndpoint]:
            leaf = routed.leaf
            key = outbound_version(leaf)
            health = _EndpointHealth(leaf)
            made: list[PacketEndpoint] = []  # the endpoint, once dialled: only its own loss counts
            endpoint = await leaf.dial_udp(
                lambda data, source: self._from_endpoint(health, data, source),
                deadline,
                on_lost=lambda error: self._endpoint_lost(key, error, made[0] if made else _UNPUBLISHED),
            )
            made.append(endpoint)
            return health, endpoint

        def eligible(routed: Routed) -> bool:
            return (
                not self._closed.is_set()
                and outbound_version(routed.leaf) not in self._drained
                and self._dispatcher.udp_eligible(routed)
            )

        def commit(routed: Routed, prepared: tuple[_EndpointHealth, PacketEndpoint]) -> None:
            key = outbound_version(routed.leaf)
            if self._has_endpoint(key):  # another target's sub-link of it came first: that one serves
                prepared[1].close()
                return
            self._health[key], self._endpoints[key] = prepared
            self._dial_episodes[key] = Episode()
            self._count(routed.leaf.name, None)

        def observed_error(routed: Routed, error: BaseException) -> None:
            self._count(routed.leaf.name, error)
            log.info(
                "udp cold preparation failed %s",
                kv(association=self.id, outbound=routed.leaf.name, error=type(error).__name__),
            )

        winner, _ = await prepare_first(
            candidates,
            prepare,
            clock=self._clock,
            deadline=deadline,
            eligible=eligible,
            commit=commit,
            observed_error=observed_error,
            discard=lambda prepared: prepared[1].close(),
            counts=getattr(getattr(self._dispatcher, "stats", None), "udp_stagger", None),
        )
        if winner.leaf is not candidates[0].leaf:
            log.info(
                "udp cold preparation served %s",
                kv(association=self.id, first=candidates[0].leaf.name, served=winner.leaf.name),
            )
        return winner

    async def _resolve(self, target: Address) -> str:
        if target.ip is not None:
            return str(target.ip)
        cached = self._resolved.get(target.host)
        if cached is not None:
            return cached
        answers = await self._dispatcher.resolver(target.host)
        if not answers:
            raise HonkError(f"{target.host} has no address")
        ip = str(ipaddress.ip_address(str(answers[0])))
        self._resolved[target.host] = ip
        return ip

    async def _remote_socket(self, family: int, leaf) -> None:  # noqa: ANN001 - the direct leaf
        """The association's direct socket of ``family``, marked as the direct leaf marks its
        dials: without the bypass mark, the host's own interception (wan_interface) would send
        honk's datagrams back to its own listener."""
        key = (family, getattr(leaf, "mark", None))
        if key in self._remotes:
            return
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            mark = getattr(leaf, "mark_socket", None)
            if mark is not None:
                mark(sock)
            sock.bind(("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0))
            transport, _ = await loop.create_datagram_endpoint(lambda: _RemoteSide(self), sock=sock)
        except BaseException:
            sock.close()
            raise
        if self._closed.is_set() or key in self._remotes:
            transport.close()
            return
        self._remotes[key] = transport

    async def _endpoint(self, leaf) -> PacketEndpoint:  # noqa: ANN001 - an Outbound
        """The association's sub-link through ``leaf``'s version, dialled once and shared by its
        targets."""
        name, key = leaf.name, outbound_version(leaf)
        endpoint = self._endpoints.get(key)
        if endpoint is not None and not endpoint.closed:
            return endpoint
        dialing = self._dialing.get(key)
        if dialing is None:
            # an authoritative single-node plan: the cold race's one absolute preparation
            # deadline, max(10 s, 4 × connect_timeout) from now (GH-G-09), over the whole dial
            deadline = self._clock.now() + preparation_deadline(self._dispatcher.global_spec.connect_timeout)
            health = self._health[key] = _EndpointHealth(leaf)
            self._dial_episodes[key] = Episode()
            dialing = asyncio.ensure_future(
                self._prepare_single(
                    leaf,
                    deadline,
                    lambda data, source: self._from_endpoint(health, data, source),
                    lambda error: self._endpoint_lost(key, error),
                )
            )
            self._dialing[key] = dialing
            dialing.add_done_callback(lambda _: self._dialing.pop(key, None))
            dialing.add_done_callback(lambda done: self._count_dial(name, done))
        try:
            endpoint = await asyncio.shield(dialing)
        except BaseException:
            if key not in self._endpoints:
                self._health.pop(key, None)  # no endpoint: nothing for it to report
            raise
        if self._closed.is_set():
            endpoint.close()
            raise FlowClosed("the association ended while its endpoint was dialled")
        if key in self._drained:  # its version was drained while it was dialled
            self._health.pop(key, None)
            endpoint.close()
            raise OutboundDrained()
        self._endpoints[key] = endpoint
        return endpoint

    async def _prepare_single(self, leaf, deadline: float, receive, on_lost) -> PacketEndpoint:  # noqa: ANN001
        """``leaf``'s endpoint, prepared under the plan's absolute ``deadline`` (GH-G-09): proxy-host
        resolution, dial admission and protocol negotiation all count against it, and its expiry
        cancels whatever phase is under way (a :class:`DialTimeout` of the plan; the cancelled
        dial reports no error of its node, GH-G-10). Publishing the endpoint then is synchronous."""
        try:
            async with timeout_at(self._clock, deadline):
                return await leaf.dial_udp(receive, deadline, on_lost=on_lost)
        except TimeoutError:
            raise DialTimeout(
                leaf.name, "connect", "UDP preparation: no endpoint before the deadline"
            ) from None

    def _count_dial(self, outbound: str, dialing: asyncio.Future[PacketEndpoint]) -> None:
        """One endpoint dial ended: counted once, however many targets waited for it."""
        if not dialing.cancelled():  # a cancelled dial (the association ended) has no outcome
            self._count(outbound, dialing.exception())

    def _count(self, outbound: str, error: BaseException | None) -> None:
        stats = getattr(self._dispatcher, "stats", None)
        if stats is not None:
            stats.dial("udp", error, outbound)

    def _endpoint_lost(self, version: str, error: HonkError | None, lost: object = None) -> None:
        """The sub-link of ``version`` ended. ``lost``: the endpoint that ended, when the caller
        knows it; one the association does not hold under ``version`` (a cold race's loser,
        never published) changes nothing."""
        if lost is not None and self._endpoints.get(version) is not lost:
            return
        endpoint = self._endpoints.pop(version, None)
        health = self._health.pop(version, None)
        if endpoint is None or self._closed.is_set():
            return
        if error is not None and health is not None:
            health.failed()  # a terminal send or receive error of the node's UDP path
        episode = Episode()  # one carrier failure: one episode for every target through it
        for route in self._routes.values():
            if route.endpoint is endpoint:
                self._retire(route, Result.failure(episode) if error is not None else None)
        log.info(
            "udp endpoint ended association=%s outbound_version=%s error=%s",
            self.id,
            version,
            type(error).__name__ if error is not None else "-",
        )
        self._forget_routes(lambda route: route.endpoint is endpoint)

    def _forget_routes(self, match) -> int:  # noqa: ANN001 - _Route -> bool
        """Drop the decisions ``match`` picks: their targets' next datagrams route again."""
        stale = [target for target, route in self._routes.items() if match(route)]
        for target in stale:
            self._retire(self._routes.pop(target))
        return len(stale)

    def _retire(self, route: _Route, result: Result | None = None) -> None:
        """Settle a route's Score reporter: with ``result``, or as an intentional retirement
        (a success after a reply, neutral without one, GH-K-22)."""
        reporter = route.reporter
        if reporter is None or reporter.settled:
            return
        if route.sockaddr is not None and self._direct_reporters.get(route.sockaddr) is reporter:
            del self._direct_reporters[route.sockaddr]
        if result is None:
            result = Result.success() if reporter.first_response_at is not None else Result.neutral()
        reporter.settle(self._clock.now(), result)

    def _note_route(self, target: Address, routed: Routed) -> None:
        """The tracker entry shows the first routed target, or the next one after its version
        was drained."""
        if self._flow is not None and (not self._flow.rule or self._retarget):
            self._retarget = False
            self._flow.retarget(target, routed.rule, routed.chain, outbound_version(routed.leaf))

    def _show_a_live_route(self) -> None:
        """The tracker entry's version was drained: show a route the association still has,
        or the next one it makes."""
        assert self._flow is not None
        for target, route in self._routes.items():
            if route.version:
                self._flow.retarget(target, route.rule, route.chain, route.version)
                return
        self._retarget = True

    # -- versions (the tracker's MultiVersionHandle) ------------------------------------

    def outbound_versions(self) -> set[str]:
        """The outbound versions the association holds now: its sub-links and its decisions."""
        held = {route.version for route in self._routes.values() if route.version}
        held.update(self._endpoints)
        return held

    def close_version(self, outbound_id: str, reason: HonkError) -> int:
        """A drain: close the sub-link of ``outbound_id`` and forget the routes through that
        version (the next datagram routes on the current plane); 1 if it held any, else 0."""
        if self._closed.is_set():
            return 0
        self._drained.add(outbound_id)  # a dial of it still under way closes what it opens
        endpoint = self._endpoints.pop(outbound_id, None)
        dialing = outbound_id in self._dialing
        if not dialing:
            self._health.pop(outbound_id, None)  # drained, not failed: nothing to tell its node
        forgotten = self._forget_routes(lambda route: route.version == outbound_id)
        if endpoint is not None:
            endpoint.close()
        if endpoint is None and not dialing and not forgotten:
            return 0
        if self._flow is not None and self._flow.outbound_version == outbound_id:
            self._show_a_live_route()
        log.info(
            "udp sub-link closed %s",
            kv(
                association=self.id,
                outbound_version=outbound_id,
                error=type(reason).__name__,
                reason=str(reason),
            ),
        )
        return 1

    # -- remote → client --------------------------------------------------------------

    def _from_endpoint(self, health: _EndpointHealth, data: bytes, source: Address) -> None:
        """A reply through a proxy leaf's endpoint: the proxy reports where it came from."""
        if self._closed.is_set() or not self._can_deliver():
            return
        health.answer()
        self.last_activity = now = self._clock.now()
        self.bytes_down += len(data)
        reporter = self._endpoint_reporter(health, source)
        if reporter is not None:
            reporter.rx(now, len(data))
        self._deliver(source, data)

    def _endpoint_reporter(self, health: _EndpointHealth, source: Address) -> ScoreReporter | None:
        """The reporter of the target a proxied reply answers: the route to ``source``, else the
        one route through that sub-link to a name on the same port (the proxy reports the IP)."""
        route = self._routes.get(source)
        if route is not None and route.health is health:
            return route.reporter
        named = [
            r
            for r in self._routes.values()
            if r.health is health
            and r.target is not None
            and r.target.ip is None
            and r.target.port == source.port
        ]
        return named[0].reporter if len(named) == 1 else None

    def _from_remote(self, data: bytes, addr: tuple) -> None:
        if self._closed.is_set() or not self._can_deliver():
            return
        try:
            key = (_norm_ip(addr[0]), addr[1])
        except ValueError:
            return
        if key not in self._sent:
            log.debug("udp reply from an unsolicited source dropped association=%s from=%s", self.id, key)
            return
        self.last_activity = now = self._clock.now()
        self.bytes_down += len(data)
        reporter = self._direct_reporters.get(key)
        if reporter is not None:
            reporter.rx(now, len(data))
        self._deliver(Address(*key), data)


class UdpAssociation(UdpNat):
    """One SOCKS5 UDP association; also the tracker's :class:`FlowHandle` for it."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        inbound: str,
        client: Address,
        requested: Address,
        user: str | None = None,
        session: object | None = None,
    ) -> None:
        if client.ip is None:
            raise ValueError("the control connection's peer must be an IP")
        super().__init__(dispatcher, inbound=inbound, client=client, user=user, session=session)
        self.requested = requested
        self.bound: Address | None = None
        self._client_ip = str(client.ip)
        self._client_addr: tuple | None = None
        self._client_transport: asyncio.DatagramTransport | None = None

    async def start(self, bind_host: str, advertise_host: str) -> Address:
        """Bind the client-facing socket; returns the address for the SOCKS5 reply."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _ClientSide(self), local_addr=(bind_host, 0)
        )
        self._client_transport = transport
        port = transport.get_extra_info("sockname")[1]
        self.bound = Address(advertise_host, port)
        self._open_flow(self.requested)
        return self.bound

    def _close_client_side(self) -> None:
        if self._client_transport is not None:
            self._client_transport.close()

    def _from_client(self, data: bytes, addr: tuple) -> None:
        if self._closed.is_set():
            return
        try:
            if _norm_ip(addr[0]) != self._client_ip:
                log.debug("udp datagram from a stranger dropped association=%s from=%s", self.id, addr[0])
                return
        except ValueError:
            return
        try:
            datagram = parse_udp_datagram(data)
        except ClientProtocolError as exc:
            log.debug("udp datagram dropped association=%s reason=%s", self.id, exc.reason)
            return
        if datagram.frag != 0:
            log.debug("udp fragment dropped association=%s frag=%d", self.id, datagram.frag)
            return
        self._client_addr = addr
        self._forward(datagram.address, datagram.payload)

    def _can_deliver(self) -> bool:
        return self._client_addr is not None and self._client_transport is not None

    def _deliver(self, source: Address, data: bytes) -> None:
        assert self._client_transport is not None and self._client_addr is not None
        self._client_transport.sendto(build_udp_datagram(source, data), self._client_addr)
