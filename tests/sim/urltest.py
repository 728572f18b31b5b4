"""The URLTest adapter: the real :class:`honk.group.policy.URLTest` over the real node health.

Probes and flow outcomes go into an :class:`honk.alive.health.AliveDialerSet` exactly as the
daemon reports them (probe success with its round trip or probe failure; dial success with its
setup latency, or dial failure), and each choice is a committed ``URLTest.pick`` over a
:class:`Candidates` view built the way :class:`honk.group.manager.GroupManager` builds one for
leaf members: eligible while TCP is not dead, ranked by the TCP halving average, demoted while
the node carries strikes. TCP, IPv4, one group of leaf nodes; no setup-failure retry round (a
flow is one attempt) so the figures show the policy's own choices.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.config.spec import DEFAULT_CHECK_TOLERANCE
from honk.core.clock import Clock
from honk.core.net import Network
from honk.group.policy import Candidate, URLTest

from .engine import FlowOutcome

GROUP = "sim"
FAMILY = Family.V4
_NODE_NAMESPACE = uuid.UUID("5e1f0000-0000-4000-8000-000000000011")


class _View:
    """One selection's Candidates (TCP, IPv4) over the health set."""

    network = Network.TCP

    def __init__(self, adapter: URLTestAdapter) -> None:
        self._adapter = adapter

    def evaluate(self, member: str) -> Candidate:
        a = self._adapter
        node_id = a.ids[member]
        return Candidate(
            member=member,
            index=a.index[member],
            eligible=a.health.tcp_alive(node_id, FAMILY),
            metric=a.health.average(node_id, Domain.TCP, FAMILY),
            demoted=a.health.demoted(node_id),
        )

    def all(self) -> list[Candidate]:
        return [self.evaluate(m) for m in self._adapter.policy.members]


class URLTestAdapter:
    name = "urltest"

    def __init__(
        self, nodes: Sequence[str], clock: Clock, tolerance: float = DEFAULT_CHECK_TOLERANCE
    ) -> None:
        self.health = AliveDialerSet(clock)
        self.policy = URLTest(GROUP, tuple(nodes), tolerance)
        self.ids = {n: uuid.uuid5(_NODE_NAMESPACE, n) for n in nodes}
        self.index = {n: i for i, n in enumerate(nodes)}
        for name, node_id in self.ids.items():
            self.health.register_node(node_id, name)
        self._view = _View(self)

    @classmethod
    def factory(cls, tolerance: float = DEFAULT_CHECK_TOLERANCE):  # noqa: ANN206
        """An engine factory for a URLTest with ``tolerance`` seconds of hysteresis."""
        return lambda nodes, clock: cls(nodes, clock, tolerance)

    def choose(self, target: str, now: float) -> str | None:
        return self.policy.pick(self._view, commit=True)  # URLTest does not look at the target

    def settle(self, outcome: FlowOutcome) -> None:
        node_id = self.ids[outcome.node]
        if outcome.ok:
            self.health.report_dial_success(node_id, FAMILY, latency=outcome.setup_latency)
        else:
            self.health.record_dial_failure(node_id, FAMILY)

    def probe(self, node: str, rtt: float | None, now: float) -> None:
        node_id = self.ids[node]
        if rtt is None:
            self.health.notify_check_failure(node_id, Domain.TCP, FAMILY)
        else:
            self.health.notify_check_success(node_id, Domain.TCP, FAMILY, rtt)
