"""Give the relay engine a plain socket for a stream it cannot carry itself.

The relay engine drives file descriptors (splice, or its own AEAD framing).
A stream that exists only as an asyncio channel -- TLS to an ``https://``
proxy, a protocol framed in Python over TLS or WebSocket
(:mod:`honk.outbound.channel`) -- is bridged: a UNIX socketpair, one end handed to the
relay as the upstream socket, the other pumped to and from the transport by a
task that lives exactly as long as the flow: it ends when either side ends,
so the relay closing its end (a flow closed at shutdown, say) stops it.
Half-closes cross the bridge both ways; an error on either side closes both
and is logged once, at INFO, as ``bridged stream failed`` with the
outbound's name (when the caller gives it), the error's type and its
``reason`` (the codec's slug: VLESS ``no-response``, Trojan
``closed-before-data``...). When a write fails because the server is gone,
the server's side is let finish first and its error, if any, is the one
logged: the write only found out later. The relay sees the socketpair end as
a plain close (or a reset, when the pump closed it with bytes unread), which
cannot carry the server's failure further, so the bridge also keeps the verdict (:class:`BridgeEnd`): the error the
server's side ended with, set before the relay's end closes. The flow's owner
reads it when the relay ends cleanly, so Score and the flow's end see an
upstream failure and not a success. An error the channel raised that is not a
:class:`~honk.core.errors.HonkError` becomes an ``UpstreamFailed`` caused by
it; the same object raised to many streams (a mux carrier's loss) keeps
that one cause.

The bridge costs one extra copy per byte in Python; it is for protocols whose
transform lives in asyncio, not for plain streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from honk.core.errors import CapacityRefused, HonkError, UpstreamFailed
from honk.core.logs import kv
from honk.outbound.base import DialedStream
from honk.outbound.channel import Channel
from honk.outbound.direct import NO_CAPACITY

__all__ = ["BridgeEnd", "bridge_stream", "bridged", "relay_end", "upstream_failure"]

PUMP_CHUNK = 256 * 1024  # bytes read from the relay's end per turn
VERDICT_WAIT = 1.0  # seconds a failed write waits for the server's side to say how it ended (a guard only)

log = logging.getLogger("honk.outbound.bridge")

_pumps: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones


class BridgeEnd:
    """How the server's side of one bridged stream ended: ``failure`` is the error its channel
    raised (a HonkError), None while it has raised none.

    The flow's owner calls :meth:`relay_ended` when the relay's flow is over. The pump cannot
    tell that from the relay's half-close: both are an EOF on its socket. Without the call, a
    flow whose client left keeps its server's side (and the pump, and two descriptors) until
    the server closes, which a v2ray server does only at its idle timeout."""

    __slots__ = ("failure", "relay_gone", "client_done", "pump")

    def __init__(self) -> None:
        self.failure: HonkError | None = None
        self.relay_gone = False  # the relay's flow ended: nothing more will come or be read
        self.client_done = False  # the relay's EOF was passed on to the server
        self.pump: asyncio.Task[None] | None = None

    def fail(self, error: BaseException) -> None:
        """The channel raised ``error``: the first one is the verdict."""
        if self.failure is None:
            self.failure = upstream_failure(error)

    def relay_ended(self) -> None:
        """The relay's flow is over: once what the relay sent has reached the server, the pump
        and the server's side close, whatever the server is still doing."""
        self.relay_gone = True
        if self.client_done and self.pump is not None and not self.pump.done():
            self.pump.cancel()


def upstream_failure(error: BaseException) -> HonkError:
    """``error`` as a flow's typed upstream end: a HonkError as it is, anything else an
    ``UpstreamFailed`` caused by it."""
    if isinstance(error, HonkError):
        return error
    failure = UpstreamFailed(f"upstream connection lost: {error!r}")
    failure.__cause__ = error
    return failure


def relay_end(error: HonkError | None, bridge: BridgeEnd | None) -> HonkError | None:
    """How a relayed flow ended: the relay's own typed end, or the failure a bridged stream's
    server side ended with when the relay saw its socket end cleanly or with an upstream error.
    The relay's upstream is then the socketpair, whose errors only echo the server's side: the
    pump closing its end with the client's last bytes unread resets it (Linux does so for UNIX
    stream sockets), so the channel's typed verdict is the truer one. A client-side end stays
    the relay's (None: a clean end)."""
    if (
        bridge is not None
        and bridge.failure is not None
        and (error is None or isinstance(error, UpstreamFailed))
    ):
        return bridge.failure
    return error


def bridged(conn: Channel, outbound: str = "") -> DialedStream:
    """``conn`` bridged for the relay, with the verdict of its server's side."""
    end = BridgeEnd()
    return DialedStream(bridge_stream(conn, outbound, end), bridge=end)


def bridge_stream(conn: Channel, outbound: str = "", end: BridgeEnd | None = None) -> socket.socket:
    """A connected non-blocking socket whose bytes are ``conn``'s, both ways; ``outbound`` names it
    in the log, ``end`` (when given) receives how the server's side ended."""
    try:
        outer, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        conn.close()  # the server's side is up: it must not outlive the flow that cannot start
        if exc.errno in NO_CAPACITY:  # out of descriptors: a local refusal, no fault of the node's
            raise CapacityRefused(
                f"{outbound or 'bridge'}: no socketpair for the stream ({exc.strerror})"
            ) from None
        raise
    outer.setblocking(False)
    inner.setblocking(False)
    end = end if end is not None else BridgeEnd()
    task = end.pump = asyncio.get_running_loop().create_task(_pump(conn, inner, outbound, end))
    _pumps.add(task)
    task.add_done_callback(_pumps.discard)
    return outer


async def _pump(conn: Channel, inner: socket.socket, outbound: str, end: BridgeEnd) -> None:
    loop = asyncio.get_running_loop()

    async def transport_to_inner() -> None:
        while True:
            try:
                data = await conn.receive()
            except Exception as exc:  # noqa: BLE001 - the server's side ended with it
                end.fail(exc)
                raise
            if not data:
                break
            await loop.sock_sendall(inner, data)
        inner.shutdown(socket.SHUT_WR)

    async def inner_to_transport() -> None:
        while data := await loop.sock_recv(inner, PUMP_CHUNK):
            try:
                conn.write(data)
                await conn.drain()
            except UpstreamFailed as exc:
                # The server's side is gone, so its reading half ends at once; how it ended (a
                # codec's typed error at EOF, say) is the flow's story, not this write's.
                await asyncio.wait([download], timeout=VERDICT_WAIT)
                end.fail(exc)
                raise
            except Exception as exc:  # noqa: BLE001
                end.fail(exc)
                raise
        try:
            conn.write_eof()
        except Exception as exc:  # noqa: BLE001
            end.fail(exc)
            raise
        end.client_done = True
        if end.relay_gone:  # the flow is over: the server's side has nothing left to say to anyone
            download.cancel()

    download = loop.create_task(transport_to_inner())
    tasks = [download, loop.create_task(inner_to_transport())]  # in the order their errors are reported
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = [
                t.exception() for t in tasks if t in done and not t.cancelled() and t.exception() is not None
            ]
            if failed:  # one side failed: tear both down
                _log_failure(failed[0], outbound)
                break
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        try:
            conn.close()
        finally:
            inner.close()  # the relay's end sees EOF whatever the transport's close did


def _log_failure(error: BaseException, outbound: str) -> None:
    fields = {"outbound": outbound} if outbound else {}
    fields.update(error=type(error).__name__, reason=getattr(error, "reason", "") or str(error))
    log.info("bridged stream failed %s", kv(**fields))
