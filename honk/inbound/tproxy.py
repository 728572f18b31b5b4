"""The transparent inbounds: TPROXY (TCP and UDP) and REDIRECT (TCP).

The router's nftables rules (:mod:`honk.netlink.nftables`) divert the LAN's new flows to this
listener without the clients knowing; there is no handshake and no user. What a flow is for
comes from the kernel:

* TPROXY TCP: the listening socket has ``IP_TRANSPARENT``, and an accepted socket's local
  address is the original destination.
* TPROXY UDP: one transparent socket with ``IP_RECVORIGDSTADDR`` receives every diverted
  datagram with its original destination as ancillary data. Each (client, original
  destination) pair is one session (:class:`_UdpSession`, a :class:`~honk.connection.udp.UdpNat`
  and one tracker entry); replies leave from the original destination: a transparent socket
  bound to it and connected to the client, cached by the session. Being connected, that socket
  is what the kernel delivers the pair's later datagrams to (the ruleset's ``socket transparent``
  rule, and TPROXY's own established lookup), so the session reads it too. A reply a proxy
  leaf reports from another source is sent from that source, with a socket of its own.
  Sessions end by the tracker's ``udp_idle_timeout`` sweeper, like a SOCKS5 association.
* Datagrams to port 53 go to ``dns_handler`` when one is set (honk's DNS module); the answer
  leaves from the original address. Without one they are proxied like any UDP.
* REDIRECT TCP (kind ``redir``): a plain listener; the original destination is
  ``SO_ORIGINAL_DST`` (``IP6T_SO_ORIGINAL_DST`` for IPv6), read from conntrack.

Host ``::`` binds one dual-stack socket per protocol (IPv4 peers appear as ``::ffff:…`` and are
unmapped); ``0.0.0.0`` serves IPv4 only.

Per flow: ``dial_mode`` (:mod:`honk.inbound.sniffing`) decides whether the first bytes are
sniffed (TLS SNI, HTTP Host; QUIC Initial SNI for UDP) for at most ``sniffing_timeout`` clock
seconds, what routing sees and what proxy leaves dial; the bytes read are forwarded upstream
first. TCP goes through the :class:`~honk.connection.dispatch.Dispatcher` as the mixed inbound's
flows do (route, ``dial_routed``, ``relay``; tracked under the inbound's tag). A refused flow
(block, NoRoute, a failed dial) is reset (``SO_LINGER`` 0) with one ``flow refused`` line
naming the error type. A flow addressed to this listener itself (not diverted) is refused:
routing it would loop back here.

Lifecycle as the reload applier drives it (see :class:`~honk.inbound.mixed.MixedInbound`):
``bind()`` binds without serving, ``serve()`` accepts, ``swap(spec)`` serves new flows with new
settings (same kind and bind), ``stop_accepting()`` closes the listening sockets (UDP sessions
keep their connected reply sockets until they idle out), ``aclose()`` ends everything. Each TCP
connection is a session of the :class:`~honk.inbound.sessions.SessionRegistry` under its tag,
so ``close_tag`` also ends connections still sniffing or dialling; tracked flows end by
``tracker.close_inbound(tag)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from honk.config.spec import DEFAULT_DIAL_MODE, DEFAULT_SNIFFING_TIMEOUT
from honk.connection.descriptors import DescriptorsExhausted
from honk.connection.dispatch import Dispatcher, Routed, Upstream
from honk.connection.udp import MAX_PENDING_DATAGRAMS, UdpNat
from honk.core.clock import Clock, TimerHandle
from honk.core.errors import Blocked, ClientGone, FlowClosed, HonkError, NotSupported
from honk.core.logs import kv
from honk.core.net import Address, FlowMeta, Network
from honk.inbound.lifecycle import BindThenServe
from honk.inbound.sessions import Principal, Session, SessionRegistry
from honk.inbound.sniffing import (
    DialMode,
    FlowPlan,
    LearnedNames,
    keeps_original_ip,
    plan_flow,
    sniff_first_bytes,
)
from honk.netlink.owner import process_name
from honk.netlink.sockopts import (
    ORIGDST_CMSG_SPACE,
    family_of,
    origdst_from_ancdata,
    original_dst,
    set_linger_reset,
    transparent_socket,
    unmap,
)
from honk.proto.sniff import NEED_MORE, QuicSniffer
from honk.relay.stream import StreamConn

__all__ = ["DnsHandler", "TransparentInbound", "TransparentSpec"]

log = logging.getLogger("honk.inbound")

KINDS = ("tproxy", "redir")
BACKLOG = 4096  # pending connections between bind() and serve(), and in connect storms
MAX_DATAGRAM = 65535  # bytes: the largest UDP payload
UDP_BURST = 64  # datagrams read per readiness callback before other work gets a turn
MAX_REPLY_SOURCES = 8  # reply sockets per UDP session (its original destination and others a proxy reported)
MAX_DNS_INFLIGHT = 256  # DNS queries handed to dns_handler and not yet answered; more are dropped
DNS_PORT = 53

# (query, client, original destination) -> the answer to send back, or None for none
DnsHandler = Callable[[bytes, Address, Address], Awaitable[bytes | None]]


@dataclass(frozen=True, slots=True)
class TransparentSpec:
    """One transparent listener: ``kind`` ``tproxy`` (TCP, and UDP when ``udp``) or ``redir``
    (TCP); ``dial_mode`` and ``sniffing_timeout`` (seconds) as the global keys of that name."""

    name: str
    kind: str
    host: str
    port: int
    dial_mode: str = DEFAULT_DIAL_MODE
    sniffing_timeout: float = DEFAULT_SNIFFING_TIMEOUT
    udp: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"inbound {self.name}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}"
            )
        DialMode.parse(self.dial_mode)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"inbound {self.name}: port {self.port} out of range")
        if self.sniffing_timeout < 0:
            raise ValueError(f"inbound {self.name}: sniffing_timeout must not be negative")

    @property
    def mode(self) -> DialMode:
        return DialMode.parse(self.dial_mode)

    @property
    def serves_udp(self) -> bool:
        return self.kind == "tproxy" and self.udp


def _listen_host(host: str) -> tuple[int, str]:
    """(family, address) to bind for ``host``: ``""`` is ``::``; names resolve to their first address."""
    host = host.strip("[]") or "::"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        family, *_rest, sockaddr = infos[0]
        return family, sockaddr[0]
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), str(ip)


def _is_local_ip(host: str) -> bool:
    """Whether ``host`` is one of this host's addresses (a plain bind succeeds)."""
    with socket.socket(family_of(host), socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


def _reply_socket(local: Address, client: Address) -> socket.socket:
    """A transparent UDP socket bound to ``local`` (an address not necessarily ours) and connected
    to ``client``: what sends a reply from the original destination. Raises OSError."""
    sock = transparent_socket(family_of(local.host), socket.SOCK_DGRAM, (local.host, local.port))
    try:
        sock.connect((client.host, client.port))
    except BaseException:
        sock.close()
        raise
    return sock


def _peer(address: Any) -> Address | None:
    if not address:
        return None
    try:
        return Address(unmap(address[0]), address[1])
    except (ValueError, IndexError, TypeError):
        return None


class _Conn(StreamConn):
    """One accepted TCP connection; its addresses are read at once (uvloop reads them lazily,
    which fails after a reset)."""

    def __init__(self, inbound: TransparentInbound) -> None:
        super().__init__(ClientGone)
        self._inbound = inbound
        self.source: Address | None = None
        self.local: Address | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.source = _peer(transport.get_extra_info("peername"))
        self.local = _peer(transport.get_extra_info("sockname"))
        self._inbound._accepted(self)

    def reset(self) -> None:
        """Abort with a reset (the client sees RST, not a clean close)."""
        transport = self.transport
        if transport is None or self.lost:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                set_linger_reset(sock)
        transport.abort()


class TransparentInbound(BindThenServe):
    """A TPROXY (TCP+UDP) or REDIRECT (TCP) listener; see the module docstring."""

    def __init__(
        self,
        spec: TransparentSpec,
        dispatcher: Dispatcher,
        clock: Clock,
        *,
        dns_handler: DnsHandler | None = None,
        learned_names: LearnedNames | None = None,
        sessions: SessionRegistry | None = None,
    ) -> None:
        """``dns_handler``: answers datagrams to port 53 (None: they are proxied);
        ``learned_names``: names honk's DNS answered with an IP (dial_mode's learning);
        ``sessions``: the daemon's session registry (default: one of this inbound's own).
        Both DNS hooks are attributes the owner may replace at any time."""
        self.spec = spec
        self.name = spec.name
        self.dns_handler = dns_handler
        self.dns_answer_now: Callable[..., bytes | None] | None = None  # cache hits answered in the callback
        self.learned_names = learned_names
        self._dispatcher = dispatcher
        self._clock = clock
        self._sessions = sessions if sessions is not None else SessionRegistry()
        self._tcp: socket.socket | None = None
        self._udp: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._reading = False  # the UDP socket is registered with the loop
        self._tasks: set[asyncio.Task[None]] = set()  # one per TCP connection
        self._dns_tasks: set[asyncio.Task[None]] = set()
        self._udp_sessions: dict[tuple[Address, Address], _UdpSession] = {}
        self._serving = False
        self._stopped = False
        self.bound: Address | None = None

    # -- settings --------------------------------------------------------------------

    def swap(self, spec: TransparentSpec, admissions: Mapping[str, Principal] | None = None) -> None:
        """Serve flows accepted from now with ``spec`` (tag, dial_mode, sniffing_timeout); open
        flows keep theirs. The kind, the bind and whether UDP is served cannot change on a
        running listener (ValueError: that is a new listener). ``admissions`` are ignored."""
        if (spec.kind, spec.host, spec.port, spec.serves_udp) != (
            self.spec.kind,
            self.spec.host,
            self.spec.port,
            self.spec.serves_udp,
        ):
            raise ValueError(f"inbound {spec.name}: a swap keeps the listener's kind, bind and UDP")
        old = self.name
        self.spec = spec
        self.name = spec.name
        log.debug("inbound handler swapped %s", kv(inbound=spec.name, previous=old, dial_mode=spec.dial_mode))

    def store_users(self, admissions: Mapping[str, Principal]) -> None:
        """Transparent inbounds have no users: nothing to store."""

    # -- lifecycle -------------------------------------------------------------------

    async def bind(self) -> None:
        """Bind (and listen) without serving. Raises OSError (PermissionError without
        CAP_NET_ADMIN for TPROXY) and leaves nothing open on failure."""
        if self._tcp is not None or self._serving or self._stopped:
            raise RuntimeError(f"inbound {self.name}: bind() is called once, first")
        family, host = _listen_host(self.spec.host)
        local = (host, self.spec.port)
        tcp = udp = None
        try:
            if self.spec.kind == "tproxy":
                tcp = transparent_socket(family, socket.SOCK_STREAM, local, dual_stack=True)
            else:
                tcp = socket.socket(family, socket.SOCK_STREAM)
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                tcp.setblocking(False)
                tcp.bind(local)
            tcp.listen(BACKLOG)
            port = tcp.getsockname()[1]
            if self.spec.serves_udp:
                udp = transparent_socket(
                    family, socket.SOCK_DGRAM, (host, port), dual_stack=True, recv_origdst=True
                )
        except OSError as exc:
            for sock in (tcp, udp):
                if sock is not None:
                    sock.close()
            raise OSError(
                exc.errno, f"error while attempting to bind on address {local!r}: {exc.strerror}"
            ) from None
        self._tcp, self._udp = tcp, udp
        self.bound = Address(host, port)
        self._sessions.attach(self)

    async def serve(self) -> None:
        """Start accepting connections and reading datagrams on what :meth:`bind` bound."""
        if self._tcp is None or self._serving or self._stopped:
            raise RuntimeError(f"inbound {self.name}: serve() needs bound, unserved sockets")
        self._serving = True
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), sock=self._tcp, backlog=BACKLOG)
        if self._udp is not None:
            loop.add_reader(self._udp.fileno(), self._udp_readable)
            self._reading = True
        log.info(
            "inbound listening %s",
            kv(
                inbound=self.name,
                kind=self.spec.kind,
                address=self.bound,
                udp=self._udp is not None,
                dial_mode=self.spec.dial_mode,
            ),
        )

    def close_unserved(self) -> None:
        """Release what :meth:`bind` bound and nothing served (a refused apply)."""
        if self._serving:
            raise RuntimeError(f"inbound {self.name}: close_unserved() after serve(); use stop_accepting()")
        self._stopped = True
        for sock in (self._tcp, self._udp):
            if sock is not None:
                sock.close()
        self._tcp = self._udp = None
        self._sessions.detach(self)

    async def stop_accepting(self) -> None:
        """Close the listening sockets; flows already open go on. Idempotent."""
        self._stopped = True
        udp, self._udp = self._udp, None
        if udp is not None:
            if self._reading:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_reader(udp.fileno())
                self._reading = False
            udp.close()
        server, self._server = self._server, None
        tcp, self._tcp = self._tcp, None
        if server is not None:
            server.close()
        if tcp is not None:
            tcp.close()

    async def aclose(self) -> None:
        """Stop accepting and end every flow this listener accepted."""
        await self.stop_accepting()
        error = FlowClosed("the inbound was closed")
        for session in list(self._udp_sessions.values()):
            session.close(error)
        tasks = [*self._tasks, *self._dns_tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._sessions.detach(self)

    async def wait_closed(self) -> None:
        """Wait until every TCP connection accepted so far has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    @property
    def active(self) -> int:
        """Flows this inbound serves now: TCP connections and UDP sessions."""
        return len(self._tasks) + len(self._udp_sessions)

    # -- the session registry's view (honk.inbound.sessions.Listener) ------------------

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def retired(self) -> bool:
        return self._stopped

    def sweep_tag(self, tag: str | None, error: HonkError, *, stopped_and_swept: bool) -> int:
        """Every TCP connection has a session and every UDP session a tracker entry: nothing
        here lives outside the registry and the tracker."""
        return 0

    # -- loops back -------------------------------------------------------------------

    def _is_self(self, original: Address) -> bool:
        """A flow addressed to this listener itself (not diverted): serving it would loop."""
        bound = self.bound
        return bound is not None and original.port == bound.port and _is_local_ip(original.host)

    # -- TCP -------------------------------------------------------------------------

    def _accepted(self, conn: _Conn) -> None:
        spec = self.spec
        session = self._sessions.open(self, spec.name, self._dispatcher.tracker)
        if session is None or conn.source is None:  # accepted as the listener stopped, or already gone
            if session is not None:
                session.finish()
            conn.abort()
            return
        session.conn = conn
        session.opened = True  # no handshake: the connection is its flow
        task = asyncio.get_running_loop().create_task(self._serve_tcp(conn, spec, session))
        session.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _original(self, conn: _Conn, spec: TransparentSpec) -> Address:
        if spec.kind == "tproxy":
            if conn.local is None:
                raise ClientGone("the accepted socket has no local address")
            return conn.local
        transport = conn.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            raise ClientGone("the accepted socket is gone")
        try:
            host, port = original_dst(sock)
        except OSError as exc:
            raise NotSupported(f"no original destination (not redirected?): {exc.strerror or exc}") from None
        return Address(host, port)

    async def _serve_tcp(self, conn: _Conn, spec: TransparentSpec, session: Session) -> None:
        source = conn.source
        assert source is not None
        target: Address | None = None
        try:
            original = target = self._original(conn, spec)
            if self._is_self(original):
                raise NotSupported("a connection to the transparent port itself")
            meta = FlowMeta(
                Network.TCP,
                source,
                original,
                spec.name,
                session=session,
                process=await self._process_of(Network.TCP, source, original),
            )
            data, sniffed = b"", None
            if spec.mode.sniffs:
                data, sniffed = await sniff_first_bytes(conn, self._clock, spec.sniffing_timeout)
                conn.unread(data)  # the relay sends these first
            plan = await self._plan(spec, meta, sniffed)
            target = plan.meta.target
            try:
                upstream = await self._dial(plan)
            except HonkError as exc:
                self._refused(spec.name, source, target, exc)
                conn.reset()
                return
            await self._dispatcher.relay(upstream, conn)
        except HonkError as exc:
            if target is None or isinstance(exc, NotSupported):
                self._refused(spec.name, source, target, exc)
                conn.reset()
            else:
                log.debug(
                    "flow ended %s",
                    kv(
                        inbound=spec.name,
                        source=source,
                        target=target,
                        error=type(exc).__name__,
                        reason=str(exc),
                    ),
                )
                conn.abort()
        except asyncio.CancelledError:
            conn.abort()
            raise
        except Exception:
            log.exception("flow crashed inbound=%s source=%s", spec.name, source)
            conn.abort()
        finally:
            conn.close()
            session.finish()

    async def _process_of(self, network: Network, source: Address, target: Address) -> str | None:
        """The local process behind a flow of the host's own, looked up only while the rules name
        processes (``pname``); None for a LAN client's flow."""
        if not self._dispatcher.reads_process:
            return None
        try:
            return await asyncio.to_thread(process_name, network, source, target)
        except Exception:  # noqa: BLE001 - an unreadable /proc leaves the flow without a process
            log.debug("process lookup failed %s", kv(source=source, target=target), exc_info=True)
            return None

    async def _plan(self, spec: TransparentSpec, meta: FlowMeta, sniffed: str | None) -> FlowPlan:
        dispatcher = self._dispatcher
        return await plan_flow(
            spec.mode,
            meta,
            sniffed,
            learned_names=self.learned_names,
            resolver=dispatcher.resolver,
            clock=self._clock,
            verify_timeout=dispatcher.global_spec.connect_timeout,
        )

    async def _dial(self, plan: FlowPlan) -> Upstream:
        """Route by ``plan.meta``, dial what the leaf should dial (the name or the original IP);
        the tracker shows the routing target. Raises the dispatcher's refusals."""
        dispatcher = self._dispatcher
        routed = await dispatcher.route(plan.meta)
        dial_target = plan.dial_target(routed.leaf.protocol, keeps_original_ip(routed))
        to_dial = dataclasses.replace(routed, meta=dataclasses.replace(routed.meta, target=dial_target))
        served, dialed = await dispatcher.dial_routed(to_dial)
        served = dataclasses.replace(served, meta=plan.meta)
        return Upstream(served, dialed.sock, dialed.framing, dialed.bridge)

    def _refused(self, tag: str, source: Address, target: Address | None, error: HonkError) -> None:
        # a spent descriptor budget is warned about once per interval by the budget itself
        level = logging.DEBUG if isinstance(error, Blocked | DescriptorsExhausted) else logging.INFO
        log.log(
            level,
            "flow refused %s",
            kv(inbound=tag, source=source, target=target or "-", error=type(error).__name__),
        )

    # -- UDP -------------------------------------------------------------------------

    def _udp_readable(self) -> None:
        sock = self._udp
        if sock is None:
            return
        for _ in range(UDP_BURST):
            try:
                data, ancdata, flags, address = sock.recvmsg(MAX_DATAGRAM, ORIGDST_CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("udp listener read failed %s", kv(inbound=self.name, error=repr(exc)))
                return
            client = _peer(address)
            original = origdst_from_ancdata(ancdata)
            if client is None or original is None or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                log.debug(
                    "udp datagram dropped %s",
                    kv(inbound=self.name, source=client or "-", reason="no original destination"),
                )
                continue
            self._datagram(data, client, Address(*original))

    def _datagram(self, data: bytes, client: Address, original: Address) -> None:
        """One client datagram to ``original``: to the DNS handler, or to its session."""
        if self._is_self(original):
            log.debug(
                "udp datagram dropped %s", kv(inbound=self.name, source=client, reason="addressed to honk")
            )
            return
        if original.port == DNS_PORT and self.dns_handler is not None:
            self._dns(data, client, original)
            return
        key = (client, original)
        session = self._udp_sessions.get(key)
        if session is None or session.closed:
            session = _UdpSession(self, self.spec, client, original)
            self._udp_sessions[key] = session
        session.receive(data)

    def _forget(self, session: _UdpSession) -> None:
        key = (session.client, session.original)
        if self._udp_sessions.get(key) is session:
            del self._udp_sessions[key]

    def _dns(self, query: bytes, client: Address, original: Address) -> None:
        now = self.dns_answer_now
        answer = now(query, client, original) if now is not None else None
        if answer is not None:  # a cache hit: no task
            self.send_from(original, client, answer)
            return
        if len(self._dns_tasks) >= MAX_DNS_INFLIGHT:
            log.debug(
                "dns query dropped %s", kv(inbound=self.name, source=client, reason="too many in flight")
            )
            return
        task = asyncio.get_running_loop().create_task(self._answer_dns(query, client, original))
        self._dns_tasks.add(task)
        task.add_done_callback(self._dns_tasks.discard)

    async def _answer_dns(self, query: bytes, client: Address, original: Address) -> None:
        handler = self.dns_handler
        if handler is None:
            return
        try:
            answer = await handler(query, client, original)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one query's failure ends only that query
            log.debug("dns query failed %s", kv(inbound=self.name, source=client, error=type(exc).__name__))
            return
        if answer:
            self.send_from(original, client, answer)

    def send_from(self, local: Address, client: Address, data: bytes) -> bool:
        """Send one datagram to ``client`` from ``local`` (a transparent socket used once);
        False when it could not be sent. Datagrams of other clients that reached the socket
        before it was closed are handled as usual."""
        try:
            sock = _reply_socket(local, client)
        except OSError as exc:
            log.debug("udp reply not sent %s", kv(inbound=self.name, source=local, error=repr(exc)))
            return False
        try:
            sock.send(data)
            sent = True
        except OSError as exc:
            log.debug("udp reply not sent %s", kv(inbound=self.name, source=local, error=repr(exc)))
            sent = False
        strays = _drain(sock)
        sock.close()
        for payload, peer in strays:
            self._datagram(payload, peer, local)
        return sent


def _drain(sock: socket.socket) -> list[tuple[bytes, Address]]:
    """What a reply socket has queued (datagrams that reached it between its bind and connect)."""
    out = []
    for _ in range(UDP_BURST):
        try:
            data, address = sock.recvfrom(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # an ICMP error of an earlier send: nothing to read
            continue
        peer = _peer(address)
        if peer is not None:
            out.append((data, peer))
    return out


class _UdpSession(UdpNat):
    """One (client, original destination) pair of the TPROXY UDP listener.

    Its first datagrams wait (at most ``MAX_PENDING_DATAGRAMS``) while dial_mode sniffs a QUIC
    Initial (at most ``sniffing_timeout`` clock seconds from the first) and plans the flow; then
    every datagram goes through the core's routing on the current plane."""

    def __init__(
        self, inbound: TransparentInbound, spec: TransparentSpec, client: Address, original: Address
    ) -> None:
        super().__init__(inbound._dispatcher, inbound=spec.name, client=client)
        self.original = original
        self._inbound = inbound
        self._spec = spec
        self._plan: FlowPlan | None = None
        self._held: list[bytes] = []
        self._planning = False
        self._sniffer = QuicSniffer() if spec.mode.sniffs else None
        self._timer: TimerHandle | None = None
        self._replies: dict[Address, socket.socket] = {}  # reply source → its connected socket
        if not spec.mode.sniffs and not inbound._dispatcher.reads_process:
            # nothing to learn from the datagrams or the host: routed by the IP at once
            self._plan = FlowPlan(FlowMeta(Network.UDP, client, original, spec.name), original)
        self._open_flow(original)
        log.debug("UDP session %s", kv(inbound=spec.name, source=client, target=original, id=self.id))

    # -- client → remote -------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """One datagram from the client to the original destination."""
        if self.closed:
            return
        if self._plan is not None:
            self._forward(self.original, data)
            return
        self.last_activity = self._clock.now()
        if len(self._held) < MAX_PENDING_DATAGRAMS:
            self._held.append(data)
        if self._planning:
            return
        sniffed: str | None = None
        if self._sniffer is not None:
            try:
                sniffed = self._sniffer.feed(data)
            except Exception:  # noqa: BLE001 - malformed bytes end the sniffing, never the session
                log.debug("quic sniffing failed %s", kv(session=self.id), exc_info=True)
                sniffed = None
            if sniffed == NEED_MORE:
                if self._timer is None:
                    self._timer = self._clock.call_later(self._spec.sniffing_timeout, self._sniff_timed_out)
                return
        self._start_planning(sniffed)

    def _sniff_timed_out(self) -> None:
        self._timer = None
        if not self._planning and not self.closed:
            self._start_planning(None)

    def _start_planning(self, sniffed: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._planning = True
        self._sniffer = None
        task = asyncio.get_running_loop().create_task(self._plan_and_flush(sniffed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _plan_and_flush(self, sniffed: str | None) -> None:
        process = await self._inbound._process_of(Network.UDP, self.client, self.original)
        meta = FlowMeta(Network.UDP, self.client, self.original, self.inbound, process=process)
        try:
            plan = await self._inbound._plan(self._spec, meta, sniffed)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a planning failure routes by the IP
            log.exception("udp flow planning failed %s", kv(session=self.id))
            plan = FlowPlan(meta, self.original)
        if self.closed:
            return
        self._plan = plan
        held, self._held = self._held, []
        for data in held:
            self._forward(self.original, data)

    # -- the core's hooks --------------------------------------------------------------

    def _route_meta(self, target: Address) -> FlowMeta:
        assert self._plan is not None
        return self._plan.meta

    def _dial_target(self, target: Address, routed: Routed) -> Address:
        assert self._plan is not None
        return self._plan.dial_target(routed.leaf.protocol, keeps_original_ip(routed))

    def _reply_source(self, source: Address) -> Address:
        """Where a reply from ``source`` leaves from: the original destination for its own
        answers (as dialled, by name or IP), else the source a proxy reported."""
        plan = self._plan
        if source == self.original or source.is_domain:
            return self.original
        if plan is not None and plan.name is not None and source.port == self.original.port:
            return self.original  # dialled by name: the proxy's resolution may differ from the client's
        if family_of(source.host) != family_of(self.client.host):
            return self.original
        return source

    def _deliver(self, source: Address, data: bytes) -> None:
        local = self._reply_source(source)
        sock = self._replies.get(local)
        if sock is None:
            if len(self._replies) >= MAX_REPLY_SOURCES:
                log.debug(
                    "udp reply dropped %s", kv(session=self.id, source=local, reason="too many sources")
                )
                return
            try:
                sock = _reply_socket(local, self.client)
            except OSError as exc:
                log.debug("udp reply dropped %s", kv(session=self.id, source=local, error=repr(exc)))
                return
            self._replies[local] = sock
            asyncio.get_running_loop().add_reader(sock.fileno(), self._reply_readable, sock, local)
        try:
            sock.send(data)
        except (BlockingIOError, InterruptedError):
            pass  # the socket buffer is full: UDP drops
        except OSError as exc:  # the client's ICMP error for an earlier reply
            log.debug("udp reply failed %s", kv(session=self.id, error=repr(exc)))

    def _reply_readable(self, sock: socket.socket, local: Address) -> None:
        """The client's later datagrams arrive on the connected reply socket; others that
        reached it before it was connected are handed to the inbound."""
        for _ in range(UDP_BURST):
            if self.closed:
                return
            try:
                data, address = sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ICMP port unreachable of an earlier reply: the client is gone or not listening
                continue
            peer = _peer(address)
            if peer is None:
                continue
            if peer == self.client and local == self.original:
                self.receive(data)
            else:
                self._inbound._datagram(data, peer, local)

    def _close_client_side(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        replies, self._replies = self._replies, {}
        for sock in replies.values():
            with contextlib.suppress(Exception):  # no running loop: nothing is registered any more
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        self._held.clear()
        self._inbound._forget(self)
