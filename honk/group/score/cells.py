"""Score's evidence cells and their bounded LRU stores (GH-K-07, GH-K-11, GH-K-25).

A cell holds decayed (30-minute half-life) counts of one node's outcomes under one key; the cell
itself is the compiled kernel ``honk._fast.cell``, every rank reads it. The stores are LRUs populated on demand; eviction drops the least recently admitted or updated
cell. Every cell gets an *incarnation* from a store-wide counter that never goes back, and a
reporter's update names the incarnation it was admitted under: after an eviction, a prune or
a clear, a stale reporter finds no cell or a newer incarnation and its update is ignored, so
it can never recreate a cell (GH-K-11).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from honk._fast.cell import EvidenceCell
from honk._fast.outcome import Outcome, Standing

K = TypeVar("K", bound=Hashable)
_NO_ROW: dict = {}  # what CellStore.row returns for a row without cells (never written)


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
        # counts every change of which cell a row holds for a node (a cell made, evicted, pruned
        # or cleared; a cell's own counts change in place): a reader may keep what it took from
        # the rows while this stands
        self.row_changes = 0

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
            self.row_changes += 1
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
            self.row_changes += 1
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
        self.row_changes += 1


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
