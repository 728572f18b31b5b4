"""ScoreEvidence: the manager's Score evidence state, sans-I/O (GH-K-02..12, GH-K-25..29).

Each outcome lands in up to three layers: the exact cell (group, network, family, target,
node), the family aggregate (group, network, family, node) and the global aggregate
(group, network, None, node). A targetless warm-up sample, or a target with no known family,
reaches the global aggregate only and never creates an exact cell.

Reporters are admitted first (:meth:`ScoreEvidence.admit`), which creates the cells on demand
and captures their incarnations; later updates apply only to cells still at those
incarnations, so eviction, prune and restart-like clears can never be undone by an old
reporter (GH-K-11), and feedback for pruned membership is ignored (GH-K-08).

Blending (GH-K-04): the global layer's Beta lower bound is the start; each more specific
layer then replaces a share ``min(1, its decayed outcomes / BLEND_FULL_EVIDENCE)`` of the
estimate so far. Each layer is rated on its own counts: counts are never added across layers,
and support is the largest layer count, not a sum.

Qualification (GH-K-27/28): a node is qualified in a group and network when one of its layers
holds QUALIFYING_COMPLETIONS decayed useful completions (qualification counts across targets,
so this is in practice the global aggregate), or while its qualification lease runs. A fresh
targeted RX, strictly after the newest failure and the last reload, renews the lease for
QUALIFICATION_LEASE from the RX event time, but only when qualification is earned at that
moment (by completions or by a running lease); failures and reload revoke it. The lease lives
on the global aggregate cell, so it shares that cell's incarnation and eviction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from honk._fast.cell import layer_weight, read_cells, reliability_bound, standing
from honk.alive.outcome import Family
from honk.core.net import IPAddress, Network
from honk.group.score.cells import CellStore, EvidenceCell, Outcome, current_cells
from honk.group.score.constants import (
    AGGREGATE_CELLS_MAX,
    EXACT_CELLS_MAX,
    QUALIFICATION_LEASE,
    QUALIFYING_COMPLETIONS,
)
from honk.group.score.keys import AggregateKey, ExactKey, NodeId, ScoreTarget, target_family

LAYERS = 3  # global, family, exact


class Admission:
    """The cells one reporter was admitted to, with their incarnations; opaque to callers.

    ``cells`` lists (store, key, incarnation), global aggregate first. ``targeted`` says the
    reporter has a business target (only targeted RX can renew a lease). Treat it as
    immutable (a plain slots class: one is built per flow and group).
    """

    __slots__ = ("cells", "targeted")

    def __init__(self, cells: tuple[tuple[CellStore, object, int], ...], targeted: bool) -> None:
        self.cells = cells
        self.targeted = targeted


@dataclass(frozen=True, slots=True)
class Blend:
    """The blended read of one (group, network, target, node).

    ``reliability``: the blended Beta lower bound. ``weights``: each layer's share of it,
    (global, family, exact), summing to 1. ``support``: the largest decayed outcome count of a
    layer. ``useful``: the largest decayed useful-completion count of a layer.
    """

    reliability: float
    weights: tuple[float, float, float]
    support: float
    useful: float


@dataclass(frozen=True, slots=True)
class EvidenceStats:
    """Totals for ``/stats.score`` cache fields: counts only, never keys or targets (GH-K-09)."""

    exact_entries: int
    exact_capacity: int
    exact_evictions: int
    aggregate_entries: int
    aggregate_capacity: int
    aggregate_evictions: int


def _layer_keys(
    group: str, network: Network, family: Family | None, target: ScoreTarget | None, node_id: NodeId
) -> list[tuple[str, object]]:
    layers: list[tuple[str, object]] = [("aggregate", AggregateKey(group, network, None, node_id))]
    if family is not None:
        layers.append(("aggregate", AggregateKey(group, network, family, node_id)))
        if target is not None:
            layers.append(("exact", ExactKey(group, network, family, target, node_id)))
    return layers


class ScoreEvidence:
    """The per-manager evidence state; one object lives across in-process reloads (GH-K-08)."""

    def __init__(
        self,
        membership: Iterable[tuple[str, NodeId]] | None = None,
        exact_max: int = EXACT_CELLS_MAX,
        aggregate_max: int = AGGREGATE_CELLS_MAX,
    ) -> None:
        self._stores: dict[str, CellStore] = {
            "exact": CellStore(exact_max),
            "aggregate": CellStore(aggregate_max),
        }
        self.exact: CellStore[ExactKey] = self._stores["exact"]
        self.aggregate: CellStore[AggregateKey] = self._stores["aggregate"]
        # None: no membership published yet, every (group, node) is accepted
        self._valid: frozenset[tuple[str, NodeId]] | None = (
            None if membership is None else frozenset(membership)
        )
        self.membership_version = 0  # +1 at every published membership: a cached is_member answer is stale
        self._reload_fence: float | None = None  # time of the last reload: older RX renews nothing
        # (group, network, family, node) -> its aggregate keys, global first: every flow of a
        # node admits the same ones, and a key is built (its hash computed) once, not per flow;
        # dropped with the membership they were built for
        self._aggregate_keys: dict[tuple, tuple[AggregateKey, ...]] = {}

    # --- keys -----------------------------------------------------------------------------------

    @staticmethod
    def keys(
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        destination: IPAddress | None = None,
    ) -> list[tuple[str, object]]:
        """The (store, key) layers of a flow, global first; an exact key only with a family."""
        return _layer_keys(group, network, target_family(target, destination), target, node_id)

    def is_member(self, group: str, node_id: NodeId) -> bool:
        return self._valid is None or (group, node_id) in self._valid

    # --- reporting ------------------------------------------------------------------------------

    def admit(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        destination: IPAddress | None = None,
    ) -> Admission | None:
        """Admit a reporter: create its cells on demand and capture their incarnations.

        None when (group, node) is not in the current membership: it reports nothing.
        """
        if not self.is_member(group, node_id):
            return None
        return self.admit_member(group, network, target_family(target, destination), target, node_id)

    def admit_member(
        self, group: str, network: Network, family: Family | None, target: ScoreTarget | None, node_id: NodeId
    ) -> Admission:
        """:meth:`admit` for a (group, node) the caller just found a member, with the flow's
        target ``family`` already decided."""
        aggregate_keys = self._aggregate_keys.get((group, network, family, node_id))
        if aggregate_keys is None:
            aggregate_keys = self._aggregate_keys[(group, network, family, node_id)] = tuple(
                key for _name, key in _layer_keys(group, network, family, None, node_id)
            )
        cells = []
        store = self.aggregate
        for key in aggregate_keys:
            cell = store.get_or_create(key)
            cells.append((store, cell.key, cell.incarnation))  # the store's own key object
        if family is not None and target is not None:
            store = self.exact
            cell = store.get_or_create(ExactKey(group, network, family, target, node_id))
            cells.append((store, cell.key, cell.incarnation))
        return Admission(tuple(cells), target is not None)

    def settle(
        self, admission: Admission | None, outcome: Outcome, now: float, *, rx_at: float | None = None
    ) -> None:
        """Record ``outcome`` at ``now`` into every admitted cell that is still current; ``rx_at``:
        a held RX flushed by this settlement first (as :meth:`rx` would, on the same cells)."""
        if admission is None:
            return
        # the admitted cells still current, each touched: a (group, node) that left the
        # membership has none left (prune dropped them), so its late feedback finds none (GH-K-08)
        current = current_cells(admission.cells)
        if rx_at is not None:
            self._renew(admission, current, rx_at)
        for cell in current:
            cell.record(outcome, now)

    def record(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        outcome: Outcome,
        now: float,
        destination: IPAddress | None = None,
    ) -> None:
        """Admit and settle at once, for samples without a long-lived reporter (warm-up)."""
        self.settle(self.admit(group, network, target, node_id, destination), outcome, now)

    def rx(self, admission: Admission | None, now: float) -> bool:
        """Fresh business RX at event time ``now``: renew *earned* qualification (GH-K-28).

        Adds no completion. Returns whether the lease was renewed.
        """
        if admission is None:
            return False
        return self._renew(admission, current_cells(admission.cells), now)

    def _renew(self, admission: Admission, current: list[EvidenceCell], now: float) -> bool:
        if not admission.targeted:
            return False
        if self._reload_fence is not None and now <= self._reload_fence:
            return False
        # the global cell, when still current, comes first (admission order)
        cell = current[0] if current and current[0].key is admission.cells[0][1] else None
        if cell is None:
            return False
        for c in current:
            if c.last_failure is not None and now <= c.last_failure:
                return False
        if cell.lease_until is None or now >= cell.lease_until:  # no running lease: earned afresh?
            for c in current:
                if c.useful.value(now) >= QUALIFYING_COMPLETIONS:
                    break
            else:
                return False
        renewed = now + QUALIFICATION_LEASE  # never shortens a running lease (not max(): a call per RX)
        if cell.lease_until is None or renewed > cell.lease_until:
            cell.lease_until = renewed
        return True

    # --- reading (never creates or touches cells) -----------------------------------------------

    def layers(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        destination: IPAddress | None = None,
    ) -> list[EvidenceCell | None]:
        """The (global, family, exact) cells of a read; missing layers are None."""
        out: list[EvidenceCell | None] = [None] * LAYERS
        for i, (store, key) in enumerate(self.keys(group, network, target, node_id, destination)):
            out[i] = self._stores[store].peek(key)
        return out

    def blend(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        now: float,
        destination: IPAddress | None = None,
    ) -> Blend:
        """The hierarchical blend of the layers at ``now`` (GH-K-04)."""
        cells = self.layers(group, network, target, node_id, destination)
        weights = [1.0, 0.0, 0.0]
        for i in range(1, LAYERS):
            w = layer_weight(cells[i], now)
            if w > 0.0:
                weights = [x * (1.0 - w) for x in weights]
                weights[i] = w
        present = [c for c in cells if c is not None]
        support = max((c.outcomes(now) for c in present), default=0.0)
        useful = max((c.useful.value(now) for c in present), default=0.0)
        return Blend(read_cells(tuple(cells), now)[0], (weights[0], weights[1], weights[2]), support, useful)

    def qualified(
        self,
        group: str,
        network: Network,
        node_id: NodeId,
        now: float,
        target: ScoreTarget | None = None,
        destination: IPAddress | None = None,
    ) -> bool:
        """Whether the node is qualified at ``now``: earned completions or a running lease."""
        return read_cells(tuple(self.layers(group, network, target, node_id, destination)), now)[1]

    # --- lifecycle ------------------------------------------------------------------------------

    def prune(self, valid: Iterable[tuple[str, NodeId]]) -> int:
        """Publish the new (group, node) membership and drop cells outside it (GH-K-08).

        Returns how many cells were dropped. Late feedback for removed membership is ignored.
        """
        self._valid = frozenset(valid)
        self.membership_version += 1
        self._aggregate_keys.clear()
        keep = self._valid
        return sum(
            store.prune(lambda key: (key.group, key.node_id) in keep) for store in self._stores.values()
        )

    def reload(self, valid: Iterable[tuple[str, NodeId]], now: float) -> int:
        """A committed in-process reload (GH-K-08/12/28): prune to the new membership and revoke
        every qualification lease; RX at or before ``now`` renews nothing. Surviving cells and
        their incarnations stay, so admitted flows of surviving membership keep reporting."""
        dropped = self.prune(valid)
        for cell in self.aggregate.cells():
            cell.lease_until = None
        self._reload_fence = now if self._reload_fence is None else max(self._reload_fence, now)
        return dropped

    def clear(self) -> None:
        """Forget everything, as a process restart would; incarnations keep counting."""
        for store in self._stores.values():
            store.clear()
        self._aggregate_keys.clear()
        self._valid = None
        self.membership_version += 1
        self._reload_fence = None

    def stats(self) -> EvidenceStats:
        return EvidenceStats(
            len(self.exact),
            self.exact.max_entries,
            self.exact.evictions,
            len(self.aggregate),
            self.aggregate.max_entries,
            self.aggregate.evictions,
        )


__all__ = [
    "Admission",
    "Blend",
    "EvidenceStats",
    "ScoreEvidence",
    "layer_weight",
    "read_cells",
    "reliability_bound",
    "standing",
]
