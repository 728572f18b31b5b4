"""The TCP health probe: a raw connect, or two HTTP requests on one connection through a leaf.

Why two rounds: the first request (a HEAD warm-up) pays for everything cold on
the path (the proxy's upstream connect, the origin's first response), so only
the second request's round trip, from writing its request to reading its final
response head, is reported (GH-F-11). Dial, TLS and HTTP/2 startup are not in it.

How one HTTP probe runs, each step with its own budget of ``stage_timeout`` on
the injected clock (GH-F-14):

  * ``dial``: ``dial(Address, deadline)`` through the leaf; a framed stream
    (Shadowsocks) becomes a plain socket through the relay engine.
  * ``tls`` (https only): certificate verification, ALPN ``h2,http/1.1``, SNI
    from the URL's host. ALPN is set on the context used, so a context given by
    the caller should be one kept for probes.
  * ``h2`` (when ALPN chose HTTP/2): preface and SETTINGS both ways; the probe
    waits for the server to acknowledge its own settings (push disabled, header
    lists capped at 16 KiB) so they are in force before the first request.
  * ``request``, once per round. Both final statuses must be 200-499 (GH-F-06).
    Round 2 stops at its response head: no body is downloaded.

Failures of round 2 that the design forgives return round 1's sample with
``fallback=True`` (GH-F-12): on HTTP/1 a transport end before any byte of the
second response (the server closed after round 1, or would not keep the
connection alive); on HTTP/2 a graceful GOAWAY during round 2, or a
``REFUSED_STREAM`` reset of its stream. Anything else fails, in particular a
partial or invalid head, a timeout, and any HTTP/2 protocol error this side
detects: that ends the probe at the frame that caused it, so nothing the server
sends later is even read (GH-F-09).

The connection is aborted when the probe ends, however it ends (GH-F-13).
Errors are :class:`~honk.alive.outcome.ProbeError` with static words only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hpack.exceptions import OversizedHeaderListError

from honk import __version__
from honk.alive.checkurl import CheckUrl
from honk.alive.outcome import ProbeError, ProbeSample
from honk.core.clock import Clock, timeout_at
from honk.core.errors import DialTimeout, HonkError
from honk.core.net import Address
from honk.outbound.base import DialedStream
from honk.relay.native import framed_socket

__all__ = ["Dial", "measure_http", "measure_tcp_connect"]

# (target, absolute deadline on the dialer's clock) -> a connected stream; Outbound.dial_tcp is one.
Dial = Callable[[Address, float], Awaitable[DialedStream]]

INFORMATIONAL_HEAD_CAP = 16 * 1024  # "Their cumulative size per round is capped at 16 KiB" (1xx heads)
HEADER_LIST_CAP = 16 * 1024  # "HTTP/2 response header lists use the same 16 KiB cap"
# h11's own limit on one head, which it applies only to a head still incomplete after a read;
# checked here on every final head so the outcome does not depend on how reads split the bytes.
HTTP1_HEAD_CAP = 16 * 1024
HEADER_ENTRY_OVERHEAD = 32  # RFC 7541 section 4.1: each header counts name + value + 32 octets
ALPN_PROTOCOLS = ["h2", "http/1.1"]  # "negotiates ALPN h2,http/1.1"
DEFAULT_METHOD = "HEAD"  # "tcp_check_http_method: empty is HEAD"
READ_CHUNK = 64 * 1024  # bytes asked of the connection per read
USER_AGENT = f"honk/{__version__}".encode()
LOWEST_STATUS, HIGHEST_STATUS = 200, 499  # "a valid decoded status in the range 200-499"
BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})  # methods whose empty body is declared

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: what a method may be
_SWITCHING_HEAD = re.compile(rb"HTTP/[0-9]\.[0-9] 101")
_STATUS = re.compile(rb"[0-9]{3}")


async def measure_tcp_connect(
    dial: Dial, target: Address, clock: Clock, *, stage_timeout: float
) -> ProbeSample:
    """The raw TCP probe (no URL configured): the time a dial through the leaf takes to complete."""
    started = clock.now()
    sock = await _dial(dial, target, clock, stage_timeout)
    rtt = clock.now() - started
    sock.close()
    return ProbeSample(rtt)


async def measure_http(
    dial: Dial,
    url: CheckUrl,
    method: str,
    clock: Clock,
    *,
    stage_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    warmup_method: str = DEFAULT_METHOD,
) -> ProbeSample:
    """Two requests to ``url`` on one connection through ``dial``; the second one's RTT.

    ``method`` is the configured method (empty: HEAD); ``warmup_method`` is round 1's.
    Raises :class:`ProbeError`.
    """
    second = _method(method)
    first = _method(warmup_method)
    sock = await _dial(dial, Address(url.host, url.port), clock, stage_timeout)
    reader, writer = await _open(sock, url, clock, stage_timeout, ssl_context)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if alpn == "h2":
            return await _Http2(reader, writer, url, clock, stage_timeout).run(first, second)
        return await _Http1(reader, writer, url, clock, stage_timeout).run(first, second)
    finally:
        writer.transport.abort()  # nothing more is read or written; the socket goes at once


def _method(text: str) -> bytes:
    text = text or DEFAULT_METHOD
    if not _TOKEN.fullmatch(text):
        raise ProbeError("request", "method")
    return text.encode("ascii")


@contextlib.asynccontextmanager
async def _phase(clock: Clock, phase: str, budget: float) -> AsyncIterator[None]:
    """Bound a phase by its own budget; its timeout is ``ProbeError(phase, "timeout")``."""
    try:
        async with timeout_at(clock, clock.now() + budget):
            yield
    except TimeoutError:
        raise ProbeError(phase, "timeout") from None


async def _dial(dial: Dial, target: Address, clock: Clock, budget: float) -> socket.socket:
    async with _phase(clock, "dial", budget):
        try:
            stream = await dial(target, clock.now() + budget)
        except DialTimeout:
            raise ProbeError("dial", "timeout") from None
        except (HonkError, OSError):
            raise ProbeError("dial", "failed") from None
    if stream.framing is None:
        return stream.sock
    try:  # a Shadowsocks stream: the relay engine frames a plain socket for us
        return framed_socket(stream.sock, stream.framing)
    except (OSError, ValueError):
        stream.sock.close()
        raise ProbeError("dial", "failed") from None


@functools.cache
def _default_context() -> ssl.SSLContext:
    """The system trust store, loaded once and shared by every probe that brings no context."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(ALPN_PROTOCOLS)
    return context


async def _open(
    sock: socket.socket, url: CheckUrl, clock: Clock, budget: float, context: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over ``sock``: TLS for https (phase ``tls``), plain otherwise."""
    if url.tls:
        if context is None:
            context = _default_context()
        else:
            context.set_alpn_protocols(ALPN_PROTOCOLS)
    phase = "tls" if url.tls else "dial"
    try:
        async with _phase(clock, phase, budget):
            return await asyncio.open_connection(
                sock=sock,
                ssl=context if url.tls else None,
                server_hostname=url.host if url.tls else None,
                limit=READ_CHUNK,
            )
    except BaseException as exc:
        sock.close()  # a no-op once a transport took the socket over (and closed it on failure)
        if isinstance(exc, ssl.SSLCertVerificationError | ssl.CertificateError):
            raise ProbeError(phase, "certificate") from None
        if isinstance(exc, ssl.SSLError):
            raise ProbeError(phase, "handshake") from None
        if isinstance(exc, OSError):
            raise ProbeError(phase, "closed") from None
        raise


# --- HTTP/1.1 ---------------------------------------------------------------------------


class _SecondRoundLost(Exception):
    """Round 2's transport ended before any byte of its response: round 1's sample stands."""


class _Exchange:
    """The two rounds over one connection; each round has ``budget`` seconds."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        url: CheckUrl,
        clock: Clock,
        budget: float,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.url = url
        self.clock = clock
        self.budget = budget


class _Http1(_Exchange):
    """Both rounds on one keep-alive HTTP/1.1 connection, parsed by h11."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.conn = h11.Connection(h11.CLIENT)  # h11's own cap: one head at most 16 KiB
        self.fed = 0  # bytes handed to h11 so far

    async def run(self, first: bytes, second: bytes) -> ProbeSample:
        warm, warm_status = await self._round(first, final=False)
        if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
            # the server will not keep the connection: nothing is sent
            return ProbeSample(warm, fallback=True, status=warm_status)
        self.conn.start_next_cycle()
        try:
            rtt, status = await self._round(second, final=True)
        except _SecondRoundLost:
            return ProbeSample(warm, fallback=True, status=warm_status)
        return ProbeSample(rtt, status=status)

    def _consumed(self) -> int:
        """Bytes h11 has parsed into events so far."""
        return self.fed - len(self.conn.trailing_data[0])

    async def _round(self, method: bytes, *, final: bool) -> tuple[float, int]:
        """One request and its final response head: (RTT seconds, status)."""
        headers = [
            (b"Host", self.url.authority.encode("ascii")),
            (b"User-Agent", USER_AGENT),
            (b"Accept", b"*/*"),
            (b"Connection", b"keep-alive"),
        ]
        if method in BODY_METHODS:
            headers.append((b"Content-Length", b"0"))
        try:
            request = self.conn.send(h11.Request(method=method, target=self.url.target, headers=headers))
            request += self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            raise ProbeError("request", "invalid-request") from None
        round_start = head_start = self._consumed()
        # Bytes already buffered when the round starts were sent unasked: they count as a response begun.
        answered = self.fed > round_start
        async with _phase(self.clock, "request", self.budget):
            started = self.clock.now()
            try:
                self.writer.write(request)
                await self.writer.drain()
            except OSError:
                raise self._lost(final, answered) from None
            while True:
                event = self._next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await self._feed()
                    except OSError:
                        data = b""  # a reset ends the round like a close
                    if not data:
                        raise self._lost(final, answered)
                    answered = True
                elif isinstance(event, h11.InformationalResponse):
                    head_start = self._consumed()
                    if head_start - round_start > INFORMATIONAL_HEAD_CAP:
                        raise ProbeError("request", "informational-too-large")
                elif isinstance(event, h11.Response):
                    elapsed = self.clock.now() - started
                    if self._consumed() - head_start > HTTP1_HEAD_CAP:
                        raise ProbeError("request", "headers-too-large")
                    if not LOWEST_STATUS <= event.status_code <= HIGHEST_STATUS:
                        raise ProbeError("request", "status")
                    if not final:
                        await self._skip_body()
                    return elapsed, event.status_code
                else:  # ConnectionClosed or a stray event before any head
                    raise self._lost(final, answered)

    def _next_event(self) -> object:
        if self.conn.their_state is h11.SEND_RESPONSE and _SWITCHING_HEAD.match(self.conn.trailing_data[0]):
            raise ProbeError("request", "upgrade")  # h11 reports an unasked 101 as a bare protocol error
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            reason = "headers-too-large" if exc.error_status_hint == 431 else "protocol"
            raise ProbeError("request", reason) from None

    async def _skip_body(self) -> None:
        """Read the warm-up response to its end (nothing for HEAD) so the connection can carry round 2."""
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                try:
                    await self._feed()  # b"" is the end of a read-until-close body
                except OSError:
                    raise ProbeError("request", "closed") from None
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise ProbeError("request", "closed")

    async def _feed(self) -> bytes:
        """Hand h11 the next bytes of the connection (``b""``: its end); a reset raises OSError."""
        data = await self.reader.read(READ_CHUNK)
        self.fed += len(data)
        self.conn.receive_data(data)
        return data

    @staticmethod
    def _lost(final: bool, answered: bool) -> Exception:
        if final and not answered:
            return _SecondRoundLost()
        return ProbeError("request", "closed")


# --- HTTP/2 -----------------------------------------------------------------------------


class _Fallback(Exception):
    """Round 2 ended the way GH-F-12 forgives on HTTP/2."""


class _Http2(_Exchange):
    """Both rounds as two streams of one HTTP/2 connection, framed by h2."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.events: deque[h2.events.Event] = deque()  # received, not yet looked at

    async def run(self, first: bytes, second: bytes) -> ProbeSample:
        await self._start()
        warm, warm_status = await self._round(first, final=False)
        try:
            rtt, status = await self._round(second, final=True)
        except _Fallback:
            return ProbeSample(warm, fallback=True, status=warm_status)
        return ProbeSample(rtt, status=status)

    async def _start(self) -> None:
        self.conn.initiate_connection()
        self.conn.update_settings(
            {SettingCodes.ENABLE_PUSH: 0, SettingCodes.MAX_HEADER_LIST_SIZE: HEADER_LIST_CAP}
        )
        self._send()
        server_settings = False
        async with _phase(self.clock, "h2", self.budget):
            # Our settings apply once acknowledged; until then push and large header lists are allowed.
            while not (server_settings and self.conn.local_settings.enable_push == 0):
                while not self.events:  # a read may carry no complete frame, or frames with no event
                    await self._receive("h2")
                event = self.events.popleft()
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    server_settings = True
                elif isinstance(event, h2.events.ConnectionTerminated):
                    raise ProbeError("h2", "goaway")

    async def _round(self, method: bytes, *, final: bool) -> tuple[float, int]:
        """One request on a new stream and its final response head: (RTT seconds, status)."""
        async with _phase(self.clock, "request", self.budget):
            # What arrived after round 1's head (a GOAWAY, say) is settled before a stream is opened.
            stream_id = self.conn.get_next_available_stream_id()
            while self.events:
                self._settle(self.events.popleft(), stream_id, final, started=None)
            headers = [
                (b":method", method),
                (b":scheme", self.url.scheme.encode("ascii")),
                (b":authority", self.url.authority.encode("ascii")),
                (b":path", self.url.target.encode("ascii")),
                (b"user-agent", USER_AGENT),
                (b"accept", b"*/*"),
            ]
            started = self.clock.now()
            try:
                self.conn.send_headers(stream_id, headers, end_stream=True)
            except h2.exceptions.ProtocolError:
                raise ProbeError("request", "protocol") from None
            self._send()
            informational = 0
            while True:
                while not self.events:  # a read may carry no complete frame, or frames with no event
                    await self._receive("request")
                event = self.events.popleft()
                outcome = self._settle(event, stream_id, final, started)
                if (
                    isinstance(event, h2.events.InformationalResponseReceived)
                    and event.stream_id == stream_id
                ):
                    informational += _header_list_size(event.headers)
                    if informational > INFORMATIONAL_HEAD_CAP:
                        raise ProbeError("request", "informational-too-large")
                if outcome is not None:
                    if not final and not self._stream_ended(stream_id):
                        self.conn.reset_stream(stream_id, ErrorCodes.CANCEL)  # a warm-up body is not read
                        self._send()
                    return outcome

    def _settle(
        self, event: h2.events.Event, stream_id: int, final: bool, started: float | None
    ) -> tuple[float, int] | None:
        """Look at one event for the round on ``stream_id`` (``started`` None: not sent yet).

        Returns the round's (RTT, status) when ``event`` is its final head, None to go on; raises
        :class:`ProbeError`, or :class:`_Fallback` when round 2 ended in a forgiven way.
        """
        if isinstance(event, h2.events.ConnectionTerminated):
            if event.error_code != ErrorCodes.NO_ERROR:
                raise ProbeError("request", "goaway")
            # A graceful GOAWAY in round 2 is forgiven even when it still covers round 2's
            # stream: h2 ends its connection state on any GOAWAY, so the stream is not read on.
            if final:
                raise _Fallback
            raise ProbeError("request", "goaway")
        if getattr(event, "stream_id", None) != stream_id or started is None:
            return None  # the cancelled warm-up stream, or connection-level chatter
        if isinstance(event, h2.events.ResponseReceived):
            elapsed = self.clock.now() - started
            if _header_list_size(event.headers) > HEADER_LIST_CAP:
                raise ProbeError("request", "headers-too-large")
            status = dict(event.headers).get(b":status", b"")
            if not _STATUS.fullmatch(status):
                raise ProbeError("request", "protocol")
            code = int(status)
            if not LOWEST_STATUS <= code <= HIGHEST_STATUS:
                raise ProbeError("request", "status")
            return elapsed, code
        if isinstance(event, h2.events.InformationalResponseReceived):
            if _header_list_size(event.headers) > HEADER_LIST_CAP:
                raise ProbeError("request", "headers-too-large")
            if dict(event.headers).get(b":status") == b"101":
                raise ProbeError("request", "upgrade")
            return None
        if isinstance(event, h2.events.StreamReset):
            if final and event.remote_reset and event.error_code == ErrorCodes.REFUSED_STREAM:
                raise _Fallback
            raise ProbeError("request", "reset")
        return None

    def _stream_ended(self, stream_id: int) -> bool:
        stream = self.conn.streams.get(stream_id)
        return stream is None or stream.closed  # our side ended with the request: closed means theirs did

    async def _receive(self, phase: str) -> None:
        try:
            data = await self.reader.read(READ_CHUNK)
        except OSError:
            data = b""
        if not data:
            raise ProbeError(phase, "closed")
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # A local protocol error ends the probe at this frame: nothing later is parsed (GH-F-09).
            self._send()  # h2's GOAWAY, best effort: the connection is aborted right after
            oversized = isinstance(exc.__cause__, OversizedHeaderListError)
            raise ProbeError(phase, "headers-too-large" if oversized else "protocol") from None
        self.events.extend(events)
        self._send()  # settings and ping acknowledgements, window updates

    def _send(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)


def _header_list_size(headers: list[tuple[bytes, bytes]]) -> int:
    """A decoded header list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it."""
    return sum(len(name) + len(value) + HEADER_ENTRY_OVERHEAD for name, value in headers)
