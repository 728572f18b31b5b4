"""The Score adapter: the real :class:`honk.group.score.ranker.ScoreState` with the real
:class:`honk.group.score.heuristic.FirstChoiceHeuristic`.

Each choice is an applied ``ScoreState.rank`` for (group, TCP, the flow's ScoreTarget, IPv4) over
the members, alive unless their last ``DEAD_AFTER_PROBE_FAILURES`` probes all failed (as honk's
health declares a node dead). Each routed flow reports through the business path: the attempt is
begun at the choice (admission precedes node I/O), and when the engine settles the flow its
timings are replayed in order through the reporter -- setup, TX, first response/RX, settlement --
with the failure carrying its own episode and no setup (a setup failure). Setup and response
latencies and probe round trips feed the heuristic, as the daemon's observers do.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Sequence

from honk.alive.outcome import Family
from honk.core.clock import Clock
from honk.core.net import Network
from honk.group.score.attempt import Result, ScoreBusinessGuard, ScoreFeedback, Traversal
from honk.group.score.heuristic import FirstChoiceHeuristic, ProbeIdentity
from honk.group.score.keys import ScoreTarget
from honk.group.score.ranker import Member, ScoreState

from .engine import FlowOutcome

GROUP = "sim"
FAMILY = Family.V4
NETWORK = Network.TCP
TARGET_PORT = 443
DESTINATION = ipaddress.IPv4Address("198.51.100.7")  # the address used: it makes the target family IPv4
DEAD_AFTER_PROBE_FAILURES = 3  # consecutive failed probes before a node is dead, as honk's health
PROBE = ProbeIdentity("http://probe.example/generate_204", "GET", 30.0)
REQUEST_BYTES = 512  # what a flow sends once set up
RESPONSE_BYTES = 4096  # what it receives with its first response
RANKER_INDEX_ERROR = "rankerIndexError"  # the workaround's reason label (see choose)
_NODE_NAMESPACE = uuid.UUID("5e1f0000-0000-4000-8000-000000000017")


class ScoreAdapter:
    name = "score"

    def __init__(self, nodes: Sequence[str], clock: Clock) -> None:
        self.clock = clock
        self.heuristic = FirstChoiceHeuristic()
        self.state = ScoreState(self.heuristic)
        self.ids = {n: uuid.uuid5(_NODE_NAMESPACE, n) for n in nodes}
        self.names = tuple(nodes)
        self.state.prune((GROUP, node_id) for node_id in self.ids.values())
        self._probe_failures = dict.fromkeys(nodes, 0)
        self._targets: dict[str, ScoreTarget] = {}
        # begun attempts by (arrival time, target, node): what a FlowOutcome identifies
        self._open: dict[tuple[float, str, str], ScoreBusinessGuard] = {}
        self.reasons: dict[str, int] = {}

    @classmethod
    def factory(cls):  # noqa: ANN206
        return cls

    def _target(self, target: str) -> ScoreTarget:
        key = self._targets.get(target)
        if key is None:
            key = self._targets[target] = ScoreTarget.of(target, TARGET_PORT)
        return key

    def alive(self, node: str) -> bool:
        return self._probe_failures[node] < DEAD_AFTER_PROBE_FAILURES

    def choose(self, target: str, now: float) -> str | None:
        members = [Member(n, self.ids[n], self.alive(n)) for n in self.names]
        key = self._target(target)
        try:
            ranked = self.state.rank(GROUP, NETWORK, key, FAMILY, members, now)
            reason, winner = ranked.reason, ranked.winner
        except IndexError:
            # ScoreState._ordinary indexes an empty challenger list when a recent failure leaves
            # the (healthy) incumbent the only eligible member; it would be held, so hold it here
            reason, winner = RANKER_INDEX_ERROR, self._incumbent(members, key)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if winner is None:
            return None
        node = winner.name
        step = Traversal(GROUP, NETWORK, key, self.ids[node], DESTINATION)
        feedback = ScoreFeedback.of([step], self.state.evidence, self.state.cohorts)
        self._open[(now, target, node)] = feedback.start().begin(now)
        return node

    def _incumbent(self, members: list[Member], key: ScoreTarget) -> Member | None:
        node_id = self.state.switches.winner((GROUP, NETWORK, FAMILY, key))
        return next((m for m in members if m.node_id == node_id), None)

    def settle(self, outcome: FlowOutcome) -> None:
        guard = self._open.pop((outcome.arrived, outcome.target, outcome.node))
        node_id, key = self.ids[outcome.node], self._target(outcome.target)
        t0 = outcome.arrived
        reporter = guard.into_reporter(t0)
        if not outcome.ok:
            if not outcome.node_fault:  # the proxy's handshake worked; the path to the target did not
                reporter.setup(t0)
            reporter.settle(outcome.settled, Result.failure(node_scoped=outcome.node_fault))
            return
        set_up = t0 + outcome.setup_latency
        reporter.setup(set_up)
        reporter.tx(set_up, REQUEST_BYTES)
        self.heuristic.observe_setup(GROUP, NETWORK, key, FAMILY, node_id, outcome.setup_latency, set_up)
        assert outcome.response_latency is not None
        answered = set_up + outcome.response_latency
        reporter.rx(answered, RESPONSE_BYTES)
        self.heuristic.observe_response(
            GROUP, NETWORK, key, FAMILY, node_id, outcome.response_latency, answered
        )
        reporter.settle(max(answered, outcome.settled), Result.success())

    def probe(self, node: str, rtt: float | None, now: float) -> None:
        if rtt is None:
            self._probe_failures[node] += 1
            return
        self._probe_failures[node] = 0
        self.heuristic.observe_probe(GROUP, NETWORK, FAMILY, self.ids[node], PROBE, rtt, now)
