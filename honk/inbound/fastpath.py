"""The SOCKS5 CONNECT fast path of the mixed inbound: the relay engine accepts and shakes hands.

Why: per connection, the asyncio path costs a protocol object, a StreamConn, a
task, the codec, the dial (socket, setsockopt, sock_connect), two reply
writes, getsockname and the fd handoff to the relay engine (dup, abort,
eventfd): about 400 µs of CPU on the loop's thread. Here the listening
socket is given to the relay engine (:meth:`Engine.listen`), whose worker
thread does every system call of the common case without the GIL, and Python
does only what needs Python: routing and the connection table.

One client, common case (a complete greeting offering "no authentication",
then a complete CONNECT to an IPv4, IPv6 or domain target):

1. the worker accepts, answers ``05 00``, checks the request and emits ONE
   ``socks_request(token, source, target)`` event;
2. :meth:`SocksFastPath.socks_request` routes the flow (``Dispatcher.route_now``:
   the plane's sans-I/O router, synchronously; a task only when a rule needs DNS)
   and sends ONE command: ``hs_connect`` when the leaf offers the engine a dial
   (``Dispatcher.engine_dial``: direct to an IP target, or a Shadowsocks, plain-TCP
   VMess, or TCP + TLS Trojan, VLESS or VMess node whose server is an IP literal; the worker
   dials with TCP_NODELAY and SO_MARK, makes the TLS handshake when there is one, sends
   the node's request header, replies with the bound address and relays through the
   node's framing), ``hs_relay`` (Python dialled: a domain target through Happy
   Eyeballs, WebSocket or mux nodes, a pick a group would retry, a ready connection, a
   dial waiting for its permit) or ``hs_reject`` (Blocked,
   NoRoute, dial errors: the same :func:`~honk.proto.socks5.reply_for` codes and
   ``flow refused`` line);
3. the connect deadline is on the injected clock (a heap entry of the path's
   :class:`~honk.core.clock.Deadlines`, one timer for all): when it passes first,
   the flow is cancelled with reply ``0x06`` and logged as ``DialTimeout``;
4. ``EV_OPEN`` (connected, reply queued) registers the flow in the tracker with
   its rule and chain through ``Dispatcher.track``, which writes the flow's
   ``flow opened …`` line as for every path; the tracker handle is a :class:`FastFlow`, a
   :class:`~honk.relay.native.NativeRelay` reading the engine's counters, so
   close by id, the idle sweeper and shutdown drain work unchanged.

Everything else is handed over: HTTP, SOCKS5 asking for authentication, BIND,
UDP ASSOCIATE, malformed or truncated bytes, a message split over several
reads, a client that errs or takes longer than ``HS_HANDOVER_AFTER`` (one
second of CLOCK_MONOTONIC) over its handshake. The worker stops reading and
emits ``socks_handover(fd, data, answered, err, …)``; the inbound wraps the fd
in its usual ``_ClientConn`` and serves it exactly as an asyncio-accepted
connection, replaying ``data`` through the same codec and skipping the
``answered`` reply bytes the worker already sent. Refusals and the
``flow ended during handshake …`` lines therefore come from one codec, not a
C copy of it; a handed-over client gets the full ``HANDSHAKE_TIMEOUT`` of the
injected clock from the handover on.

Per connection on the loop's thread: one request event, one command, the connect
deadline (a heap entry of the path's ``Deadlines``; the verdict's response deadline
is another, only for a flow whose client bytes are told before its answer), one
:class:`FastFlow`, one tracker entry, and the relay's events: four for a short flow
(opened, first byte with the totals so far, final bytes, end).
Routing is never cached. The pure-Python twin of the engine implements the
same listener mode on the event loop, so the same tests run over both.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from honk._fast import relay as _relay
from honk.connection import scoring
from honk.connection.dispatch import EngineDial, Routed, log_failed_end
from honk.connection.verdict import FlowVerdict, observe_flow
from honk.core.clock import Deadlines
from honk.core.errors import AuthenticationFailed, Blocked, ClientGone, DialTimeout, FlowClosed, HonkError
from honk.core.logs import kv
from honk.core.net import Address, FlowMeta, Network
from honk.core.stats import ACCEPT_EXHAUSTED
from honk.outbound.block import BlockOutbound
from honk.outbound.bridge import relay_end
from honk.outbound.direct import ConnectFailed
from honk.outbound.tls import handshake_failed
from honk.proto.framing import Framing
from honk.proto.socks5 import reply_for
from honk.proto.tls_framing import TlsFraming
from honk.relay.events import EndCause, RelayEnd, Side, decode_end
from honk.relay.native import NativeRelay, native_available, shared_engine, shared_engines

if TYPE_CHECKING:
    from honk.inbound.mixed import MixedInbound

__all__ = ["FastFlow", "SocksFastPath", "SocksFastPaths", "fastpath_engine", "handshake_workers"]

log = logging.getLogger("honk.inbound")
conn_log = logging.getLogger("honk.connection")  # the logger of Dispatcher.relay's line

# Relay engines (one worker thread each) that accept on a mixed inbound's sockets once its engine
# dials a TLS handshake: one worker queues the handshakes' crypto behind each other while part of
# the machine idles (Trojan/TLS on the 2-core test machine: +5 % conn/s at c=16, +12 % at c=64 with
# two), and for flows without a handshake a second worker only adds wake-ups (Shadowsocks: -4 %).
# ``HONK_FASTPATH_WORKERS`` overrides it (1: never a second); never more than the CPUs.
FASTPATH_WORKERS = int(os.environ.get("HONK_FASTPATH_WORKERS", "2"))

# Reply code for a connect cancelled by its deadline (Reply.TTL_EXPIRED, as reply_for(DialTimeout)).
_TIMEOUT_CODE = 0x06
_GENERAL_FAILURE = 0x01
_NOT_ALLOWED = 0x02  # Reply.NOT_ALLOWED

_EV_OPEN = _relay.EV_OPEN
_EV_END = _relay.EV_END
_ENDED = object()  # FastFlow.tracked once its tracker entry was released (never None: it connected)


def handshake_workers(loop: asyncio.AbstractEventLoop) -> Callable[[], list[Any]] | None:
    """What :class:`SocksFastPaths` calls for its other engines once a TLS handshake is dialled:
    the loop's shared engines after the first, :data:`FASTPATH_WORKERS` in all, one per CPU at
    most; None over the twin (its engines run on the loop's own thread: nothing to gain)."""
    if not native_available():
        return None
    count = max(1, min(FASTPATH_WORKERS, os.cpu_count() or 1))
    return lambda: shared_engines(count, loop)[1:]


def fastpath_engine(inbound_users: tuple, loop: asyncio.AbstractEventLoop) -> Any:
    """The engine to give the listening socket to, or ``None`` for the asyncio path.

    ``HONK_FASTPATH``: ``auto`` (default: on when the compiled engine is built),
    ``on`` (also over the pure-Python twin, e.g. with ``HONK_NO_EXTENSIONS=1``),
    ``off``. Never with inbound users (authentication is Python's) or with
    ``HONK_RELAY=copy``. Read at each inbound start.
    """
    choice = os.environ.get("HONK_FASTPATH", "auto").strip().lower()
    if choice in ("off", "0", "no", "false") or inbound_users:
        return None
    if os.environ.get("HONK_RELAY", "").strip().lower() == "copy":
        return None
    if choice in ("auto", "") and not native_available():
        return None
    engine = shared_engine(loop)
    return engine if hasattr(engine, "listen") else None


class FastFlow(NativeRelay):
    """One fast-path flow: the engine's listener for it and its tracker handle."""

    def __init__(self, path: SocksFastPath, routed: Routed) -> None:
        super().__init__(path.clock, path.engine)
        self.routed = routed
        self.tracked: Any = None
        self.timer: Any = None
        self._path = path
        self.reporter = routed.reporter  # Score: the Python dial's reporter, or the engine dial's (EV_OPEN)
        self.dial: EngineDial | None = None  # the engine's own dial, until EV_OPEN or refusal
        self.bridge: Any = None  # DialedStream.bridge: how a bridged upstream's server side ended
        # the flow's verdict on its node and its Score byte counts (None: nobody listens)
        self.verdict: FlowVerdict | None = None
        self._listen(self.reporter)

    def _listen(self, reporter: Any) -> FlowVerdict | None:
        path = self._path
        self.verdict = observe_flow(
            path.clock,
            self.routed.leaf,
            reporter,
            path._dispatcher.global_spec.response_timeout,
            path._deadlines,
        )
        self.observer = self.verdict
        return self.verdict

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        # called four times per short flow: the event kinds are module constants, the base called directly
        if kind == _EV_OPEN:
            self._path._opened(self, b)
        elif kind == _EV_END:
            end = decode_end(a, b)
            if self.tracked is None:  # ended before it connected
                self._ended = True
                self._id = None
                self._path._refused(self, end)
            else:
                self.ended(end)
                self._path._ended(self)
        else:
            NativeRelay.relay_event(self, kind, a, b, t)

    def deadline(self) -> None:
        """The connect deadline passed: reply 0x06 unless the flow connected meanwhile."""
        self.timer = None
        if self.tracked is None and self._id is not None and self._error is None:
            port = self.routed.meta.target.port
            self._error = DialTimeout(
                self.routed.leaf.name, "connect", f"port {port}: no connection before the deadline"
            )
            self._engine.cancel(self._id, _TIMEOUT_CODE)


class SocksFastPaths:
    """One mixed inbound's fast path, over one engine and, once that engine dials a TLS
    handshake, over :data:`FASTPATH_WORKERS` (``more`` gives the others): every engine accepts
    on the same sockets and the kernel hands each connection to one of them. The lifecycle of
    one :class:`SocksFastPath` per engine, as one."""

    def __init__(
        self, inbound: MixedInbound, engine: Any, more: Callable[[], list[Any]] | None = None
    ) -> None:
        self._inbound = inbound
        self._more = more  # None: this one engine for good
        self._socks: list[socket.socket] = []
        self._accepting = False
        self.paths = [SocksFastPath(inbound, engine, self)]

    def listen(self, socks: list[socket.socket]) -> None:
        self._socks = list(socks)
        self.paths[0].listen(self._socks)
        self._accepting = True

    def handshake_dialled(self) -> None:
        """A path's engine dials a TLS handshake: the other workers start accepting (once)."""
        more, self._more = self._more, None
        if more is None or not self._accepting:
            return
        for engine in more():
            path = SocksFastPath(self._inbound, engine, self)
            try:
                path.listen(self._socks)
            except Exception as exc:  # noqa: BLE001 - the first engine serves on regardless
                path.stop_accepting()
                log.warning(
                    "fast path worker unavailable %s", kv(inbound=self._inbound.name, error=repr(exc))
                )
                return
            self.paths.append(path)
        log.debug("fast path workers %s", kv(inbound=self._inbound.name, workers=len(self.paths)))

    def stop_accepting(self) -> None:
        self._accepting = False
        for path in self.paths:
            path.stop_accepting()

    async def aclose(self) -> None:
        self._accepting = False
        for path in self.paths:
            await path.aclose()

    def close_tag(self, tag: str | None, error: HonkError, *, drop: bool) -> int:
        return sum(path.close_tag(tag, error, drop=drop) for path in self.paths)

    @property
    def live(self) -> int:
        return sum(path.live for path in self.paths)

    async def wait_closed(self) -> None:
        while self.live:
            for path in self.paths:
                await path.wait_closed()


class SocksFastPath:
    """The engine-side listener of one mixed inbound on one engine (see the module docstring)."""

    def __init__(self, inbound: MixedInbound, engine: Any, group: SocksFastPaths | None = None) -> None:
        self.inbound = inbound
        self.engine = engine
        self._group = group  # told when this engine dials a TLS handshake
        self.clock = inbound._clock
        self._dispatcher = inbound._dispatcher
        self._lids: list[int] = []
        self._socks: list[socket.socket] = []  # the listening sockets (their address names a rest)
        self._resolved = 0  # accepted connections the engine has told us about
        self._flows: set[FastFlow] = set()  # from the command until END
        self._tasks: dict[asyncio.Task[None], str] = {}  # routing that needs DNS, dials by Python -> tag
        self._changed: asyncio.Future[None] | None = None
        self._deadlines = Deadlines(self.clock)  # the flows' connect and response deadlines, on one timer

    # -- lifecycle -----------------------------------------------------------------------

    def listen(self, socks: list[socket.socket]) -> None:
        self._socks = list(socks)
        for sock in socks:
            self._lids.append(self.engine.listen(sock.fileno(), self))

    def stop_accepting(self) -> None:
        if not self.engine.closed:
            for lid in self._lids:
                self.engine.unlisten(lid)

    async def aclose(self) -> None:
        """End every client this path serves: in the worker's handshake, routing or relaying."""
        if not self.engine.closed:
            for lid in self._lids:
                self.engine.unlisten(lid, True)
        for task in list(self._tasks):
            task.cancel()
        for flow in list(self._flows):
            if flow._id is not None:
                flow.close(FlowClosed("inbound closed"))
        await self.wait_closed()

    def close_tag(self, tag: str | None, error: HonkError, *, drop: bool) -> int:
        """End the clients of inbound ``tag`` (``None``: all) this path routes, dials or relays;
        ``drop``: also the ones still in the worker's handshake (this listener has stopped
        and its tag was closed, so whatever they ask is refused anyway). Returns how many
        were ended (handshakes dropped in the worker are not counted: they never opened)."""
        if drop and not self.engine.closed:
            for lid in self._lids:
                self.engine.unlisten(lid, True)
        ended = 0
        for task, task_tag in list(self._tasks.items()):
            if (tag is None or task_tag == tag) and not task.done():
                task.cancel()
                ended += 1
        for flow in list(self._flows):
            if (
                (tag is None or flow.routed.meta.inbound == tag)
                and flow._id is not None
                and flow._error is None
            ):
                flow.close(error)
                ended += 1
        return ended

    @property
    def live(self) -> int:
        """Clients in the worker's handshake, being routed or dialled, or relaying."""
        engine = self.engine
        in_worker = 0
        if not engine.closed:
            in_worker = sum(engine.accepted(lid) for lid in self._lids) - self._resolved
        return max(in_worker, 0) + len(self._flows) + len(self._tasks)

    async def wait_closed(self) -> None:
        while self.live:
            if self._changed is None or self._changed.done():
                self._changed = asyncio.get_running_loop().create_future()
            await self._changed

    def _changed_now(self) -> None:
        changed = self._changed
        if changed is not None and not changed.done():
            changed.set_result(None)

    # -- engine events --------------------------------------------------------------------

    def socks_dropped(self) -> None:
        self._resolved += 1
        self._changed_now()

    def socks_rested(self, err: int) -> None:
        """The engine's accept found no descriptor, buffer or memory and rests a moment: reported
        as asyncio's own servers report theirs, so the loop guard counts and warns once."""
        asyncio.get_running_loop().call_exception_handler(
            {
                "message": ACCEPT_EXHAUSTED,
                "exception": OSError(err, os.strerror(err)),
                "socket": self._socks[0] if self._socks else None,
            }
        )

    def socks_handover(
        self, fd: int, data: bytes, answered: int, err: int, src_host: str, src_port: int
    ) -> None:
        self._resolved += 1
        self.inbound._adopt(fd, data, answered, err, Address(src_host, src_port))
        self._changed_now()

    def socks_request(self, token: int, src_host: str, src_port: int, host: str, port: int) -> None:
        self._resolved += 1
        if self.engine.closed:  # delivered by close(): the engine frees the handshake itself
            return
        source = Address(src_host, src_port)
        target = Address(host, port)
        meta = FlowMeta(Network.TCP, source, target, self.inbound.name)
        if self.inbound.requires_auth:
            # The listener moved to the asyncio path for authentication; the worker may have
            # accepted this client after the move, so it never skips the password.
            self.inbound._refused(
                meta.inbound, source, target, AuthenticationFailed("the inbound requires authentication")
            )
            self.engine.hs_reject(token, _NOT_ALLOWED)
            return
        try:
            routed = self._dispatcher.route_now(meta)
            if routed is None:
                self._spawn(self._route_and_dial(token, meta), meta.inbound)
            else:
                self._dial(token, routed)
        except HonkError as exc:
            self._reject(token, meta, exc)
        except Exception:
            log.exception("flow crashed inbound=%s source=%s", self.inbound.name, source)
            self.engine.hs_reject(token, _GENERAL_FAILURE)

    # -- one flow ------------------------------------------------------------------------------

    def _dial(self, token: int, routed: Routed) -> None:
        """Send the one command that answers a routed request."""
        leaf = routed.leaf
        if type(leaf) is BlockOutbound:
            error = Blocked(f"{leaf.name}: {routed.meta.target} is blocked")
            self._count_dial(error, leaf.name)
            self._reject(token, routed.meta, error)
            return
        try:
            dial = self._dispatcher.engine_dial(routed)  # a spent descriptor budget refuses here
        except HonkError as exc:
            self._reject(token, routed.meta, exc)
            return
        if dial is None:
            self._spawn(self._dial_async(token, routed), routed.meta.inbound)
            return
        flow = FastFlow(self, routed)
        flow.dial = dial
        plan = dial.plan
        if self._group is not None and type(plan.framing) is TlsFraming:
            self._group.handshake_dialled()
        flow.framing = plan.framing
        try:
            flow._id = self.engine.hs_connect(
                token, plan.ip, plan.port, plan.mark, flow, plan.framing, plan.head
            )
        except BaseException:
            dial.failed(FlowClosed("the relay engine refused the flow"))
            raise
        self._flows.add(flow)
        flow.timer = self._deadlines.at(dial.deadline, flow.deadline)

    def _spawn(self, coro: Any, tag: str) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[task] = tag
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        tag = self._tasks.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None:  # retrieved: the flow only
            log.error("flow crashed inbound=%s", tag, exc_info=(type(exc), exc, exc.__traceback__))
        self._changed_now()

    async def _route_and_dial(self, token: int, meta: FlowMeta) -> None:
        try:
            routed = await self._dispatcher.route(meta)
        except HonkError as exc:
            self._reject(token, meta, exc)
            return
        except BaseException:
            self._abandon(token)
            raise  # cancelled, or a bug: _task_done logs it
        self._dial(token, routed)

    async def _dial_async(self, token: int, routed: Routed) -> None:
        meta = routed.meta
        try:
            routed, dialed = await self._dispatcher.dial_routed(routed)
        except HonkError as exc:
            self._reject(token, meta, exc)
            return
        except asyncio.CancelledError:
            self._abandon(token)
            raise
        except Exception:  # a bug or a local failure the dial did not type: this flow only
            log.exception("flow crashed inbound=%s source=%s", meta.inbound, meta.source)
            self._abandon(token)
            return
        flow = FastFlow(self, routed)
        flow.framing = dialed.framing
        flow.bridge = dialed.bridge
        fd = dialed.sock.detach()
        try:
            flow._id = self.engine.hs_relay(token, fd, flow, dialed.framing)
        except BaseException as exc:
            os.close(fd)
            self._abandon(token)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning(
                "flow refused by the relay engine %s",
                kv(inbound=meta.inbound, source=meta.source, error=type(exc).__name__, reason=str(exc)),
            )
            return
        self._flows.add(flow)

    def _abandon(self, token: int) -> None:
        if not self.engine.closed:
            try:
                self.engine.hs_reject(token, _GENERAL_FAILURE)
            except (ValueError, _relay.EngineClosed):
                pass

    def _reject(self, token: int, meta: FlowMeta, error: HonkError) -> None:
        self.inbound._refused(meta.inbound, meta.source, meta.target, error)
        self.engine.hs_reject(token, int(reply_for(error)))

    def _opened(self, flow: FastFlow, facts: int = 0) -> None:
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        routed = flow.routed
        flow.last_activity = self.clock.now()
        if flow.dial is not None:
            flow.reporter = flow.dial.opened(facts)
            flow.dial = None
            if flow.reporter is not None:
                flow._listen(flow.reporter)
        flow.tracked = self._dispatcher.track(routed, flow)  # and its `flow opened` line
        if flow._error is not None and flow._id is not None:  # closed while it connected
            self.engine.cancel(flow._id)

    def _ended(self, flow: FastFlow) -> None:
        self._flows.discard(flow)
        end = relay_end(flow.error, flow.bridge)
        if flow.bridge is not None:
            flow.bridge.relay_ended()
        log_failed_end(flow.routed, end, flow.bridge is not None)
        if flow.verdict is not None:
            flow.verdict.end(end)
        scoring.settle_relay(flow.reporter, self.clock, end)
        # The flow and its tracker entry point at each other: unlinked here, both go as soon as
        # nothing else holds them, not at a collector pass (which freed their TLS state too).
        tracked, flow.tracked = flow.tracked, _ENDED
        tracked.release()
        self._changed_now()

    def _refused(self, flow: FastFlow, end: RelayEnd) -> None:
        """END before EV_OPEN: the connect failed, timed out or was cancelled (reply sent)."""
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        self._flows.discard(flow)
        if flow.bridge is not None:
            flow.bridge.relay_ended()
        meta = flow.routed.meta
        error = flow._error
        if error is None:
            err = end.errno
            if end.side is Side.CLIENT:
                error = ClientGone(f"client went away during the connect: {os.strerror(err)}")
            elif end.side is Side.UPSTREAM and _shook_hands(flow.framing):
                error = handshake_failed(
                    flow.routed.leaf.name, flow.framing.handshake, flow.framing.tls_detail, err
                )
            elif end.cause is EndCause.ERROR:
                dialled = (
                    meta.target if flow.dial is None else Address(flow.dial.plan.ip, flow.dial.plan.port)
                )
                reason = os.strerror(err)
                error = ConnectFailed(
                    flow.routed.leaf.name, f"{dialled}: {reason}", err, (OSError(err, reason),)
                )
            else:
                error = FlowClosed("relay engine closed")
        elif isinstance(error, DialTimeout) and _shook_hands(flow.framing):
            error = flow._error = DialTimeout(
                flow.routed.leaf.name, "tls", "no TLS handshake before the deadline"
            )
        flow._error = error
        if flow.dial is not None:
            flow.dial.failed(error)
            flow.dial = None
        if isinstance(error, ClientGone):
            log.debug(
                "flow ended inbound=%s source=%s error=%s reason=%s",
                meta.inbound,
                meta.source,
                type(error).__name__,
                "client-gone",
            )
        elif not isinstance(error, FlowClosed):
            self.inbound._refused(meta.inbound, meta.source, meta.target, error)
        self._changed_now()

    def _count_dial(self, error: HonkError | None, outbound: str) -> None:
        """Block refusals never reach the dispatcher's dial path: count them here, like it
        counts its own (the engine's own dials are counted by their :class:`EngineDial`)."""
        stats = self._dispatcher.stats
        if stats is not None:
            stats.dial("tcp", error, outbound)


def _shook_hands(framing: Framing | None) -> TypeGuard[TlsFraming]:
    """Whether the engine began a TLS handshake for this flow and it never finished."""
    report = framing.handshake if isinstance(framing, TlsFraming) else None
    return report is not None and report.started and not report.finished


def bind_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host``:``port`` as ``loop.create_server`` binds them
    (every address ``host`` resolves to, SO_REUSEADDR, IPV6_V6ONLY when several)."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    seen = set()
    unique = []
    for info in infos:
        if (info[0], info[4]) not in seen:
            seen.add((info[0], info[4]))
            unique.append(info)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _name, addr in unique:
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(unique) > 1:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"error while attempting to bind on address {addr!r}: {exc.strerror}"
                ) from None
            sock.listen(backlog)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def close_listening(socks: list[socket.socket]) -> None:
    """Stop listening now: ``shutdown`` takes the port back even while the engine's dup lives."""
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RD)
        except OSError as exc:
            if exc.errno not in (_errno.ENOTCONN, _errno.EINVAL):
                log.debug("shutdown of a listening socket failed: %s", exc)
        sock.close()
