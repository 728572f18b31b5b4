"""The ``direct`` outbound: resolve, then Happy Eyeballs v2 (RFC 8305) to the target.

Theory of operation:
  * Resolution (skipped for IP literals) goes through an injectable resolver
    (default :class:`~honk.route.resolve.SystemResolver`) and is bounded by
    ``min(deadline, now + connect_timeout)``.
  * The addresses are interleaved by family, starting with the family of the
    first address returned. One attempt starts at once; the next starts when
    :data:`CONNECTION_ATTEMPT_DELAY` has passed since the last start, or as
    soon as an attempt fails. The first connected socket wins; every other
    attempt is cancelled and its socket closed.
  * The connect stage is bounded by ``min(deadline, now + connect_timeout)``.
    Every timer runs on the injected :class:`~honk.core.clock.Clock`.

Errors: a resolution failure is ``DialError(phase="resolve")`` (``DialTimeout``
if its deadline passed); connection failures are :class:`ConnectFailed`
(``phase="connect"``, with ``errno``); the connect deadline is ``DialTimeout``;
no socket to dial with (EMFILE and the like) is :class:`CapacityRefused`.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable

from honk.core.clock import Clock, timeout_at
from honk.core.errors import CapacityRefused, DialError, DialTimeout
from honk.core.net import Address, IPAddress
from honk.outbound.base import Capabilities, DialedStream, EnginePlan
from honk.proto.framing import Framing
from honk.route.resolve import ResolveError, Resolver, ResolveTimeout, SystemResolver, wait_until

log = logging.getLogger(__name__)

CONNECTION_ATTEMPT_DELAY = 0.250  # seconds; RFC 8305 section 5 recommended default
_DIRECT_CAPABILITIES = Capabilities(tcp=True, udp=True, udp_mode="direct")
# socket() errors that mean "this process or host is out of sockets": CapacityRefused
NO_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
BYPASS_MARK = 0x100  # fwmark upstream honk puts on its own upstream sockets so TPROXY skips them
SO_MARK = getattr(socket, "SO_MARK", 36)  # Linux value; older Pythons lack the constant

# (non-blocking socket, sockaddr) -> connected; default: loop.sock_connect
Connector = Callable[[socket.socket, tuple], Awaitable[None]]


class ConnectFailed(DialError):
    """Every connection attempt failed. ``errno`` is the shared errno when all
    attempts agree, else the first attempt's; ``errors`` keeps each failure."""

    def __init__(self, outbound: str, message: str, errno: int | None, errors: tuple[OSError, ...]) -> None:
        super().__init__(outbound, "connect", message)
        self.errno = errno
        self.errors = errors


def interleave_families(addresses: list[IPAddress]) -> list[IPAddress]:
    """Alternate address families, starting with the family of the first address."""
    if not addresses:
        return []
    first = addresses[0].version
    preferred = [a for a in addresses if a.version == first]
    other = [a for a in addresses if a.version != first]
    out: list[IPAddress] = []
    for pair in itertools.zip_longest(preferred, other):
        out.extend(a for a in pair if a is not None)
    return out


def _sockaddr(ip: IPAddress, port: int) -> tuple:
    if ip.version == 6:
        return (str(ip), port, 0, 0)
    return (str(ip), port)


class DirectOutbound:
    """Dials the target itself. ``connect_timeout`` bounds each stage (seconds).

    ``resolver`` and ``connect`` are injectable for tests; ``mark`` is the
    ``SO_MARK`` set on each socket (``None`` disables it). Without
    CAP_NET_ADMIN the kernel refuses the mark with EPERM; the outbound then
    stops trying and dials unmarked, silently.
    """

    protocol = "direct"
    runtime = None

    def __init__(
        self,
        clock: Clock,
        connect_timeout: float,
        *,
        name: str = "direct",
        resolver: Resolver | None = None,
        connect: Connector | None = None,
        mark: int | None = BYPASS_MARK,
        attempt_delay: float = CONNECTION_ATTEMPT_DELAY,
    ) -> None:
        self.name = name
        self._clock = clock
        self._connect_timeout = connect_timeout
        self._resolver: Resolver = (
            resolver if resolver is not None else SystemResolver(clock, connect_timeout)
        )
        self._connect = connect
        self._mark = mark  # None once the kernel refused it (no CAP_NET_ADMIN)
        self._configured_mark = mark
        self._attempt_delay = attempt_delay
        self._marked: dict[int, DirectOutbound] = {}  # with_mark's twins, by mark

    @property
    def mark(self) -> int | None:
        """The socket mark this outbound is configured with (its identity among its twins; the
        kernel may still refuse it without CAP_NET_ADMIN)."""
        return self._configured_mark

    def with_mark(self, mark: int) -> DirectOutbound:
        """This outbound dialling with socket mark ``mark`` instead of the bypass mark (a rule's
        ``-> direct(mark: N)``): the same name, resolver and timeouts, one twin per mark."""
        if mark == self._configured_mark:
            return self
        twin = self._marked.get(mark)
        if twin is None:
            twin = DirectOutbound(
                self._clock,
                self._connect_timeout,
                name=self.name,
                resolver=self._resolver,
                connect=self._connect,
                mark=mark,
                attempt_delay=self._attempt_delay,
            )
            self._marked[mark] = twin
        return twin

    @property
    def supports_udp(self) -> bool:
        return True

    @property
    def capabilities(self) -> Capabilities:
        return _DIRECT_CAPABILITIES

    @property
    def connect_timeout(self) -> float:
        """Seconds each dial stage (resolve, connect) may take at most."""
        return self._connect_timeout

    def __repr__(self) -> str:
        return f"DirectOutbound(name={self.name!r})"

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        return DialedStream(await self.connect(target, deadline))

    @property
    def engine_dials(self) -> bool:
        """Whether the relay engine may dial for this outbound (not with a test's ``connect`` hook)."""
        return self._connect is None

    def engine_plan(
        self,
        target: Address,
        framing: Framing | None = None,
        head: bytes = b"",
        opened: Callable[[int], None] | None = None,
    ) -> EnginePlan | None:
        """The relay engine's dial of ``target`` (see :class:`EnginePlan`): only for an IP literal
        and the real connect (a test's ``connect`` hook needs Python). A node's leaf passes its
        server, ``framing``, ``head`` and ``opened``."""
        if target.ip is None or not self.engine_dials:
            return None
        mark = -1 if self._mark is None else self._mark
        return EnginePlan(target.host, target.port, mark, self._connect_timeout, framing, head, opened)

    async def connect(self, target: Address, deadline: float) -> socket.socket:
        """A connected, non-blocking socket to ``target`` (proxy outbounds reach their server with it)."""
        ip = target.ip
        if ip is not None:
            addresses = [ip]
        else:
            addresses = await self._resolve(
                target.host, min(deadline, self._clock.now() + self._connect_timeout)
            )
        connect_deadline = min(deadline, self._clock.now() + self._connect_timeout)
        if len(addresses) == 1:  # nothing to race: one attempt under one timer
            return await self._single(addresses[0], target.port, connect_deadline)
        return await self._race(interleave_families(addresses), target.port, connect_deadline)

    async def _single(self, ip: IPAddress, port: int, deadline: float) -> socket.socket:
        try:
            async with timeout_at(self._clock, deadline):
                return await self._attempt(ip, port)
        except TimeoutError:
            raise DialTimeout(
                self.name, "connect", f"port {port}: no connection before the deadline"
            ) from None
        except OSError as exc:
            raise self._failed([ip], port, [exc]) from None

    async def resolve(self, host: str, deadline: float) -> list[IPAddress]:
        """The addresses of ``host`` by this outbound's resolver, with typed ``resolve`` errors."""
        return await self._resolve(host, deadline)

    async def _resolve(self, host: str, deadline: float) -> list[IPAddress]:
        try:
            addresses = await wait_until(self._clock, deadline, self._resolver(host))
        except (TimeoutError, ResolveTimeout):
            raise DialTimeout(self.name, "resolve", f"{host}: no address before the deadline") from None
        except ResolveError as exc:
            raise DialError(self.name, "resolve", str(exc)) from None
        except OSError as exc:
            raise DialError(self.name, "resolve", f"{host}: {exc.strerror or exc}") from None
        if not addresses:
            raise DialError(self.name, "resolve", f"{host}: no address")
        return list(addresses)

    async def _race(self, addresses: list[IPAddress], port: int, deadline: float) -> socket.socket:
        clock = self._clock
        queue = deque(addresses)
        pending: set[asyncio.Task[socket.socket]] = set()
        errors: list[OSError] = []
        timer = asyncio.ensure_future(clock.sleep(deadline - clock.now()))
        stagger: asyncio.Future[None] | None = None
        try:
            start_next = True
            while True:
                if start_next and queue:
                    pending.add(asyncio.ensure_future(self._attempt(queue.popleft(), port)))
                    if stagger is not None:
                        stagger.cancel()
                    stagger = asyncio.ensure_future(clock.sleep(self._attempt_delay)) if queue else None
                start_next = False
                if not pending:
                    raise self._failed(addresses, port, errors)
                waiters: set[asyncio.Future] = {timer, *pending}
                if stagger is not None:
                    waiters.add(stagger)
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                winner: socket.socket | None = None
                unexpected: BaseException | None = None
                for task in done & pending:
                    pending.discard(task)
                    exc = task.exception()
                    if exc is None:
                        if winner is None:
                            winner = task.result()
                        else:
                            task.result().close()
                    elif isinstance(exc, OSError):
                        errors.append(exc)
                        start_next = True
                    else:
                        unexpected = exc
                if unexpected is not None:  # a bug, not a network failure: surface it
                    if winner is not None:
                        winner.close()
                    raise unexpected
                if winner is not None:
                    return winner
                if stagger is not None and stagger in done:
                    stagger = None
                    start_next = True
                if timer in done:
                    raise DialTimeout(self.name, "connect", f"port {port}: no connection before the deadline")
        finally:
            await self._cleanup(timer, stagger, pending)

    @staticmethod
    async def _cleanup(
        timer: asyncio.Future[None],
        stagger: asyncio.Future[None] | None,
        pending: set[asyncio.Task[socket.socket]],
    ) -> None:
        """Cancel the losers and close any socket one of them still produced."""
        leftovers: list[asyncio.Future] = [timer, *pending]
        if stagger is not None:
            leftovers.append(stagger)
        for fut in leftovers:
            fut.cancel()
        results = await asyncio.gather(*leftovers, return_exceptions=True)
        for result in results:
            if isinstance(result, socket.socket):
                result.close()

    async def _attempt(self, ip: IPAddress, port: int) -> socket.socket:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            if exc.errno in NO_CAPACITY:  # nothing was sent: a local limit, not the network
                raise CapacityRefused(f"{self.name}: no socket for the dial ({exc.strerror})") from None
            raise
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._apply_mark(sock)
            address = _sockaddr(ip, port)
            if self._connect is not None:
                await self._connect(sock, address)
            else:
                await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return sock

    def connected_udp(self, host: str, port: int) -> socket.socket:
        """A non-blocking UDP socket marked as this outbound's dials are, connected to the IP
        literal ``host`` and ``port`` (a leaf's own datagrams: DNS, DoQ, a node's relay).
        Raises OSError with nothing left open."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            self._apply_mark(sock)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def mark_socket(self, sock: socket.socket) -> None:
        """Put the bypass mark on ``sock`` (a leaf's own UDP socket, for example)."""
        self._apply_mark(sock)

    def _apply_mark(self, sock: socket.socket) -> None:
        if self._mark is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_MARK, self._mark)
        except PermissionError:
            # No CAP_NET_ADMIN: dial unmarked from now on, without noise.
            self._mark = None

    def _failed(self, addresses: list[IPAddress], port: int, errors: list[OSError]) -> ConnectFailed:
        codes = {e.errno for e in errors}
        code = codes.pop() if len(codes) == 1 else (errors[0].errno if errors else None)
        if len(errors) == 1:
            detail = errors[0].strerror or str(errors[0])
            message = f"{Address(str(addresses[0]), port)}: {detail}"
        else:
            parts = "; ".join(e.strerror or str(e) for e in errors)
            message = f"port {port}: all {len(errors)} attempts failed ({parts})"
        return ConnectFailed(self.name, message, code, tuple(errors))
