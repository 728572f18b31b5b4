"""Which leaves may serve a network, and how they rank: the groups' view of node health.

* TCP: a node serves while its TCP state for the health family is not dead (an
  unprobed node serves).
* UDP: capability first, before any health evidence: a leaf that cannot carry UDP never
  serves UDP. Then the UDP liveness rule: DataUdp or DnsUdp alive serves, both dead does
  not, no UDP evidence at all follows TCP.
* A group with its own ``check_url`` also needs the (member tag, URL) state not dead,
  and ranks its members by that state's moving average instead of the global probe's.
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


class HealthFilter:
    """Eligibility and ranking metrics of leaves, read from the health state."""

    __slots__ = ("alive", "checks")

    def __init__(self, alive: AliveDialerSet | None = None, checks: GroupChecks | None = None) -> None:
        self.alive = alive
        self.checks = checks

    def version(self) -> tuple[int, int]:
        """Changes whenever health could change a selection (cached picks expire with it)."""
        return (self.alive.version if self.alive is not None else 0,
                self.checks.version if self.checks is not None else 0)

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

    def eligible(self, leaf: Any, network: Network, family: Family, group: str = "", member: str = "") -> bool:
        if not self.capable(leaf, network):
            return False
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return True
        if network is Network.TCP:
            if not self.alive.tcp_alive(node_id, family):
                return False
            if self.checks is not None and group and not self.checks.member_alive(group, member):
                return False
            return True
        return self.alive.udp_selectable(node_id, family)

    def tcp_metric(self, leaf: Any, family: Family, group: str = "", member: str = "") -> float | None:
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return None
        if self.checks is not None and group:
            url = self.checks.url_of(group)
            if url is not None:
                return self.checks.average(member, url)
        return self.alive.average(node_id, Domain.TCP, family)

    def udp_metric(self, leaf: Any, family: Family) -> float | None:
        """DataUdp's average, else DnsUdp's; None when the node has no UDP evidence."""
        node_id = node_id_of(leaf)
        if node_id is None or self.alive is None:
            return None
        data = self.alive.average(node_id, Domain.DATA_UDP, family)
        return data if data is not None else self.alive.average(node_id, Domain.DNS_UDP, family)

    def demoted(self, leaf: Any) -> bool:
        node_id = node_id_of(leaf)
        return node_id is not None and self.alive is not None and self.alive.demoted(node_id)


NO_HEALTH = HealthFilter()
