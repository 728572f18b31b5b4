"""Give the relay engine a plain socket for a stream it cannot carry itself.

The relay engine drives file descriptors (splice, or its own AEAD framing).
A stream that exists only as an asyncio channel -- TLS to an ``https://``
proxy, a protocol framed in Python over TLS or WebSocket
(:mod:`honk.outbound.channel`) -- is bridged: a UNIX socketpair, one end handed to the
relay as the upstream socket, the other pumped to and from the transport by a
task that lives exactly as long as the flow: it ends when either side ends,
so the relay closing its end (a flow closed at shutdown, say) stops it.
Half-closes cross the bridge both ways; an error on either side closes both
and is logged with its type and reason. The relay sees the socketpair end as
a plain close: a UNIX socket has no reset to carry the failure further.

The bridge costs one extra copy per byte in Python; it is for protocols whose
transform lives in asyncio, not for plain streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from honk.daemon.logs import kv
from honk.outbound.channel import Channel

__all__ = ["bridge_stream"]

PUMP_CHUNK = 256 * 1024  # bytes read from the relay's end per turn

log = logging.getLogger("honk.outbound.bridge")

_pumps: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones


def bridge_stream(conn: Channel) -> socket.socket:
    """A connected non-blocking socket whose bytes are ``conn``'s, both ways."""
    outer, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    outer.setblocking(False)
    inner.setblocking(False)
    task = asyncio.get_running_loop().create_task(_pump(conn, inner))
    _pumps.add(task)
    task.add_done_callback(_pumps.discard)
    return outer


async def _pump(conn: Channel, inner: socket.socket) -> None:
    loop = asyncio.get_running_loop()

    async def transport_to_inner() -> None:
        while data := await conn.receive():
            await loop.sock_sendall(inner, data)
        inner.shutdown(socket.SHUT_WR)

    async def inner_to_transport() -> None:
        while data := await loop.sock_recv(inner, PUMP_CHUNK):
            conn.write(data)
            await conn.drain()
        conn.write_eof()

    tasks = [loop.create_task(transport_to_inner()), loop.create_task(inner_to_transport())]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
            if failed:  # one side failed: tear both down
                error = failed[0]
                log.info("bridged stream failed %s", kv(error=type(error).__name__,
                                                        reason=getattr(error, "reason", "") or str(error)))
                break
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        conn.close()
        inner.close()
