"""Per-cell hard-failure episodes, availability cohorts and the recovery quorum (GH-K-36..45).

A cell (an opaque hashable key owned by the evidence store) has at most one open hard-failure
episode. Recovery does not come from time or probes: it needs RECOVERY_REPORTERS distinct
business reporters whose targeted Traffic RX lands in the cell's uninterrupted post-failure
availability cohort (GH-K-37). The same cohort answers recent usability (GH-K-40).

Sans-I/O: every call takes the time it acts at. ``rx`` may also carry the RX's actual event time
(``at``) when a reporter flushes a throttled receive at settlement (GH-K-43); ``now`` is then the
settlement time and only decides whether that RX's support has already expired.

This module never adds Beta outcomes and never touches historical failure counts kept elsewhere;
``failures`` here is its own count of failed flows, so callers can see recovery leave it alone.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from honk.group.score.constants import (
    COHORT_GAP,
    EPISODE_MEMORY,
    RECOVERY_LEASE,
    RECOVERY_REPORTERS,
    TX_MEMORY,
    USABLE_REPORTERS,
)

# A cohort needs to tell apart only this many reporters: past it, more reporters change nothing
# but the event time, so the credited set stays bounded however busy the cell is.
_CREDITS_NEEDED = max(RECOVERY_REPORTERS, USABLE_REPORTERS)


class Kind(enum.Enum):
    """What produced an RX. Only business Traffic earns availability (GH-K-39, GH-K-41)."""

    TRAFFIC = "traffic"
    PROBE = "probe"
    WARMUP = "warmup"
    TX_ONLY = "tx_only"
    SETUP_ONLY = "setup_only"


class FailResult(enum.Enum):
    OPENED = "opened"  # a new episode opened: cohort reset, usability and lease revoked
    KEPT = "kept"  # another flow of the already open episode: counted, cohort untouched
    COUNTED = "counted"  # late report of a recovered or superseded episode: counted only


class Credit(enum.Enum):
    IGNORED = "ignored"  # not eligible: wrong kind, no prior TX, behind a fence, expired
    COUNTED = "counted"  # a new distinct reporter joined the cohort
    REFRESHED = "refreshed"  # an eligible RX that only moved the cohort's event time
    RECOVERED = "recovered"  # this credit completed the quorum and cleared the episode


@dataclass(frozen=True, slots=True)
class Reporter:
    """One business flow's reporter. Clones share ``origin`` and so count once (GH-K-41)."""

    id: Hashable
    origin: Hashable | None = None

    @property
    def key(self) -> Hashable:
        return self.id if self.origin is None else self.origin

    def clone(self, id: Hashable) -> Reporter:
        return Reporter(id, self.key)


class EpisodeState(Protocol):
    """What a reader sees of a cell with an open episode (:meth:`Cohorts.open_states`)."""

    @property
    def rx_since_fence(self) -> bool:
        """An accepted RX came after the episode's (or a later reload's) fence: funded
        half-open work may continue (GH-K-36)."""

    @property
    def open_failures(self) -> int:
        """Independent failures since the episode opened (fan-out not counted)."""


@dataclass(slots=True)
class _Cell:
    """One cell's episode and cohort state (read through :class:`EpisodeState`)."""

    episode: Hashable | None = None  # the open hard-failure episode
    episodes: OrderedDict = field(default_factory=OrderedDict)  # recently seen episode ids
    fence: float = float("-inf")  # RX must be strictly later than the last failure/reload
    floor: float = float("-inf")  # RX earlier than this belongs to a cohort a gap already ended
    credits: set = field(default_factory=set)  # reporter keys in the current cohort
    last_event: float | None = None  # the cohort's event time; None = empty cohort
    lease_until: float | None = None
    rx_since_fence: bool = False
    tx: OrderedDict = field(default_factory=OrderedDict)  # reporter key -> time of first TX
    failures: int = 0
    open_failures: int = 0  # independent failure episodes since the open episode opened

    def reset_cohort(self) -> None:
        self.credits.clear()
        self.last_event = None


# Enum members read on every event, bound once: in Python 3.11 each ``Enum.MEMBER`` read goes
# through the enum metaclass's __getattr__ hook, several hundred instructions; a global is one.
_TRAFFIC = Kind.TRAFFIC
_IGNORED, _REFRESHED, _RECOVERED, _COUNTED = (
    Credit.IGNORED,
    Credit.REFRESHED,
    Credit.RECOVERED,
    Credit.COUNTED,
)
_KEPT, _FAIL_COUNTED, _OPENED = FailResult.KEPT, FailResult.COUNTED, FailResult.OPENED

_NO_STATES: dict = {}  # what open_states returns for a row without any (never written)


class Cohorts:
    """Episodes and availability cohorts of every cell, keyed by an opaque cell key."""

    def __init__(self) -> None:
        self._cells: dict[Hashable, _Cell] = {}
        # row (the cell key without its node) -> node -> the state of its open episode: a rank
        # reads the open episodes of its own rows at once (keys with a ``row``)
        self._open_rows: dict[Hashable, dict[Hashable, _Cell]] = {}

    def _cell(self, cell: Hashable) -> _Cell:
        state = self._cells.get(cell)
        if state is None:
            state = self._cells[cell] = _Cell()
        return state

    # --- events -------------------------------------------------------------------------------

    def fail(self, cell: Hashable, now: float, *, episode: Hashable) -> FailResult:
        """An applicable failure at ``now`` reported for ``episode`` (GH-K-17, GH-K-42, GH-K-45).

        Every call counts one failed flow. Only an episode new to this cell opens: it fences RX,
        resets the cohort and revokes usability and the lease. Another flow of the open episode
        keeps it as it is (its post-failure credits are still post-failure), and a late report of
        an episode this cell already recovered or replaced never reopens anything."""
        state = self._cell(cell)
        state.failures += 1
        if episode == state.episode:
            return _KEPT
        if episode in state.episodes:
            state.episodes.move_to_end(episode)
            return _FAIL_COUNTED
        state.episodes[episode] = None
        if len(state.episodes) > EPISODE_MEMORY:
            state.episodes.popitem(last=False)
        if state.episode is None:
            self._opened(cell, state)
        state.open_failures = state.open_failures + 1 if state.episode is not None else 1
        state.episode = episode
        state.fence = max(state.fence, now)
        state.reset_cohort()
        state.lease_until = None
        state.rx_since_fence = False
        return _OPENED

    def tx(self, cell: Hashable, reporter: Reporter, now: float) -> None:
        """The reporter is set up and made positive TX on this cell; its later RX may count."""
        state = self._cell(cell)
        key = reporter.key
        if key in state.tx:
            state.tx.move_to_end(key)
            return
        state.tx[key] = now
        if len(state.tx) > TX_MEMORY:
            state.tx.popitem(last=False)

    def rx(
        self, cell: Hashable, reporter: Reporter, now: float, *, kind: Kind, at: float | None = None
    ) -> Credit:
        """A targeted positive RX at event time ``at`` (default ``now``) (GH-K-36, GH-K-41).

        It counts only for Traffic, after this reporter's TX, strictly after the failure/reload
        fence, and while its support is unexpired at ``now``. A gap of COHORT_GAP since the
        cohort's last event starts a new cohort, so one returning reporter cannot revive old
        credits (GH-K-42)."""
        at = now if at is None else at
        if kind is not _TRAFFIC:
            return _IGNORED
        state = self._cells.get(cell)
        if state is None:
            return _IGNORED
        key = reporter.key
        tx_at = state.tx.get(key)
        if tx_at is None or at < tx_at or at <= state.fence or at < state.floor:
            return _IGNORED
        if now - at >= COHORT_GAP:  # never flush across expired support (GH-K-43)
            return _IGNORED
        state.tx.move_to_end(key)
        state.rx_since_fence = True
        if state.last_event is not None and at - state.last_event >= COHORT_GAP:
            state.floor = state.last_event + COHORT_GAP
            state.reset_cohort()
        if state.last_event is None or at > state.last_event:  # (not max(): a call per RX)
            state.last_event = at
        if key in state.credits or len(state.credits) >= _CREDITS_NEEDED:
            return _REFRESHED
        state.credits.add(key)
        if state.episode is not None and len(state.credits) >= RECOVERY_REPORTERS:
            # The cohort began after the failure (fail() reset it), so it is post-failure.
            state.episode = None
            self._opened(cell, None)
            state.lease_until = state.last_event + RECOVERY_LEASE
            return _RECOVERED
        return _COUNTED

    def reload(self, now: float) -> None:
        """A committed reload: every cohort restarts behind a reload fence and usability and
        leases are revoked. It opens no episode and closes none (GH-K-38, GH-K-45)."""
        for state in self._cells.values():
            state.fence = max(state.fence, now)
            state.reset_cohort()
            state.lease_until = None
            state.rx_since_fence = False

    def forget(self, cell: Hashable) -> None:
        """Drop a cell the evidence store evicted or pruned."""
        state = self._cells.pop(cell, None)
        if state is not None and state.episode is not None:
            self._opened(cell, None)

    def _opened(self, cell: Hashable, state: _Cell | None) -> None:
        """Index ``cell``'s open episode (``state``), or drop it (None), under its row."""
        row = getattr(cell, "row", None)
        if row is None:
            return
        if state is not None:
            self._open_rows.setdefault(row, {})[cell.node_id] = state  # type: ignore[attr-defined]
            return
        nodes = self._open_rows.get(row)
        if nodes is not None:
            nodes.pop(cell.node_id, None)  # type: ignore[attr-defined]
            if not nodes:
                del self._open_rows[row]

    def open_states(self, row: Hashable | None) -> Mapping[Hashable, EpisodeState]:
        """The cells of ``row`` with an open episode, by node: their states, to read and never
        change (a rank reads the members of its rows at once); none for None (a layer the read
        does not have)."""
        return self._open_rows.get(row, _NO_STATES)

    # --- reads --------------------------------------------------------------------------------

    def open_episode(self, cell: Hashable) -> Hashable | None:
        state = self._cells.get(cell)
        return None if state is None else state.episode

    def exploration_cleared(self, cell: Hashable) -> bool:
        """False while an open episode has seen no accepted RX after its (or a later reload's)
        fence; the first such RX permits funded half-open work (GH-K-36)."""
        state = self._cells.get(cell)
        return state is None or state.episode is None or state.rx_since_fence

    def observed_usable(self, cell: Hashable, now: float) -> bool:
        """USABLE_REPORTERS distinct Traffic reporters in the current, unexpired cohort (GH-K-40)."""
        state = self._cells.get(cell)
        if state is None or state.last_event is None or now - state.last_event >= COHORT_GAP:
            return False
        return len(state.credits) >= USABLE_REPORTERS

    def reporters(self, cell: Hashable, now: float) -> int:
        """Distinct reporters credited in the current unexpired cohort (capped at the quorum)."""
        state = self._cells.get(cell)
        if state is None or state.last_event is None or now - state.last_event >= COHORT_GAP:
            return 0
        return len(state.credits)

    def lease_valid(self, cell: Hashable, now: float) -> bool:
        """The recovery lease: valid from the quorum's event time for RECOVERY_LEASE (GH-K-37)."""
        state = self._cells.get(cell)
        return state is not None and state.lease_until is not None and now < state.lease_until

    def episode_failures(self, cell: Hashable) -> int:
        """Independent failures (distinct episodes, not fan-out) since the cell's open episode
        opened; 0 when none is open."""
        state = self._cells.get(cell)
        return 0 if state is None or state.episode is None else state.open_failures

    def failures(self, cell: Hashable) -> int:
        """Failed flows counted for this cell; recovery and reload never lower it."""
        state = self._cells.get(cell)
        return 0 if state is None else state.failures


__all__ = [
    "EPISODE_MEMORY",
    "TX_MEMORY",
    "Cohorts",
    "Credit",
    "EpisodeState",
    "FailResult",
    "Kind",
    "Reporter",
]
