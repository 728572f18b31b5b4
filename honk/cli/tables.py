"""Plain-text tables and the number formats honkctl prints.

Widths count terminal cells: East Asian wide characters take two, combining
marks none, so a group named in Chinese or Japanese still lines up.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

GAP = "  "  # between columns
EMPTY = "-"  # a cell with no value
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
BYTE_STEP = 1024.0


def width(text: str) -> int:
    """Terminal cells ``text`` occupies."""
    cells = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        cells += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return cells


def _pad(text: str, cells: int, right: bool) -> str:
    fill = " " * max(0, cells - width(text))
    return fill + text if right else text + fill


def cell(value: object) -> str:
    if value is None or value == "":
        return EMPTY
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: Iterable[int] = ()) -> str:
    """Columns padded to their widest cell; ``right``: indices of right-aligned (numeric) columns.
    No trailing spaces; an empty row set still prints the header."""
    body = [[cell(v) for v in row] for row in rows]
    widths = [width(h) for h in headers]
    for row in body:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], width(text))
    align = set(right)
    lines = []
    for row in [list(headers), *body]:
        texts = [_pad(text, widths[i], i in align) for i, text in enumerate(row)]
        lines.append(GAP.join(texts).rstrip())
    return "\n".join(lines)


def pairs(items: Iterable[tuple[str, object]]) -> str:
    """``key  value`` lines with the keys padded to the longest."""
    items = [(k, cell(v)) for k, v in items]
    if not items:
        return ""
    keys = max(width(k) for k, _ in items)
    return "\n".join(f"{_pad(k, keys, False)}{GAP}{v}".rstrip() for k, v in items)


def size(n: int | float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 KiB``, ``30.2 MiB``."""
    if n is None:
        return EMPTY
    value = float(n)
    for unit in BYTE_UNITS:
        if abs(value) < BYTE_STEP or unit == BYTE_UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= BYTE_STEP
    raise AssertionError("unreachable")


def duration(seconds: float | None) -> str:
    """``45s``, ``3m05s``, ``2h03m``, ``4d02h``."""
    if seconds is None:
        return EMPTY
    s = int(max(0.0, seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


def delay(ms: float | None) -> str:
    if ms is None:
        return EMPTY
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def parse_time(text: str | None) -> datetime | None:
    """An API time (RFC 3339 UTC, ``...Z``) or None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(text: str | None, now: datetime | None = None) -> str:
    """How long ago the API time ``text`` was."""
    when = parse_time(text)
    if when is None:
        return EMPTY
    now = now or datetime.now(UTC)
    return duration((now - when).total_seconds())


def clock_time(text: str | None) -> str:
    """An API time as local ``HH:MM:SS.mmm`` (log lines)."""
    when = parse_time(text)
    if when is None:
        return text or EMPTY
    return when.astimezone().strftime("%H:%M:%S.%f")[:-3]
