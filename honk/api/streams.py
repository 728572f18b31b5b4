"""Live streams: the Clash API's /traffic, /memory, /connections and /logs.

A stream is an async iterator of JSON objects (*frames*) and a transport:

* a WebSocket when the request asks for the upgrade (one text message per frame), or
* a chunked ``GET`` with one JSON object per line (Yacd-meta's fallback, ``curl``).

The periodic frames tick on the daemon's clock (``await clock.sleep``), once a
second unless asked otherwise; the first frame goes out at once so a dashboard
shows something immediately (mihomo's /memory sends ``inuse: 0`` first, as here).

A stream ends when its client leaves (the WebSocket closes; for a chunked
response the transport is checked every :data:`LIVENESS_CHECK` seconds, since a
quiet /logs stream writes nothing that could fail), and when the server stops:
the server aborts every connection, and :func:`stop_streams` cancels what is
still running at once. Log frames come from a
:class:`~honk.core.logs.LogSubscription` and a formatter, so the native API can
serve its own log lines through :func:`serve_log_lines`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from honk.api import clash_views as views
from honk.api.context import Control
from honk.core.clock import Clock
from honk.core.logs import LogEvent, LogSubscription

TICK = 1.0  # seconds between periodic frames (mihomo's 1 Hz)
MIN_INTERVAL = 0.1  # seconds; the smallest /connections `interval` honoured (no busy loop)
MAX_INTERVAL = 3600.0  # seconds; the largest
LIVENESS_CHECK = 1.0  # seconds between checks that a chunked stream's client is still there
NDJSON = "application/json"  # mihomo answers its chunked streams as application/json lines
STATM = "/proc/self/statm"

Frames = AsyncIterator[Any]
LogFormatter = Callable[[LogEvent], Any]


# --- open streams per server -------------------------------------------------------------------


class StreamSet:
    """The handler tasks of one server's open streams, so its stop can end them at once."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        tasks = [task for task in self.tasks if not task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()


# by the identity of the server's aiohttp application (aiohttp 3.8, Debian 12's, cannot hash
# one): a reload that rebinds the API stops the old server's streams and leaves the new one's
# running; an application that goes away takes its entry with it
_open: dict[int, StreamSet] = {}


def stream_set(app: web.Application) -> StreamSet:
    found = _open.get(id(app))
    if found is None:
        found = _open[id(app)] = StreamSet()
        weakref.finalize(app, _open.pop, id(app), None)
    return found


async def stop_streams(app: web.Application) -> None:
    """End every open stream of the server serving ``app`` (it is stopping)."""
    found = _open.pop(id(app), None)
    if found is not None:
        await found.close()


# --- transports --------------------------------------------------------------------------------


def _dumps(frame: Any) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def wants_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def serve(request: web.Request, frames: Frames, control: Control) -> web.StreamResponse:
    """Send ``frames`` to the client until it leaves, the frames end or the server stops."""
    task = asyncio.current_task()
    streams = stream_set(request.app)
    if task is not None:
        streams.tasks.add(task)
    try:
        if wants_websocket(request):
            return await _serve_websocket(request, frames)
        return await _serve_chunked(request, frames, control.clock)
    finally:
        if task is not None:
            streams.tasks.discard(task)
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _race(pump: asyncio.Future[Any], watch: asyncio.Future[Any]) -> None:
    """Run until either the frames are sent out or the watcher sees the client gone."""
    try:
        await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in (pump, watch):
            fut.cancel()
        for fut in (pump, watch):
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                await fut


async def _serve_websocket(request: web.Request, frames: Frames) -> web.StreamResponse:
    ws = web.WebSocketResponse(autoping=True)
    await ws.prepare(request)

    async def pump() -> None:
        async for frame in frames:
            await ws.send_str(_dumps(frame))

    async def watch() -> None:
        async for _ in ws:  # clients send nothing we use; the loop ends when the socket closes
            pass

    await _race(asyncio.ensure_future(pump()), asyncio.ensure_future(watch()))
    if not ws.closed:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()
    return ws


async def _serve_chunked(request: web.Request, frames: Frames, clock: Clock) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-cache"})
    response.enable_chunked_encoding()
    await response.prepare(request)

    async def pump() -> None:
        async for frame in frames:
            await response.write((_dumps(frame) + "\n").encode())

    async def watch() -> None:
        while not _gone(request):
            await clock.sleep(LIVENESS_CHECK)

    await _race(asyncio.ensure_future(pump()), asyncio.ensure_future(watch()))
    return response


# --- frame sources ----------------------------------------------------------------------------


def read_rss() -> int:
    """This process's resident set size in bytes (0 where /proc is not available)."""
    try:
        with open(STATM, encoding="ascii") as statm:
            text = statm.read()
    except OSError:
        return 0
    return views.rss_from_statm(text, os.sysconf("SC_PAGE_SIZE"))


async def traffic_frames(control: Control, tick: float = TICK) -> Frames:
    """Bytes per second relayed, from the tracker's cumulative totals. The first frame comes a
    tick after the stream opens, as mihomo's does: a rate needs an interval, and an immediate
    frame would read 0 B/s while flows are moving."""
    clock = control.clock
    previous, at = control.tracker.totals(), clock.now()
    while True:
        await clock.sleep(tick)
        current, now = control.tracker.totals(), clock.now()
        yield views.traffic(previous, current, now - at)
        previous, at = current, now


async def memory_frames(control: Control, tick: float = TICK) -> Frames:
    yield views.memory(0)  # as mihomo: the first frame carries 0
    while True:
        await control.clock.sleep(tick)
        yield views.memory(read_rss())


async def connection_frames(control: Control, snapshot: Callable[[], Any], tick: float = TICK) -> Frames:
    """A complete snapshot per tick (dashboards diff successive ones)."""
    while True:
        yield snapshot()
        await control.clock.sleep(tick)


async def log_frames(subscription: LogSubscription, formatter: LogFormatter) -> Frames:
    """Each event of ``subscription`` through ``formatter``; closes the subscription at the end."""
    try:
        while True:
            yield formatter(await subscription.get())
    finally:
        subscription.close()


async def serve_log_lines(
    request: web.Request, control: Control, subscription: LogSubscription, formatter: LogFormatter
) -> web.StreamResponse:
    """A log stream (WebSocket or chunked lines) of ``subscription`` in ``formatter``'s shape."""
    return await serve(request, log_frames(subscription, formatter), control)


def interval_of(text: str | None) -> float:
    """The /connections ``interval`` query (milliseconds) in seconds; ValueError when invalid."""
    if text is None or text == "":
        return TICK
    ms = int(text)
    if ms <= 0:
        raise ValueError("interval must be positive")
    return min(MAX_INTERVAL, max(MIN_INTERVAL, ms / 1000.0))
