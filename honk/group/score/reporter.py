"""One business reporter's RX publication throttle (GH-K-79) and settlement flush (GH-K-43).

The first eligible positive RX publishes at once; later ones at most once per RX_PUBLISH_INTERVAL.
A receive inside the interval is held, not scheduled: no timer turns silence into progress, and a
TX-only callback never flushes it. It goes out with the next publishable RX (which supersedes it)
or at terminal settlement, stamped with its own event time, never the cleanup time. Settlement
happens once; cancellation, rejection and shutdown are neutral: the factual RX is kept but no
success is recorded. Publications feed availability and the recovery quorum only, never Beta
outcomes (those belong to the evidence store).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import NamedTuple, Protocol

from honk.group.score.cohort import Credit, Kind, Reporter
from honk.group.score.constants import RX_PUBLISH_INTERVAL


class RxSink(Protocol):
    """What a reporter feeds; ``cohort.Cohorts`` is one."""

    def tx(self, cell: Hashable, reporter: Reporter, now: float) -> None: ...

    def rx(
        self, cell: Hashable, reporter: Reporter, now: float, *, kind: Kind, at: float | None = None
    ) -> Credit: ...


class Outcome(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"  # neutral
    REJECTED = "rejected"  # neutral
    SHUTDOWN = "shutdown"  # neutral


_SUCCESS = Outcome.SUCCESS  # bound once: an Enum.MEMBER read costs a metaclass hook in Python 3.11
_tuple_new = tuple.__new__  # builds a named tuple as its _make does, without a Python call


class Settled(NamedTuple):  # one per settled publisher: a tuple builds several times faster
    """What settlement did: the flushed RX's event time (None if nothing was held) and whether
    the caller should record a terminal success (only for SUCCESS)."""

    flushed_at: float | None
    success: bool


class RxPublisher:
    """The publication state machine of one reporter on one cell.

    States: before setup -> set up -> sent (positive TX seen) -> settled. RX is eligible only
    once sent; an ineligible RX is dropped, not held (GH-K-41)."""

    __slots__ = (
        "_cell",
        "_reporter",
        "_sink",
        "_kind",
        "_setup",
        "_sent",
        "_last_published",
        "_held",
        "_settled",
    )

    def __init__(
        self, cell: Hashable, reporter: Reporter, sink: RxSink, *, kind: Kind = Kind.TRAFFIC
    ) -> None:
        self._cell = cell
        self._reporter = reporter
        self._sink = sink
        self._kind = kind
        self._setup = False
        self._sent = False
        self._last_published: float | None = None
        self._held: float | None = None  # event time of the newest suppressed RX
        self._settled = False

    @property
    def held(self) -> float | None:
        return self._held

    @property
    def settled(self) -> bool:
        return self._settled

    def setup(self, now: float) -> None:
        self._setup = True

    def tx(self, now: float) -> None:
        """A positive TX. Announces the reporter to the sink once; never flushes a held RX."""
        if self._settled or not self._setup or self._sent:
            return
        self._sent = True
        self._sink.tx(self._cell, self._reporter, now)

    def rx(self, now: float) -> Credit | None:
        """A targeted positive RX at ``now``. Returns the sink's answer if it was published,
        None if it was held or not eligible."""
        if self._settled or not self._sent:
            return None
        if self._last_published is not None and now - self._last_published < RX_PUBLISH_INTERVAL:
            self._held = now
            return None
        self._last_published = now
        self._held = None  # this newer RX supersedes the held one
        return self._sink.rx(self._cell, self._reporter, now, kind=self._kind)

    def settle(self, now: float, outcome: Outcome) -> Settled | None:
        """Terminal settlement at ``now``; None if already settled. A held RX is flushed at its
        own event time for every outcome: it happened, and the sink's fences and expiry decide
        whether it still counts. Neutral outcomes record no success."""
        if self._settled:
            return None
        self._settled = True
        flushed = self._held
        if flushed is not None:
            self._held = None
            self._sink.rx(self._cell, self._reporter, now, kind=self._kind, at=flushed)
        return _tuple_new(Settled, (flushed, outcome is _SUCCESS))  # Settled(...) without its Python __new__


__all__ = ["Outcome", "RxPublisher", "RxSink", "Settled"]
