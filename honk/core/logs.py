"""Structured logging to stderr.

One line per event: ``<ISO-8601 local time> <LEVEL> <logger> <message> key=value …``.
Values containing spaces or quotes are quoted so a line splits unambiguously.

A live reader (the API's ``/logs``, ``/v1/logs``) may ask for a level below the daemon's: while
it is open the ``honk`` logger runs at the lowest level anyone wants and the stderr handler
keeps the configured one (:func:`set_level`), so the reader gets its lines and stderr does not.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

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
HONK_LOGGER = "honk"  # the logger every honk module logs under
FLOW_FIELD = (
    "honk_flow"  # LogRecord attribute: a flow line's facts, which a Clash log stream renders its own way
)

# The configured level: what stderr (journald) gets. The honk logger itself may run lower while
# a live reader asks for more (see _apply_level); the stderr handler keeps to this one.
_daemon_level = logging.INFO
_brokers: list[LogBroker] = []  # installed brokers: their readers' levels count
_brokers_lock = threading.Lock()


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send honk's logs to ``stream`` (stderr) at ``level``; safe to call again on reload."""
    global _HANDLER
    root = logging.getLogger(HONK_LOGGER)
    if _HANDLER is None:
        _HANDLER = logging.StreamHandler(stream or sys.stderr)
        _HANDLER.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(_HANDLER)
        root.propagate = False
    set_level(level)


def set_level(level: str) -> None:
    """The daemon's level (start, reload, ``PATCH /configs``): stderr writes from it on; live
    readers asking for lower levels keep getting theirs."""
    global _daemon_level
    _daemon_level = LEVELS.get(level.lower(), logging.INFO)
    if _HANDLER is not None:
        _HANDLER.setLevel(_daemon_level)
    _apply_level()


def daemon_level() -> int:
    """The configured level (what stderr gets), whatever live readers lowered the logger to."""
    return _daemon_level


def _apply_level() -> None:
    """The honk logger lets through the lowest level anyone wants: the daemon's, or an open
    reader's. Without a reader below the daemon's level a record under it is dropped at the
    ``isEnabledFor`` check, before it is formatted."""
    with _brokers_lock:
        wanted = [broker.lowest_threshold() for broker in _brokers]
    logging.getLogger(HONK_LOGGER).setLevel(min([_daemon_level, *wanted]))


# --- live log streams (the API's /logs, `honkctl logs -f`) ----------------------------------

LOG_STREAM_QUEUE = 1024  # events a slow stream reader may fall behind before events are dropped
NO_READER = LEVELS["silent"]  # a broker without readers asks for nothing below any level


@dataclass(frozen=True, slots=True)
class LogEvent:
    wall: float  # seconds since the epoch
    level: str  # "debug", "info", "warning" or "error" (trace shows as debug)
    logger: str
    message: str  # the formatted message, key=value fields included
    flow: object = None  # a flow line's facts (the record's FLOW_FIELD), for a view with a shape of its own


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
        logging.getLogger(HONK_LOGGER).addHandler(self)
        with _brokers_lock:
            if self not in _brokers:
                _brokers.append(self)
        _apply_level()

    def uninstall(self) -> None:
        logging.getLogger(HONK_LOGGER).removeHandler(self)
        with _brokers_lock:
            if self in _brokers:
                _brokers.remove(self)
        _apply_level()

    def subscribe(self, level: str) -> LogSubscription:
        """A reader for events at ``level`` or above (a LEVELS spelling; ``silent`` gets none).
        A level below the daemon's lowers the honk logger while the reader is open."""
        sub = LogSubscription(self, LEVELS[level.lower()], asyncio.get_running_loop())
        with self._lock_subs:
            self._subs.append(sub)
        _apply_level()
        return sub

    def unsubscribe(self, sub: LogSubscription) -> None:
        with self._lock_subs:
            if sub not in self._subs:
                return
            self._subs.remove(sub)
        _apply_level()

    def lowest_threshold(self) -> int:
        """The lowest level an open reader wants (above every level when none is open)."""
        with self._lock_subs:
            return min((sub.threshold for sub in self._subs), default=NO_READER)

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
        event = LogEvent(
            record.created,
            _level_name(record.levelno),
            record.name,
            message,
            getattr(record, FLOW_FIELD, None),
        )
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
