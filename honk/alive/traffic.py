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
  neutral, it says nothing about the node.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterator

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
        fam = Family(family)
        if outcome is None:
            self.alive.report_dial_success(self.node_id, fam, latency, pool_hit)
        elif counts_against_node(outcome):
            self.alive.record_dial_failure(self.node_id, fam)

    def packets_failed(self, family: int) -> None:
        """A UDP endpoint through the node failed: a terminal send or receive error, or it
        idled out without ever receiving a reply."""
        if not _probing.get():
            self.alive.report_traffic_failure(self.node_id, Domain.DATA_UDP, Family(family))

    def packets_answered(self, family: int) -> None:
        """A UDP endpoint through the node received a reply."""
        if not _probing.get():
            self.alive.report_traffic_success(self.node_id, Domain.DATA_UDP, Family(family))
