"""Relay engines: move bytes between a client stream and an upstream socket.

The seam a native engine plugs into is :class:`RelayEngine`: construct with a
clock, expose ``bytes_up``/``bytes_down``/``last_activity`` (read live by the
connection tracker) and ``close(reason)``, and implement
``await run(client, upstream_sock)`` which returns after a clean finish (both
directions saw EOF) or raises the typed end (``ClientGone``,
``UpstreamFailed``, ``IdleTimeout``, ``FlowClosed``).

``client`` is the :class:`~honk.relay.stream.StreamConn` the handshake read
through; ``client.detach()`` yields the transport, the bytes it had already
buffered (they must be sent upstream first) and whether EOF was seen.
``upstream_sock`` is the connected non-blocking socket from
``Outbound.dial_tcp``; ``framing`` is that dial's ``DialedStream.framing``
(``None`` for plain bytes; a Shadowsocks stream's AEAD state otherwise, which the
relay applies). :class:`~honk.relay.copy.CopyRelay` is the pure-Python
reference; a native splice engine replaces it by taking the client's fd
(``transport.get_extra_info("socket")``) after ``detach`` and the upstream fd
directly, and must pass the same tests in ``tests/unit/relay/``.
:class:`~honk.relay.native.NativeRelay` is that engine (splice in a worker
thread, :mod:`honk._fast.relay`). :func:`relay_engine` is the one place that
picks the engine; ``HONK_RELAY=copy|native`` forces a choice (benchmarks,
debugging), read at each call.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.proto.framing import Framing
from honk.relay.copy import CopyRelay
from honk.relay.native import NativeRelay, native_available
from honk.relay.stream import StreamConn

__all__ = ["CopyRelay", "NativeRelay", "RelayEngine", "StreamConn", "relay_engine"]


class RelayEngine(Protocol):
    engine: str
    bytes_up: int
    bytes_down: int
    last_activity: float

    async def run(
        self, client: StreamConn, upstream: socket.socket, framing: Framing | None = None
    ) -> None: ...

    def close(self, reason: HonkError | None = None) -> None: ...


def relay_engine(clock: Clock) -> RelayEngine:
    """A new relay for one flow.

    The native engine when it is compiled, else the copy engine.
    ``HONK_RELAY=copy`` forces the copy engine; ``HONK_RELAY=native`` forces the
    native one even when only its pure-Python twin is available.
    """
    choice = os.environ.get("HONK_RELAY", "").strip().lower()
    if choice == "copy":
        return CopyRelay(clock)
    if choice == "native" or native_available():
        return NativeRelay(clock)
    return CopyRelay(clock)
