"""A small buffered byte stream over an asyncio transport.

Inbounds read handshakes through :class:`StreamConn` and the HTTP forwarder
talks to upstreams with it. It is an ``asyncio.Protocol``, not a
``StreamReader``, so that what it has buffered is ours: when the relay takes
the transport over (``transport.set_protocol``), :meth:`StreamConn.detach`
hands back every byte already received, whether EOF was seen, and the
transport with reading resumed. Pipelined bytes are never lost.

Errors: a read raises the error set by :meth:`StreamConn.fail` (a watchdog's
``HandshakeTimeout``, a tracker's ``FlowClosed``) or, after a reset, the
``gone`` type given at construction (``ClientGone`` for the client side,
``UpstreamFailed`` for the upstream side). A clean EOF is ``b""``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from honk.core.errors import HonkError

# Reading pauses while this many unread bytes are buffered (bytes).
READ_LIMIT = 256 * 1024


class StreamConn(asyncio.Protocol):
    def __init__(self, gone: Callable[[str], HonkError], *, limit: int = READ_LIMIT) -> None:
        self._gone = gone
        self._limit = limit
        self._buf = bytearray()
        self._eof = False
        self._lost = False
        self._error: HonkError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self.transport: asyncio.Transport | None = None
        self.bytes_in = 0
        self.bytes_out = 0

    # -- protocol callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self.bytes_in += len(data)
        if len(self._buf) > self._limit and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # keep the write side open: a reply may still be owed (TLS cannot half-close, and asyncio warns if asked)
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None and self._error is None:
            self._error = self._gone(f"connection lost: {exc!r}")
        self._eof = True
        self._wake()
        self._wake_drain()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain()

    # -- waking ------------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_drain(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- API ---------------------------------------------------------------------

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._buf

    @property
    def lost(self) -> bool:
        return self._lost

    def fail(self, error: HonkError) -> None:
        """End the stream with ``error``: pending and later reads raise it; the transport is aborted."""
        if self._error is None:
            self._error = error
        if self.transport is not None and not self._lost:
            self.transport.abort()
        self._wake()
        self._wake_drain()

    async def receive(self) -> bytes:
        """Everything buffered (at least one byte), or ``b""`` at EOF."""
        while True:
            if self._error is not None:
                raise self._error
            if self._buf:
                data = bytes(self._buf)
                self._buf.clear()
                self._resume()
                return data
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def _resume(self) -> None:
        if self._read_paused and self.transport is not None and not self._lost:
            self._read_paused = False
            self.transport.resume_reading()

    def unread(self, data: bytes) -> None:
        """Put bytes a codec received but did not consume back in front of the buffer."""
        if data:
            self._buf[:0] = data
            self._wake()

    def write(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self.transport is None or self._lost or self.transport.is_closing():
            raise self._gone("write after close")
        if data:
            self.transport.write(data)
            self.bytes_out += len(data)

    async def drain(self) -> None:
        while self._write_paused:
            if self._error is not None:
                raise self._error
            if self._lost:
                raise self._gone("connection lost while writing")
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        if self._error is not None:
            raise self._error

    def write_eof(self) -> None:
        if self.transport is not None and not self._lost and self.transport.can_write_eof():
            self.transport.write_eof()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self._lost:
            self.transport.abort()

    def detach(self) -> tuple[asyncio.Transport, bytes, bool]:
        """Give up the transport: returns it (reading resumed), buffered bytes and EOF seen.

        Raises the stream's error if it already failed or was reset. After
        this the caller must ``set_protocol`` on the transport at once (in the
        same loop iteration), so no callback reaches this object again.
        """
        if self._error is not None:
            raise self._error
        if self.transport is None or self._lost:
            raise self._gone("connection closed before relay")
        data = bytes(self._buf)
        self._buf.clear()
        self._resume()
        transport, self.transport = self.transport, None
        return transport, data, self._eof
