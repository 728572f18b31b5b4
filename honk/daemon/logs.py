"""Structured logging to stderr.

One line per event: ``<ISO-8601 local time> <LEVEL> <logger> <message> key=value …``.
Values containing spaces or quotes are quoted so a line splits unambiguously.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from dataclasses import dataclass

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

# Configured spellings (upstream `log_level` plus the Clash API's) -> logging levels.
LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "silent": logging.CRITICAL + 10,
}


def kv(**fields: object) -> str:
    """Format ``key=value`` pairs for a log line, quoting values that need it."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        if not text or any(c in text for c in ' "=\t\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        local = time.localtime(record.created)
        offset = time.strftime("%z", local)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", local)
        return f"{stamp}.{int(record.msecs):03d}{offset[:3]}:{offset[3:]}"


_HANDLER: logging.Handler | None = None


def setup_logging(level: str = "info", stream=None) -> None:
    """Send honk's logs to ``stream`` (stderr) at ``level``; safe to call again on reload."""
    global _HANDLER
    root = logging.getLogger("honk")
    if _HANDLER is None:
        _HANDLER = logging.StreamHandler(stream or sys.stderr)
        _HANDLER.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(_HANDLER)
        root.propagate = False
    set_level(level)


def set_level(level: str) -> None:
    logging.getLogger("honk").setLevel(LEVELS.get(level.lower(), logging.INFO))


# --- live log streams (the API's /logs, `honkctl logs -f`) ----------------------------------

LOG_STREAM_QUEUE = 1024  # events a slow stream reader may fall behind before events are dropped


@dataclass(frozen=True, slots=True)
class LogEvent:
    wall: float  # seconds since the epoch
    level: str  # "debug", "info", "warning" or "error" (trace shows as debug)
    logger: str
    message: str  # the formatted message, key=value fields included


def _level_name(levelno: int) -> str:
    if levelno < logging.INFO:
        return "debug"
    if levelno < logging.WARNING:
        return "info"
    if levelno < logging.ERROR:
        return "warning"
    return "error"


class LogSubscription:
    """One reader's queue of events at or above its level."""

    def __init__(self, broker: LogBroker, threshold: int, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.threshold = threshold
        self.loop = loop
        self.queue: asyncio.Queue[LogEvent] = asyncio.Queue(LOG_STREAM_QUEUE)
        self.dropped = 0

    def offer(self, event: LogEvent) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def get(self) -> LogEvent:
        return await self.queue.get()

    def close(self) -> None:
        self.broker.unsubscribe(self)


class LogBroker(logging.Handler):
    """Fans honk's log records out to live readers, each with its own level.

    Installed on the ``honk`` logger next to the stderr handler; a record from a
    worker thread reaches the readers through their event loop. A reader that
    falls more than :data:`LOG_STREAM_QUEUE` events behind loses the excess (counted),
    never the daemon's time.
    """

    def __init__(self) -> None:
        super().__init__(level=TRACE)
        self._subs: list[LogSubscription] = []
        self._lock_subs = threading.Lock()

    def install(self) -> None:
        logging.getLogger("honk").addHandler(self)

    def uninstall(self) -> None:
        logging.getLogger("honk").removeHandler(self)

    def subscribe(self, level: str) -> LogSubscription:
        """A reader for events at ``level`` or above (a LEVELS spelling; ``silent`` gets none)."""
        sub = LogSubscription(self, LEVELS[level.lower()], asyncio.get_running_loop())
        with self._lock_subs:
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: LogSubscription) -> None:
        with self._lock_subs:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def readers(self) -> int:
        return len(self._subs)

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_subs:
            subs = [s for s in self._subs if record.levelno >= s.threshold]
        if not subs:
            return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        event = LogEvent(record.created, _level_name(record.levelno), record.name, message)
        for sub in subs:
            if sub.loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is sub.loop:
                sub.offer(event)
            else:
                sub.loop.call_soon_threadsafe(sub.offer, event)
