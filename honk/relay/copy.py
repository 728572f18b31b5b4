"""CopyRelay: the pure-Python reference relay engine.

After a handshake the relay takes both transports over with ``asyncio.Protocol``
objects: the client transport by ``transport.set_protocol`` (the handshake
reader hands back whatever it already buffered, which is written upstream
first), the upstream socket by ``loop.create_connection(sock=...)``. From then
on every chunk moves in a ``data_received`` callback straight into the peer
transport's ``write`` -- no task, no await per chunk, the same on asyncio and
on uvloop.

Invariants:
  * Flow control both ways: when a transport's write buffer passes its
    high-water mark, the *other* transport stops reading
    (``pause_writing`` → ``peer.pause_reading``) until it drains.
  * Half-close: EOF from one side becomes ``write_eof()`` on the other while
    the opposite direction keeps flowing. The flow finishes cleanly once both
    directions have seen EOF; both transports are then closed (flushing).
  * End classification (the first cause wins), by :mod:`honk.relay.ends`: a
    lost client connection (reset, failed write) is :class:`ClientGone`; a
    lost upstream connection is :class:`UpstreamFailed`; both keep the errno; :meth:`CopyRelay.close` ends with the reason
    given (``IdleTimeout`` from the tracker's sweeper, ``FlowClosed`` by
    default). A client's EOF alone is a half-close, not an error.
  * ``bytes_up`` (client → upstream, including pipelined handshake bytes),
    ``bytes_down`` and ``last_activity`` (``clock.now()`` of the last chunk)
    are read live by the connection tracker; only this relay writes them.
  * Framing (``run(..., framing)``, a ``ShadowsocksFraming``): client bytes go
    through ``framing.encryptor`` on their way up, upstream bytes through
    ``framing.decryptor`` on their way down, in the protocols' callbacks. The
    codec's errors end the flow as they are; EOF from the upstream inside a
    chunk is ``ShadowsocksProtocolError("truncated")``. Counters count what
    each socket delivered (plaintext from the client, wire bytes from the
    upstream), as the native engine's do.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable

from honk.core.clock import Clock
from honk.core.errors import FlowClosed, HonkError, UpstreamFailed
from honk.proto.framing import Framing
from honk.relay.ends import client_error, upstream_error
from honk.relay.stream import StreamConn

__all__ = ["CopyRelay", "WRITE_HIGH_WATER"]

# Write-buffer high-water mark per transport (bytes); the low-water mark is a quarter.
WRITE_HIGH_WATER = 256 * 1024


class _Side(asyncio.Protocol):
    """One transport of the relay; ``peer`` is the transport bytes go to."""

    def __init__(self, relay: CopyRelay, is_client: bool) -> None:
        self.relay = relay
        self.is_client = is_client
        self.transport: asyncio.Transport | None = None
        self.peer: _Side
        self.read_done = False  # EOF received from this side
        self.write_done = False  # EOF (or close) sent to this side
        self.lost = False
        # Bytes for this side that arrived before its transport was attached
        # (the upstream may deliver data before the client is taken over).
        self.early: list[bytes] | None = []
        self.early_eof = False

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        early, self.early = self.early, None
        for data in early or ():
            self.send(data)
        if self.early_eof:
            self.shutdown_write()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)  # type: ignore[arg-type]  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        relay = self.relay
        relay.last_activity = relay.clock.now()
        if self.is_client:
            relay.bytes_up += len(data)
        else:
            relay.bytes_down += len(data)
        observer = relay.observer
        if observer is not None:
            if self.is_client:
                observer(len(data), 0)
            else:
                observer(0, len(data))
        framing = relay._framing
        if framing is not None:
            if self.is_client:
                data = framing.encryptor.encrypt(data)
            else:
                data = relay._unframe(data)
            if not data:
                return
        self.peer.send(data)

    def send(self, data: bytes) -> None:
        if self.early is not None:
            self.early.append(data)
            return
        transport = self.transport
        if transport is not None and not self.lost and not self.write_done and not transport.is_closing():
            transport.write(data)

    def eof_received(self) -> bool:
        relay = self.relay
        if not self.is_client and relay._framing is not None and relay._truncated():
            return True
        if self.is_client and relay._framing is not None:
            tail = relay._framing.end()  # VMess ends its body with an empty chunk before the FIN
            if tail:
                self.peer.send(tail)
        self.read_done = True
        if relay.half_closed_at is None:
            relay.half_closed_at = relay.clock.now()
        if not self.is_client or relay._framing is None or getattr(relay._framing, "half_close", True):
            self.peer.shutdown_write()  # (WebSocket inside TLS has no half-close: the upstream stays open)
        self.relay._maybe_finish()
        return True

    def shutdown_write(self) -> None:
        if self.early is not None:
            self.early_eof = True
            return
        if self.write_done:
            return
        self.write_done = True
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        relay = self.relay
        if exc is not None or not relay._finishing:
            err = getattr(exc, "errno", None)
            detail = "" if exc is None or err is not None else repr(exc)
            if not self.is_client and relay._refused_by_reset(err):
                from honk._fast.relay_py import FRAMING_SILENT

                relay._fail(relay._framing.error_for(FRAMING_SILENT))
            else:
                relay._fail(client_error(err, detail) if self.is_client else upstream_error(err, detail))
        relay._side_lost()

    def pause_writing(self) -> None:
        peer = self.peer.transport
        if peer is not None and not self.peer.lost and not self.peer.read_done:
            peer.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer.transport
        if peer is not None and not self.peer.lost and not self.peer.read_done and not peer.is_closing():
            peer.resume_reading()

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.lost and not self.transport.is_closing():
            self.transport.close()


class CopyRelay:
    """Relay one client stream and one connected upstream socket until both directions end.

    Create it, hand its :meth:`close` to the tracker, then ``await run(...)``.
    ``run`` returns after a clean finish and raises the typed end otherwise.
    """

    engine = "copy"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = clock.now()
        self.half_closed_at: float | None = None  # clock time of the first EOF (the tracker's linger)
        self._client = _Side(self, is_client=True)
        self._upstream = _Side(self, is_client=False)
        self._client.peer = self._upstream
        self._upstream.peer = self._client
        self._error: HonkError | None = None
        self._finishing = False
        self._done: asyncio.Future[None] | None = None
        self._started = False  # both transports are wrapped (or setup failed)
        self._open = 0
        self._framing: Framing | None = None
        # told (up, down) byte counts as they arrive (the flow's Score reporter); None: nobody
        self.observer: Callable[[int, int], None] | None = None

    @property
    def error(self) -> HonkError | None:
        return self._error

    async def run(self, client: StreamConn, upstream: socket.socket, framing: Framing | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._framing = framing
        if self._error is not None:  # closed before it started
            client.abort()
            upstream.close()
            await asyncio.sleep(0)  # one loop turn: let the aborted transport release its socket
            raise self._error
        try:
            await loop.create_connection(lambda: self._upstream, sock=upstream)
        except OSError as exc:
            upstream.close()
            client.abort()
            raise UpstreamFailed(f"upstream socket unusable: {exc!r}") from None
        self._open += 1
        try:
            transport, preamble, eof = client.detach()
        except HonkError as exc:
            self._fail(exc)
        else:
            transport.set_protocol(self._client)
            self._client.attach(transport)
            self._open += 1
            if self._error is not None:  # closed while the upstream was being wrapped
                self._client.abort()
                self._upstream.abort()
            else:
                if preamble:
                    self.bytes_up += len(preamble)
                    self.last_activity = self.clock.now()
                    self._upstream.send(preamble if framing is None else framing.encryptor.encrypt(preamble))
                if eof:
                    self._client.eof_received()
        # Only now may the flow count as ended: before this point ``_open`` did not
        # yet include both transports.
        self._started = True
        self._maybe_done()
        try:
            await self._done
        except asyncio.CancelledError:
            # The owner is going away (inbound closed, daemon stopping): never leave
            # the two transports relaying on their own.
            self.close(FlowClosed("relay cancelled"))
            raise
        if self._error is not None:
            raise self._error

    def close(self, reason: HonkError | None = None) -> None:
        """End the flow now with ``reason`` (default ``FlowClosed``); idempotent."""
        self._fail(reason if reason is not None else FlowClosed("closed by request"))

    # -- internals ----------------------------------------------------------------

    def _fail(self, error: HonkError) -> None:
        if self._error is None and not self._finishing:
            self._error = error
        self._finishing = True
        self._client.abort()
        self._upstream.abort()
        self._maybe_done()

    def _unframe(self, data: bytes) -> bytes:
        """Upstream wire bytes -> the plaintext they complete; a codec error ends the flow."""
        try:
            return self._framing.decryptor.feed(data)
        except self._framing.errors as exc:
            self._fail(exc)
            return b""

    def _refused_by_reset(self, err: int | None) -> bool:
        """A TLS upstream reset (or found gone by a write) before any plaintext: the server's
        refusal, as a close then would be (Trojan and VLESS servers reset when they close with
        bytes unread); the engines read it the same way (relay_py._tls_refused)."""
        framing = self._framing
        return (
            framing is not None
            and getattr(framing, "kind", None) == "tls"
            and not framing.answered
            and err in (errno.ECONNRESET, errno.EPIPE)
        )

    def _truncated(self) -> bool:
        """The upstream's EOF came before its answer or inside a chunk: end the flow with the codec's error."""
        from honk._fast.relay_py import FRAMING_SILENT, FRAMING_TRUNCATED

        framing = self._framing
        if not framing.answered:
            self._fail(framing.error_for(FRAMING_SILENT))
            return True
        if not framing.decryptor.pending:
            return False
        self._fail(framing.error_for(FRAMING_TRUNCATED))
        return True

    def _maybe_finish(self) -> None:
        if self._client.read_done and self._upstream.read_done and not self._finishing:
            self._finishing = True
            self._client.close()
            self._upstream.close()

    def _side_lost(self) -> None:
        self._open -= 1
        self._maybe_done()

    def _maybe_done(self) -> None:
        done = self._done
        if self._started and self._open <= 0 and self._finishing and done is not None and not done.done():
            done.set_result(None)
