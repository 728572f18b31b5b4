"""DNS over TLS (RFC 7858) and DNS over HTTPS on HTTP/2 (RFC 8484): one connection per
upstream, many queries on it at once.

A TLS handshake costs a round trip or two and a few hundred microseconds of
CPU on both ends; a resolver asked a query per name would pay it on every
cache miss. So an upstream keeps one connection, and every exchange in flight
shares it:

* DoT writes each query with the two-octet length prefix of TCP DNS and does
  not wait for the previous answer (RFC 7858 §3.3 pipelining; a server may
  answer out of order), so replies are matched to queries by message id. The
  connection chooses the id on the wire: the exchange's own id unless another
  query in flight holds it.
* DoH POSTs each query as ``application/dns-message`` on its own HTTP/2
  stream (h2, sans-I/O), with message id 0 (RFC 8484 §4.1: cache friendly,
  the stream already tells replies apart); the exchange's id is put back on
  the reply. The server's stream limit and flow-control windows are honoured.
  A server offering HTTP/3 on the same host (``Alt-Svc: h3=":443"``, RFC 7838)
  is remembered (:func:`h3_alternative`): the exchange moves that upstream to
  DoH3 while the offer is fresh, and back to HTTP/2 for a while if HTTP/3 fails.

The framing parts (:class:`LengthPrefixed`, :func:`doh_request_headers`,
:func:`with_id`) are pure and tested alone. The connections run over a
:class:`~honk.relay.stream.StreamConn` the exchange opened through the routed
outbound (a node or group carries the TCP stream; TLS runs end to end with the
DNS server); a reader task per connection delivers replies. A connection
that ends (the server closed it, as RFC 7858 §3.4 lets an idle one be, or the
stream broke) fails the queries in flight with ``closed`` and is never picked
again; the pool dials a new one on the next query. A connection nobody used
for :data:`IDLE_TIMEOUT` seconds (on the injected clock) is closed by us.

The pool also owns the dial's Score reporter: the first reply on a connection
settles it as a success, the connection failing before any reply as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from honk.core.clock import Clock, TimerHandle
from honk.dns.failure import ExchangeFailed
from honk.group.score.attempt import Result, ScoreReporter
from honk.relay.stream import StreamConn

__all__ = [
    "ALPN_H2",
    "DNS_MESSAGE",
    "IDLE_TIMEOUT",
    "Connection",
    "ConnectionPool",
    "DohConnection",
    "DotConnection",
    "LengthPrefixed",
    "doh_request_headers",
    "with_id",
]

IDLE_TIMEOUT = 30.0  # seconds a connection with nothing in flight is kept before we close it
ALPN_H2 = "h2"  # RFC 7540 §3.3: HTTP/2 over TLS; RFC 8484 §5.2: DoH SHOULD be HTTP/2
DNS_MESSAGE = "application/dns-message"  # RFC 8484 §6
HTTP_OK = 200
LENGTH = struct.Struct("!H")  # RFC 1035 §4.2.2, RFC 7858 §3.3: the two-octet length of TCP DNS
MESSAGE_ID = struct.Struct("!H")
MAX_MESSAGE = 0xFFFF  # what the two-octet length can carry
READ_SIZE = 64 * 1024
DEFAULT_MAX_STREAMS = 100  # RFC 9113 §6.5.2 recommends a server allows at least 100 concurrent streams
ALT_SVC = "alt-svc"  # RFC 7838 §3: the header a server offers HTTP/3 in
ALT_SVC_H3 = "h3"  # RFC 9114 §3.1's ALPN token (drafts' h3-NN are not taken)
ALT_SVC_CLEAR = "clear"  # RFC 7838 §3: every alternative withdrawn
ALT_SVC_MAX_AGE = 86400  # RFC 7838 §3.1: seconds an alternative is fresh without ``ma``


# --- framing (pure) -------------------------------------------------------------------------


class LengthPrefixed:
    """Splits a byte stream into the messages of TCP DNS framing, however the bytes arrive."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order; a partial one waits for more bytes."""
        self._buf += data
        messages = []
        while len(self._buf) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buf)
            end = LENGTH.size + length
            if len(self._buf) < end:
                break
            messages.append(bytes(self._buf[LENGTH.size : end]))
            del self._buf[:end]
        return messages

    @property
    def pending(self) -> int:
        """Bytes held for a message not complete yet."""
        return len(self._buf)


def length_prefixed(message: bytes) -> bytes:
    """``message`` framed for a stream (TCP DNS, DoT, DoQ)."""
    if len(message) > MAX_MESSAGE:
        raise ExchangeFailed("too-large", f"a {len(message)}-byte message does not fit a DNS frame")
    return LENGTH.pack(len(message)) + message


def with_id(message: bytes, qid: int) -> bytes:
    """``message`` with its id replaced."""
    return MESSAGE_ID.pack(qid) + message[MESSAGE_ID.size :]


def message_id(message: bytes) -> int | None:
    return MESSAGE_ID.unpack_from(message)[0] if len(message) >= MESSAGE_ID.size else None


def doh_request_headers(authority: str, path: str, length: int) -> list[tuple[str, str]]:
    """The HTTP/2 (or HTTP/3) request headers of an RFC 8484 POST of ``length`` bytes."""
    return [
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", authority),
        (":path", path),
        ("accept", DNS_MESSAGE),
        ("content-type", DNS_MESSAGE),
        ("content-length", str(length)),
    ]


def authority_of(host: str, port: int, default_port: int) -> str:
    """``host[:port]`` as a URL authority (an IPv6 literal bracketed, the default port left out)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def h3_alternative(value: str) -> tuple[int, float] | str | None:
    """What an ``Alt-Svc`` header (RFC 7838) offers for HTTP/3 on the same host: ``(port,
    max_age)``, :data:`ALT_SVC_CLEAR`, or None (nothing usable: another host, only drafts)."""
    if value.strip() == ALT_SVC_CLEAR:
        return ALT_SVC_CLEAR
    for entry in value.split(","):
        protocol, _, rest = entry.strip().partition("=")
        authority, *params = rest.split(";")
        authority = authority.strip()
        if (
            protocol.strip() != ALT_SVC_H3
            or len(authority) < 2
            or authority[0] != '"'
            or authority[-1] != '"'
        ):
            continue
        host, sep, port = authority[1:-1].rpartition(":")
        if not sep or host or not port.isdigit() or not 0 < int(port) <= 0xFFFF:
            continue  # only an alternative port of the same host: another host is another server to trust
        max_age = float(ALT_SVC_MAX_AGE)
        for param in params:
            key, _, raw = param.strip().partition("=")
            if key == "ma" and raw.strip().isdigit():
                max_age = float(raw.strip())
        return int(port), max_age
    return None


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # its waiter may have given up: the failure is seen here, not logged as lost


# --- connections ----------------------------------------------------------------------------


class Connection:
    """One multiplexed connection to one upstream; subclasses speak its protocol."""

    def _query_id(self, query: bytes) -> int:
        """The id of ``query`` to send on this connection; ExchangeFailed once it ended, or for
        bytes too short to hold an id."""
        if self.closed:
            raise self.failure or ExchangeFailed("closed")
        own = message_id(query)
        if own is None:
            raise ExchangeFailed("bad-query", "shorter than a message id")
        return own

    def __init__(self, clock: Clock, reporter: ScoreReporter | None) -> None:
        self._clock = clock
        self._reporter = reporter
        self._answered = False
        self.closed = False
        self.failure: ExchangeFailed | None = None
        self.exchanges = 0  # queries sent on this connection (tests, the pool's reuse accounting)
        self._idle: TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None

    def _start(self, reader: Awaitable[None], name: str) -> None:
        self._reader = asyncio.get_running_loop().create_task(reader, name=name)  # type: ignore[arg-type]
        self._reader.add_done_callback(self._reader_done)
        self._arm_idle()

    def _reader_done(self, task: asyncio.Task[None]) -> None:
        error: BaseException | None = None if task.cancelled() else task.exception()
        if isinstance(error, ExchangeFailed):
            self._fail(error)
        else:
            self._fail(
                ExchangeFailed(
                    "closed",
                    f"the connection ended: {error}" if error else "the server closed the connection",
                )
            )

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    async def exchange(self, query: bytes) -> bytes:
        """The reply to ``query`` (wire format, the caller's id on both); ExchangeFailed."""
        raise NotImplementedError

    def _answered_once(self, size: int) -> None:
        reporter = self._reporter
        if reporter is not None:
            now = self._clock.now()
            reporter.rx(now, size)
            if not self._answered:
                reporter.settle(now, Result.success())
        self._answered = True

    def _sent(self, size: int) -> None:
        self.exchanges += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._reporter is not None:
            self._reporter.tx(self._clock.now(), size)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = None
        if self.in_flight:
            return
        if self.closed:
            self._abort()  # draining after the server's GOAWAY: the last query is done
        else:
            self._idle = self._clock.call_later(IDLE_TIMEOUT, self.close)

    def _fail(self, failure: ExchangeFailed, *, ours: bool = False) -> None:
        """End the connection: every query in flight fails with ``failure``. ``ours``: we closed
        it (idle, retired, shut down), which says nothing about the node."""
        if self.failure is None:
            self.failure = failure
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._reporter is not None and not self._answered:
            self._reporter.settle(self._clock.now(), Result.neutral() if ours else Result.failure())
        self._abort()

    def _abort(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close now; queries in flight fail with ``closed``."""
        self._fail(ExchangeFailed("closed", "the connection was closed"), ours=True)
        if self._reader is not None:
            self._reader.cancel()

    async def aclose(self) -> None:
        self.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


class DotConnection(Connection):
    """DNS over TLS: length-prefixed messages, pipelined, matched by id (RFC 7858 §3.3)."""

    def __init__(self, stream: StreamConn, clock: Clock, reporter: ScoreReporter | None = None) -> None:
        super().__init__(clock, reporter)
        self._stream = stream
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._start(self._read(), "honk-dns-dot")

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    async def exchange(self, query: bytes) -> bytes:
        own = self._query_id(query)
        wire_id = own
        while wire_id in self._waiting:
            wire_id = secrets.randbits(16)
        frame = length_prefixed(with_id(query, wire_id))
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(_retrieve)
        self._waiting[wire_id] = reply
        try:
            self._stream.write(frame)
            self._sent(len(frame))
            await self._stream.drain()
            return with_id(await reply, own)
        except ExchangeFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream, typed as the connection's end
            self._fail(ExchangeFailed("closed", str(exc)))
            raise self.failure from None  # type: ignore[misc]
        finally:
            if self._waiting.get(wire_id) is reply:
                del self._waiting[wire_id]
            self._arm_idle()

    async def _read(self) -> None:
        frames = LengthPrefixed()
        while True:
            data = await self._stream.receive()
            if not data:
                return
            for message in frames.feed(data):
                wire_id = message_id(message)
                reply = self._waiting.pop(wire_id, None) if wire_id is not None else None
                if reply is not None and not reply.done():
                    self._answered_once(len(message) + LENGTH.size)
                    reply.set_result(message)
                # else: an answer to a query whose exchange gave up: dropped

    def _fail(self, failure: ExchangeFailed, *, ours: bool = False) -> None:
        super()._fail(failure, ours=ours)
        waiting, self._waiting = self._waiting, {}
        for reply in waiting.values():
            if not reply.done():
                reply.set_exception(self.failure or failure)

    def _abort(self) -> None:
        self._stream.abort()


class _Stream:
    """One DoH request's reply as it arrives."""

    __slots__ = ("body", "future", "status")

    def __init__(self, future: asyncio.Future[bytes]) -> None:
        self.future = future
        self.status: int | None = None
        self.body = bytearray()


class DohConnection(Connection):
    """DNS over HTTPS on HTTP/2: one POST per query, each on its own stream (RFC 8484 §4.1)."""

    def __init__(
        self,
        stream: StreamConn,
        clock: Clock,
        authority: str,
        path: str,
        reporter: ScoreReporter | None = None,
    ) -> None:
        import h2.config
        import h2.connection

        super().__init__(clock, reporter)
        self._stream = stream
        self._authority = authority
        self._path = path
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._h2.initiate_connection()
        self._streams: dict[int, _Stream] = {}
        self.alt_svc: str | None = None  # the last Alt-Svc header the server sent (HTTP/3 offered?)
        self._room = asyncio.Event()  # set whenever a stream slot or flow-control window may have opened
        self._flush()
        self._start(self._read(), "honk-dns-doh")

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data:
            self._stream.write(data)

    async def exchange(self, query: bytes) -> bytes:
        own = message_id(query)
        if own is None:
            raise ExchangeFailed("bad-query", "shorter than a message id")
        body = with_id(query, 0)
        stream_id = -1
        try:
            while True:  # wait for a stream slot: the server's limit on concurrent streams
                if self.closed:
                    raise self.failure or ExchangeFailed("closed")
                if self._h2.open_outbound_streams < self._max_streams():
                    break
                self._room.clear()
                await self._room.wait()
            stream_id = self._h2.get_next_available_stream_id()
            reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            reply.add_done_callback(_retrieve)
            self._streams[stream_id] = _Stream(reply)
            self._h2.send_headers(stream_id, doh_request_headers(self._authority, self._path, len(body)))
            self._sent(len(body))
            await self._send_body(stream_id, body)
            return with_id(await reply, own)
        except ExchangeFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - h2's protocol errors, a broken stream: the connection's end
            self._fail(ExchangeFailed("closed", f"HTTP/2: {exc}"))
            raise self.failure from None  # type: ignore[misc]
        finally:
            if self._streams.pop(stream_id, None) is not None and not self.closed:
                with contextlib.suppress(Exception):  # a stream we gave up on: tell the server
                    self._h2.reset_stream(stream_id)
                    self._flush()
            self._room.set()
            self._arm_idle()

    def _max_streams(self) -> int:
        limit = self._h2.remote_settings.max_concurrent_streams
        return DEFAULT_MAX_STREAMS if limit is None else limit

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        """``body`` as DATA frames within the peer's flow-control windows, the last one ending the stream."""
        view = memoryview(body)
        while True:
            window = min(self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size)
            if window >= len(view):
                self._h2.send_data(stream_id, bytes(view), end_stream=True)
                self._flush()
                await self._stream.drain()
                return
            if window > 0:
                self._h2.send_data(stream_id, bytes(view[:window]))
                view = view[window:]
                self._flush()
            self._room.clear()
            await self._room.wait()
            if self.closed:
                raise self.failure or ExchangeFailed("closed")

    async def _read(self) -> None:
        import h2.events

        while True:
            data = await self._stream.receive()
            if not data:
                return
            for event in self._h2.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    pending = self._streams.get(event.stream_id)
                    if pending is not None:
                        pending.status = _status(event.headers)
                    alt_svc = _header(event.headers, ALT_SVC)
                    if alt_svc is not None:
                        self.alt_svc = alt_svc
                elif isinstance(event, h2.events.DataReceived):
                    self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    pending = self._streams.get(event.stream_id)
                    if pending is not None:
                        if len(pending.body) + len(event.data) > MAX_MESSAGE:
                            self._finish(
                                event.stream_id, ExchangeFailed("too-large", "the DoH reply is too large")
                            )
                        else:
                            pending.body += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    self._ended(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self._finish(event.stream_id, ExchangeFailed("reset", f"HTTP/2 error {event.error_code}"))
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self._goaway(event.last_stream_id, event.error_code)
                elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                    self._room.set()
            self._flush()

    def _ended(self, stream_id: int) -> None:
        pending = self._streams.get(stream_id)
        if pending is None:
            return
        if pending.status != HTTP_OK:
            self._finish(stream_id, ExchangeFailed("http-status", f"HTTP status {pending.status}"))
            return
        self._streams.pop(stream_id)
        self._room.set()
        if not pending.future.done():
            self._answered_once(len(pending.body))
            pending.future.set_result(bytes(pending.body))

    def _finish(self, stream_id: int, failure: ExchangeFailed) -> None:
        pending = self._streams.pop(stream_id, None)
        self._room.set()
        if pending is not None and not pending.future.done():
            pending.future.set_exception(failure)

    def _goaway(self, last_stream_id: int | None, error_code: int) -> None:
        """The server goes away: streams past ``last_stream_id`` were never processed; no new ones."""
        self.closed = True
        self.failure = ExchangeFailed("closed", f"the server sent GOAWAY ({error_code})")
        for stream_id in [s for s in self._streams if last_stream_id is None or s > last_stream_id]:
            self._finish(stream_id, self.failure)
        self._room.set()
        self._arm_idle()  # nothing left to finish: let go of the connection now

    def _fail(self, failure: ExchangeFailed, *, ours: bool = False) -> None:
        super()._fail(failure, ours=ours)
        for stream_id in list(self._streams):
            self._finish(stream_id, self.failure or failure)
        self._room.set()

    def _abort(self) -> None:
        self._stream.abort()


def _header(headers: list[tuple[str, str]], wanted: str) -> str | None:
    for name, value in headers:
        if name == wanted:
            return value
    return None


def _status(headers: list[tuple[str, str]]) -> int | None:
    value = _header(headers, ":status")
    return int(value) if value is not None and value.isdigit() else None


# --- the pool -------------------------------------------------------------------------------


Opener = Callable[[], Awaitable[Connection]]


class ConnectionPool:
    """At most one live connection per key; concurrent first queries share one dial."""

    def __init__(self) -> None:
        self._connections: dict[Hashable, Connection] = {}
        self._opening: dict[Hashable, asyncio.Task[Connection]] = {}
        self.dials = 0  # connections opened (tests and the benchmark count reuse by it)

    def live(self, key: Hashable) -> Connection | None:
        connection = self._connections.get(key)
        if connection is not None and connection.closed:
            del self._connections[key]
            return None
        return connection

    async def connection(self, key: Hashable, open_: Opener) -> tuple[Connection, bool]:
        """The live connection for ``key`` (dialled by ``open_`` when there is none) and whether
        it was dialled for this call."""
        connection = self.live(key)
        if connection is not None:
            return connection, False
        opening = self._opening.get(key)
        fresh = opening is None
        if opening is None:
            opening = asyncio.get_running_loop().create_task(open_(), name="honk-dns-connect")
            self._opening[key] = opening
            opening.add_done_callback(lambda done: self._opened(key, done))
        return await asyncio.shield(opening), fresh

    def _opened(self, key: Hashable, task: asyncio.Task[Connection]) -> None:
        if self._opening.get(key) is task:
            del self._opening[key]
        if task.cancelled() or task.exception() is not None:
            return
        self.dials += 1
        old = self._connections.get(key)
        self._connections[key] = task.result()
        if old is not None and old is not task.result():
            old.close()

    def retire(self, key: Hashable) -> None:
        """Close ``key``'s connection (its route changed): the next query dials anew."""
        connection = self._connections.pop(key, None)
        if connection is not None:
            connection.close()

    async def aclose(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.aclose() for c in connections), return_exceptions=True)
