"""Per-rule hit and miss counters and the disabled flags of the compiled router."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.expr import MUST_RULES
from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec, Spec
from honk.connection.plane import build_plane
from honk.core.clock import FakeClock
from honk.core.net import Address, FlowMeta, Network
from honk.route.router import NeedsResolution, Router
from honk.route.rulestats import NEVER, RuleRow


def port_rule(outbound: str, port: int) -> RuleSpec:
    return RuleSpec((Predicate("dport", (MatchArg("", str(port)),)),), outbound)


def dip_rule(outbound: str, cidr: str) -> RuleSpec:
    return RuleSpec((Predicate("dip", (MatchArg("", cidr),)),), outbound)


def compiled(*rules: RuleSpec, fallback: str = "proxy") -> Router:
    return Router.compile(RoutingSpec(rules=tuple(rules), fallback=fallback))


def flow(port: int = 443, target: str = "example.com") -> FlowMeta:
    return FlowMeta(Network.TCP, Address("192.168.1.10", 50000), Address(target, port), "lan")


def counts(router: Router) -> list[tuple[int, int]]:
    """(hits, misses) per position, the fallback last."""
    return [(row.hits, row.misses) for row in router.stats.rows()]


THREE = (port_rule("a", 1), port_rule("b", 2), port_rule("c", 3))


def test_a_flow_hits_its_rule_and_misses_every_rule_before_it() -> None:
    router = compiled(*THREE)
    assert router.route(flow(2), now=100.0).outbound == "b"
    rows = router.stats.rows()
    assert rows == [
        RuleRow(disabled=False, hits=0, hit_at=NEVER, misses=1, miss_at=100.0),
        RuleRow(disabled=False, hits=1, hit_at=100.0, misses=0, miss_at=NEVER),
        RuleRow(disabled=False, hits=0, hit_at=NEVER, misses=0, miss_at=NEVER),  # never reached
        RuleRow(disabled=False, hits=0, hit_at=NEVER, misses=0, miss_at=NEVER),  # the fallback
    ]


def test_a_flow_no_rule_matches_misses_every_rule_and_hits_the_fallback() -> None:
    router = compiled(*THREE)
    assert router.route(flow(9), now=5.0).outbound == "proxy"
    assert counts(router) == [(0, 1), (0, 1), (0, 1), (1, 0)]
    assert router.stats.rows()[-1].hit_at == 5.0


def test_a_rule_list_of_only_the_fallback_counts_its_hits() -> None:
    router = compiled()
    router.route(flow(), now=1.0)
    router.route(flow(), now=2.0)
    assert router.stats.rows() == [RuleRow(False, 2, 2.0, 0, NEVER)]


def test_times_are_the_last_hit_and_the_last_miss() -> None:
    router = compiled(*THREE)
    router.route(flow(3), now=10.0)
    router.route(flow(1), now=20.0)
    router.route(flow(2), now=30.0)
    rows = router.stats.rows()
    assert (rows[0].hits, rows[0].hit_at, rows[0].misses, rows[0].miss_at) == (1, 20.0, 2, 30.0)
    assert (rows[1].hits, rows[1].hit_at, rows[1].misses, rows[1].miss_at) == (1, 30.0, 1, 10.0)
    assert (rows[2].hits, rows[2].hit_at, rows[2].misses, rows[2].miss_at) == (1, 10.0, 0, NEVER)


def test_a_search_that_needs_resolution_counts_nothing_until_it_is_resumed() -> None:
    router = compiled(port_rule("a", 1), dip_rule("lan", "10.0.0.0/8"))
    first = router.route(flow(443), now=1.0)
    assert first == NeedsResolution(1)
    assert counts(router) == [(0, 0), (0, 0), (0, 0)]
    # a caller that gave up on the synchronous path starts over: still nothing counted
    assert router.route(flow(443), now=1.0) == NeedsResolution(1)
    resolved = dataclasses.replace(flow(443), resolved=ipaddress.ip_address("10.1.2.3"))
    assert router.route(resolved, start=1, now=2.0).outbound == "lan"
    # rule 0, read by the first call, missed once; rule 1 hit once
    assert counts(router) == [(0, 1), (1, 0), (0, 0)]
    assert router.stats.rows()[0].miss_at == 2.0


def test_a_failed_resolution_is_a_miss_of_the_destination_ip_rule() -> None:
    router = compiled(port_rule("a", 1), dip_rule("lan", "10.0.0.0/8"))
    assert router.route(flow(443), now=1.0) == NeedsResolution(1)
    assert router.route(flow(443), start=1, resolution_failed=True, now=2.0).outbound == "proxy"
    assert counts(router) == [(0, 1), (0, 1), (1, 0)]


def test_a_disabled_rule_is_skipped_and_neither_hits_nor_misses() -> None:
    router = compiled(port_rule("ssh", 22), port_rule("web", 443), port_rule("tls", 443))
    assert router.route(flow(443), now=1.0).outbound == "web"
    router.stats.set_disabled({1: True})
    decision = router.route(flow(443), now=2.0)
    assert (decision.outbound, decision.rule_index) == ("tls", 2)  # the next matching rule
    router.route(flow(9), now=3.0)  # and a flow that reaches the fallback skips it too
    rows = router.stats.rows()
    assert rows[1] == RuleRow(disabled=True, hits=1, hit_at=1.0, misses=0, miss_at=NEVER)
    assert (rows[0].misses, rows[0].miss_at) == (3, 3.0)
    assert (rows[2].hits, rows[2].hit_at, rows[2].misses) == (1, 2.0, 1)
    assert (rows[3].hits, rows[3].hit_at) == (1, 3.0)


def test_re_enabling_a_rule_restores_it_and_keeps_its_counters() -> None:
    router = compiled(*THREE)
    router.route(flow(3), now=10.0)  # rule 1 missed at 10
    router.stats.set_disabled({1: True})
    router.route(flow(3), now=20.0)  # rule 1 skipped: its last miss stays 10
    assert router.stats.rows()[1] == RuleRow(True, 0, NEVER, 1, 10.0)
    router.stats.set_disabled({1: False})
    assert router.route(flow(2), now=30.0).outbound == "b"
    router.route(flow(9), now=40.0)
    assert counts(router) == [(0, 4), (1, 2), (2, 1), (1, 0)]
    rows = router.stats.rows()
    assert (rows[1].disabled, rows[1].hit_at, rows[1].miss_at) == (False, 30.0, 40.0)
    assert (rows[0].miss_at, rows[2].hit_at, rows[2].miss_at) == (40.0, 20.0, 40.0)


def test_disabling_every_rule_sends_every_flow_to_the_fallback() -> None:
    router = compiled(*THREE)
    router.stats.set_disabled({0: True, 1: True, 2: True})
    assert router.route(flow(1), now=1.0).outbound == "proxy"
    assert counts(router) == [(0, 0), (0, 0), (0, 0), (1, 0)]


@pytest.mark.parametrize(
    "changes",
    [
        {0: True, 7: True},  # out of range
        {0: True, 3: True},  # the fallback's position
        {0: True, 1: "yes"},  # not a bool
        {0: True, 1: 1},  # a number is no bool either
        {0: True, "1": True},  # indexes are ints here (the API parses the keys)
    ],
)
def test_set_disabled_validates_every_change_before_applying_any(changes) -> None:
    router = compiled(*THREE)
    with pytest.raises(ValueError):
        router.stats.set_disabled(changes)
    assert [row.disabled for row in router.stats.rows()] == [False, False, False, False]
    assert router.route(flow(1)).outbound == "a"


def test_the_fallback_cannot_be_disabled() -> None:
    router = compiled(*THREE)
    with pytest.raises(ValueError, match="fallback"):
        router.stats.set_disabled({3: True})


def test_a_recompiled_router_starts_with_zero_counters_and_every_rule_enabled() -> None:
    spec = RoutingSpec(rules=THREE, fallback="proxy")
    router = Router.compile(spec)
    router.stats.set_disabled({0: True})
    router.route(flow(2), now=1.0)
    again = Router.compile(spec)
    assert again.stats.rows() == [RuleRow(False, 0, NEVER, 0, NEVER)] * 4
    assert again.route(flow(1)).outbound == "a"


# must_rules: a rule that holds counts as a hit (its flow goes on and hits a second rule),
# one that does not hold as a miss.

MUST = RuleSpec((Predicate("dport", (MatchArg("", "53"),)),), MUST_RULES)


def test_a_must_rules_rule_that_holds_is_a_hit_and_the_flow_hits_its_deciding_rule_too() -> None:
    router = compiled(MUST, port_rule("dns", 53), port_rule("web", 443))
    decision = router.route(flow(53), now=1.0)
    assert (decision.outbound, decision.must) == ("dns", True)
    assert counts(router) == [(1, 0), (1, 0), (0, 0), (0, 0)]
    router.route(flow(443), now=2.0)
    assert counts(router) == [(1, 1), (1, 1), (1, 0), (0, 0)]
    rows = router.stats.rows()
    assert (rows[0].hit_at, rows[0].miss_at) == (1.0, 2.0)


def test_a_must_rules_rule_before_a_resumed_search_is_counted_once() -> None:
    router = compiled(MUST, dip_rule("lan", "10.0.0.0/8"))
    assert router.route(flow(53), now=1.0) == NeedsResolution(1)
    resolved = dataclasses.replace(flow(53), resolved=ipaddress.ip_address("10.0.0.1"))
    decision = router.route(resolved, start=1, now=2.0)
    assert (decision.outbound, decision.must) == ("lan", True)
    assert counts(router) == [(1, 0), (1, 0), (0, 0)]


def test_a_disabled_must_rules_rule_no_longer_makes_decisions_must() -> None:
    router = compiled(MUST, port_rule("dns", 53))
    router.stats.set_disabled({0: True})
    decision = router.route(flow(53), now=1.0)
    assert (decision.outbound, decision.must) == ("dns", False)
    assert counts(router) == [(0, 0), (1, 0), (0, 0)]


def test_a_must_decision_keeps_the_rules_own_mark() -> None:
    marked = dataclasses.replace(port_rule("direct", 53), mark=0x800)
    decision = compiled(MUST, marked).route(flow(53))
    assert (decision.outbound, decision.must, decision.mark) == ("direct", True, 0x800)


# --- against a naive per-rule count -------------------------------------------------------------

PORTS = (1, 2, 3, 53)


@st.composite
def scenarios(draw):
    rules = draw(st.lists(st.sampled_from(PORTS + (0,)), max_size=6))  # 0: a must_rules rule on port 53
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("flow"), st.sampled_from(PORTS + (9,))),
                st.tuples(st.just("flip"), st.integers(0, max(0, len(rules) - 1))),
            ),
            max_size=25,
        )
    )
    return rules, ops


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_the_counters_agree_with_counting_every_evaluated_rule_one_by_one(scenario) -> None:
    ports, ops = scenario
    specs = [MUST if port == 0 else port_rule(f"r{i}", port) for i, port in enumerate(ports)]
    router = compiled(*specs)
    size = len(ports)
    disabled = [False] * size
    hits, hit_at = [0] * (size + 1), [NEVER] * (size + 1)
    misses, miss_at = [0] * (size + 1), [NEVER] * (size + 1)
    for step, (op, arg) in enumerate(ops, start=1):
        now = float(step)
        if op == "flip":
            if size:
                disabled[arg] = not disabled[arg]
                router.stats.set_disabled({arg: disabled[arg]})
            continue
        router.route(flow(arg), now=now)
        for i, port in enumerate(ports):  # the reference: every enabled rule, one at a time
            if disabled[i]:
                continue
            holds = arg == (53 if port == 0 else port)
            if not holds:
                misses[i] += 1
                miss_at[i] = now
                continue
            hits[i] += 1
            hit_at[i] = now
            if port != 0:
                break
        else:
            hits[size] += 1
            hit_at[size] = now
    expected = [
        RuleRow(i < size and disabled[i], hits[i], hit_at[i], misses[i], miss_at[i]) for i in range(size + 1)
    ]
    assert router.stats.rows() == expected


# --- through the plane, with the injected clock ---------------------------------------------------


async def test_the_plane_records_its_clocks_wall_time_and_counts_a_restarted_search_once() -> None:
    clock = FakeClock(start=1000.0, wall_offset=1_700_000_000.0)
    spec = Spec(
        routing=RoutingSpec(
            rules=(port_rule("direct", 1), dip_rule("direct", "10.0.0.0/8")), fallback="direct"
        )
    )
    plane = build_plane(spec, clock, generation=1)

    async def resolver(host: str) -> list:
        return [ipaddress.ip_address("10.9.9.9")]

    assert plane.decide_now(flow(443)) is None  # needs the destination IP: the sync path gives up
    clock.advance(5.0)
    decision = await plane.decide(flow(443), resolver)  # and the async path starts over
    assert decision.route.rule_index == 1
    rows = plane.router.stats.rows()
    assert (rows[0].misses, rows[0].miss_at) == (1, 1_700_001_005.0)
    assert (rows[1].hits, rows[1].hit_at) == (1, 1_700_001_005.0)
    clock.advance(1.0)
    assert plane.decide_now(flow(1)).route.rule_index == 0
    assert plane.router.stats.rows()[0].hit_at == 1_700_001_006.0
