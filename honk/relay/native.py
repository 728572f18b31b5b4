"""NativeRelay: the tracker-facing adapter over the shared native relay engine.

:class:`NativeRelay` has the interface ``Dispatcher.relay`` uses for
:class:`~honk.relay.copy.CopyRelay` (``engine``, ``bytes_up``, ``bytes_down``,
``last_activity``, ``close(reason)``, ``await run(client, upstream)``), so the
tracker, close-by-id, the sweeper and shutdown drain work unchanged. The bytes
themselves move in :mod:`honk._fast.relay` (a worker thread splicing natively,
or its pure-Python twin); this object is the only per-flow Python object.

Handoff (``run``):
  1. wait until the client transport has flushed what the handshake wrote
     (uvloop sends queued writes at the end of a loop turn);
  2. ``client.detach()`` -> transport, buffered preamble, EOF seen; then, in
     the same loop turn, ``os.dup`` the client fd, ``pause_reading``, swap in a
     protocol that ignores everything, and ``abort()`` the transport: that
     closes only the original fd (no RST without SO_LINGER), the dup lives on;
  3. the upstream socket is given up with ``sock.detach()``;
  4. ``engine.add(client_fd, upstream_fd, self, preamble, eof)``: the preamble
     goes upstream before any later client byte, and an EOF seen during the
     handshake is forwarded.

Streams the engine cannot carry as plain fds (a TLS transport, anything that
is not a connected SOCK_STREAM socket) are relayed by an internal
:class:`CopyRelay` instead; ``engine`` then says ``copy``.

Framed upstreams (``run(..., framing)`` with a ``ShadowsocksFraming``) go to the
engine with their AEAD state: the worker seals client bytes and opens upstream
chunks itself (no Python per chunk). An END on the upstream side with one of the
engine's FRAMING_* errnos becomes the codec's typed error
(:class:`~honk.proto.shadowsocks.ShadowsocksAuthError` for a tag that does not
verify, :class:`~honk.proto.shadowsocks.ShadowsocksProtocolError` for an
oversized length or a truncated stream). :func:`framed_socket` gives code that
needs a plain socket (the HTTP forwarder) one whose far end the engine frames.

Counters: ``bytes_up``/``bytes_down`` are read live from the engine (exact at
any moment; they count bytes read from each side, preamble included);
``last_activity`` is ``clock.now()`` when the adapter last drained a byte event
for the flow. Byte events are coalesced to one per second, which is fine
against idle timeouts of minutes; event times of the engine (CLOCK_MONOTONIC)
are used only for ``first_byte_at``, never compared with the injected clock.

Engines: :func:`shared_engine` keeps one engine per event loop, created on
first use, and :func:`shared_engines` more of them for the SOCKS fast path's
other worker threads; :func:`close_engines` closes them all (daemon shutdown),
and an engine whose loop is garbage-collected is closed then.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import weakref
from collections.abc import Callable
from typing import Any

from honk._fast import relay as _relay
from honk.core.clock import Clock
from honk.core.errors import FlowClosed, HonkError
from honk.proto.framing import Framing
from honk.relay.copy import CopyRelay
from honk.relay.ends import client_error, local_error, upstream_error
from honk.relay.events import EndCause, RelayEnd, Side, decode_end
from honk.relay.stream import StreamConn

__all__ = [
    "NativeRelay",
    "close_engines",
    "framed_socket",
    "end_error",
    "native_available",
    "shared_engine",
    "shared_engines",
]

# Size a bulk direction's splice pipe grows to (bytes; 0 = the engine's BULK_PIPE_SIZE, 1 MiB;
# -1 = never grow, keep the kernel's 64 KiB). Benchmarks and debugging only.
PIPE_SIZE = int(os.environ.get("HONK_RELAY_PIPE_SIZE", "0"))

# How long run() waits for the handshake's reply to leave the client transport (seconds).
FLUSH_TIMEOUT = 5.0

# the engine's event kinds, read once: relay_event compares against them for every event
_EV_BYTES, _EV_FIRST_BYTE = _relay.EV_BYTES, _relay.EV_FIRST_BYTE
_EV_HALF_CLOSE, _EV_END = _relay.EV_HALF_CLOSE, _relay.EV_END

_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _relay.Engine] = weakref.WeakKeyDictionary()
# more engines of a loop, for the SOCKS fast path's other worker threads (shared_engines)
_more_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_relay.Engine]] = (
    weakref.WeakKeyDictionary()
)


def native_available() -> bool:
    """True when the compiled engine is built (the twin is used only when forced)."""
    return _relay.IMPLEMENTATION == "compiled"


def shared_engine(loop: asyncio.AbstractEventLoop | None = None) -> _relay.Engine:
    """The engine of ``loop`` (default: the running loop), created on first use."""
    if loop is None:
        loop = asyncio.get_running_loop()
    engine = _engines.get(loop)
    if engine is None or engine.closed:
        engine = _relay.Engine(loop, pipe_size=PIPE_SIZE)
        _engines[loop] = engine
        # The engine holds its loop weakly; when the loop goes, so does the engine.
        weakref.finalize(loop, engine.close)
    return engine


def shared_engines(count: int, loop: asyncio.AbstractEventLoop | None = None) -> list[_relay.Engine]:
    """``count`` engines of ``loop`` (each its own worker thread), :func:`shared_engine`'s first;
    the others are created on first use and kept for the loop's life as it is."""
    if loop is None:
        loop = asyncio.get_running_loop()
    first = shared_engine(loop)
    more = [engine for engine in _more_engines.get(loop, []) if not engine.closed]
    while len(more) < count - 1:
        engine = _relay.Engine(loop, pipe_size=PIPE_SIZE)
        weakref.finalize(loop, engine.close)
        more.append(engine)
    _more_engines[loop] = more
    return [first, *more[: max(count - 1, 0)]]


def close_engines() -> int:
    """Close every shared engine (their flows end with ``FlowClosed``); returns how many."""
    engines = list(_engines.values()) + [engine for more in _more_engines.values() for engine in more]
    _engines.clear()
    _more_engines.clear()
    for engine in engines:
        engine.close()
    return len(engines)


def end_error(end: RelayEnd, framing: Framing | None) -> HonkError | None:
    """The typed error of a flow that ended as ``end`` (None for a clean end): the framing's
    own error for its verdict on the upstream's bytes, else the failing side's."""
    if end.cause is EndCause.CLEAN:
        return None
    if end.cause is EndCause.CANCELLED:
        return FlowClosed("relay engine closed")
    if end.side is Side.CLIENT:
        return client_error(end.errno)
    if end.side is Side.UPSTREAM:
        if framing is not None and end.framing_verdict:
            return framing.error_for(end.errno)
        return upstream_error(end.errno)
    return local_error(end.errno)


class _Bridge:
    """Engine events of a :func:`framed_socket` bridge: nothing to track, the plain end carries the flow."""

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        pass


def framed_socket(
    upstream: socket.socket, framing: Framing, engine: _relay.Engine | None = None
) -> socket.socket:
    """A plain connected stream socket standing for the framed ``upstream``.

    The engine (default: the running loop's) takes ``upstream`` over and relays
    between it and the other end of a socket pair, sealing and opening through
    ``framing``; the caller reads and writes plain bytes on the returned socket.
    A framing failure closes the pair (the caller sees EOF or a reset).
    """
    if engine is None:
        engine = shared_engine()
    plain, inner = socket.socketpair()
    plain.setblocking(False)
    inner_fd = inner.detach()
    upstream_fd = upstream.detach()
    try:
        engine.add(inner_fd, upstream_fd, _Bridge(), framing=framing)
    except Exception:
        os.close(inner_fd)
        os.close(upstream_fd)
        plain.close()
        raise
    return plain


class _Discard(asyncio.Protocol):
    """The client transport's last protocol, while it is being aborted."""

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return True


class NativeRelay:
    """Relay one client stream and one upstream socket through the native engine."""

    def __init__(self, clock: Clock, engine: _relay.Engine | None = None) -> None:
        self.clock = clock
        implementation = engine.implementation if engine is not None else _relay.IMPLEMENTATION
        self.engine = "native" if implementation == "compiled" else "native-python"
        self.last_activity = clock.now()
        self.first_byte_at: float | None = None  # CLOCK_MONOTONIC seconds of the first upstream byte
        self.half_closed = 0  # bit 0: client EOF forwarded upstream; bit 1: upstream EOF forwarded
        self.half_closed_since: float | None = (
            None  # clock time of the first EOF forwarded (the tracker's linger)
        )
        self._engine = engine
        self._id: int | None = None
        self._base_up = 0  # preamble bytes, sent before the engine counts
        self._up = 0
        self._down = 0
        self._error: HonkError | None = None
        self._ended = False
        self._done: asyncio.Future[None] | None = None
        self._copy: CopyRelay | None = None
        self.framing: Framing | None = (
            None  # the upstream's framing (run() sets it; the fast path before hs_relay)
        )
        # told (up, down) byte deltas at each byte event (the flow's Score reporter); None: nobody
        self.observer: Callable[[int, int], None] | None = None
        self._seen = (0, 0)  # the counters the observer was last told

    # -- what the tracker reads ---------------------------------------------------------

    @property
    def bytes_up(self) -> int:
        if self._copy is not None:
            return self._copy.bytes_up
        if self._id is not None:
            counts = self._engine.counters(self._id)
            if counts is not None:
                return self._base_up + counts[0]
        return self._up

    @property
    def bytes_down(self) -> int:
        if self._copy is not None:
            return self._copy.bytes_down
        if self._id is not None:
            counts = self._engine.counters(self._id)
            if counts is not None:
                return counts[1]
        return self._down

    @property
    def error(self) -> HonkError | None:
        return self._copy.error if self._copy is not None else self._error

    @property
    def half_closed_at(self) -> float | None:
        """When the flow's first direction ended (None: both still open), whichever engine runs it."""
        return self._copy.half_closed_at if self._copy is not None else self.half_closed_since

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, client: StreamConn, upstream: socket.socket, framing: Framing | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self.framing = framing
        transport = client.transport
        if self._error is None and not _eligible(transport, upstream):
            await self._run_copy(client, upstream, framing)
            return
        if self._error is None and transport is not None and not await _flushed(transport):
            self._error = client_error(errno.ETIMEDOUT, "the handshake reply was not taken")
        if self._error is not None:  # closed before it started
            client.abort()
            upstream.close()
            await asyncio.sleep(0)  # one loop turn: let the aborted transport release its socket
            raise self._error
        try:
            transport, preamble, eof = client.detach()
        except HonkError:
            upstream.close()
            raise
        try:
            client_fd = os.dup(transport.get_extra_info("socket").fileno())
        except OSError as exc:
            transport.abort()
            upstream.close()
            raise client_error(exc.errno, "taking the socket over") from None
        transport.pause_reading()
        transport.set_protocol(_Discard())
        transport.abort()
        upstream_fd = upstream.detach()
        if self._engine is None:
            self._engine = shared_engine(loop)
        if preamble:
            self._base_up = self._up = len(preamble)
            self.last_activity = self.clock.now()
        try:
            self._id = self._engine.add(client_fd, upstream_fd, self, preamble, eof, framing=framing)
        except Exception as exc:
            os.close(client_fd)
            os.close(upstream_fd)
            raise local_error(getattr(exc, "errno", None), f"engine refused the flow: {exc}") from None
        try:
            await self._done
        except asyncio.CancelledError:
            # The owner is going away: never leave the flow relaying on its own.
            self.close(FlowClosed("relay cancelled"))
            raise
        if self._error is not None:
            raise self._error

    async def _run_copy(self, client: StreamConn, upstream: socket.socket, framing: Framing | None) -> None:
        self.engine = "copy"
        self._copy = CopyRelay(self.clock)
        self._copy.observer = self.observer
        try:
            await self._copy.run(client, upstream, framing)
        finally:
            self.last_activity = self._copy.last_activity

    def close(self, reason: HonkError | None = None) -> None:
        """End the flow now with ``reason`` (default ``FlowClosed``); idempotent, the first reason wins."""
        if self._copy is not None:
            self._copy.close(reason)
            return
        if self._error is None and not self._ended:
            self._error = reason if reason is not None else FlowClosed("closed by request")
        if self._id is not None:
            self._engine.cancel(self._id)

    # -- events from the engine (on the loop's thread) ------------------------------------

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        if kind == _EV_BYTES:
            up = self._base_up + a
            if up != self._up or b != self._down:
                self.last_activity = self.clock.now()
            self._up, self._down = up, b
            if self.observer is not None:
                self._observe(up, b)
        elif kind == _EV_FIRST_BYTE:  # with the counts so far: the client's bytes are told first
            self.first_byte_at = t
            self.last_activity = self.clock.now()
            up = self._base_up + a
            if up > self._up:
                self._up = up
            if b > self._down:
                self._down = b
            if self.observer is not None:  # told at once: byte events are coalesced to one a second
                self._observe(max(up, self._seen[0]), max(b, self._seen[1], 1))
        elif kind == _EV_HALF_CLOSE:
            self.half_closed |= 1 << a
            if self.half_closed_since is None:
                self.half_closed_since = self.clock.now()
        elif kind == _EV_END:
            self.ended(decode_end(a, b))

    def ended(self, end: RelayEnd) -> None:
        """The engine's END: the flow is over; its error (the first one stands) is kept."""
        self._id = None
        self._ended = True
        if end.cause is EndCause.CLEAN:
            self.half_closed = 0b11  # both directions finished (the second EOF is not an event)
        if self._error is None:
            self._error = end_error(end, self.framing)
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)

    def _observe(self, up: int, down: int) -> None:
        seen_up, seen_down = self._seen
        if up > seen_up or down > seen_down:
            self._seen = (max(up, seen_up), max(down, seen_down))
            self.observer(max(up - seen_up, 0), max(down - seen_down, 0))  # type: ignore[misc]


def _eligible(transport: Any, upstream: socket.socket) -> bool:
    """Plain TCP/Unix stream sockets on both sides, no TLS in between."""
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return False
    if transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None or getattr(sock, "type", None) != socket.SOCK_STREAM:
        return False
    return isinstance(upstream, socket.socket) and upstream.type == socket.SOCK_STREAM


async def _flushed(transport: Any) -> bool:
    """Wait until the transport's write buffer is empty; False after FLUSH_TIMEOUT seconds."""
    if not transport.get_write_buffer_size():
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FLUSH_TIMEOUT
    spins = 0
    while transport.get_write_buffer_size() and not transport.is_closing():
        if loop.time() > deadline:
            return False
        spins += 1
        await asyncio.sleep(0 if spins < 8 else 0.001)
    return True
