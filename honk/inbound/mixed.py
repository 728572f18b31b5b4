"""The mixed inbound: SOCKS5 and HTTP proxy on one TCP port.

The first byte decides: ``0x05`` is SOCKS5, anything else is HTTP. Each
accepted connection is served by its own task, owned by the inbound.

When the relay engine can listen (:func:`honk.inbound.fastpath.fastpath_engine`:
compiled engine, no inbound users, ``HONK_RELAY`` not ``copy``), the engine's
worker accepts and serves plain SOCKS5 CONNECTs itself
(:mod:`honk.inbound.fastpath`); every other client is handed over to the
path described here, with the bytes the worker already read.

Failure policy (one flow never hurts another):
  * A client that sends malformed bytes, stops half-way, vanishes, or does not
    finish its handshake within :data:`HANDSHAKE_TIMEOUT` (clock seconds) ends
    only its own flow, with a typed error and one log line on ``honk.inbound``:
    ``flow ended during handshake inbound=… source=… error=… reason=…``.
  * Routing and dialing failures are answered in the client's protocol
    (:func:`honk.inbound.socks5.reply_for`, :func:`honk.inbound.http.status_for`):
    Blocked → SOCKS5 ``0x02`` / HTTP 403; NoRoute → ``0x02`` / 502;
    DialTimeout → ``0x06`` / 504; other DialErrors → ``0x01``/``0x03``/
    ``0x04``/``0x05`` by errno / 502. One log line:
    ``flow refused inbound=… source=… target=… error=…``.
  * Anything unexpected is logged with its traceback and ends that flow only.

HTTP absolute-form requests are forwarded one at a time with ``h11`` on both
sides (a response is relayed completely before the next request is read);
the upstream connection is reused while requests go to the same host, and
each upstream connection is one flow in the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from typing import Any

import h11

from honk.config.spec import InboundSpec, InboundUser
from honk.connection.dispatch import Dispatcher, Upstream, format_chain
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
    UpstreamFailed,
)
from honk.core.net import Address, FlowMeta, Network
from honk.inbound import http as http_proto
from honk.inbound import socks5
from honk.inbound.http import MAX_HEAD_SIZE, HttpProxyServerConnection, ProxyRequest
from honk.relay.native import framed_socket
from honk.relay.stream import StreamConn

__all__ = ["HANDSHAKE_TIMEOUT", "MixedInbound"]

log = logging.getLogger("honk.inbound")

# Seconds (of the injected clock) a client has from accept until its proxy
# request is complete; a slow or silent client is cut off after this.
HANDSHAKE_TIMEOUT = 10.0

# Pending connections a fast-path listening socket queues (the kernel caps it at
# somaxconn): the worker accepts in bursts, a deep queue absorbs connect storms.
FAST_BACKLOG = 4096


def _reason(error: BaseException) -> str:
    if isinstance(error, ClientProtocolError):
        return error.reason
    return {
        ClientGone: "client-gone",
        HandshakeTimeout: "timeout",
        AuthenticationFailed: "auth-failed",
        NotSupported: "not-supported",
        FlowClosed: "closed",
        IdleTimeout: "idle",
    }.get(type(error), "-")


def _check_user(users: tuple[InboundUser, ...], username: str, password: str) -> bool:
    ok = False
    for user in users:
        name_ok = hmac.compare_digest(user.username.encode(), username.encode())
        pass_ok = hmac.compare_digest(user.password.encode(), password.encode())
        ok |= name_ok and pass_ok
    return ok


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
    def __init__(self, inbound: MixedInbound, source: Address = _UNKNOWN_SOURCE,
                 pre: tuple[bytes, int, int] | None = None) -> None:
        super().__init__(ClientGone)
        self._inbound = inbound
        self.source = source
        # handed over by the fast path: (bytes read, reply bytes already sent, errno)
        self.pre = pre

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.source is _UNKNOWN_SOURCE:
            # Read at once: uvloop looks the peer up lazily, which fails after a reset.
            peer = transport.get_extra_info("peername")
            if peer:
                self.source = Address(peer[0], peer[1])
        self._inbound._accepted(self)


class MixedInbound:
    """A SOCKS5 + HTTP proxy listener.

    ``start()`` binds (port 0 picks a free port) and returns once listening;
    ``bound`` is then the listening address. ``stop_accepting()`` closes the
    listener and leaves live flows alone; ``aclose()`` also ends every flow
    still in its handshake or relay that this inbound serves.
    """

    def __init__(self, spec: InboundSpec, dispatcher: Dispatcher, clock: Clock, *, engine: Any = None) -> None:
        """``engine``: the relay engine for the SOCKS5 fast path (tests pass the compiled
        engine or its twin); default :func:`~honk.inbound.fastpath.fastpath_engine`."""
        self.spec = spec
        self.name = spec.name
        self._dispatcher = dispatcher
        self._clock = clock
        self._users = tuple(spec.users)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._engine = engine
        self._fast: Any = None  # SocksFastPath while the engine serves the port
        self._fast_socks: list[socket.socket] = []
        self.bound: Address | None = None

    async def start(self) -> None:
        from honk.inbound import fastpath

        loop = asyncio.get_running_loop()
        engine = self._engine
        if engine is None:
            engine = fastpath.fastpath_engine(self._users, loop)
        elif self._users:
            engine = None
        if engine is not None:
            socks = fastpath.bind_sockets(self.spec.host, self.spec.port, FAST_BACKLOG)
            self._fast = fastpath.SocksFastPath(self, engine)
            try:
                self._fast.listen(socks)
            except BaseException:
                fastpath.close_listening(socks)
                self._fast = None
                raise
            self._fast_socks = socks
            sockname = socks[0].getsockname()
        else:
            self._server = await loop.create_server(
                lambda: _ClientConn(self), host=self.spec.host, port=self.spec.port, reuse_address=True
            )
            sockname = self._server.sockets[0].getsockname()
        self.bound = Address(sockname[0], sockname[1])
        log.info("inbound listening inbound=%s kind=mixed address=%s", self.name, self.bound)

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._fast is not None:
            from honk.inbound.fastpath import close_listening

            self._fast.stop_accepting()
            socks, self._fast_socks = self._fast_socks, []
            close_listening(socks)

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

    def _adopt(self, fd: int, data: bytes, answered: int, err: int, source: Address) -> None:
        """Serve a client the fast path handed over, as if this loop had accepted it."""
        conn = _ClientConn(self, source, (data, answered, err))
        task = asyncio.get_running_loop().create_task(self._wrap(fd, conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wrap(self, fd: int, conn: _ClientConn) -> None:
        sock = socket.socket(fileno=fd)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=sock)
        except OSError as exc:
            sock.close()
            log.info(
                "flow ended during handshake inbound=%s source=%s error=%s reason=%s",
                self.name, conn.source, "ClientGone", _reason(ClientGone(str(exc))),
            )

    def _accepted(self, conn: _ClientConn) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one connection ----------------------------------------------------------------

    async def _serve(self, conn: _ClientConn) -> None:
        source = conn.source
        watchdog = _Watchdog(self._clock, conn)
        watchdog.arm(HANDSHAKE_TIMEOUT, HandshakeTimeout(f"no complete request within {HANDSHAKE_TIMEOUT}s"))
        session: _Session | None = None
        answered = 0
        try:
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
                session = _Socks5Session(self, conn, source, watchdog)
                session.skip = answered
            else:
                session = _HttpSession(self, conn, source, watchdog)
            await session.run(first)
        except HonkError as exc:
            if session is None or not session.past_handshake:
                log.info(
                    "flow ended during handshake inbound=%s source=%s error=%s reason=%s",
                    self.name,
                    source,
                    type(exc).__name__,
                    _reason(exc),
                )
            else:
                log.debug(
                    "flow ended inbound=%s source=%s error=%s reason=%s",
                    self.name,
                    source,
                    type(exc).__name__,
                    _reason(exc),
                )
        except asyncio.CancelledError:
            conn.abort()
            raise
        except Exception:
            log.exception("flow crashed inbound=%s source=%s", self.name, source)
            conn.abort()
        finally:
            watchdog.disarm()
            if session is not None:
                await session.cleanup()
            conn.close()

    def _refused(self, source: Address, target: Address, error: HonkError) -> None:
        level = logging.DEBUG if isinstance(error, Blocked) else logging.INFO
        log.log(
            level,
            "flow refused inbound=%s source=%s target=%s error=%s",
            self.name,
            source,
            target,
            type(error).__name__,
        )


class _Session:
    past_handshake = False

    def __init__(self, inbound: MixedInbound, conn: StreamConn, source: Address, watchdog: _Watchdog) -> None:
        self.inbound = inbound
        self.conn = conn
        self.source = source
        self.watchdog = watchdog
        self.dispatcher = inbound._dispatcher

    async def run(self, first: bytes) -> None:
        raise NotImplementedError

    async def cleanup(self) -> None:
        return None


# --- SOCKS5 ---------------------------------------------------------------------------


class _Socks5Session(_Session):
    skip = 0  # reply bytes the fast path already sent before handing the client over

    async def run(self, first: bytes) -> None:
        codec = socks5.Socks5ServerConnection(require_auth=bool(self.inbound._users))
        codec.receive_data(first)
        request = await self._handshake(codec)
        self.watchdog.disarm()
        self.past_handshake = True
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
        users = self.inbound._users
        while True:
            try:
                event = codec.next_event()
                if isinstance(event, socks5.Credentials):
                    codec.auth_result(event.username, _check_user(users, event.username, event.password))
            finally:
                self._flush(codec)
            if event is socks5.NEED_DATA:
                codec.receive_data(await self.conn.receive())
            elif isinstance(event, socks5.Request):
                trailing, _eof = codec.trailing_data()
                self.conn.unread(trailing)
                return event

    async def _connect(self, codec: socks5.Socks5ServerConnection, target: Address) -> None:
        meta = FlowMeta(Network.TCP, self.source, target, self.inbound.name, user=codec.username)
        try:
            upstream = await self.dispatcher.connect(meta)
        except HonkError as exc:
            self.inbound._refused(self.source, target, exc)
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
        assoc = UdpAssociation(
            self.dispatcher, inbound=self.inbound.name, client=self.source, requested=requested
        )
        transport = self.conn.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        advertise = local[0] if local else self.inbound.spec.host
        try:
            bound = await assoc.start(self.inbound.spec.host, advertise)
        except OSError as exc:
            assoc.close(FlowClosed(f"udp bind failed: {exc!r}"))
            self._reply(codec, socks5.Reply.GENERAL_FAILURE)
            raise NotSupported("udp associate could not bind") from None
        try:
            self._reply(codec, socks5.Reply.SUCCEEDED, bound)
            log.debug(
                "UDP association inbound=%s source=%s bound=%s id=%s",
                self.inbound.name,
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

    def __init__(self, session: _HttpSession, upstream_conn: StreamConn) -> None:
        self._session = session
        self._upstream = upstream_conn
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = session.inbound._clock.now()

    def close(self, reason: HonkError | None = None) -> None:
        error = reason if reason is not None else FlowClosed("closed by request")
        self._upstream.fail(error)
        self._session.conn.fail(error)


class _HttpUpstream:
    def __init__(self, upstream: Upstream, conn: StreamConn, handle: _ForwardHandle, flow) -> None:
        self.target = upstream.routed.meta.target
        self.conn = conn
        self.handle = handle
        self.flow = flow
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
        self.conn.close()
        self.flow.release()


class _HttpSession(_Session):
    def __init__(self, inbound: MixedInbound, conn: StreamConn, source: Address, watchdog: _Watchdog) -> None:
        super().__init__(inbound, conn, source, watchdog)
        self.proto = HttpProxyServerConnection(self.inbound._users)
        self.upstream: _HttpUpstream | None = None

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
            if event.tunnel:
                await self._tunnel(event)
                return
            if not await self._forward(event):
                return
            if not self.proto.can_keep_alive:
                return
            self.proto.start_next_cycle()
            self.watchdog.arm(idle, IdleTimeout(f"no request for {idle}s"))

    async def _dial(self, request: ProxyRequest) -> Upstream | None:
        meta = FlowMeta(Network.TCP, self.source, request.target, self.inbound.name, user=request.user)
        try:
            return await self.dispatcher.connect(meta)
        except HonkError as exc:
            self.inbound._refused(self.source, request.target, exc)
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
            if upstream.framing is not None:  # h11 needs plain bytes: a socket whose far end the engine frames
                sock = framed_socket(upstream.sock, upstream.framing)
            await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock)
        except (OSError, ValueError) as exc:
            sock.close()
            upstream.sock.close()
            error = UpstreamFailed(f"upstream socket unusable: {exc!r}")
            self._send_error(error)
            raise error from None
        handle = _ForwardHandle(self, conn)
        flow = self.dispatcher.track(upstream.routed, handle)
        routed = upstream.routed
        log.debug(
            "TCP connection inbound=%s source=%s target=%s rule=%s chain=%s",
            self.inbound.name,
            self.source,
            request.target,
            routed.rule,
            format_chain(routed.chain),
        )
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

        def to_upstream(data: bytes) -> None:
            up.conn.write(data)
            handle.bytes_up += len(data)
            handle.last_activity = clock.now()

        def to_client(data: bytes) -> None:
            self.conn.write(data)
            handle.bytes_down += len(data)
            handle.last_activity = clock.now()

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
            self._send_error(error)
            raise error from None
        except UpstreamFailed as exc:
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
