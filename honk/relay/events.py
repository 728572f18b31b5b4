"""The relay engine's END event, decoded once at the Python edge.

The engine reports to its listeners through ``relay_event(kind, a, b, t)``, four plain
integers and a float: cheap to build on the worker thread and to deliver in batches. Only
END packs two facts into one integer (``b = side << 16 | errno``); :func:`decode_end` is the
one place that unpacks it, into a :class:`RelayEnd` the rest of honk reads by name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from honk._fast import relay as _relay

__all__ = ["EndCause", "RelayEnd", "Side", "decode_end"]


class EndCause(enum.IntEnum):
    CLEAN = _relay.END_CLEAN  # both directions finished
    ERROR = _relay.END_ERROR  # a socket (or the framing, or memory) failed
    CANCELLED = _relay.END_CANCELLED  # cancel() or the engine closed


class Side(enum.IntEnum):
    CLIENT = _relay.SIDE_CLIENT  # the error came from the client's socket
    UPSTREAM = _relay.SIDE_UPSTREAM  # from the upstream's socket, or the framing's verdict on its bytes
    LOCAL = _relay.SIDE_LOCAL  # honk's own: no pipe, no memory


# an errno the engine reports on the upstream side of a framed flow: the framing's verdict
FRAMING_VERDICTS = frozenset(
    {_relay.FRAMING_AUTH, _relay.FRAMING_PROTOCOL, _relay.FRAMING_TRUNCATED, _relay.FRAMING_SILENT}
)


@dataclass(frozen=True, slots=True)
class RelayEnd:
    """How a flow ended: ``side`` and ``errno`` only for :attr:`EndCause.ERROR` (else None, 0)."""

    cause: EndCause
    side: Side | None = None
    errno: int = 0

    @property
    def framing_verdict(self) -> bool:
        """The framing judged what the upstream sent (a tag, a length, a truncation, silence)."""
        return self.side is Side.UPSTREAM and self.errno in FRAMING_VERDICTS


_CLEAN = RelayEnd(EndCause.CLEAN)
_CANCELLED = RelayEnd(EndCause.CANCELLED)


def decode_end(a: int, b: int) -> RelayEnd:
    """The END event's ``a`` (cause) and ``b`` (``side << 16 | errno`` for an error)."""
    if a == _relay.END_ERROR:
        return RelayEnd(EndCause.ERROR, Side(b >> 16), b & 0xFFFF)
    return _CLEAN if a == _relay.END_CLEAN else _CANCELLED
