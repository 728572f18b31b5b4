"""A node's ready pool: bare TCP connections to its server, opened before a flow needs one.

A proxy dial begins with a TCP connection to the node's server; on a router the first flow
after a selection change or an idle spell pays that round trip (and its SYN retries) on top of
the protocol's handshake. Warm-up (startup preconnect, a Selector's pin) opens that connection
ahead and deposits it here; the next dial through the node takes it instead of connecting
(:meth:`honk.outbound.proxy.ProxyLeaf.connect_server`).

Only the bare connection is pooled: whatever the protocol says on it (SOCKS5 greeting, TLS,
a Shadowsocks header) is the flow's own, so any bare-TCP protocol can use it. A connection
waits at most READY_MAX_IDLE seconds; one the server closed meanwhile (EOF, reset) or that
received unsolicited bytes is closed at the take and the next one tried. Times are arguments:
the pool has no clock and no timer (the warm-up pass reaps it).

``HONK_POOL_DISABLE=1`` bypasses every pool: nothing is deposited, every dial connects. A
health probe bypasses it too (:func:`bypassed`, entered by the runtime's probe guard): its delay
must include the connect, and the ready connection stays for a flow.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
from collections import deque
from collections.abc import Iterator

__all__ = ["POOL_DISABLE_ENV", "READY_MAX_IDLE", "READY_POOL_MAX", "ReadyPool", "bypassed", "pools_disabled"]

READY_MAX_IDLE = 30.0  # seconds a deposited connection waits for a flow: well under the minute after
# which servers and NATs commonly drop an idle TCP connection, and three warm-up passes (10 s) long
READY_POOL_MAX = 2  # connections a node keeps ready at most: a pin's one and a preconnect seed
POOL_DISABLE_ENV = "HONK_POOL_DISABLE"


_bypass: contextvars.ContextVar[bool] = contextvars.ContextVar("honk_ready_bypass", default=False)


def pools_disabled() -> bool:
    """``HONK_POOL_DISABLE=1``: no pool deposits or takes (read at each use)."""
    return os.environ.get(POOL_DISABLE_ENV, "") == "1"


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Dials made inside take no ready connection (health probes)."""
    token = _bypass.set(True)
    try:
        yield
    finally:
        _bypass.reset(token)


def _alive(sock: socket.socket) -> bool:
    """Whether a pooled connection can still carry a flow: open, and nothing received on it
    (the server speaks only after the client, so any byte or EOF means it is spent)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return False  # b"" is EOF, and a byte is unsolicited: spent either way
    except BlockingIOError:
        return True  # open and silent: ready
    except OSError:
        return False


class ReadyPool:
    """A node's ready connections, oldest first, each with the time it was deposited."""

    def __init__(self) -> None:
        self._ready: deque[tuple[float, socket.socket]] = deque()
        self.hits = 0  # dials served by a ready connection
        self.misses = 0  # dials that found none and connected
        self.deposited = 0

    @property
    def entries(self) -> int:
        return len(self._ready)

    def deposit(self, sock: socket.socket, now: float) -> bool:
        """Keep ``sock`` for a later dial; False (and ``sock`` closed) when pools are disabled
        or the pool is full."""
        if pools_disabled() or len(self._ready) >= READY_POOL_MAX:
            sock.close()
            return False
        self._ready.append((now, sock))
        self.deposited += 1
        return True

    def has_ready(self, now: float) -> bool:
        """A connection younger than READY_MAX_IDLE waits (its liveness is checked at the take)."""
        ready = self._ready  # looked at first: every dial asks, and the pool is mostly empty
        return bool(ready) and not pools_disabled() and any(now - at < READY_MAX_IDLE for at, _ in ready)

    def take(self, now: float) -> socket.socket | None:
        """The freshest live ready connection, else None (a miss); spent ones are closed.
        Inside :func:`bypassed` (a probe) none, and nothing counted."""
        if pools_disabled() or _bypass.get():
            return None
        while self._ready:
            at, sock = self._ready.pop()  # newest first: the most likely to be alive
            if now - at < READY_MAX_IDLE and _alive(sock):
                self.hits += 1
                return sock
            sock.close()
        self.misses += 1
        return None

    def reap(self, now: float) -> int:
        """Close the connections that waited READY_MAX_IDLE or died; how many."""
        kept: deque[tuple[float, socket.socket]] = deque()
        closed = 0
        for at, sock in self._ready:
            if now - at < READY_MAX_IDLE and _alive(sock):
                kept.append((at, sock))
            else:
                sock.close()
                closed += 1
        self._ready = kept
        return closed

    def drain(self) -> int:
        """Close every ready connection (the node's last warm owner let go, or it closed)."""
        closed = len(self._ready)
        while self._ready:
            with contextlib.suppress(OSError):
                self._ready.pop()[1].close()
        return closed
