"""The four policies over real health state (requirements areas A, B, C, D), on a fake clock."""

from __future__ import annotations

import logging
import random
import uuid

import pytest

from honk.alive.group_checks import GroupCheck, GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.core.clock import FakeClock
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.events import ChoiceChanged, FlowsInterrupted, GroupEvent
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.group.policy import UnknownMember
from honk.outbound.registry import build_outbounds

TCP, UDP = Network.TCP, Network.UDP
V4 = Family.V4
MS = 0.001


def node(name: str, protocol: str = "socks5") -> NodeSpec:
    return with_node_id(NodeSpec(name, protocol, "127.0.0.1", 1000 + sum(map(ord, name))))


def group(name: str, *members: str, subgroups: tuple[str, ...] = (), **kw) -> GroupSpec:
    filters = (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in members)),)),) if members else ()
    return GroupSpec(
        name, filters=filters, subgroups=subgroups, has_filter_lines=bool(members or subgroups), **kw
    )


def routed(manager: GroupManager, kind: type) -> list[GroupEvent]:
    """Every event of ``kind`` the manager routes from now on (its sink)."""
    seen: list[GroupEvent] = []
    manager.sink = lambda event: seen.extend((event,) if isinstance(event, kind) else ())
    return seen


class World:
    """Nodes with real health state, and a manager built over them."""

    def __init__(
        self,
        *groups: GroupSpec,
        nodes=("a", "b", "c"),
        tcp_only: tuple[str, ...] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.alive = AliveDialerSet(self.clock, on_emergency=self.emergencies.append)
        self.checks = GroupChecks(self.clock)
        specs = tuple(node(n, "http" if n in tcp_only else "socks5") for n in nodes)  # HTTP CONNECT: TCP only
        self.spec = Spec(nodes=specs, groups=groups)
        self.outbounds = build_outbounds(self.spec, self.clock)[0]
        self.ids = {n.name: n.id for n in specs}
        for n in specs:
            self.alive.register_node(n.id, n.name)
        self.clock.advance(REGISTRATION_GRACE + 1)
        self.manager = GroupManager.build(
            self.spec, self.outbounds, health=HealthFilter(self.alive, self.checks), clock=self.clock, rng=rng
        )

    emergencies: list = []

    def leaf(self, name: str, network: Network = TCP) -> str:
        return self.manager.resolve(name, network).leaf.name

    def sample(self, n: str, ms: float, domain: Domain = Domain.TCP) -> None:
        self.alive.notify_check_success(self.ids[n], domain, V4, ms * MS)

    def kill(self, n: str, domain: Domain = Domain.TCP) -> None:
        for _ in range(3):
            self.alive.notify_check_failure(self.ids[n], domain, V4)

    def revive(self, n: str, domain: Domain = Domain.TCP) -> None:
        for _ in range(2):
            self.alive.notify_check_success(self.ids[n], domain, V4, 0.05)

    def dial_failures(self, n: str, count: int) -> None:
        for _ in range(count):
            self.alive.record_dial_failure(self.ids[n], V4)

    def dial_ok(self, n: str, seconds: float | None = None) -> None:
        self.alive.report_dial_success(self.ids[n], V4, seconds)


@pytest.fixture(autouse=True)
def fresh_emergencies():
    World.emergencies = []


# --- B: URLTest -------------------------------------------------------------------------------


def test_moving_average_halves_and_ignores_the_placeholder():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    for ms in (100, 200, 50):
        w.sample("a", ms)
    assert w.alive.average(w.ids["a"], Domain.TCP, V4) == pytest.approx(0.100)  # 100 -> 150 -> 100
    w.dial_failures("a", 2)
    assert w.alive.average(w.ids["a"], Domain.TCP, V4) == pytest.approx(0.100)


def test_tolerance_zero_behaves_as_one_millisecond_and_a_degraded_incumbent_is_replaced():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST, tolerance=0.0))
    w.sample("a", 101)
    w.sample("b", 300)
    assert w.leaf("auto") == "a"
    w.sample("b", 100)  # b: 300 -> 200 ... make b 100 exactly
    w.alive.node(w.ids["b"]).state(Domain.TCP, V4).average.reset()
    w.sample("b", 100)
    assert w.leaf("auto") == "a"  # 100 + 1 >= 101: the incumbent stays
    w.alive.node(w.ids["a"]).state(Domain.TCP, V4).average.reset()
    w.sample("a", 102)
    assert w.leaf("auto") == "b"  # re-read at selection: 100 + 1 < 102


def test_fifty_ms_tolerance_keeps_the_incumbent_until_it_passes_best_plus_tolerance():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST, tolerance=0.050))
    w.sample("a", 140)
    w.sample("b", 400)
    assert w.leaf("auto") == "a"
    w.alive.node(w.ids["b"]).state(Domain.TCP, V4).average.reset()
    w.sample("b", 100)
    assert w.leaf("auto") == "a"  # 100 + 50 >= 140
    w.sample("a", 162)  # (140 + 162) / 2 = 151
    assert w.leaf("auto") == "b"


def test_strikes_bypass_hysteresis_and_need_two_real_successes_to_clear():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST, tolerance=0.050))
    w.sample("a", 100)
    w.sample("b", 120)
    assert w.leaf("auto") == "a"
    w.dial_failures("a", 2)
    assert w.alive.node(w.ids["a"]).strikes == 1
    assert w.leaf("auto") == "b"  # replaced at once, although within tolerance
    w.revive("a")  # probe successes change nothing
    assert w.leaf("auto") == "b"
    w.dial_ok("a")
    assert w.alive.demoted(w.ids["a"])
    w.dial_ok("a")
    assert not w.alive.demoted(w.ids["a"])


def test_probe_failures_touch_only_liveness():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    w.sample("a", 80)
    for _ in range(3):
        w.alive.notify_check_failure(w.ids["a"], Domain.TCP, V4)
    node = w.alive.node(w.ids["a"])
    assert node.strikes == 0 and w.alive.average(w.ids["a"], Domain.TCP, V4) == pytest.approx(0.080)
    assert not w.alive.tcp_alive(w.ids["a"], V4)


def test_ema_detector_thresholds_and_emergency_probe():
    w = World(nodes=("n1", "n2", "n3"))
    for n in ("n1", "n2", "n3"):
        for _ in range(3):
            w.dial_ok(n, 0.060)
    for _ in range(3):
        w.dial_ok("n1", 0.200)  # threshold max(min(120, 560), 250) = 250 ms
    assert not w.alive.demoted(w.ids["n1"]) and World.emergencies == []
    for _ in range(3):
        w.dial_ok("n2", 0.260)
    assert w.alive.node(w.ids["n2"]).detector_strikes == 1 and World.emergencies == [w.ids["n2"]]
    assert w.alive.average(w.ids["n2"], Domain.TCP, V4) is None  # the probe average is untouched
    for _ in range(2):
        w.dial_ok("n3", 0.260)
        w.alive.report_dial_success(w.ids["n3"], V4, 0.001, pool_hit=True)  # ready-pool hits do not count
    w.dial_ok("n3", 0.260)
    assert w.alive.node(w.ids["n3"]).detector_strikes == 1


def test_detector_strike_self_heals_after_the_emergency_probe_and_one_more_success():
    w = World(nodes=("n1",))
    for ms in (0.06, 0.06, 0.06, 0.3, 0.3, 0.3):
        w.dial_ok("n1", ms)
    assert w.alive.node(w.ids["n1"]).detector_strikes == 1
    w.sample("n1", 60)
    assert w.alive.demoted(w.ids["n1"])
    w.sample("n1", 60)
    assert not w.alive.demoted(w.ids["n1"])


def test_udp_mirrors_tcp_until_udp_evidence_exists_then_data_udp_beats_dns_udp():
    w = World(group("auto", "a", "b", "c", policy=Policy.URLTEST, tolerance=0.001))
    w.sample("a", 50)
    w.sample("b", 80)
    w.sample("c", 90)
    assert w.leaf("auto", UDP) == "a"  # mirror
    w.sample("b", 20, Domain.DNS_UDP)
    w.sample("a", 60, Domain.DNS_UDP)
    assert w.leaf("auto", UDP) == "b"
    w.sample("c", 10, Domain.DATA_UDP)
    assert w.leaf("auto", UDP) == "c"
    assert w.leaf("auto", TCP) == "a"  # winners are separate


def test_only_placeholders_keep_the_udp_mirror():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    w.sample("a", 90)
    w.sample("b", 30)
    w.dial_failures("b", 2)  # b demoted: TCP winner a
    assert w.leaf("auto", UDP) == w.leaf("auto", TCP) == "a"


# --- B: LoadBalance and Fallback ------------------------------------------------------------------


def test_load_balance_cursors_are_independent_per_network():
    w = World(group("lb", "a", "b", "c", policy=Policy.LOADBALANCE))
    assert [w.leaf("lb") for _ in range(2)] == ["a", "b"]
    assert w.leaf("lb", UDP) == "a"
    assert [w.leaf("lb") for _ in range(2)] == ["c", "a"]
    assert w.leaf("lb", UDP) == "b"


def test_load_balance_skips_ineligible_members():
    w = World(group("lb", "a", "b", "c", policy=Policy.LOADBALANCE))
    w.kill("b")
    assert [w.leaf("lb") for _ in range(4)] == ["a", "c", "a", "c"]


def test_fallback_pins_without_failback_per_network():
    w = World(group("fb", "a", "b", "c", policy=Policy.FALLBACK))
    assert w.leaf("fb") == "a" and w.leaf("fb", UDP) == "a"
    w.kill("a")
    assert w.leaf("fb") == "b"
    w.revive("a")
    assert w.leaf("fb") == "b"  # no failback
    assert w.leaf("fb", UDP) == "a"  # the UDP pin was not asked for while a was down: it never moved
    w.kill("b")
    assert w.leaf("fb") == "a"


# --- B/A: Selector, last resort ------------------------------------------------------------------


def test_selector_does_not_fall_to_a_sibling_when_its_choice_dies():
    w = World(group("sel", "a", "b"))
    w.manager.select("sel", "b")
    w.kill("b")
    w.kill("a")
    # b is the sole chosen leaf: the TCP last resort serves it, never a
    assert w.leaf("sel") == "b"
    w.kill("b", Domain.DNS_UDP)
    w.kill("b", Domain.DATA_UDP)
    with pytest.raises(NoRoute):
        w.manager.resolve("sel", UDP)  # UDP has no last resort, and a (UDP-eligible) is not used


def test_selector_with_a_dead_choice_and_a_final_takes_the_final():
    w = World(group("sel", "a", "b", final="c"))
    w.manager.select("sel", "b")
    w.kill("b")
    assert w.manager.resolve("sel", TCP).chain == ("sel", "c")


def test_selector_writes_validate_once_and_report_changed_networks():
    w = World(group("sel", "a", "b"))
    seen = routed(w.manager, ChoiceChanged)
    with pytest.raises(UnknownMember):
        w.manager.select("sel", "zzz")
    assert w.manager.choices() == {} and seen == []
    assert w.manager.select("sel", "b", TCP) == [TCP]
    assert seen == [ChoiceChanged("sel", TCP, ("node", w.ids["b"]))]
    assert w.manager.select("sel", "b") == [UDP]  # both: only UDP changed


def test_last_resort_serves_the_sole_dead_leaf_for_tcp_only_with_a_rate_limited_warning(caplog):
    w = World(group("g", "a"), nodes=("a",))
    w.kill("a")
    with caplog.at_level(logging.WARNING):
        assert w.leaf("g") == "a"
        w.clock.advance(10)
        w.manager.resolve("g", TCP, peek=True)  # a warm-up peek logs nothing
        w.clock.advance(49)
        w.leaf("g")
        assert caplog.text.count("last resort") == 1
        w.clock.advance(2)
        w.leaf("g")
        assert caplog.text.count("last resort") == 2
    assert not w.alive.tcp_alive(w.ids["a"], V4)  # serving it changed no health
    w.kill("a", Domain.DNS_UDP)
    w.kill("a", Domain.DATA_UDP)
    with pytest.raises(NoRoute):
        w.manager.resolve("g", UDP)


def test_last_resort_respects_the_selector_choice_path():
    w = World(group("p", subgroups=("s1", "s2")), group("s1", "a"), group("s2", "b"))
    w.manager.select("p", "s1")
    w.kill("a")
    assert w.manager.resolve("p", TCP).leaf.name == "a"


# --- C: nesting -----------------------------------------------------------------------------------


def test_one_candidate_per_subgroup_and_introspection():
    w = World(
        group("p", "c", subgroups=("s",), policy=Policy.URLTEST), group("s", "a", "b", policy=Policy.URLTEST)
    )
    w.sample("a", 50)
    w.sample("b", 10)
    w.sample("c", 30)
    assert w.manager.resolve("p", TCP).chain == ("p", "s", "b")
    assert w.manager.node_names_in_group("p") == ("c", "s")
    assert sorted(w.manager.leaf_node_names_in_group("p")) == ["a", "b", "c"]
    assert [(m, leaf.name) for m, leaf in w.manager.delay_test_members("p")] == [("c", "c"), ("s", "b")]


def test_final_semantics_and_chain():
    w = World(group("p", subgroups=("s",)), group("s", "a", "b", final="f"), group("f", "c"))
    w.manager.select("p", "s")
    w.kill("a")
    w.kill("b")
    assert w.manager.selection_chain("p") == ("p", "s", "f", "c")
    assert "f" not in w.manager.node_names_in_group("s")
    assert "c" in w.manager.leaf_node_names_in_group("s")


def test_no_sibling_is_peeked_when_the_chosen_subgroup_has_no_pick():
    w = World(
        group("p", subgroups=("s1", "s2")),
        group("s1", "a", "b", policy=Policy.LOADBALANCE),
        group("s2", "c", "b", policy=Policy.LOADBALANCE),
    )
    w.manager.select("p", "s1")
    w.kill("a")
    w.kill("b")
    w.kill("c")
    for n in ("a", "b"):
        w.kill(n, Domain.DNS_UDP)
        w.kill(n, Domain.DATA_UDP)
    with pytest.raises(NoRoute):
        w.manager.resolve("p", UDP)
    assert w.manager.policy("s2")._last == {}  # the sibling's cursor never moved


def test_group_check_url_excludes_a_member_from_that_group_only():
    w = World(
        group("g1", "a", "b", policy=Policy.URLTEST, check_url="http://u/"),
        group("g2", "a", "b", policy=Policy.URLTEST),
    )
    w.checks.sync_group_check_urls(
        [GroupCheck("g1", Policy.URLTEST, "http://u/", lambda: [("a", w.ids["a"]), ("b", w.ids["b"])])]
    )
    for _ in range(3):
        w.checks.notify("a", "http://u/", None)
    assert w.leaf("g1") == "b" and w.leaf("g2") == "a"


# --- D: UDP eligibility ------------------------------------------------------------------------


def test_a_tcp_only_node_never_serves_udp():
    w = World(
        group("auto", "v", "a", policy=Policy.URLTEST),
        group("sel", "v", "a"),
        nodes=("v", "a"),
        tcp_only=("v",),
    )
    w.sample("v", 10)
    w.sample("a", 90)
    assert w.leaf("auto", TCP) == "v" and w.leaf("auto", UDP) == "a"
    with pytest.raises(NoRoute):
        w.manager.resolve("sel", UDP)  # the choice v is incapable; a sibling is never used


def test_udp_liveness_is_per_family_and_both_dead_excludes():
    w = World(group("fb", "a", "b", policy=Policy.FALLBACK))
    w.kill("a", Domain.DNS_UDP)
    w.kill("a", Domain.DATA_UDP)
    assert w.leaf("fb", UDP) == "b" and w.leaf("fb", TCP) == "a"


def test_choices_survive_reload_by_node_identity_not_by_name():
    w = World(group("g", "x", "y"), nodes=("x", "y"))
    w.manager.select("g", "x", TCP)
    w.manager.select("g", "y", UDP)
    renamed_y = with_node_id(NodeSpec("y", "socks5", "127.0.0.1", 4242))  # a different node now named y
    spec = Spec(nodes=(node("x"), renamed_y), groups=w.spec.groups)
    outbounds = build_outbounds(spec, w.clock)[0]
    new = GroupManager.build(spec, outbounds, previous=w.manager)
    assert new.resolve("g", TCP).leaf.name == "x"
    assert new.choices() == {"g": {TCP: "x"}}  # the UDP choice did not move to the new y
    assert new.resolve("g", UDP).leaf.name == "x"  # default, else the first member
    assert uuid.UUID(int=0) not in (w.ids["x"], w.ids["y"])


def test_a_urltest_winner_change_interrupts_flows_only_with_interrupt_connections():
    w = World(
        group("auto", "a", "b", policy=Policy.URLTEST, interrupt_connections=True),
        group("quiet", "a", "b", policy=Policy.URLTEST),
    )
    fired = routed(w.manager, FlowsInterrupted)
    w.sample("a", 50)
    w.sample("b", 90)
    assert w.leaf("auto") == "a" and w.leaf("quiet") == "a"
    assert fired == []  # a first selection replaces nothing
    w.dial_failures("a", 2)
    assert w.leaf("auto") == "b" and w.leaf("quiet") == "b"
    assert fired == [FlowsInterrupted("auto", TCP)]


def test_load_balance_rotation_never_interrupts():
    w = World(group("lb", "a", "b", policy=Policy.LOADBALANCE, interrupt_connections=True))
    fired = routed(w.manager, FlowsInterrupted)
    assert [w.leaf("lb") for _ in range(4)] == ["a", "b", "a", "b"]
    assert fired == []


def test_a_selector_whose_choice_cannot_carry_udp_continues_only_through_its_final():
    """D suggested test 3: with a final the UDP plan is the final; without one it is empty, and the
    UDP-capable sibling is not used."""
    w = World(
        group("with", "v", "a", final="b"), group("without", "v", "a"), nodes=("v", "a", "b"), tcp_only=("v",)
    )
    assert w.manager.resolve("with", UDP).chain == ("with", "b")
    with pytest.raises(NoRoute):
        w.manager.resolve("without", UDP)
    assert w.leaf("without", TCP) == "v"  # TCP is unaffected


def test_readers_of_the_shared_handle_always_see_one_whole_manager():
    """A suggested test 4: every read takes the current manager once; its members and choices
    come from that one manager however often the handle is swapped."""
    from honk.group.manager import SharedGroupManager

    first = World(group("g", "a", "b"))
    second = World(group("g", "b", "c"), nodes=("b", "c"))
    first.manager.select("g", "b")
    shared = SharedGroupManager(first.manager)
    seen = set()
    for i in range(200):
        manager = shared.current
        members = manager.members("g")
        assert shared.publish(second.manager if i % 2 == 0 else first.manager) is manager  # swapped mid-read
        chosen = manager.resolve("g", TCP).leaf.name
        seen.add((members, chosen))
    assert seen == {(("a", "b"), "b"), (("b", "c"), "b")}  # both whole managers, never a mix


# --- G: cold URLTest UDP preparation plan ----------------------------------------------------------


def _cold(w: World, name: str = "auto") -> list[str]:
    return [s.leaf.name for s in w.manager.cold_udp_candidates(name)]


def test_an_unmeasured_top_level_urltest_prepares_its_members_by_rank():
    w = World(group("auto", "a", "b", "c", policy=Policy.URLTEST))
    w.sample("a", 50)
    w.sample("b", 80)
    w.sample("c", 20)
    assert _cold(w) == ["c", "a", "b"]  # the URLTest's own ranking (TCP's, which unmeasured UDP mirrors)
    assert w.leaf("auto", UDP) == "c"  # its pick comes first


def test_any_usable_udp_measurement_makes_the_plan_single_leaf():
    w = World(group("auto", "a", "b", "c", policy=Policy.URLTEST))
    w.sample("a", 50)
    w.sample("b", 20, Domain.DNS_UDP)  # DnsUdp is a usable UDP measurement as well
    assert _cold(w) == []


def test_a_nested_urltest_is_not_top_level_and_other_policies_prepare_one_leaf():
    w = World(
        group("auto", "a", "b", policy=Policy.URLTEST),
        group("outer", subgroups=("auto",), policy=Policy.SELECTOR),
    )
    assert _cold(w, "outer") == []  # the route's target is the Selector: one leaf
    assert _cold(w, "auto") == ["a", "b"]  # (the dispatcher asks only for a route's own target)
    w2 = World(
        group("fb", "a", "b", policy=Policy.FALLBACK), group("lb", "a", "b", policy=Policy.LOADBALANCE)
    )
    assert _cold(w2, "fb") == [] and _cold(w2, "lb") == [] and _cold(w2, "a") == []


def test_the_cold_plan_leaves_out_dead_udp_less_and_duplicate_leaves():
    w = World(
        group("auto", "a", "b", "c", "h", subgroups=("inner",), policy=Policy.URLTEST),
        group("inner", "a", policy=Policy.SELECTOR),
        nodes=("a", "b", "c", "h"),
        tcp_only=("h",),
    )
    assert _cold(w) == ["a", "b", "c"]  # inner serves a, listed already: one attempt per leaf
    w.kill("b", Domain.DATA_UDP)
    assert _cold(w) == ["a", "c"]  # b cannot carry UDP now; h (HTTP CONNECT) never can
    w.kill("c", Domain.DATA_UDP)
    assert _cold(w) == []  # one leaf left: nothing to race


def test_a_udp_pin_makes_the_plan_single_leaf():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    w.manager.pin("auto", "b", UDP)
    assert _cold(w) == []
