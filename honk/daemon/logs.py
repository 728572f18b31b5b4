"""Structured logging to stderr.

One line per event: ``<ISO-8601 local time> <LEVEL> <logger> <message> key=value …``.
Values containing spaces or quotes are quoted so a line splits unambiguously.
"""

from __future__ import annotations

import logging
import sys
import time

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
