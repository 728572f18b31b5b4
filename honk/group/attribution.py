"""Score attribution: which Score groups a served flow, a warm-up or a reload speaks to.

A Score group ranks in the one :class:`~honk.group.score.ranker.ScoreState` of the manager
lineage: ``build(previous=...)`` shares it, :meth:`ScoreAttribution.commit` prunes removed
membership when that manager starts serving, a fresh build starts empty. A served flow is
attributed to every Score group on its path, once each, with the leaf's NodeId (GH-K-05).
"""

from __future__ import annotations

from honk.core.net import Network
from honk.group.filter import node_id_of
from honk.group.identity import leaf_node_id
from honk.group.policy import Score
from honk.group.score.attempt import ScoreFeedback, Traversal
from honk.group.score.keys import NodeId
from honk.group.score.ranker import ScoreState
from honk.group.structure import Structure
from honk.group.view import Flow
from honk.outbound.base import Outbound


class ScoreAttribution:
    """The Score groups of one manager, and what reaches them."""

    __slots__ = ("structure", "score", "_by_node")

    def __init__(self, structure: Structure, score: ScoreState) -> None:
        self.structure = structure
        self.score = score
        self._by_node: dict[NodeId, tuple[str, ...]] | None = None  # node -> Score groups reaching it

    def _reachable(self) -> list[tuple[str, NodeId]]:
        """(Score group, NodeId) for every leaf below each Score group, in configuration order."""
        structure = self.structure
        return [
            (name, leaf_node_id(structure.outbounds.get(leaf), leaf))
            for name, group in structure.groups.items()
            if isinstance(group.policy, Score)
            for leaf in structure.leaves_below(name)
        ]

    def membership(self) -> set[tuple[str, NodeId]]:
        """Every (Score group, NodeId) pair reachable below each Score group (members and
        finals): the membership whose evidence survives a reload."""
        return set(self._reachable())

    def commit(self, now: float) -> None:
        """This manager, built with ``previous``, now serves (a committed reload): the shared
        Score state prunes removed membership and ignores its late feedback (GH-K-08), revokes
        leases and restarts cohorts behind a reload fence (GH-K-45) and clears configured-probe
        baselines (GH-K-12). A prepared manager that is never committed changes nothing."""
        self.score.reload(now, self.membership())
        reload_performance = getattr(self.score.performance, "reload", None)
        if reload_performance is not None:
            reload_performance(now)

    def feedback(
        self, chain: tuple[str, ...], leaf: Outbound, network: Network, flow: Flow
    ) -> ScoreFeedback | None:
        """The attribution of ``flow``, served through ``chain`` to ``leaf``: every Score group on
        the path, each once, with the leaf's NodeId (GH-K-05); None when no Score group was
        traversed (the flow then reports to no Score evidence)."""
        groups = self.structure.groups
        steps = [
            Traversal(name, network, flow.target, leaf_node_id(leaf), flow.destination)
            for name in chain[:-1]
            if isinstance(getattr(groups.get(name), "policy", None), Score)
        ]
        if not steps:
            return None
        score = self.score
        return ScoreFeedback.of(steps, score.evidence, score.cohorts, performance=score.performance)

    def observe_warm_setup(self, leaf: Outbound, network: Network, latency: float, now: float) -> int:
        """Warm-up opened ``leaf``'s reusable resource (a bare server connection, a mux carrier)
        in ``latency`` seconds: one targetless setup-quality sample for every Score group that
        reaches the node (members and finals, as :meth:`membership`), in the aggregate
        layer with no target family (GH-K-03, GH-F-26: "Warm-up records setup quality only").
        It lands only in the first-choice heuristic's targetless setup scope: no Beta outcome
        (reliability), no failure, streak, cohort RX, lease or recovery credit (GH-K-39,
        GH-K-41), and no exact cell. ``network``: the path the resource serves (TCP for a
        preconnect or a Selector pin, UDP for the UDP warm set). How many groups took it."""
        observe = getattr(self.score.performance, "observe_setup", None)
        node_id = node_id_of(leaf)
        if observe is None or node_id is None:
            return 0
        if self._by_node is None:
            by_node: dict[NodeId, list[str]] = {}
            for name, reached in self._reachable():  # configuration order
                by_node.setdefault(reached, []).append(name)
            self._by_node = {node: tuple(groups) for node, groups in by_node.items()}
        groups = self._by_node.get(node_id, ())
        for group in groups:
            observe(group, network, None, None, node_id, latency, now)
        return len(groups)
