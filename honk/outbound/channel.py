"""Byte channels a leaf stacks between the relay and its server: transports and protocol framing.

A :class:`Channel` is the small interface :func:`~honk.outbound.bridge.bridge_stream`
pumps: ``receive()`` (bytes, ``b""`` at EOF), ``write``, ``drain``,
``write_eof``, ``close``, ``abort``. :class:`~honk.relay.stream.StreamConn` (plain TCP
or TLS through asyncio) is one; the classes here stack on another channel:

* :class:`WsChannel`: WebSocket binary messages (``honk.proto.websocket``) after
  the upgrade; pings are answered; a server close is EOF. WebSocket has no
  half-close: ``write_eof`` keeps the connection open both ways (the server's
  answer may still be coming) and ``close`` sends the close frame.
* :class:`CodecChannel`: a proxy protocol's framing: ``encode`` seals what the
  client sends, ``decode`` opens what the server sends (typed errors from the
  codec end the flow), ``eof`` is what the protocol sends when the client is
  done (VMess's empty chunk, for one), ``at_eof`` checks that the server did
  not stop inside a frame.

So a VMess-over-WebSocket-over-TLS stream is
``CodecChannel(WsChannel(StreamConn with TLS), vmess codec)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from honk.core.errors import HonkError
from honk.proto.websocket import WsDecoder, WsEncoder

__all__ = ["Channel", "CodecChannel", "WsChannel"]


class Channel(Protocol):
    async def receive(self) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class _Stacked:
    """Passes the lifecycle calls through to the channel below."""

    def __init__(self, inner: Channel) -> None:
        self.inner = inner

    async def drain(self) -> None:
        await self.inner.drain()

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


class WsChannel(_Stacked):
    """Binary WebSocket messages over ``inner``, after a completed upgrade."""

    def __init__(self, inner: Channel, encoder: WsEncoder | None = None) -> None:
        super().__init__(inner)
        self._encoder = encoder or WsEncoder()
        self._decoder = WsDecoder()
        self._closing = False

    async def receive(self) -> bytes:
        while True:
            if self._decoder.closed:
                return b""
            data = await self.inner.receive()
            if not data:
                return b""
            events = self._decoder.feed(data)
            for payload in events.pongs:
                self.inner.write(self._encoder.pong(payload))
            if events.data:
                return events.data
            if events.closed is not None:
                return b""

    def write(self, data: bytes) -> None:
        if data:
            self.inner.write(self._encoder.binary(data))

    def write_eof(self) -> None:
        """Nothing: WebSocket has no half-close, and a close frame now would end the server's
        direction too (v2ray stops sending once it reads one). The frame goes out with close()."""

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            with contextlib.suppress(HonkError, OSError):  # the server may be gone already
                self.inner.write(self._encoder.close())
        self.inner.close()


class CodecChannel(_Stacked):
    """A proxy protocol's framing over ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: Channel,
        encode: Callable[[bytes], bytes],
        decode: Callable[[bytes], bytes],
        eof: Callable[[], bytes] | None = None,
        at_eof: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self._encode = encode
        self._decode = decode
        self._eof = eof
        self._at_eof = at_eof  # raises the codec's truncation error if the server stopped mid-frame

    async def receive(self) -> bytes:
        while True:
            data = await self.inner.receive()
            if not data:
                if self._at_eof is not None:
                    self._at_eof()
                return b""
            plain = self._decode(data)
            if plain:
                return plain

    def write(self, data: bytes) -> None:
        if data:
            self.inner.write(self._encode(data))

    def write_eof(self) -> None:
        if self._eof is not None:
            tail = self._eof()
            if tail:
                self.inner.write(tail)
        self.inner.write_eof()
