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
from honk._fast.rank import positions, scope_add, scope_best
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


_SETUP, _RESPONSE = Metric.SETUP, Metric.RESPONSE  # bound once: an Enum.MEMBER read costs a metaclass hook (3.11)
_GOODPUT = {Direction.UP: Metric.GOODPUT_UP, Direction.DOWN: Metric.GOODPUT_DOWN}
_WEIGHTS = {
    Metric.RESPONSE: PERFORMANCE_WEIGHT_RESPONSE,
    Metric.SETUP: PERFORMANCE_WEIGHT_SETUP,
    Metric.GOODPUT_UP: PERFORMANCE_WEIGHT_GOODPUT,
    Metric.GOODPUT_DOWN: PERFORMANCE_WEIGHT_GOODPUT,
}
_HIGHER_BETTER = frozenset({Metric.GOODPUT_UP, Metric.GOODPUT_DOWN})


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
_GROUP, _NODE = 0, 4


class _Scope:
    """One metric's newest event time and bounded inertia."""

    __slots__ = ("event", "mean")

    def __init__(self) -> None:
        self.event = float("-inf")
        self.mean = WeightedMean(PERFORMANCE_INERTIA)

    def add(self, value: float, weight: float, now: float) -> None:
        if self.event - now >= PERFORMANCE_EXPIRY:
            return  # a late report already expired against the newest event adds nothing
        if now - self.event >= PERFORMANCE_EXPIRY:
            self.mean.clear()  # expired: a fresh observation starts a new mean
        self.mean.add(value, weight)
        if now > self.event:  # (not max(): a call per observation)
            self.event = now

    def read(self, now: float) -> tuple[float, float] | None:
        """(value, confidence), or None when expired or empty."""
        age = now - self.event
        if age >= PERFORMANCE_EXPIRY or len(self.mean) == 0:
            return None
        value = self.mean.mean()
        if value is None:
            return None
        return value, (1.0 if age < PERFORMANCE_CONFIDENCE_LOSS else PERFORMANCE_STALE_CONFIDENCE)


class _RowView:
    """One row's fresh readings as of ``built``, per scope, valid until the first confidence
    loss or expiry among them (an observation into the row drops the view). Business metrics
    and probe scopes apart: a targetless read of a family reads that family's row as both.

    Probe rows hold every member of a group and change only when a probe reports, yet every
    plan of the group reads them: the view spares each plan a read of every scope."""

    __slots__ = ("built", "until", "metrics", "probes")

    def __init__(self, row: dict[NodeId, dict[Hashable, _Scope]], now: float) -> None:
        self.built = now
        until = float("inf")
        by_scope: dict[Hashable, tuple[list, list, list]] = {}
        for node, cell in row.items():
            for scope, entry in cell.items():
                reading = entry.read(now)
                if reading is None:
                    continue
                lists = by_scope.get(scope)
                if lists is None:
                    lists = by_scope[scope] = ([], [], [])
                lists[0].append(node)
                lists[1].append(reading[0])
                lists[2].append(reading[1])
                fresh_until = entry.event + PERFORMANCE_CONFIDENCE_LOSS
                until = min(until, fresh_until if now < fresh_until else entry.event + PERFORMANCE_EXPIRY)
        self.until = until
        # (scope, higher is better, nodes, values, confidences), in the row's order
        scopes = [(scope, scope in _HIGHER_BETTER, *lists) for scope, lists in by_scope.items()]
        self.metrics = [entry for entry in scopes if isinstance(entry[0], Metric)]
        self.probes = [entry for entry in scopes if isinstance(entry[0], ProbeIdentity)]

    def current(self, now: float) -> bool:
        return self.built <= now < self.until


class FirstChoiceHeuristic:
    """Per-scope performance state and the first-choice utility read; all times are explicit."""

    def __init__(self) -> None:
        # bounded like the exact evidence cells: the least recently observed key goes first
        self._cells: OrderedDict[_Key, dict[Hashable, _Scope]] = OrderedDict()
        # the same cells by (group, network, family, target) then node: a read takes one row for
        # all its candidates instead of building and hashing a key per candidate
        self._rows: dict[tuple, dict[NodeId, dict[Hashable, _Scope]]] = {}
        # by row key; dropped whenever the row changes (an observation, a dropped key), and all
        # at once when scopes leave cells in place (reload, expire)
        self._views: dict[tuple, _RowView] = {}
        self._probe_generation = 0

    # --- observations ---------------------------------------------------------------------

    def _observe(self, key: _Key, scope: Hashable, value: float, weight: float, now: float) -> None:
        row = _row(key)
        self._views.pop(row, None)
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

    def observe_setup(self, group: str, network: Network, target: ScoreTarget | None, family: Family | None,
                      node_id: NodeId, latency: float, now: float) -> None:
        """A setup latency (s), kept at the exact target (or targetless at its family/global level)."""
        self._observe((group, network, family, target, node_id), _SETUP, _latency(latency), 1.0, now)

    def observe_response(self, group: str, network: Network, target: ScoreTarget | None, family: Family | None,
                         node_id: NodeId, latency: float, now: float) -> None:
        """A response latency (s), target-scoped like setup."""
        self._observe((group, network, family, target, node_id), _RESPONSE, _latency(latency), 1.0, now)

    def observe_goodput(self, group: str, network: Network, target: ScoreTarget | None, family: Family | None,
                        node_id: NodeId, direction: Direction, nbytes: int, seconds: float, now: float) -> None:
        """A directional transfer window; the mean is weighted by bytes, so tiny windows barely count."""
        if nbytes <= 0 or not seconds > 0.0:
            return  # no offered load measures nothing (unknown, not zero)
        self._observe((group, network, family, target, node_id), _GOODPUT[direction],
                      nbytes / seconds, float(nbytes), now)

    def observe_probe(self, group: str, network: Network, health_family: Family | None, node_id: NodeId,
                      probe: ProbeIdentity, rtt: float, now: float, generation: int | None = None) -> bool:
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
        row = self._rows.get(row_key)
        if row is not None:
            row.pop(key[_NODE], None)
            if not row:
                del self._rows[row_key]

    # --- reads ----------------------------------------------------------------------------

    def _view(self, row_key: tuple, row: dict[NodeId, dict[Hashable, _Scope]], now: float) -> _RowView:
        view = self._views.get(row_key)
        if view is None or not view.current(now):
            view = self._views[row_key] = _RowView(row, now)
        return view

    def score(self, group: str, network: Network, target: ScoreTarget | None, family: Family | None,
              candidates: Sequence[Hashable], now: float) -> list[float | None]:
        """Each candidate's utility in [0, 1] (higher better), or None with no fresh comparable
        metric; in the candidates' order.

        Business scopes are read at (family, target); probe scopes at every health family, each
        (identity, health family) its own scope.
        """
        # the rows to read: a target's business row (it holds the few nodes that carried the
        # target), and each health family's probe row. Each row's scopes are its own, so a row
        # of fewer nodes than a comparison needs cannot rank anybody.
        reads = []  # per row read: its (scope, higher, nodes, values, confidences)
        business_key = (group, network, family, target)
        business = self._rows.get(business_key)
        if business is not None and len(business) >= PERFORMANCE_COMPARABLE_MIN:
            reads.append(self._view(business_key, business, now).metrics)
        for health in _HEALTH_FAMILIES:
            row_key = (group, network, health, None)
            row = self._rows.get(row_key)
            if row is not None and len(row) >= PERFORMANCE_COMPARABLE_MIN:
                reads.append(self._view(row_key, row, now).probes)
        if not reads:
            return [None] * len(candidates)
        # a node listed twice (two names, one node) reads once; its alias copies the gain
        position, aliases = positions(candidates if isinstance(candidates, list) else list(candidates))
        # each (scope, row family) lives in one row: a scope counts when enough candidates read it
        comparable = []
        probe_scopes = 0
        for scopes in reads:
            for scope, higher, nodes, values, confidences in scopes:
                count, best = scope_best(nodes, values, position, higher)
                if count >= PERFORMANCE_COMPARABLE_MIN:
                    comparable.append((scope, higher, nodes, values, confidences, best))
                    if isinstance(scope, ProbeIdentity):
                        probe_scopes += 1
        total = 0.0
        gains: list[float | None] = [None] * len(candidates)
        for scope, higher, nodes, values, confidences, best in comparable:
            if higher and best <= 0.0:
                continue  # nothing moved anywhere: the scope ranks nobody
            weight = PERFORMANCE_WEIGHT_PROBE / probe_scopes if isinstance(scope, ProbeIdentity) else _WEIGHTS[scope]
            total += weight
            scope_add(nodes, values, confidences, position, higher, best, weight, PERFORMANCE_LATENCY_FLOOR, gains)
        for i, j in aliases:
            gains[i] = gains[j]
        return [None if gain is None else gain / total for gain in gains]

    def degraded(self, group: str, network: Network, target: ScoreTarget | None, node_id: NodeId,
                 sample: float, now: float, *, metric: Metric = Metric.RESPONSE,
                 family: Family | None = None) -> bool:
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
