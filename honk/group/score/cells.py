"""Score's evidence cells and their bounded LRU stores (GH-K-07, GH-K-11, GH-K-25).

A cell holds decayed (30-minute half-life) counts of one node's outcomes under one key. The
stores are LRUs populated on demand; eviction drops the least recently admitted or updated
cell. Every cell gets an *incarnation* from a store-wide counter that never goes back, and a
reporter's update names the incarnation it was admitted under: after an eviction, a prune or
a clear, a stale reporter finds no cell or a newer incarnation and its update is ignored, so
it can never recreate a cell (GH-K-11).
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

from honk._fast.decay import EVIDENCE_HALF_LIFE, DecayedCounter
from honk.group.score.constants import BOUND_REUSE

K = TypeVar("K", bound=Hashable)
_NO_ROW: dict = {}  # what CellStore.row returns for a row without cells (never written)


class Outcome(enum.Enum):
    """What one settled attempt (or one warm-up sample) contributes to a cell."""

    SETUP_OK = "setup_ok"  # a setup that succeeded and settles nothing else (warm-up)
    SUCCESS = "success"  # a settled success that saw no response
    USEFUL = "useful"  # a settled success that saw a response: a useful completion (GH-K-27)
    FAILURE = "failure"  # a business failure after setup
    SETUP_FAILURE = "setup_failure"  # the setup itself failed; weighs more in the Beta bound

    @property
    def is_failure(self) -> bool:
        return self is Outcome.FAILURE or self is Outcome.SETUP_FAILURE


class Standing(NamedTuple):
    """What a rank reads of one cell at one time (see :func:`honk.group.score.evidence.standing`)."""

    bound: float  # the Beta reliability lower bound (GH-K-26)
    weight: float  # how much of the blend this layer takes over from its parents (GH-K-04)
    useful: float  # decayed useful completions (qualification, GH-K-27)


class EvidenceCell:
    """Decayed outcome counts of one key. Time is always an argument."""

    __slots__ = ("_standing", "attempts", "failures", "incarnation", "key", "last_failure", "lease_until",
                 "setup_failures", "successes", "useful")

    def __init__(self, incarnation: int, key: Hashable = None) -> None:
        self.incarnation = incarnation
        self.key = key  # the key object the store holds it under: reusing it makes lookups identity hits
        self.attempts = DecayedCounter(EVIDENCE_HALF_LIFE)  # every recorded sample, warm-up included
        self.successes = DecayedCounter(EVIDENCE_HALF_LIFE)  # settled successes (useful or not)
        self.failures = DecayedCounter(EVIDENCE_HALF_LIFE)  # failures after setup
        self.setup_failures = DecayedCounter(EVIDENCE_HALF_LIFE)
        self.useful = DecayedCounter(EVIDENCE_HALF_LIFE)  # useful completions
        self.last_failure: float | None = None  # event time of the newest failure
        self.lease_until: float | None = None  # qualification lease end (kept on the global cell)
        self._standing: tuple[float, Standing] | None = None  # (time, what a rank reads of it then)

    def standing(self, now: float, compute: Callable[[EvidenceCell, float], Standing]) -> Standing:
        """``compute(self, now)``, reused for BOUND_REUSE seconds while the counts are unchanged
        (a record drops it): the ranks of a busy group read every member's cells each flow."""
        memo = self._standing
        if memo is not None and 0.0 <= now - memo[0] < BOUND_REUSE:
            return memo[1]
        value = compute(self, now)
        self._standing = (now, value)
        return value

    def record(self, outcome: Outcome, now: float) -> None:
        """Add one ``outcome`` that happened at ``now``."""
        self._standing = None
        self.attempts.add(1.0, now)
        if outcome is Outcome.SUCCESS or outcome is Outcome.USEFUL:
            self.successes.add(1.0, now)
            if outcome is Outcome.USEFUL:
                self.useful.add(1.0, now)
        elif outcome.is_failure:
            (self.failures if outcome is Outcome.FAILURE else self.setup_failures).add(1.0, now)
            if self.last_failure is None or now > self.last_failure:
                self.last_failure = now
            self.lease_until = None  # a failure revokes the qualification lease (GH-K-28)

    def outcomes(self, now: float) -> float:
        """Decayed settled outcomes (successes and failures of both kinds): the layer's evidence."""
        return self.successes.value(now) + self.failures.value(now) + self.setup_failures.value(now)

    def __repr__(self) -> str:
        return f"EvidenceCell(incarnation={self.incarnation})"


class CellStore(Generic[K]):
    """A bounded LRU of :class:`EvidenceCell` by key, with store-wide incarnations."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.evictions = 0  # cells dropped to stay within max_entries (prunes and clears not counted)
        self._cells: OrderedDict[K, EvidenceCell] = OrderedDict()
        self._incarnations = itertools.count(1)
        # the same cells by row (the key without its node, ``key.row``) then node: a rank reads
        # one row for all its members instead of building and hashing a key per member
        self._rows: dict[Hashable, dict[Hashable, EvidenceCell]] = {}

    def __len__(self) -> int:
        return len(self._cells)

    def get_or_create(self, key: K) -> EvidenceCell:
        """The cell of ``key``, created on demand (evicting the least recently used); touches it."""
        cell = self._cells.get(key)
        if cell is not None:
            self._cells.move_to_end(key)
            return cell
        cell = EvidenceCell(next(self._incarnations), key)
        self._cells[key] = cell
        row = getattr(key, "row", None)  # score keys have rows; a plain key is only in the LRU
        if row is not None:
            self._rows.setdefault(row, {})[key.node_id] = cell  # type: ignore[attr-defined]
        while len(self._cells) > self.max_entries:
            evicted, _ = self._cells.popitem(last=False)
            self._unindex(evicted)
            self.evictions += 1
        return cell

    def _unindex(self, key: K) -> None:
        row_key = getattr(key, "row", None)
        row = self._rows.get(row_key) if row_key is not None else None
        if row is not None:
            row.pop(key.node_id, None)  # type: ignore[attr-defined]
            if not row:
                del self._rows[row_key]

    def row(self, row: Hashable | None) -> dict[Hashable, EvidenceCell]:
        """The cells of one row by node (read-only; empty when it has none, or for None)."""
        return self._rows.get(row, _NO_ROW)

    def peek(self, key: K) -> EvidenceCell | None:
        """The cell of ``key`` without touching the LRU order (reads are not use)."""
        return self._cells.get(key)

    def prune(self, keep: Callable[[K], bool]) -> int:
        """Drop every cell whose key ``keep`` rejects; return how many were dropped."""
        doomed = [key for key in self._cells if not keep(key)]
        for key in doomed:
            del self._cells[key]
            self._unindex(key)
        return len(doomed)

    def cells(self):
        """The live cells, least recently used first (for whole-store passes such as reload)."""
        return self._cells.values()

    def clear(self) -> None:
        """Drop every cell; incarnations keep counting so no old reporter matches a new cell."""
        self._cells.clear()
        self._rows.clear()


def current_cells(admitted: Iterable[tuple[CellStore, Hashable, int]]) -> list[EvidenceCell]:
    """The cells of the (store, key, incarnation) triples in ``admitted`` that are still that
    incarnation, in order, each touched; never creates one (an evicted, pruned or cleared cell's
    old reporter finds nothing). A reporter's settlement and its published RX read them all at once."""
    out = []
    for store, key, incarnation in admitted:
        cells = store._cells  # this module's own store: one lookup and one touch per cell
        cell = cells.get(key)
        if cell is not None and cell.incarnation == incarnation:
            cells.move_to_end(key)
            out.append(cell)
    return out


__all__ = ["CellStore", "EvidenceCell", "Outcome", "Standing", "current_cells"]
