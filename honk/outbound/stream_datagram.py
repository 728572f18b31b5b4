"""UDP carried inside a stream: the datagram endpoints of VMess, VLESS and Trojan nodes.

These protocols have no UDP of their own: a request with the UDP command opens
a stream (TCP, TLS, WebSocket: :func:`~honk.outbound.transport.open_transport`)
and the datagrams travel inside it, each framed by the protocol.

* :class:`StreamDatagramEndpoint` is one such stream. A
  :class:`DatagramCodec` says how a datagram is framed for the server and how
  the server's bytes split into ``(payload, source)`` pairs. A reader task
  delivers the replies; ``send`` frames and writes at once (it never waits: a
  datagram for a stream that is not up yet waits in a small queue, one for a
  stream that is gone is dropped and counted). The stream ending (EOF, an
  error, a malformed reply) ends the endpoint, reported once through
  ``on_lost``. Trojan uses it as is: one stream carries every target.
* :class:`PerTargetDatagramEndpoint` is what VMess and VLESS need: their UDP
  request names one target, so it keeps one stream per target, opened on the
  first datagram to it, at most :data:`MAX_STREAMS_PER_ENDPOINT` (the oldest is
  closed first). Any of its streams being lost ends the whole endpoint: the
  association that owns it drops its routes and dials afresh on the next
  datagram, which is cheaper than telling a server that went away from one
  stream closed for idling.

Endpoints belong to the association that dialled them, not to the node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from honk.core.errors import HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost
from honk.outbound.channel import Channel

__all__ = [
    "MAX_PENDING_PER_STREAM",
    "MAX_STREAMS_PER_ENDPOINT",
    "DatagramCodec",
    "PerTargetDatagramEndpoint",
    "StreamDatagramEndpoint",
]

log = logging.getLogger("honk.outbound.stream_datagram")

# Streams one VMess/VLESS endpoint keeps open (one per target); the oldest is closed past this.
MAX_STREAMS_PER_ENDPOINT = 64
# Datagrams held while a stream is being opened; more are dropped (UDP may lose them).
MAX_PENDING_PER_STREAM = 16


class DatagramCodec(Protocol):
    """A protocol's datagram framing inside one stream."""

    def encode(self, payload: bytes, target: Address) -> bytes:
        """The bytes that carry ``payload`` to ``target`` (the request header before the first);
        ValueError when it does not fit the protocol."""

    def decode(self, data: bytes) -> list[tuple[bytes, Address]]:
        """The datagrams completed by ``data`` with their sources; ``b""`` is EOF.
        Raises the codec's typed error (a :class:`HonkError`) for malformed bytes."""


class StreamDatagramEndpoint:
    """One stream carrying datagrams (see the module docstring).

    Counters: ``dropped`` (datagrams sent while the stream was gone or its
    queue full), ``send_errors`` (datagrams the protocol cannot frame).
    """

    def __init__(
        self, outbound: str, codec: DatagramCodec, receive: DatagramSink, on_lost: EndpointLost | None
    ) -> None:
        self.outbound = outbound
        self._codec = codec
        self._receive = receive
        self._on_lost = on_lost
        self._channel: Channel | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: list[tuple[bytes, Address]] = []
        self._closed = False
        self.dropped = 0
        self.send_errors = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def attach(self, channel: Channel) -> None:
        """Start carrying datagrams over ``channel`` (a transport that is up); queued ones go first."""
        if self._closed:
            channel.abort()
            return
        self._channel = channel
        pending, self._pending = self._pending, []
        for payload, target in pending:
            self._write(payload, target)
        if not self._closed:
            self._reader = asyncio.get_running_loop().create_task(self._read(channel))

    def send(self, payload: bytes, target: Address) -> None:
        if self._closed:
            self.dropped += 1
            return
        if self._channel is None:
            if len(self._pending) >= MAX_PENDING_PER_STREAM:
                self.dropped += 1
            else:
                self._pending.append((payload, target))
            return
        self._write(payload, target)

    def close(self) -> None:
        self._finish(None)

    def fail(self, error: HonkError) -> None:
        """End the endpoint with ``error`` (its stream could not be opened, for one)."""
        self._finish(error)

    def _write(self, payload: bytes, target: Address) -> None:
        assert self._channel is not None
        try:
            data = self._codec.encode(payload, target)
        except ValueError:  # too long for the protocol's length field, or a name that does not fit
            self.send_errors += 1
            return
        try:
            self._channel.write(data)
        except HonkError as exc:  # the transport below is gone; its reader reports it too
            self.dropped += 1
            self._finish(exc)
        except OSError as exc:
            self.dropped += 1
            self._finish(UpstreamFailed(f"{self.outbound}: UDP stream write failed: {exc.strerror or exc}"))

    async def _read(self, channel: Channel) -> None:
        error: HonkError
        try:
            while True:
                data = await channel.receive()
                for payload, source in self._codec.decode(data):
                    if self._closed:
                        return
                    self._receive(payload, source)
                if not data:
                    error = UpstreamFailed(f"{self.outbound}: the server closed the UDP stream")
                    break
        except asyncio.CancelledError:
            return  # closed by its owner
        except HonkError as exc:
            error = exc
        except OSError as exc:
            error = UpstreamFailed(f"{self.outbound}: UDP stream failed: {exc.strerror or exc}")
        self._finish(error)

    def _finish(self, error: HonkError | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._pending = []
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        if self._channel is not None:
            if error is None:
                self._channel.close()
            else:
                self._channel.abort()
        if error is not None:
            log.debug("udp stream ended outbound=%s error=%s", self.outbound, type(error).__name__)
        if self._on_lost is not None:
            self._on_lost(error)


# Opens the stream for one target: the transport up, ready for the codec's bytes.
StreamOpener = Callable[[], Awaitable[Channel]]


class PerTargetDatagramEndpoint:
    """Datagrams to any target over one stream per target (VMess, VLESS; see the module docstring)."""

    def __init__(
        self,
        outbound: str,
        open_stream: StreamOpener,
        codec_for: Callable[[Address], DatagramCodec],
        receive: DatagramSink,
        on_lost: EndpointLost | None,
    ) -> None:
        self.outbound = outbound
        self._open_stream = open_stream
        self._codec_for = codec_for
        self._receive = receive
        self._on_lost = on_lost
        self._streams: dict[Address, StreamDatagramEndpoint] = {}  # insertion order: oldest first
        self._opening: set[asyncio.Task[None]] = set()
        self._closed = False
        self.send_errors = 0  # datagrams to targets the protocol cannot name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def streams(self) -> int:
        """How many per-target streams are open or opening."""
        return len(self._streams)

    def send(self, payload: bytes, target: Address) -> None:
        if self._closed:
            return
        stream = self._streams.get(target)
        if stream is None:
            try:
                codec = self._codec_for(target)
            except ValueError:
                self.send_errors += 1
                return
            stream = self._start(target, codec)
        stream.send(payload, target)

    def close(self) -> None:
        self._finish(None)

    def _start(self, target: Address, codec: DatagramCodec) -> StreamDatagramEndpoint:
        while len(self._streams) >= MAX_STREAMS_PER_ENDPOINT:
            oldest = next(iter(self._streams))
            self._streams.pop(oldest).close()  # already out of the dict: its on_lost is ours, not a loss
        # the callback looks ``stream`` up when it runs, by which time it is bound
        stream = StreamDatagramEndpoint(
            self.outbound, codec, self._receive, lambda error: self._stream_lost(stream, error)
        )
        self._streams[target] = stream
        task = asyncio.get_running_loop().create_task(self._open(stream))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)
        return stream

    async def _open(self, stream: StreamDatagramEndpoint) -> None:
        try:
            channel = await self._open_stream()
        except asyncio.CancelledError:
            stream.close()
            raise
        except HonkError as exc:
            stream.fail(exc)
            return
        except OSError as exc:
            stream.fail(UpstreamFailed(f"{self.outbound}: UDP stream failed: {exc.strerror or exc}"))
            return
        stream.attach(channel)

    def _stream_lost(self, stream: StreamDatagramEndpoint, error: HonkError | None) -> None:
        for target, known in self._streams.items():
            if known is stream:
                del self._streams[target]
                break
        else:
            return  # closed by us (evicted, or the endpoint closing)
        self._finish(error)

    def _finish(self, error: HonkError | None) -> None:
        if self._closed:
            return
        self._closed = True
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.close()
        for task in self._opening:
            task.cancel()
        if self._on_lost is not None:
            self._on_lost(error)
