"""Scalar readers shared by both formats: quotes, lists, durations, booleans.

The low-level functions (``unquote``, ``split_unquoted``, ``parse_seconds``,
``parse_millis``, ``parse_bool``) work on text. The ``get_*`` readers take an
:class:`~honk.config.tree.Entry` (dae text or a typed TOML/JSON value), report
problems to a :class:`~honk.config.tree.Sink` at the entry's key path, and
never put the value into a message.
"""

from __future__ import annotations

import math
import re

from honk.config.tree import Entry, Sink

QUOTES = "'\""
# After one of these characters (or at the start) a quote opens a quoted span;
# elsewhere an apostrophe is data (``/tmp/don't``).
QUOTE_OPENERS = frozenset(" \t\r\n(,:!>{")


def quote_mask(text: str) -> tuple[list[bool], int | None]:
    """Which characters are inside a quoted span (the quotes included).

    Returns the mask and the index of an unterminated opening quote, if any.
    A backslash inside quotes escapes the next character for the purpose of
    finding the closing quote; the text itself is never changed.
    """
    mask = [False] * len(text)
    i = 0
    n = len(text)
    prev_closed = False
    while i < n:
        c = text[i]
        if c in QUOTES and (i == 0 or text[i - 1] in QUOTE_OPENERS or prev_closed):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if j >= n or text[j] != c:
                for k in range(i, min(j, n)):
                    mask[k] = True
                return mask, i
            for k in range(i, j + 1):
                mask[k] = True
            i = j + 1
            prev_closed = True
            continue
        prev_closed = False
        i += 1
    return mask, None


def unquote(text: str) -> str:
    """Strip surrounding whitespace and one enclosing pair of matching quotes."""
    s = text.strip()
    if is_quoted(s):
        return s[1:-1]
    return s


def is_quoted(text: str) -> bool:
    """Whether the stripped text is exactly one quoted span (``'a'``, not ``'a' 'b'``)."""
    s = text.strip()
    if len(s) < 2 or s[0] not in QUOTES:
        return False
    q = s[0]
    j = 1
    while j < len(s) and s[j] != q:
        j += 2 if s[j] == "\\" else 1
    return j == len(s) - 1


def split_unquoted(text: str, sep: str, *, depth_aware: bool = True) -> list[str]:
    """Split on ``sep`` where it is outside quotes (and outside parentheses)."""
    mask, _ = quote_mask(text)
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    while i < n:
        if not mask[i]:
            c = text[i]
            if depth_aware and c == "(":
                depth += 1
            elif depth_aware and c == ")" and depth > 0:
                depth -= 1
            elif depth == 0 and text.startswith(sep, i):
                parts.append(text[start:i])
                i += len(sep)
                start = i
                continue
        i += 1
    parts.append(text[start:])
    return parts


def find_unquoted(text: str, needle: str, *, depth_aware: bool = True) -> int:
    """Index of the first ``needle`` outside quotes (and parentheses), or -1."""
    mask, _ = quote_mask(text)
    depth = 0
    for i, c in enumerate(text):
        if mask[i]:
            continue
        if depth_aware and c == "(":
            depth += 1
        elif depth_aware and c == ")" and depth > 0:
            depth -= 1
        elif depth == 0 and text.startswith(needle, i):
            return i
    return -1


def split_list(text: str) -> tuple[list[str], bool]:
    """A dae list value: split on unquoted commas, then unquote each item.

    Returns the non-empty items and whether an item was a whole-quoted comma
    aggregate (``'a,b'``), which the caller may split further.
    """
    items: list[str] = []
    aggregate = False
    for part in split_unquoted(text, ",", depth_aware=False):
        item = unquote(part)
        if not item:
            continue
        if item != part.strip() and "," in item:
            aggregate = True
        items.append(item)
    return items, aggregate


# --- durations -------------------------------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_BARE = re.compile(rf"^{_NUMBER}$")
_PIECE = re.compile(rf"({_NUMBER})(ms|s|m|h)", re.IGNORECASE)
_COMPOUND = re.compile(rf"^(?:{_NUMBER}(?:ms|s|m|h))+$", re.IGNORECASE)


def parse_seconds(text: str) -> float | None:
    """A second-based duration: bare seconds or ``ms``/``s``/``m``/``h`` pieces
    (``1m30s`` works); returns seconds, or None when unparseable."""
    s = text.strip()
    if len(s) > 64:
        return None
    if _BARE.match(s):
        value = float(s)
    elif _COMPOUND.match(s):
        value = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _PIECE.findall(s))
    else:
        return None
    return value if math.isfinite(value) else None


_MILLIS = re.compile(rf"^({_NUMBER})\s*(ms|s)?$", re.IGNORECASE)


def parse_millis(text: str) -> float | None:
    """A millisecond setting: bare milliseconds, ``ms`` or ``s``; fractional
    milliseconds are truncated. Returns seconds, or None when unparseable."""
    s = text.strip()
    if len(s) > 64:
        return None
    m = _MILLIS.match(s)
    if not m:
        return None
    number = float(m.group(1))
    unit = (m.group(2) or "ms").lower()
    ms = number * 1000.0 if unit == "s" else number
    if not math.isfinite(ms):
        return None
    return millis_to_seconds(ms)


def millis_to_seconds(ms: float) -> float:
    return math.floor(ms) / 1000.0


# --- booleans --------------------------------------------------------------------

TRUE_WORDS = frozenset({"true", "yes", "1", "on"})
FALSE_WORDS = frozenset({"false", "f", "no", "n", "0", "off", "t", "y"})
SHORTHANDS = frozenset({"t", "y", "f", "n"})


def parse_bool(text: str) -> tuple[bool, str | None]:
    """Lenient boolean (dialect rules). Returns the value and a diagnostic code
    to report, if any: ``legacy-bool-shorthand`` or ``invalid-bool``."""
    s = text.strip().lower()
    if s in TRUE_WORDS:
        return True, None
    if s in FALSE_WORDS:
        return False, "legacy-bool-shorthand" if s in SHORTHANDS else None
    return False, "invalid-bool"


# --- entry readers ---------------------------------------------------------------


def _type_error(entry: Entry, sink: Sink, expected: str) -> None:
    sink.error("invalid-type", entry.path, f"expected {expected}", entry.loc)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def get_str(entry: Entry, sink: Sink) -> str | None:
    if entry.raw:
        return unquote(str(entry.value))
    if isinstance(entry.value, str):
        return entry.value.strip()
    _type_error(entry, sink, "a string")
    return None


def get_list(entry: Entry, sink: Sink, *, aggregates: bool = False) -> tuple[str, ...] | None:
    """A list setting: dae comma list, or a TOML/JSON list or comma string."""
    value = entry.value
    if entry.raw:
        items, aggregate = split_list(str(value))
        if aggregate and aggregates:
            sink.info(
                "legacy-quoted-list",
                entry.path,
                "a quoted item holds several comma-separated values; quote each item",
                entry.loc,
            )
            items = [p.strip() for item in items for p in item.split(",") if p.strip()]
        return tuple(items)
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value if v.strip())
    _type_error(entry, sink, "a list of strings")
    return None


def get_seconds(entry: Entry, sink: Sink) -> float | None:
    """A second-based duration. Unparseable text becomes 0 with a warning (the
    caller decides whether 0 is acceptable); a wrong type is an error (None)."""
    value = entry.value
    if entry.raw or isinstance(value, str):
        text = unquote(str(value)) if entry.raw else str(value)
        seconds = parse_seconds(text)
        if seconds is None:
            sink.warning("invalid-duration", entry.path, "not a duration; read as 0", entry.loc)
            return 0.0
        return seconds
    if _is_number(value):
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number) or number < 0:
            sink.warning("invalid-duration", entry.path, "not a duration; read as 0", entry.loc)
            return 0.0
        return number
    _type_error(entry, sink, "a duration (string or number of seconds)")
    return None


def get_millis(entry: Entry, sink: Sink, default: float) -> float | None:
    """A millisecond setting, returned in seconds. Unparseable text keeps the
    default with a warning; a wrong type is an error (None)."""
    value = entry.value
    if entry.raw or isinstance(value, str):
        text = unquote(str(value)) if entry.raw else str(value)
        seconds = parse_millis(text)
        if seconds is None:
            sink.warning(
                "invalid-duration", entry.path, "not a millisecond duration; keeping the default", entry.loc
            )
            return default
        return seconds
    if _is_number(value):
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number) or number < 0:
            sink.warning(
                "invalid-duration", entry.path, "not a millisecond duration; keeping the default", entry.loc
            )
            return default
        return millis_to_seconds(number)
    _type_error(entry, sink, "a duration (string or number of milliseconds)")
    return None


def get_int(entry: Entry, sink: Sink) -> int | None:
    value = entry.value
    if entry.raw or isinstance(value, str):
        text = unquote(str(value)) if entry.raw else str(value).strip()
        if re.fullmatch(r"[+]?\d{1,18}", text):
            return int(text)
        sink.error("invalid-value", entry.path, "expected an integer", entry.loc)
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    _type_error(entry, sink, "an integer")
    return None


def get_bool(entry: Entry, sink: Sink) -> bool | None:
    value = entry.value
    if entry.raw:
        result, code = parse_bool(unquote(str(value)))
        if code == "legacy-bool-shorthand":
            sink.warning(code, entry.path, "single-letter boolean shorthand; write true or false", entry.loc)
        elif code == "invalid-bool":
            sink.warning(code, entry.path, "not a boolean; read as false", entry.loc)
        return result
    if isinstance(value, bool):
        return value
    _type_error(entry, sink, "a boolean")
    return None
