"""The daemon's asyncio exception handler: nothing a task raises goes unseen.

asyncio reports an exception nobody retrieved (a task that failed and was dropped, a callback
that raised, an engine listener that failed) to the loop's exception handler. The default one
writes to the ``asyncio`` logger, which honk's log broker, ``/logs`` and journald through honk's
own format never see, so a failing background task would be silent. :class:`LoopGuard` logs
each report on ``honk.daemon`` with its traceback and counts it in the daemon's
:class:`~honk.core.stats.RuntimeStats` (``/metrics`` ``honk_loop_errors_total``); it keeps no
reference to the task or exception.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from honk.core.stats import RuntimeStats

log = logging.getLogger("honk.daemon")

__all__ = ["LoopGuard"]


class LoopGuard:
    """Installed on the daemon's loop at start, the previous handler put back at shutdown."""

    def __init__(self, stats: RuntimeStats) -> None:
        self.stats = stats
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
        self.stats.loop_errors[type(exc).__name__ if exc is not None else "none"] += 1
        where = context.get("task") or context.get("future") or context.get("handle")
        name = where.get_name() if isinstance(where, asyncio.Task) else type(where).__name__ if where else "-"
        log.error("unhandled error in the event loop: %s (in %s)", context.get("message", "?"), name,
                  exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)
