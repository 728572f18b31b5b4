"""Real traffic as health evidence: what a node's dials and UDP endpoints report.

Only real flows feed the traffic counters and the dial-failure strikes: the
dispatcher reports each flow's TCP dial (with its latency, for the degradation
detector), UDP associations report their endpoints. Probes run inside
:func:`probing` and report nothing here. Each node's runtime carries
one :class:`NodeTraffic` (set by the health service), so every leaf of every
generation of that node reports to the same place.

Classification of a dial's outcome, independent of any other consumer:

* success: the traffic count and the strikes restart;
* a failure to reach or use the node (connect, TLS, the proxy handshake, its
  authentication, a timeout): one TCP traffic failure and one strike;
* the node refusing this one target (:class:`~honk.core.errors.TargetRefused`),
  a capacity refusal, an unsupported request or a configuration refusal:
  neutral, it says nothing about the node -- until another member of the group
  reaches that target in the same retry round (:meth:`NodeTraffic.refused_reachable`):
  then the refusal was the node's, and counts as a dial failure.

After setup, each relayed flow leaves one outcome (:class:`~honk.connection.verdict.FlowVerdict`
decides it): answered at its first response byte, or failed when the upstream reset it or
stayed silent past ``response_timeout`` after the client's last byte. Dial failures that count
are failed outcomes too. The outcomes feed the node's flow-failure share
(:meth:`~honk.alive.health.AliveDialerSet.report_flow`).
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator
from typing import Any

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.core.errors import DialError, HonkError, TargetRefused

_probing: contextvars.ContextVar[bool] = contextvars.ContextVar("honk_probing", default=False)


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """Dials made inside are health probes, not traffic."""
    token = _probing.set(True)
    try:
        yield
    finally:
        _probing.reset(token)


_FAMILIES = {int(f): f for f in Family}


def traffic_of(leaf: Any) -> NodeTraffic | None:
    """The health reporter of ``leaf``'s node (None for ``direct``, ``block`` and tools' leaves)."""
    return getattr(getattr(leaf, "runtime", None), "traffic", None)


def counts_against_node(outcome: HonkError) -> bool:
    """Whether a failed dial is evidence against the node itself."""
    return isinstance(outcome, DialError) and not isinstance(outcome, TargetRefused)


class NodeTraffic:
    """One node's reporter into the health state (``NodeRuntime.traffic``)."""

    __slots__ = ("alive", "node_id")

    def __init__(self, alive: AliveDialerSet, node_id: uuid.UUID) -> None:
        self.alive = alive
        self.node_id = node_id

    def dial(
        self, outcome: HonkError | None, family: int, latency: float | None = None, pool_hit: bool = False
    ) -> None:
        """A flow's dial through the node ended: ``None`` for success (taking ``latency`` seconds;
        ``pool_hit``: a ready pooled connection, no network round trip), else its error."""
        if _probing.get():
            return
        fam = _FAMILIES.get(family) or Family(family)  # Family(4) is an enum lookup, on every dial
        if outcome is None:
            self.alive.report_dial_success(self.node_id, fam, latency, pool_hit)
        elif counts_against_node(outcome):
            self.alive.record_dial_failure(self.node_id, fam)
            self.alive.report_flow(self.node_id, True)

    def refused_reachable(self, family: int) -> None:
        """The node refused a target that another member of the group then reached: the
        refusal was the node's own, a dial failure like any other."""
        if not _probing.get():
            self.alive.record_dial_failure(self.node_id, Family(family))
            self.alive.report_flow(self.node_id, True)

    def flow_answered(self) -> None:
        """A relayed flow through the node received its first response byte."""
        if not _probing.get():
            self.alive.report_flow(self.node_id, False)

    def flow_failed(self, family: int) -> None:
        """A relayed flow through the node sent data and got nothing back: the upstream reset
        it, or stayed silent past the response deadline. A TCP traffic failure."""
        if not _probing.get():
            self.alive.report_traffic_failure(self.node_id, Domain.TCP, Family(family))
            self.alive.report_flow(self.node_id, True)

    def packets_failed(self, family: int) -> None:
        """A UDP endpoint through the node failed: a terminal send or receive error, or it
        idled out without ever receiving a reply."""
        if not _probing.get():
            self.alive.report_traffic_failure(self.node_id, Domain.DATA_UDP, Family(family))

    def packets_answered(self, family: int) -> None:
        """A UDP endpoint through the node received a reply."""
        if not _probing.get():
            self.alive.report_traffic_success(self.node_id, Domain.DATA_UDP, Family(family))
