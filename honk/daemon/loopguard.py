"""The daemon's asyncio exception handler: nothing a task raises goes unseen.

asyncio reports an exception nobody retrieved (a task that failed and was dropped, a callback
that raised, an engine listener that failed) to the loop's exception handler. The default one
writes to the ``asyncio`` logger, which honk's log broker, ``/logs`` and journald through honk's
own format never see, so a failing background task would be silent. :class:`LoopGuard` logs
each report on ``honk.daemon`` with its traceback and counts it in the daemon's
:class:`~honk.core.stats.RuntimeStats` (``/metrics`` ``honk_loop_errors_total``); it keeps no
reference to the task or exception.

One report is not an error of honk's: an asyncio server whose ``accept`` found no descriptor
(or buffer, or memory) left says ``socket.accept() out of system resource`` and rests for a
second before accepting again, by itself (the relay engine's listeners report their rests the same
way). :class:`LoopGuard` counts those rests per listening
address (``honk_accept_rests_total``) and logs a warning at most once per
:data:`ACCEPT_WARN_INTERVAL` per address instead of a traceback per refusal.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

from honk.core.clock import Clock, MonotonicClock
from honk.core.logs import kv
from honk.core.stats import ACCEPT_EXHAUSTED, RuntimeStats

log = logging.getLogger("honk.daemon")

ACCEPT_WARN_INTERVAL = 10.0  # seconds between two warnings about one listener's accept rests

__all__ = ["LoopGuard"]


class LoopGuard:
    """Installed on the daemon's loop at start, the previous handler put back at shutdown."""

    def __init__(self, stats: RuntimeStats, clock: Clock | None = None) -> None:
        self.stats = stats
        self.clock = clock or MonotonicClock()
        self._warned: dict[str, float] = {}  # listening address -> clock time of its last warning
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Any = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self._report)

    def uninstall(self) -> None:
        if self._loop is not None and self._loop.get_exception_handler() == self._report:
            self._loop.set_exception_handler(self._previous)
        self._loop = None

    def _report(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") == ACCEPT_EXHAUSTED and isinstance(exc, OSError):
            self._accept_rest(context.get("socket"), exc)
            return
        self.stats.loop_errors[type(exc).__name__ if exc is not None else "none"] += 1
        where = context.get("task") or context.get("future") or context.get("handle")
        name = where.get_name() if isinstance(where, asyncio.Task) else type(where).__name__ if where else "-"
        log.error(
            "unhandled error in the event loop: %s (in %s)",
            context.get("message", "?"),
            name,
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )

    def _accept_rest(self, sock: Any, exc: OSError) -> None:
        try:
            host, port = sock.getsockname()[:2]
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        except (AttributeError, OSError, TypeError, ValueError):
            address = "-"
        self.stats.accept_rests[address] += 1
        now = self.clock.now()
        last = self._warned.get(address)
        if last is None or now - last >= ACCEPT_WARN_INTERVAL:
            self._warned[address] = now
            log.warning(
                "listener out of resources, accepting again shortly %s",
                kv(
                    listener=address,
                    error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                    rests=self.stats.accept_rests[address],
                ),
            )
