"""Every group judges a node in its own health family, the family of the address its server is
reached on (GH-D-07, GH-K-01): eligibility, ranking, Score's liveness filter and the UDP warm set,
whatever the flow's target family. On a fake clock, over real health state."""

from __future__ import annotations

import ipaddress

import pytest

from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.core.clock import FakeClock
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.filter import HealthFilter, health_family_of
from honk.group.manager import GroupManager
from honk.group.score.keys import ScoreTarget
from honk.outbound.registry import build_outbounds

TCP, UDP = Network.TCP, Network.UDP
V4, V6 = Family.V4, Family.V6
SELECTIONS = 10  # flows resolved where a test asserts "never"
SERVERS = {"six": "::1", "four": "127.0.0.1", "named": "proxy.example"}
TARGET = ScoreTarget.of("x.example", 443)
DEST_V4 = ipaddress.ip_address("192.0.2.1")
DEST_V6 = ipaddress.ip_address("2001:db8::1")
AUTOMATIC = [Policy.URLTEST, Policy.FALLBACK, Policy.SCORE]


def group(name: str, *members: str, **kw) -> GroupSpec:
    filters = (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in members)),)),)
    return GroupSpec(name, filters=filters, has_filter_lines=True, **kw)


class World:
    """Nodes reached over IPv6 (``six``), IPv4 (``four``) and a name (``named``), with real health."""

    def __init__(self, *groups: GroupSpec) -> None:
        self.clock = FakeClock()
        self.alive = AliveDialerSet(self.clock)
        specs = tuple(with_node_id(NodeSpec(n, "socks5", host, 1080)) for n, host in SERVERS.items())
        self.spec = Spec(nodes=specs, groups=groups)
        self.outbounds = build_outbounds(self.spec, self.clock)[0]
        self.ids = {n.name: n.id for n in specs}
        for n in specs:
            self.alive.register_node(n.id, n.name)
        self.clock.advance(REGISTRATION_GRACE + 1)
        health = HealthFilter(self.alive, GroupChecks(self.clock))
        self.manager = GroupManager.build(self.spec, self.outbounds, health=health, clock=self.clock)

    def leaf(self, name: str, network: Network = TCP, **kw) -> str:
        return self.manager.resolve(name, network, **kw).leaf.name

    def kill(self, n: str, family: Family, *domains: Domain) -> None:
        for domain in domains or (Domain.TCP,):
            for _ in range(3):
                self.alive.notify_check_failure(self.ids[n], domain, family)


def test_the_health_family_is_the_family_the_server_is_reached_on():
    w = World()
    assert [health_family_of(w.outbounds[n]) for n in SERVERS] == [V6, V4, V4]
    assert health_family_of(w.outbounds["direct"]) is V4  # no server: never judged anyway


@pytest.mark.parametrize("policy", AUTOMATIC)
def test_an_ipv6_reached_leaf_whose_ipv6_tcp_state_is_dead_is_not_eligible(policy):
    w = World(group("g", "six", "four", policy=policy))
    w.kill("six", V6)  # its IPv4 state stays unknown: it must not keep the node in
    for _ in range(SELECTIONS):
        assert w.leaf("g") == "four"
        assert w.leaf("g", target=TARGET, destination=DEST_V6) == "four"
    assert w.manager.selection_chain("g") == ("g", "four")


@pytest.mark.parametrize("policy", AUTOMATIC)
def test_a_dead_state_of_a_family_the_node_is_not_reached_on_excludes_nothing(policy):
    w = World(group("g", "six", "four", policy=policy, final="named"))
    w.kill("six", V4)
    w.kill("four", V6)
    served = {w.leaf("g") for _ in range(SELECTIONS)}
    assert served <= {"six", "four"} and "named" not in served  # both still eligible: no final taken
    w.kill("four", V4)
    assert {w.leaf("g") for _ in range(SELECTIONS)} == {"six"}


def test_score_serves_an_ipv6_target_over_an_ipv4_reached_node_and_never_a_dead_ipv6_one():
    w = World(group("g", "six", "four", policy=Policy.SCORE))
    w.kill("six", V6)
    for destination in (DEST_V4, DEST_V6):  # the target family selects the bucket, never liveness
        for _ in range(SELECTIONS):
            assert w.leaf("g", target=TARGET, destination=destination) == "four"
    assert w.manager.retry_candidates("g", TCP, w.outbounds["four"], target=TARGET, destination=DEST_V6) == []


def test_udp_eligibility_reads_the_udp_states_of_the_health_family():
    w = World(group("g", "six", "four", policy=Policy.FALLBACK))
    w.kill("six", V4, Domain.DATA_UDP, Domain.DNS_UDP)  # not its family: no verdict
    assert w.leaf("g", UDP) == "six"
    w.kill("six", V6, Domain.DATA_UDP, Domain.DNS_UDP)  # both UDP domains dead where it is reached
    assert w.leaf("g", UDP) == "four"
    assert w.leaf("g", TCP) == "six"  # TCP alive: UDP death is UDP's
    w.kill("four", V4, Domain.DATA_UDP, Domain.DNS_UDP)
    with pytest.raises(NoRoute):
        w.manager.resolve("g", UDP)


def test_urltest_ranks_each_leaf_by_its_health_familys_average():
    w = World(group("g", "four", "six", policy=Policy.URLTEST))
    w.alive.notify_check_success(w.ids["four"], Domain.TCP, V4, 0.080)
    w.alive.notify_check_success(w.ids["six"], Domain.TCP, V6, 0.020)
    w.alive.notify_check_success(w.ids["six"], Domain.TCP, V4, 0.500)  # a family it is not reached on
    assert w.leaf("g") == "six"


def test_the_udp_warm_set_per_family_takes_the_leaves_of_that_health_family():
    w = World(group("g", "six", "four", "named", policy=Policy.FALLBACK))
    everything = lambda leaf: True  # noqa: E731
    assert [leaf.name for leaf in w.manager.udp_warm_leaves("g", V6, 3, everything)] == ["six"]
    assert [leaf.name for leaf in w.manager.udp_warm_leaves("g", V4, 3, everything)] == ["four", "named"]
    w.kill("six", V6, Domain.DATA_UDP, Domain.DNS_UDP)
    assert w.manager.udp_warm_leaves("g", V6, 3, everything) == []
