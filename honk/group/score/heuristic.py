"""Score's first-choice performance heuristic, sans-I/O (GH-K-29..33, detection of GH-K-47).

State is kept per (group, network, family or None, target or None, node) and, inside that, per
metric scope: each scope holds its newest event time and a WeightedMean of at most
PERFORMANCE_INERTIA observations (GH-K-30). A scope loses confidence PERFORMANCE_CONFIDENCE_LOSS
after its newest event time and expires at PERFORMANCE_EXPIRY, whatever its count (GH-K-31);
an expired scope is cleared before it takes a new observation, so old values never leak into a
fresh mean.

Scopes (GH-K-32) are never pooled: setup latency, response latency and each goodput direction of
one exact target (or of targetless work at the family/global level), and configured-probe RTT per
(probe identity, health family). A read ranks candidates within each scope relative to the best
candidate's value and combines scopes with the K.4 weights (see constants.py). A scope counts
only when it is comparable (PERFORMANCE_COMPARABLE_MIN candidates have it); a candidate missing a
comparable scope scores zero there, so missing or expired performance is never a gain. The
response weight lets a fresh comparable target response override the probe baseline.

This is a proposal for first choice, never promotion proof (GH-K-33). Historical volume adds
nothing: a scope is one mean of at most four observations (GH-K-29). Keys and targets never
appear in reprs (GH-K-09).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from honk._fast.movavg import WeightedMean
from honk._fast.rank import normalized, positions, scope_add, scope_best, scope_utilities
from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.constants import (
    DEGRADATION_MIN_EXCESS,
    DEGRADATION_MIN_HISTORY,
    DEGRADATION_RATIO,
    EXACT_CELLS_MAX,
    PERFORMANCE_COMPARABLE_MIN,
    PERFORMANCE_CONFIDENCE_LOSS,
    PERFORMANCE_EXPIRY,
    PERFORMANCE_INERTIA,
    PERFORMANCE_LATENCY_FLOOR,
    PERFORMANCE_STALE_CONFIDENCE,
    PERFORMANCE_WEIGHT_GOODPUT,
    PERFORMANCE_WEIGHT_PROBE,
    PERFORMANCE_WEIGHT_RESPONSE,
    PERFORMANCE_WEIGHT_SETUP,
)
from honk.group.score.keys import NodeId, ScoreTarget

_HEALTH_FAMILIES = (Family.V4, Family.V6, None)


class Metric(enum.Enum):
    """A business metric kind; probe RTT is scoped by :class:`ProbeIdentity` instead."""

    SETUP = "setup"
    RESPONSE = "response"
    GOODPUT_UP = "goodput_up"
    GOODPUT_DOWN = "goodput_down"

    __hash__ = object.__hash__  # singletons compared by identity: hashed so, in C (a hot dict key)


class Direction(enum.Enum):
    UP = "up"
    DOWN = "down"


_SETUP, _RESPONSE = (
    Metric.SETUP,
    Metric.RESPONSE,
)  # bound once: an Enum.MEMBER read costs a metaclass hook (3.11)
_GOODPUT = {Direction.UP: Metric.GOODPUT_UP, Direction.DOWN: Metric.GOODPUT_DOWN}
_WEIGHTS = {
    Metric.RESPONSE: PERFORMANCE_WEIGHT_RESPONSE,
    Metric.SETUP: PERFORMANCE_WEIGHT_SETUP,
    Metric.GOODPUT_UP: PERFORMANCE_WEIGHT_GOODPUT,
    Metric.GOODPUT_DOWN: PERFORMANCE_WEIGHT_GOODPUT,
}
_HIGHER_BETTER = frozenset({Metric.GOODPUT_UP, Metric.GOODPUT_DOWN})
_METRICS = tuple(Metric)  # the order a view lists business metrics in
_NEVER = float("inf")
_LONG_AGO = float("-inf")  # a new scope's newest event: none yet
VIEW_PENDING_MAX = 16  # changes a target row's view notes before it is dropped instead (a row observed
# but not read would otherwise note every observation)


@dataclass(frozen=True, slots=True)
class ProbeIdentity:
    """A configured probe's measurement scope: normalized request URI, method and cadence (s).

    Two probes differing in any of them measure different things and never share a baseline.
    The repr hides the URI (scorer data is never logged).
    """

    uri: str
    method: str
    cadence: float

    def __repr__(self) -> str:
        return f"ProbeIdentity(<hidden>, {self.method}, {self.cadence:g})"


# A heuristic cell's key: (group, network, family, target, node id), a plain tuple (built per
# observation and per read; a named tuple's constructor costs a Python call). Its first four
# fields are its row (:func:`_row`); a target's repr is hidden, so a key never shows one.
_Key = tuple
_GROUP, _TARGET, _NODE = 0, 3, 4


class _Scope:
    """One metric's newest event time and bounded inertia."""

    __slots__ = ("event", "mean")

    def __init__(self) -> None:
        self.event = _LONG_AGO
        self.mean = WeightedMean(PERFORMANCE_INERTIA)

    def add(self, value: float, weight: float, now: float) -> None:
        if self.event - now >= PERFORMANCE_EXPIRY:
            return  # a late report already expired against the newest event adds nothing
        if now - self.event >= PERFORMANCE_EXPIRY:
            self.mean.clear()  # expired: a fresh observation starts a new mean
        self.mean.add(value, weight)
        if now > self.event:  # (not max(): a call per observation)
            self.event = now

    def read(self, now: float) -> tuple[float, float, float] | None:
        """(value, confidence, until): the reading at ``now`` and when it next changes (its
        confidence loss, else its expiry); None when expired or empty."""
        age = now - self.event
        if age >= PERFORMANCE_EXPIRY or len(self.mean) == 0:
            return None
        value = self.mean.mean()
        if value is None:
            return None
        if age < PERFORMANCE_CONFIDENCE_LOSS:
            return value, 1.0, self.event + PERFORMANCE_CONFIDENCE_LOSS
        return value, PERFORMANCE_STALE_CONFIDENCE, self.event + PERFORMANCE_EXPIRY


class _RowView:
    """One row's fresh readings as of ``built``, per scope, valid until the first confidence
    loss or expiry among them. Business metrics and probe scopes apart: a targetless read of a
    family reads that family's row as both.

    Probe rows hold every member of a group and change only when a probe reports, yet every
    plan of the group reads them: the view spares each plan a read of every scope. A target's
    row changes on almost every flow of the target: an observation there leaves the view and
    notes the (node, scope) it changed, and the next read takes just those readings again
    (``refresh``), where building the view anew reads every scope of the row."""

    __slots__ = ("built", "until", "metrics", "probes", "_lists", "pending")

    def __init__(self, row: dict[NodeId, dict[Hashable, _Scope]], now: float) -> None:
        self.built = now
        self.until = _NEVER
        lists: dict[Hashable, tuple[list, list, list]] = {}  # scope -> (nodes, values, confidences)
        self._lists = lists
        self.pending: list[tuple[NodeId, Hashable]] = []  # changed since the view was built
        for node, cell in row.items():
            for scope, entry in cell.items():
                reading = entry.read(now)
                if reading is None:
                    continue
                scope_lists = lists.get(scope)
                if scope_lists is None:
                    scope_lists = lists[scope] = ([], [], [])
                scope_lists[0].append(node)
                scope_lists[1].append(reading[0])
                scope_lists[2].append(reading[1])
                if reading[2] < self.until:
                    self.until = reading[2]
        # business metrics as (metric, higher is better, nodes, values, confidences, weight), in
        # Metric order so that every view of the same readings adds its scopes in the same order;
        # probe scopes as (identity, False, nodes, values, confidences)
        self.metrics = [
            (metric, metric in _HIGHER_BETTER, *lists[metric], _WEIGHTS[metric])
            for metric in _METRICS
            if metric in lists
        ]
        self.probes = [
            (scope, False, *scope_lists)
            for scope, scope_lists in lists.items()
            if scope.__class__ is ProbeIdentity
        ]

    def current(self, now: float) -> bool:
        return self.built <= now < self.until

    def refresh(self, row: dict[NodeId, dict[Hashable, _Scope]], now: float) -> bool:
        """Take the pending (node, scope) readings again at ``now``; False when the view must be
        built anew instead (a scope it does not list, a reading that vanished)."""
        lists = self._lists
        for node, scope in self.pending:
            scope_lists = lists.get(scope)
            cell = row.get(node)
            entry = cell.get(scope) if cell is not None else None
            if scope_lists is None or entry is None:
                return False
            reading = entry.read(now)
            if reading is None:
                return False
            nodes = scope_lists[0]
            if node in nodes:  # (a row lists each node once; order within a scope changes no sum)
                k = nodes.index(node)
                scope_lists[1][k] = reading[0]
                scope_lists[2][k] = reading[1]
            else:
                nodes.append(node)
                scope_lists[1].append(reading[0])
                scope_lists[2].append(reading[1])
            if reading[2] < self.until:
                self.until = reading[2]
        self.pending.clear()
        return True


class _ProbeBaseline:
    """The probe rows' share of one (group, network)'s reads for one candidate list: each
    candidate's weighted probe gain and the probe weight, as of ``built``, valid until the first
    confidence loss or expiry among its rows' readings (a probe into any of the rows drops it).

    Every plan of a group reads the same probe rows over the same members, while its target's
    business row holds only the few nodes that carried the target: the baseline spares each
    plan a pass over every member of every probe row. Candidate positions are kept with it."""

    __slots__ = ("built", "until", "candidates", "position", "aliases", "gains", "weight", "utilities")

    def __init__(self, views: list[_RowView], candidates: list, now: float) -> None:
        self.built = now
        self.until = min((view.until for view in views), default=float("inf"))
        self.candidates = candidates
        self.position, self.aliases = positions(candidates)
        # a probe scope counts when enough candidates read it; the weight is split evenly
        # across the counting ones
        comparable = []
        for view in views:
            for _scope, higher, nodes, values, confidences in view.probes:
                count, best = scope_best(nodes, values, self.position, higher)
                if count >= PERFORMANCE_COMPARABLE_MIN:
                    comparable.append((higher, nodes, values, confidences, best))
        gains: list[float | None] = [None] * len(candidates)
        weight = 0.0
        for higher, nodes, values, confidences, best in comparable:
            if higher and best <= 0.0:
                continue  # nothing moved anywhere: the scope ranks nobody
            share = PERFORMANCE_WEIGHT_PROBE / len(comparable)
            weight += share
            scope_add(
                nodes,
                values,
                confidences,
                self.position,
                higher,
                best,
                share,
                PERFORMANCE_LATENCY_FLOOR,
                gains,
            )
        for i, j in self.aliases:
            gains[i] = gains[j]
        self.gains = gains
        self.weight = weight
        self.utilities = normalized(gains, weight)  # what a read with no comparable business scope answers

    def current(self, candidates: list, now: float) -> bool:
        return self.built <= now < self.until and candidates == self.candidates


class FirstChoiceHeuristic:
    """Per-scope performance state and the first-choice utility read; all times are explicit."""

    def __init__(self) -> None:
        # bounded like the exact evidence cells: the least recently observed key goes first
        self._cells: OrderedDict[_Key, dict[Hashable, _Scope]] = OrderedDict()
        # the same cells by (group, network, family, target) then node: a read takes one row for
        # all its candidates instead of building and hashing a key per candidate
        self._rows: dict[tuple, dict[NodeId, dict[Hashable, _Scope]]] = {}
        # by row key; a targetless row's is dropped whenever the row changes, a target row's
        # notes the change (_RowView.refresh); dropped when a key leaves the row, and all at once
        # when scopes leave cells in place (reload, expire)
        self._views: dict[tuple, _RowView] = {}
        # by (group, network); dropped whenever one of its targetless rows changes, and all at
        # once with the views
        self._baselines: dict[tuple, _ProbeBaseline] = {}
        self._probe_generation = 0

    # --- observations ---------------------------------------------------------------------

    def _observe(self, key: _Key, scope: Hashable, value: float, weight: float, now: float) -> None:
        row = _row(key)
        if key[_TARGET] is None:  # a targetless row: one a probe baseline may read
            self._views.pop(row, None)
            self._baselines.pop(key[:2], None)
        else:
            view = self._views.get(row)
            if view is not None:
                pending = view.pending
                if len(pending) < VIEW_PENDING_MAX:
                    pending.append((key[_NODE], scope))
                else:
                    del self._views[row]
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = {}
            self._rows.setdefault(row, {})[key[_NODE]] = cell
            if len(self._cells) > EXACT_CELLS_MAX:
                self._unindex(self._cells.popitem(last=False)[0])
        else:
            self._cells.move_to_end(key)
        entry = cell.get(scope)
        if entry is None:
            entry = cell[scope] = _Scope()
        entry.add(value, weight, now)

    def observe_setup(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        node_id: NodeId,
        latency: float,
        now: float,
    ) -> None:
        """A setup latency (s), kept at the exact target (or targetless at its family/global level)."""
        self._observe((group, network, family, target, node_id), _SETUP, _latency(latency), 1.0, now)

    def observe_response(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        node_id: NodeId,
        latency: float,
        now: float,
    ) -> None:
        """A response latency (s), target-scoped like setup."""
        self._observe((group, network, family, target, node_id), _RESPONSE, _latency(latency), 1.0, now)

    def observe_goodput(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        node_id: NodeId,
        direction: Direction,
        nbytes: int,
        seconds: float,
        now: float,
    ) -> None:
        """A directional transfer window; the mean is weighted by bytes, so tiny windows barely count."""
        if nbytes <= 0 or not seconds > 0.0:
            return  # no offered load measures nothing (unknown, not zero)
        self._observe(
            (group, network, family, target, node_id),
            _GOODPUT[direction],
            nbytes / seconds,
            float(nbytes),
            now,
        )

    def observe_probe(
        self,
        group: str,
        network: Network,
        health_family: Family | None,
        node_id: NodeId,
        probe: ProbeIdentity,
        rtt: float,
        now: float,
        generation: int | None = None,
    ) -> bool:
        """A configured-probe RTT (s); refused (False) when from an old probe generation (GH-K-12)."""
        if generation is not None and generation != self._probe_generation:
            return False
        self._observe((group, network, health_family, None, node_id), probe, _latency(rtt), 1.0, now)
        return True

    @property
    def probe_generation(self) -> int:
        """The current probe generation; probes started before a reload carry an older one."""
        return self._probe_generation

    # --- lifecycle ------------------------------------------------------------------------

    def reload(self, now: float) -> None:
        """Clear every configured-probe baseline and start a new probe generation (GH-K-12).

        Business metrics survive: admitted flows may keep reporting for surviving membership.
        """
        del now  # reload is a fence, not a timed event; kept for the uniform API
        self._probe_generation += 1
        self._views.clear()
        self._baselines.clear()
        for key in list(self._cells):
            cell = self._cells[key]
            for scope in [s for s in cell if isinstance(s, ProbeIdentity)]:
                del cell[scope]
            if not cell:
                self._drop(key)

    def prune(self, valid_pairs: Iterable[tuple[str, NodeId]]) -> None:
        """Forget every (group, node) not in ``valid_pairs``."""
        valid = set(valid_pairs)  # (each dropped key's row drops its view)
        for key in [k for k in self._cells if (k[_GROUP], k[_NODE]) not in valid]:
            self._drop(key)

    def expire(self, now: float) -> None:
        """Drop expired scopes, bounding memory by recent activity."""
        self._views.clear()
        self._baselines.clear()
        for key in list(self._cells):
            cell = self._cells[key]
            for scope in [s for s, e in cell.items() if e.read(now) is None]:
                del cell[scope]
            if not cell:
                self._drop(key)

    def _drop(self, key: _Key) -> None:
        del self._cells[key]
        self._unindex(key)

    def _unindex(self, key: _Key) -> None:
        row_key = _row(key)
        self._views.pop(row_key, None)
        if key[_TARGET] is None:
            self._baselines.pop(key[:2], None)
        row = self._rows.get(row_key)
        if row is not None:
            row.pop(key[_NODE], None)
            if not row:
                del self._rows[row_key]

    # --- reads ----------------------------------------------------------------------------

    def _view(self, row_key: tuple, row: dict[NodeId, dict[Hashable, _Scope]], now: float) -> _RowView:
        view = self._views.get(row_key)
        if view is None or not view.current(now) or (view.pending and not view.refresh(row, now)):
            view = self._views[row_key] = _RowView(row, now)
        return view

    def score(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        candidates: Sequence[Hashable],
        now: float,
    ) -> list[float | None]:
        """Each candidate's utility in [0, 1] (higher better), or None with no fresh comparable
        metric; in the candidates' order.

        Business scopes are read at (family, target); probe scopes at every health family, each
        (identity, health family) its own scope.
        """
        candidates = candidates if isinstance(candidates, list) else list(candidates)
        baseline = self._baseline(group, network, candidates, now)
        # a target's business row holds the few nodes that carried the target; a row of fewer
        # nodes than a comparison needs cannot rank anybody
        business_key = (group, network, family, target)
        business = self._rows.get(business_key)
        if business is None or len(business) < PERFORMANCE_COMPARABLE_MIN:
            return list(baseline.utilities)
        utilities = scope_utilities(
            self._view(business_key, business, now).metrics,
            baseline.position,
            baseline.aliases,
            baseline.gains,
            baseline.weight,
            PERFORMANCE_LATENCY_FLOOR,
            PERFORMANCE_COMPARABLE_MIN,
        )
        return list(baseline.utilities) if utilities is None else utilities

    def _baseline(self, group: str, network: Network, candidates: list, now: float) -> _ProbeBaseline:
        """The (group, network)'s probe baseline for ``candidates`` at ``now``: each health
        family's probe row, each (identity, health family) its own scope."""
        baseline = self._baselines.get((group, network))
        if baseline is None or not baseline.current(candidates, now):
            views = []
            for health in _HEALTH_FAMILIES:
                row_key = (group, network, health, None)
                row = self._rows.get(row_key)
                if row is not None and len(row) >= PERFORMANCE_COMPARABLE_MIN:
                    views.append(self._view(row_key, row, now))
            baseline = self._baselines[(group, network)] = _ProbeBaseline(views, list(candidates), now)
        return baseline

    def degraded(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        node_id: NodeId,
        sample: float,
        now: float,
        *,
        metric: Metric = Metric.RESPONSE,
        family: Family | None = None,
    ) -> bool:
        """Whether a setup or response ``sample`` (s) is degraded against the same exact target's
        fresh history (GH-K-47); never for a targetless read or against other targets.

        ``family`` defaults to the target literal's family. The sample is not recorded.
        """
        if target is None or metric not in (Metric.SETUP, Metric.RESPONSE):
            return False
        if family is None:
            family = target.family()
        if family is None:
            return False  # no family, no exact cell (keys.py)
        cell = self._cells.get((group, network, family, target, node_id))
        entry = cell.get(metric) if cell is not None else None
        if entry is None or len(entry.mean) < DEGRADATION_MIN_HISTORY:
            return False
        reading = entry.read(now)
        if reading is None:
            return False
        mean = reading[0]
        return sample >= DEGRADATION_RATIO * mean and sample >= mean + DEGRADATION_MIN_EXCESS

    def __len__(self) -> int:
        return len(self._cells)

    def __repr__(self) -> str:
        return f"FirstChoiceHeuristic(cells={len(self._cells)}, probe_generation={self._probe_generation})"


def _row(key: _Key) -> tuple:
    """The key without its node (the fields before it): every member's cell of one read."""
    return key[:4]


def _latency(value: float) -> float:
    if not value >= 0.0:
        raise ValueError("a latency must be a non-negative number of seconds")
    return value


__all__ = ["Direction", "FirstChoiceHeuristic", "Metric", "ProbeIdentity"]
