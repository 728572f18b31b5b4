"""The mixed inbound: SOCKS5 and HTTP proxy on one TCP port.

The first byte decides: ``0x05`` is SOCKS5, anything else is HTTP. Each
accepted connection is served by its own task, owned by the inbound.

When the relay engine can listen (:func:`honk.inbound.fastpath.fastpath_engine`:
compiled engine, no inbound users, ``HONK_RELAY`` not ``copy``), the engine's
worker (and, once it dials a TLS handshake, ``FASTPATH_WORKERS`` engines' workers, on the same
sockets) accepts and serves plain SOCKS5 CONNECTs itself
(:mod:`honk.inbound.fastpath`); every other client is handed over to the
path described here, with the bytes the worker already read.

Lifecycle (what the reload reconciler drives, RL-28/29/42):
  * ``bind()`` binds and listens but accepts nothing: clients wait in the
    backlog until ``serve()`` (commit) starts accepting, or
    ``close_unserved()`` (a refused apply) releases the port.
  * ``swap(spec)`` and ``store_users(admissions)`` install a new *handler*
    (tag, user table, settings) on the same listening socket. A connection is
    served with the handler current when it was accepted, to its end. A swap
    that adds users to a port the fast path serves hands the same listening
    socket (same inode) to an asyncio server: the engine cannot authenticate.
  * Every accepted connection opens a session in the daemon's
    :class:`~honk.inbound.sessions.SessionRegistry` under the tag it was
    accepted for; sessions outlive their listener (``stop_accepting`` never
    ends one) and end by tag or by revoked principal.

Failure policy (one flow never hurts another):
  * A client that sends malformed bytes, stops half-way, vanishes, or does not
    finish its handshake within :data:`HANDSHAKE_TIMEOUT` (clock seconds) ends
    only its own flow, with a typed error and one log line on ``honk.inbound``:
    ``flow ended during handshake inbound=… source=… error=… reason=…``.
  * Routing and dialing failures are answered in the client's protocol
    (:func:`honk.proto.socks5.reply_for`, :func:`honk.inbound.http.status_for`):
    Blocked → SOCKS5 ``0x02`` / HTTP 403; NoRoute → ``0x02`` / 502;
    DialTimeout → ``0x06`` / 504; other DialErrors → ``0x01``/``0x03``/
    ``0x04``/``0x05`` by errno / 502. One log line:
    ``flow refused inbound=… source=… target=… error=…``.
  * A session whose first flow presents a revoked principal is refused
    (``0x02`` / 403) under every removal policy (RL-57).
  * Anything unexpected is logged with its traceback and ends that flow only.

HTTP absolute-form requests are forwarded one at a time with ``h11`` on both
sides (a response is relayed completely before the next request is read);
the upstream connection is reused while requests go to the same host, and
each upstream connection is one flow in the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import h11

from honk.config.spec import InboundSpec
from honk.connection import scoring
from honk.connection.descriptors import DescriptorsExhausted
from honk.connection.dispatch import Dispatcher, Upstream
from honk.connection.udp import UdpAssociation
from honk.core.clock import Clock, TimerHandle
from honk.core.errors import (
    AuthenticationFailed,
    Blocked,
    ClientGone,
    ClientProtocolError,
    FlowClosed,
    HandshakeTimeout,
    HonkError,
    IdleTimeout,
    NotSupported,
    OutboundDrained,
    UpstreamFailed,
)
from honk.core.logs import kv
from honk.core.net import Address, FlowMeta, Network
from honk.inbound import http as http_proto
from honk.inbound.http import MAX_HEAD_SIZE, HttpProxyServerConnection, ProxyRequest
from honk.inbound.lifecycle import BindThenServe
from honk.inbound.sessions import USER_REMOVED_TEXT, Principal, Session, SessionRegistry, admit, authenticate
from honk.outbound.bridge import relay_end
from honk.proto import socks5
from honk.relay.native import framed_socket
from honk.relay.stream import StreamConn

__all__ = ["HANDSHAKE_TIMEOUT", "MixedInbound"]

log = logging.getLogger("honk.inbound")

# Seconds (of the injected clock) a client has from accept until its proxy
# request is complete; a slow or silent client is cut off after this.
HANDSHAKE_TIMEOUT = 10.0

# Pending connections a listening socket queues (the kernel caps it at somaxconn):
# the fast path's worker accepts in bursts, and between bind() and serve() every
# client waits here; a deep queue absorbs connect storms.
FAST_BACKLOG = 4096

FORBIDDEN = 403  # the HTTP status of a refused flow (a revoked user's, a blocked target's)


def _reason(error: BaseException) -> str:
    if isinstance(error, ClientProtocolError):
        return error.reason
    return {
        ClientGone: "client-gone",
        HandshakeTimeout: "timeout",
        AuthenticationFailed: "auth-failed",
        NotSupported: "not-supported",
        FlowClosed: "closed",
        OutboundDrained: "drained",
        IdleTimeout: "idle",
    }.get(type(error), "-")


@dataclass(frozen=True, slots=True, eq=False)
class _Handler:
    """What a connection is served with, fixed when it is accepted: a swap or a stored user
    table installs a new handler, connections already open keep theirs (RL-42)."""

    spec: InboundSpec
    admissions: Mapping[str, Principal]  # username -> principal; empty: no authentication

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def requires_auth(self) -> bool:
        return bool(self.admissions)

    def authenticate(self, username: str, password: str) -> Principal | None:
        return authenticate(self.admissions, username, password)


class _Watchdog:
    """Fails a stream with an error once a clock deadline passes, unless disarmed first.

    A plain clock timer, not a task: one is armed for every accepted connection.
    """

    def __init__(self, clock: Clock, conn: StreamConn) -> None:
        self._clock = clock
        self._conn = conn
        self._timer: TimerHandle | None = None

    def arm(self, seconds: float, error: HonkError) -> None:
        self.disarm()
        self._timer = self._clock.call_later(seconds, lambda: self._conn.fail(error))

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_UNKNOWN_SOURCE = Address("0.0.0.0", 0)


class _ClientConn(StreamConn):
    def __init__(
        self,
        inbound: MixedInbound,
        source: Address = _UNKNOWN_SOURCE,
        pre: tuple[bytes, int, int] | None = None,
    ) -> None:
        super().__init__(ClientGone)
        self._inbound = inbound
        self.source = source
        # handed over by the fast path: (bytes read, reply bytes already sent, errno)
        self.pre = pre
        # set at accept (for a handover: when the fast path hands it over)
        self.handler: _Handler | None = None
        self.session: Session | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.source is _UNKNOWN_SOURCE:
            # Read at once: uvloop looks the peer up lazily, which fails after a reset.
            peer = transport.get_extra_info("peername")
            if peer:
                self.source = Address(peer[0], peer[1])
        self._inbound._accepted(self)


class MixedInbound(BindThenServe):
    """A SOCKS5 + HTTP proxy listener.

    ``bind()`` binds and listens (port 0 picks a free port; ``bound`` is then the
    listening address) without accepting; ``serve()`` starts accepting; ``start()``
    is both. ``stop_accepting()`` closes the listener and leaves live sessions alone;
    ``aclose()`` also ends every connection this listener accepted.
    """

    def __init__(
        self,
        spec: InboundSpec,
        dispatcher: Dispatcher,
        clock: Clock,
        *,
        engine: Any = None,
        sessions: SessionRegistry | None = None,
    ) -> None:
        """``engine``: the relay engine for the SOCKS5 fast path (tests pass the compiled
        engine or its twin: the fast path then keeps that one worker); default
        :func:`~honk.inbound.fastpath.fastpath_engine`, joined by
        :func:`~honk.inbound.fastpath.handshake_workers` once it dials a TLS handshake.
        ``sessions``: the daemon's session registry; default a registry of this inbound's own."""
        self.spec = spec
        self.name = spec.name
        self._dispatcher = dispatcher
        self._clock = clock
        self._handler = _Handler(spec, admit(None, spec.name, spec.users)[0])
        self._sessions = sessions if sessions is not None else SessionRegistry()
        self._socks: list[socket.socket] = []  # the listening sockets bind() made; ours until stop
        self._servers: list[asyncio.AbstractServer] = []  # asyncio servers accepting on them
        self._moving: asyncio.Task[None] | None = None  # sockets moving from the engine to asyncio
        self._tasks: set[asyncio.Task[None]] = set()
        self._engine = engine
        self._fast: Any = (
            None  # SocksFastPaths once the engines served the port (kept for their live clients)
        )
        self._fast_socks: list[socket.socket] = []  # the sockets the engine accepts on now
        self._serving = False
        self._stopped = False
        self.bound: Address | None = None

    # -- handler -----------------------------------------------------------------------

    @property
    def admissions(self) -> Mapping[str, Principal]:
        """The user table handshakes authenticate against now (username -> principal)."""
        return self._handler.admissions

    @property
    def requires_auth(self) -> bool:
        """Whether connections accepted now must authenticate."""
        return self._handler.requires_auth

    def swap(self, spec: InboundSpec, admissions: Mapping[str, Principal] | None = None) -> None:
        """Serve connections accepted from now with ``spec`` (tag, users, settings) on the
        same listening socket; open connections keep what they started with.

        ``admissions``: the principals the reconciler admitted for ``spec`` (RL-31); when
        omitted, ``spec.users`` are admitted against the running table of the same tag
        (unchanged users keep their principals; nothing is revoked here).
        """
        if (spec.host, spec.port) != (self.spec.host, self.spec.port):
            raise ValueError(f"inbound {spec.name}: a swap keeps the listener's bind")
        if admissions is None:
            running = self._handler.admissions if spec.name == self.name else None
            admissions = admit(running, spec.name, spec.users)[0]
        old = self.name
        self.spec = spec
        self.name = spec.name
        self._install(_Handler(spec, dict(admissions)))
        log.debug("inbound handler swapped %s", kv(inbound=spec.name, previous=old, users=len(admissions)))

    def store_users(self, admissions: Mapping[str, Principal]) -> None:
        """The table handshakes of connections accepted from now authenticate against."""
        self._install(replace(self._handler, admissions=dict(admissions)))

    def _install(self, handler: _Handler) -> None:
        self._handler = handler
        if handler.requires_auth and self._fast_socks:
            self._move_to_asyncio()

    def _move_to_asyncio(self) -> None:
        """The engine cannot authenticate: the same listening sockets go to an asyncio server.

        The engine closes only its own dup; our socket keeps listening, so the port, the
        inode and the clients queued in the backlog stay. Clients the worker holds keep
        being served by it (and any it accepts before the unlisten lands are refused:
        ``SocksFastPath.socks_request`` checks :attr:`requires_auth`)."""
        socks, self._fast_socks = self._fast_socks, []
        self._fast.stop_accepting()
        self._moving = asyncio.get_running_loop().create_task(self._serve_asyncio(socks))
        log.debug("inbound moved off the fast path %s", kv(inbound=self.name, reason="users"))

    # -- lifecycle ---------------------------------------------------------------------

    async def bind(self) -> None:
        """Bind and listen; accept nothing yet (clients queue in the backlog). Raises
        OSError and leaves nothing open on failure."""
        from honk.inbound import fastpath

        if self._socks or self._serving or self._stopped:
            raise RuntimeError(f"inbound {self.name}: bind() is called once, first")
        socks = fastpath.bind_sockets(self.spec.host, self.spec.port, FAST_BACKLOG)
        for sock in socks:
            sock.setblocking(False)
        self._socks = socks
        sockname = socks[0].getsockname()
        self.bound = Address(sockname[0], sockname[1])
        self._sessions.attach(self)

    async def serve(self) -> None:
        """Start accepting on the sockets :meth:`bind` made (the fast path when it can)."""
        from honk.inbound import fastpath

        if not self._socks or self._serving or self._stopped:
            raise RuntimeError(f"inbound {self.name}: serve() needs bound, unserved sockets")
        self._serving = True
        loop = asyncio.get_running_loop()
        engine, more = self._engine, None
        if engine is None:
            engine = fastpath.fastpath_engine(tuple(self._handler.admissions), loop)
            more = fastpath.handshake_workers(loop)
        elif self._handler.requires_auth:
            engine = None
        if engine is not None:
            fast = fastpath.SocksFastPaths(self, engine, more)
            try:
                fast.listen(self._socks)
            except Exception as exc:  # noqa: BLE001 - serving is commit: the asyncio path always works
                fast.stop_accepting()
                log.warning("inbound fast path unavailable %s", kv(inbound=self.name, error=repr(exc)))
            else:
                self._fast = fast
                self._fast_socks = list(self._socks)
        if not self._fast_socks:
            await self._serve_asyncio(self._socks)
        log.info("inbound listening inbound=%s kind=mixed address=%s", self.name, self.bound)

    async def _serve_asyncio(self, socks: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in socks:
            server = await loop.create_server(lambda: _ClientConn(self), sock=sock, backlog=FAST_BACKLOG)
            self._servers.append(server)

    def close_unserved(self) -> None:
        """Release sockets :meth:`bind` made and nothing served (a refused apply): the
        port can be bound again at once."""
        from honk.inbound.fastpath import close_listening

        if self._serving:
            raise RuntimeError(f"inbound {self.name}: close_unserved() after serve(); use stop_accepting()")
        self._stopped = True
        socks, self._socks = self._socks, []
        close_listening(socks)
        self._sessions.detach(self)

    async def stop_accepting(self) -> None:
        """Stop accepting; sessions already open go on (RL-43). Idempotent."""
        self._stopped = True
        moving, self._moving = self._moving, None
        if moving is not None and not moving.done():
            moving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await moving
        if self._fast is not None:
            self._fast.stop_accepting()
        socks, self._socks, self._fast_socks = self._socks, [], []
        servers, self._servers = self._servers, []
        for sock in socks:
            # shutdown takes the port back at once, even while an engine's dup of it lives
            if sock.fileno() >= 0:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)
        for server in servers:
            server.close()
        for sock in socks:
            sock.close()

    async def aclose(self) -> None:
        await self.stop_accepting()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if self._fast is not None:
            await self._fast.aclose()
        tasks = list(self._tasks)  # handed over while the fast path closed
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._sessions.detach(self)

    async def wait_closed(self) -> None:
        """Wait until every connection this inbound accepted so far has ended."""
        while self._tasks or (self._fast is not None and self._fast.live):
            if self._tasks:
                await asyncio.wait(list(self._tasks))
            else:
                await self._fast.wait_closed()

    @property
    def active(self) -> int:
        """Connections this inbound is serving (handshaking or relaying)."""
        return len(self._tasks) + (self._fast.live if self._fast is not None else 0)

    # -- the session registry's view (honk.inbound.sessions.Listener) --------------------

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def retired(self) -> bool:
        return self._stopped and (self._fast is None or not self._fast.live)

    def sweep_tag(self, tag: str | None, error: HonkError, *, stopped_and_swept: bool) -> int:
        """End the fast path's clients of ``tag``: they have no session object (the engine's
        worker accepts them; routing and the tracker see them as flows of the tag)."""
        if self._fast is None:
            return 0
        return self._fast.close_tag(tag, error, drop=stopped_and_swept)

    # -- accepting ---------------------------------------------------------------------

    def _adopt(self, fd: int, data: bytes, answered: int, err: int, source: Address) -> None:
        """Serve a client the fast path handed over, as if this loop had accepted it."""
        conn = _ClientConn(self, source, (data, answered, err))
        if not self._open_session(conn, accepted_earlier=True):
            os.close(fd)
            return
        task = asyncio.get_running_loop().create_task(self._wrap(fd, conn))
        assert conn.session is not None
        conn.session.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wrap(self, fd: int, conn: _ClientConn) -> None:
        sock = socket.socket(fileno=fd)
        session = conn.session
        assert session is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=sock)
        except OSError as exc:
            sock.close()
            session.finish()
            log.info(
                "flow ended during handshake inbound=%s source=%s error=%s reason=%s",
                session.tag,
                conn.source,
                "ClientGone",
                _reason(ClientGone(str(exc))),
            )
        except BaseException:
            if conn.transport is None:  # cancelled before a transport owned the socket
                sock.close()
                session.finish()
            raise

    def _open_session(self, conn: _ClientConn, *, accepted_earlier: bool) -> bool:
        handler = self._handler
        session = self._sessions.open(
            self, handler.name, self._dispatcher.tracker, accepted_earlier=accepted_earlier
        )
        if session is None:  # RL-58: accepted as the listener stopped
            log.debug(
                "connection dropped: its inbound stopped accepting %s",
                kv(inbound=handler.name, source=conn.source),
            )
            return False
        session.conn = conn
        conn.handler, conn.session = handler, session
        return True

    def _accepted(self, conn: _ClientConn) -> None:
        if conn.session is None and not self._open_session(conn, accepted_earlier=False):
            conn.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        assert conn.session is not None
        conn.session.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one connection ----------------------------------------------------------------

    async def _serve(self, conn: _ClientConn) -> None:
        source = conn.source
        handler, session = conn.handler, conn.session
        assert handler is not None and session is not None
        tag = session.tag
        watchdog = _Watchdog(self._clock, conn)
        watchdog.arm(HANDSHAKE_TIMEOUT, HandshakeTimeout(f"no complete request within {HANDSHAKE_TIMEOUT}s"))
        client: _Client | None = None
        answered = 0
        try:
            if session.error is not None:  # ended while the connection was being set up
                raise session.error
            first = b""
            if conn.pre is not None:
                first, answered, err = conn.pre
                conn.pre = None
                if err:
                    raise ClientGone(f"connection lost: errno {err}")
            if not first:
                first = await conn.receive()
            if not first:
                raise ClientGone("closed before sending a byte")
            if first[0] == socks5.VERSION:
                client = _Socks5Client(self, conn, handler, session, watchdog)
                client.skip = answered
            else:
                client = _HttpClient(self, conn, handler, session, watchdog)
            await client.run(first)
        except HonkError as exc:
            if client is None or not client.past_handshake:
                log.info(
                    "flow ended during handshake inbound=%s source=%s error=%s reason=%s",
                    tag,
                    source,
                    type(exc).__name__,
                    _reason(exc),
                )
            else:
                log.debug(
                    "flow ended inbound=%s source=%s error=%s reason=%s",
                    tag,
                    source,
                    type(exc).__name__,
                    _reason(exc),
                )
        except asyncio.CancelledError:
            conn.abort()
            raise
        except Exception:
            log.exception("flow crashed inbound=%s source=%s", tag, source)
            conn.abort()
        finally:
            watchdog.disarm()
            try:
                if client is not None:
                    await client.cleanup()
                conn.close()
            finally:
                session.finish()

    def _refused(self, tag: str, source: Address, target: Address, error: HonkError) -> None:
        # a spent descriptor budget is warned about once per interval by the budget itself
        level = logging.DEBUG if isinstance(error, Blocked | DescriptorsExhausted) else logging.INFO
        log.log(
            level,
            "flow refused inbound=%s source=%s target=%s error=%s",
            tag,
            source,
            target,
            type(error).__name__,
        )


def _user_removed(session: Session, principal: Principal) -> None:
    log.info("%s %s", USER_REMOVED_TEXT, kv(inbound=session.tag, user=principal.username))


class _Client:
    """One client connection's protocol side (SOCKS5 or HTTP), served with one handler."""

    past_handshake = False

    def __init__(
        self,
        inbound: MixedInbound,
        conn: _ClientConn,
        handler: _Handler,
        session: Session,
        watchdog: _Watchdog,
    ) -> None:
        self.inbound = inbound
        self.conn = conn
        self.source = conn.source
        self.handler = handler
        self.session = session
        self.tag = session.tag
        self.watchdog = watchdog
        self.dispatcher = inbound._dispatcher

    async def run(self, first: bytes) -> None:
        raise NotImplementedError

    async def cleanup(self) -> None:
        return None


# --- SOCKS5 ---------------------------------------------------------------------------


class _Socks5Client(_Client):
    skip = 0  # reply bytes the fast path already sent before handing the client over

    async def run(self, first: bytes) -> None:
        codec = socks5.Socks5ServerConnection(require_auth=self.handler.requires_auth)
        codec.receive_data(first)
        request = await self._handshake(codec)
        self.watchdog.disarm()
        self.past_handshake = True
        principal = self.session.principal
        if principal is not None and principal.revoked:  # RL-57: the session's first (only) flow
            _user_removed(self.session, principal)
            self._reply(codec, socks5.Reply.NOT_ALLOWED)
            return
        self.session.opened = True
        if request.command is socks5.Command.CONNECT:
            await self._connect(codec, request.target)
        elif request.command is socks5.Command.UDP_ASSOCIATE:
            await self._associate(codec, request.target)
        else:
            self._reply(codec, socks5.Reply.COMMAND_NOT_SUPPORTED)
            raise NotSupported("socks5 BIND is not supported")

    def _flush(self, codec: socks5.Socks5ServerConnection) -> None:
        out = codec.data_to_send()
        if self.skip:
            taken = min(self.skip, len(out))
            out = out[taken:]
            self.skip -= taken
        if out and not self.conn.lost:
            self.conn.write(out)

    def _reply(
        self, codec: socks5.Socks5ServerConnection, code: socks5.Reply, bound: Address | None = None
    ) -> None:
        codec.reply(code, bound)
        self._flush(codec)

    async def _handshake(self, codec: socks5.Socks5ServerConnection) -> socks5.Request:
        while True:
            try:
                event = codec.next_event()
                if isinstance(event, socks5.Credentials):
                    principal = self.handler.authenticate(event.username, event.password)
                    if principal is not None:
                        self.session.bind(principal)
                    codec.auth_result(event.username, principal is not None)
            finally:
                self._flush(codec)
            if event is socks5.NEED_DATA:
                codec.receive_data(await self.conn.receive())
            elif isinstance(event, socks5.Request):
                trailing, _eof = codec.trailing_data()
                self.conn.unread(trailing)
                return event

    async def _connect(self, codec: socks5.Socks5ServerConnection, target: Address) -> None:
        meta = FlowMeta(Network.TCP, self.source, target, self.tag, user=codec.username, session=self.session)
        try:
            upstream = await self.dispatcher.connect(meta)
        except HonkError as exc:
            self.inbound._refused(self.tag, self.source, target, exc)
            self._reply(codec, socks5.reply_for(exc))
            return
        bound = None  # 0.0.0.0:0 unless the upstream is an IP socket (a bridged one is not)
        if upstream.sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                local = upstream.sock.getsockname()
                bound = Address(local[0], local[1])
        try:
            self._reply(codec, socks5.Reply.SUCCEEDED, bound)
        except HonkError:
            upstream.sock.close()
            raise
        await self.dispatcher.relay(upstream, self.conn)

    async def _associate(self, codec: socks5.Socks5ServerConnection, requested: Address) -> None:
        user = self.session.principal.username if self.session.principal is not None else None
        assoc = UdpAssociation(
            self.dispatcher,
            inbound=self.tag,
            client=self.source,
            requested=requested,
            user=user,
            session=self.session,
        )
        transport = self.conn.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        host = self.handler.spec.host
        advertise = local[0] if local else host
        try:
            bound = await assoc.start(host, advertise)
        except OSError as exc:
            assoc.close(FlowClosed(f"udp bind failed: {exc!r}"))
            self._reply(codec, socks5.Reply.GENERAL_FAILURE)
            raise NotSupported("udp associate could not bind") from None
        try:
            self._reply(codec, socks5.Reply.SUCCEEDED, bound)
            log.debug(
                "UDP association inbound=%s source=%s bound=%s id=%s",
                self.tag,
                self.source,
                bound,
                assoc.id,
            )
            control = asyncio.get_running_loop().create_task(self._drain_control())
            closed = asyncio.get_running_loop().create_task(assoc.wait_closed())
            try:
                await asyncio.wait((control, closed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                control.cancel()
                closed.cancel()
        finally:
            assoc.close(FlowClosed("control connection closed"))

    async def _drain_control(self) -> None:
        """Read (and ignore) the control connection until it ends: EOF, reset or failure."""
        try:
            while await self.conn.receive():
                pass
        except HonkError:
            pass


# --- HTTP -----------------------------------------------------------------------------


class _ForwardHandle:
    """The tracker's view of one forwarded upstream connection (absolute-form HTTP)."""

    def __init__(self, client: _HttpClient, upstream_conn: StreamConn) -> None:
        self._client = client
        self._upstream = upstream_conn
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = client.inbound._clock.now()

    def close(self, reason: HonkError | None = None) -> None:
        error = reason if reason is not None else FlowClosed("closed by request")
        self._upstream.fail(error)
        self._client.conn.fail(error)


class _HttpUpstream:
    def __init__(self, upstream: Upstream, conn: StreamConn, handle: _ForwardHandle, flow) -> None:
        self.target = upstream.routed.meta.target
        self.conn = conn
        self.handle = handle
        self.flow = flow
        self.reporter = upstream.routed.reporter  # Score: settled once, when this connection ends
        self.bridge = upstream.bridge  # how a bridged upstream's server side ended
        self.clock = handle._client.inbound._clock
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_SIZE)

    @property
    def reusable(self) -> bool:
        return (
            self.h11.our_state is h11.IDLE
            and self.h11.their_state is h11.IDLE
            and not self.conn.lost
            and not self.conn.at_eof
        )

    def drop(self) -> None:
        """End the upstream connection: a success for Score if it answered, else neutral."""
        reporter = self.reporter
        if reporter is not None and not reporter.settled:
            if reporter.first_response_at is not None:
                scoring.settle_relay(reporter, self.clock, None)
            else:
                scoring.cancel(reporter, self.clock)
        self.conn.close()
        if self.bridge is not None:
            self.bridge.relay_ended()
        self.flow.release()

    def failed(self, error: HonkError) -> None:
        """The upstream broke (bad HTTP, a failed read or write): a failure for Score, the
        failure of a bridged upstream's server side when it had one (the cause)."""
        scoring.settle_relay(self.reporter, self.clock, relay_end(None, self.bridge) or error)


class _HttpClient(_Client):
    def __init__(
        self,
        inbound: MixedInbound,
        conn: _ClientConn,
        handler: _Handler,
        session: Session,
        watchdog: _Watchdog,
    ) -> None:
        super().__init__(inbound, conn, handler, session, watchdog)
        authenticate = handler.authenticate if handler.requires_auth else None
        self.proto = HttpProxyServerConnection(authenticate=authenticate)
        self.upstream: _HttpUpstream | None = None
        self.requests = 0  # requests that passed the revocation check (flows opened or attempted)

    async def cleanup(self) -> None:
        if self.upstream is not None:
            self.upstream.drop()
            self.upstream = None

    def _send_error(self, error: HonkError) -> None:
        if not self.proto.response_started and not self.conn.lost:
            try:
                self.conn.write(http_proto.error_response(http_proto.status_for(error)))
            except HonkError:
                pass

    async def _next_client_event(self):
        while True:
            try:
                event = self.proto.next_event()
            except HonkError as exc:
                self._send_error(exc)
                raise
            if event is not h11.NEED_DATA:
                return event
            self.proto.receive_data(await self.conn.receive())

    async def run(self, first: bytes) -> None:
        self.proto.receive_data(first)
        idle = self.dispatcher.global_spec.relay_idle_timeout
        while True:
            event = await self._next_client_event()
            if isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, ProxyRequest):
                raise ClientProtocolError("http", "bad-request", f"unexpected {type(event).__name__}")
            self.watchdog.disarm()
            self.past_handshake = True
            if not self._admitted(event):
                return
            if event.tunnel:
                await self._tunnel(event)
                return
            if not await self._forward(event):
                return
            if not self.proto.can_keep_alive:
                return
            self.proto.start_next_cycle()
            self.watchdog.arm(idle, IdleTimeout(f"no request for {idle}s"))

    def _admitted(self, request: ProxyRequest) -> bool:
        """RL-57: a revoked principal may not open the session's first flow (nor a later one
        under another principal); the session answers 403 and ends."""
        principal = request.principal
        if not isinstance(principal, Principal):
            return True
        if principal.revoked and (self.requests == 0 or principal is not self.session.principal):
            _user_removed(self.session, principal)
            if not self.conn.lost:
                with contextlib.suppress(HonkError):
                    self.conn.write(http_proto.error_response(FORBIDDEN))
            return False
        if self.session.principal is None:
            self.session.bind(principal)
        self.session.opened = True
        self.requests += 1
        return True

    async def _dial(self, request: ProxyRequest) -> Upstream | None:
        meta = FlowMeta(
            Network.TCP, self.source, request.target, self.tag, user=request.user, session=self.session
        )
        try:
            return await self.dispatcher.connect(meta)
        except HonkError as exc:
            self.inbound._refused(self.tag, self.source, request.target, exc)
            self._send_error(exc)
            return None

    async def _tunnel(self, request: ProxyRequest) -> None:
        await self.cleanup()
        upstream = await self._dial(request)
        if upstream is None:
            return
        try:
            self.conn.write(self.proto.tunnel_established())
        except HonkError:
            upstream.sock.close()
            raise
        trailing, _eof = self.proto.trailing_data
        self.conn.unread(trailing)
        await self.dispatcher.relay(upstream, self.conn)

    async def _upstream_for(self, request: ProxyRequest) -> _HttpUpstream | None:
        current = self.upstream
        if current is not None and current.target == request.target and current.reusable:
            return current
        await self.cleanup()
        upstream = await self._dial(request)
        if upstream is None:
            return None
        conn = StreamConn(UpstreamFailed)
        sock = upstream.sock
        try:
            if (
                upstream.framing is not None
            ):  # h11 needs plain bytes: a socket whose far end the engine frames
                sock = framed_socket(upstream.sock, upstream.framing)
            await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock)
        except (OSError, ValueError) as exc:
            sock.close()
            upstream.sock.close()
            error = UpstreamFailed(f"upstream socket unusable: {exc!r}")
            self._send_error(error)
            raise error from None
        handle = _ForwardHandle(self, conn)
        flow = self.dispatcher.track(upstream.routed, handle)  # and its `flow opened` line
        self.upstream = _HttpUpstream(upstream, conn, handle, flow)
        return self.upstream

    async def _forward(self, request: ProxyRequest) -> bool:
        """Forward one request and its response; False if it was refused (and answered)."""
        up = await self._upstream_for(request)
        if up is None:
            # The refusal closes the connection; whatever body followed is not read.
            return False
        assert request.forward is not None
        clock = self.inbound._clock
        handle = up.handle

        reporter = up.reporter

        def to_upstream(data: bytes) -> None:
            up.conn.write(data)
            handle.bytes_up += len(data)
            handle.last_activity = now = clock.now()
            if reporter is not None:
                reporter.tx(now, len(data))

        def to_client(data: bytes) -> None:
            self.conn.write(data)
            handle.bytes_down += len(data)
            handle.last_activity = now = clock.now()
            if reporter is not None:
                reporter.rx(now, len(data))

        try:
            to_upstream(up.h11.send(request.forward) or b"")
            while True:
                event = await self._next_client_event()
                if isinstance(event, h11.Data):
                    to_upstream(up.h11.send(h11.Data(data=event.data)) or b"")
                    await up.conn.drain()
                elif isinstance(event, h11.EndOfMessage):
                    to_upstream(up.h11.send(h11.EndOfMessage()) or b"")
                    break
                else:  # ConnectionClosed mid-body
                    raise ClientGone("client closed while sending a request body")
            await self._relay_response(up, to_client)
        except h11.ProtocolError as exc:
            error = UpstreamFailed(f"upstream spoke bad HTTP: {exc}")
            up.failed(error)
            self._send_error(error)
            raise error from None
        except UpstreamFailed as exc:
            up.failed(exc)
            self._send_error(exc)
            raise
        if up.h11.our_state is h11.DONE and up.h11.their_state is h11.DONE:
            up.h11.start_next_cycle()
        else:
            up.drop()
            self.upstream = None
        return True

    async def _relay_response(self, up: _HttpUpstream, to_client) -> None:
        while True:
            event = up.h11.next_event()
            if event is h11.NEED_DATA:
                up.h11.receive_data(await up.conn.receive())
                continue
            if isinstance(event, h11.InformationalResponse):
                headers = http_proto.clean_headers(event.headers.raw_items())
                to_client(
                    self.proto.send(
                        h11.InformationalResponse(
                            status_code=event.status_code, headers=headers, reason=event.reason
                        )
                    )
                )
            elif isinstance(event, h11.Response):
                headers = http_proto.clean_headers(event.headers.raw_items())
                to_client(
                    self.proto.send(
                        h11.Response(status_code=event.status_code, headers=headers, reason=event.reason)
                    )
                )
            elif isinstance(event, h11.Data):
                to_client(self.proto.send(h11.Data(data=event.data)))
                await self.conn.drain()
            elif isinstance(event, h11.EndOfMessage):
                to_client(self.proto.send(h11.EndOfMessage()))
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise UpstreamFailed("upstream closed before the response ended")
