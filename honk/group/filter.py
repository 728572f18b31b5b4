"""Which leaves may serve a network, and how they rank: the groups' view of node health.

* Every judgement reads the leaf's own health family: the family of the address its server
  is reached on (:func:`health_family_of`; 4 for a named server), the one family the prober
  probes and traffic reports into. The flow's target family never selects it (GH-D-07,
  GH-K-01): a node reached over IPv4 serves an IPv6 target, and a node reached over IPv6 is
  dead when its IPv6 state is, whatever its (never recorded) IPv4 state.
* TCP: a node serves while its TCP state for the health family is not dead (an
  unprobed node serves).
* UDP: capability first, before any health evidence: a leaf that cannot carry UDP never
  serves UDP. Then the UDP liveness rule: DataUdp or DnsUdp alive serves, both dead does
  not, no UDP evidence at all follows TCP.
* A group with its own ``check_url`` also needs the (member tag, URL) state not dead,
  and ranks its members by that state's samples instead of the global probe's.
* A URLTest ranks by one statistic of the real probe samples (its spec's ``strategy``): the
  halving moving average (``min_moving_avg``), the newest sample (``min``) or the mean of the
  newest 10 (``min_avg10``).
* ``direct``, ``block`` and nodes without health are always eligible (``block`` is a
  terminal action, never filtered into another route) and unmeasured.

Without a health subsystem (``alive`` None, as in tools and unit tests) every leaf is
eligible and unmeasured.
"""

from __future__ import annotations

import uuid
from typing import Any

from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.core.net import Network


def node_id_of(leaf: Any) -> uuid.UUID | None:
    """The NodeId of a proxy leaf (None for ``direct``, ``block`` and unsupported nodes)."""
    runtime = getattr(leaf, "runtime", None)
    return runtime.node_id if runtime is not None else None


_FAMILIES = {4: Family.V4, 6: Family.V6}


def health_family_of(leaf: Any) -> Family:
    """The leaf's health family: the address family its server is reached on (a proxy leaf's
    ``health_family``; IPv4 for a named server and for a leaf without one)."""
    return _FAMILIES.get(getattr(leaf, "health_family", 4), Family.V4)


class HealthFilter:
    """Eligibility and ranking metrics of leaves, read from the health state."""

    __slots__ = ("alive", "checks")

    def __init__(self, alive: AliveDialerSet | None = None, checks: GroupChecks | None = None) -> None:
        self.alive = alive
        self.checks = checks

    def version(self) -> tuple[int, int]:
        """Changes whenever health could change a selection (cached picks expire with it)."""
        return (
            self.alive.version if self.alive is not None else 0,
            self.checks.version if self.checks is not None else 0,
        )

    def leaf_version(self, leaf: Any) -> tuple[int, int]:
        """Changes whenever health could change how ``leaf`` is judged (its node, group checks)."""
        node_id = node_id_of(leaf)
        node = self.alive.node_version(node_id) if node_id is not None and self.alive is not None else 0
        return (node, self.checks.version if self.checks is not None else 0)

    def capable(self, leaf: Any, network: Network) -> bool:
        """Whether the leaf can carry ``network`` at all (UDP capability comes before health)."""
        if network is Network.TCP:
            return True
        return bool(getattr(leaf, "supports_udp", False)) or getattr(leaf, "protocol", "") == "block"

    def eligible(self, leaf: Any, network: Network, group: str = "", member: str = "") -> bool:
        """Whether ``leaf`` may serve ``network``, judged in the leaf's own health family."""
        if not self.capable(leaf, network):
            return False
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return True
        family = health_family_of(leaf)
        if network is Network.TCP:
            if not self.alive.tcp_alive(node_id, family):
                return False
            if self.checks is not None and group and not self.checks.member_alive(group, member):
                return False
            return True
        return self.alive.udp_selectable(node_id, family)

    def tcp_metric(self, leaf: Any, group: str = "", member: str = "", rank_by: str = "") -> float | None:
        """The ranking latency: the group check's for ``member`` when ``group`` has one, else the
        global TCP probe's in the leaf's health family. ``rank_by`` picks the statistic of the
        real probe samples: the halving moving average (""), the newest ("last"), the mean of
        the newest 10 ("avg10")."""
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return None
        if self.checks is not None and group:
            url = self.checks.url_of(group)
            if url is not None:
                return self.checks.ranking(member, url, rank_by)
        return self.alive.ranking(node_id, Domain.TCP, health_family_of(leaf), rank_by)

    def udp_metric(self, leaf: Any, rank_by: str = "") -> float | None:
        """DataUdp's ranking latency (``rank_by`` as for :meth:`tcp_metric`), else DnsUdp's, in
        the leaf's health family; None when the node has no UDP evidence there."""
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return None
        family = health_family_of(leaf)
        data = self.alive.ranking(node_id, Domain.DATA_UDP, family, rank_by)
        return data if data is not None else self.alive.ranking(node_id, Domain.DNS_UDP, family, rank_by)

    def demoted(self, leaf: Any) -> bool:
        node_id = node_id_of(leaf)
        return node_id is not None and self.alive is not None and self.alive.demoted(node_id)


NO_HEALTH = HealthFilter()
