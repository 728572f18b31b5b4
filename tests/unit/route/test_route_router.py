"""The compiled router: order, fallback, must, and the resolution protocol."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.core.net import Address, FlowMeta, Network
from honk.route.router import NeedsResolution, RouteDecision, Router

KEYS = ("suffix", "full", "keyword", "regex", "geosite", "geoip")


def pred(name: str, *args: str, negated: bool = False) -> Predicate:
    out = []
    for text in args:
        key, sep, value = text.partition(":")
        out.append(MatchArg(key, value) if sep and key in KEYS else MatchArg("", text))
    return Predicate(name, tuple(out), negated)


def rule(outbound: str, *predicates: Predicate, must: bool = False) -> RuleSpec:
    return RuleSpec(tuple(predicates), outbound, must)


def router(*rules: RuleSpec, fallback: str = "proxy") -> Router:
    return Router.compile(RoutingSpec(rules=tuple(rules), fallback=fallback))


def meta(
    target: str = "example.com", port: int = 443, source: str = "192.168.1.10", network: Network = Network.TCP
) -> FlowMeta:
    return FlowMeta(network, Address(source, 50000), Address(target, port), "lan")


def test_no_rules_routes_to_the_fallback() -> None:
    decision = router(fallback="direct").route(meta())
    assert decision == RouteDecision(outbound="direct", rule="fallback", must=False, rule_index=None)


def test_unmatched_flow_routes_to_the_fallback() -> None:
    r = router(rule("block", pred("domain", "ads.example")))
    assert r.route(meta("example.com")).outbound == "proxy"


def test_first_matching_rule_wins() -> None:
    r = router(
        rule("a", pred("dport", "443")),
        rule("b", pred("domain", "example.com")),
    )
    decision = r.route(meta("example.com", 443))
    assert (decision.outbound, decision.rule_index) == ("a", 0)
    assert r.route(meta("example.com", 80)).outbound == "b"


def test_all_predicates_of_a_rule_must_hold() -> None:
    r = router(rule("ssh", pred("dport", "22"), pred("sip", "10.0.0.0/8", negated=True)))
    assert r.route(meta(port=22, source="192.168.1.1")).outbound == "ssh"
    assert r.route(meta(port=22, source="10.1.1.1")).outbound == "proxy"
    assert r.route(meta(port=23, source="192.168.1.1")).outbound == "proxy"


def test_decision_names_the_rule_in_short_text() -> None:
    r = router(
        rule("block", pred("domain", "suffix:ads.example")),
        rule("ssh", pred("dport", "22"), pred("sip", "10.0.0.0/8", negated=True)),
    )
    assert r.route(meta("x.ads.example")).rule == "domain(suffix:ads.example)"
    assert r.route(meta("1.2.3.4", 22)).rule == "dport(22)&&!sip(10.0.0.0/8)"


def test_must_rule_matches_and_carries_must() -> None:
    r = router(rule("direct", pred("dport", "53"), must=True))
    decision = r.route(meta(port=53))
    assert decision == RouteDecision("direct", "dport(53)", True, 0)


def test_rule_without_predicates_matches_everything() -> None:
    assert router(rule("x"), rule("y")).route(meta()).outbound == "x"


def test_literal_ip_target_never_needs_resolution() -> None:
    r = router(rule("lan", pred("dip", "geoip:private")))
    assert r.route(meta("192.168.3.3")).outbound == "lan"
    assert r.route(meta("8.8.8.8")).outbound == "proxy"


def test_domain_target_reaching_a_dip_rule_needs_resolution() -> None:
    r = router(
        rule("block", pred("domain", "ads.example")),
        rule("lan", pred("dip", "geoip:private")),
    )
    assert r.route(meta("example.com")) == NeedsResolution(1)


def test_domain_rule_before_the_dip_rule_decides_without_resolution() -> None:
    r = router(
        rule("block", pred("domain", "ads.example")),
        rule("lan", pred("dip", "geoip:private")),
    )
    assert r.route(meta("x.ads.example")).outbound == "block"


def test_resolution_is_not_requested_when_the_rules_other_predicates_fail() -> None:
    r = router(rule("lan", pred("dport", "22"), pred("dip", "10.0.0.0/8")))
    assert r.route(meta("example.com", 443)).outbound == "proxy"
    assert r.route(meta("example.com", 22)) == NeedsResolution(0)


def test_ipversion_needs_resolution_too() -> None:
    r = router(rule("v6", pred("ipversion", "6")))
    assert r.route(meta("example.com")) == NeedsResolution(0)


def test_resume_after_resolution_continues_from_the_same_rule() -> None:
    r = router(
        rule("first", pred("domain", "other.test")),
        rule("lan", pred("dip", "10.0.0.0/8")),
        rule("v4", pred("ipversion", "4")),
    )
    m = meta("example.com")
    asked = r.route(m)
    assert asked == NeedsResolution(1)
    resolved = dataclasses.replace(m, resolved=ipaddress.ip_address("10.1.2.3"))
    assert r.route(resolved, start=asked.rule_index).outbound == "lan"
    public = dataclasses.replace(m, resolved=ipaddress.ip_address("93.184.216.34"))
    decision = r.route(public, start=asked.rule_index)
    assert (decision.outbound, decision.rule_index) == ("v4", 2)


def test_resume_does_not_revisit_earlier_rules() -> None:
    r = router(rule("early", pred("dport", "443")), rule("late", pred("dip", "0.0.0.0/0")))
    resolved = FlowMeta(
        Network.TCP,
        Address("1.1.1.1", 1),
        Address("example.com", 443),
        "lan",
        resolved=ipaddress.ip_address("9.9.9.9"),
    )
    assert r.route(resolved, start=1).outbound == "late"


def test_after_failed_resolution_ip_rules_do_not_match() -> None:
    r = router(
        rule("lan", pred("dip", "10.0.0.0/8")),
        rule("not-lan", pred("dip", "10.0.0.0/8", negated=True)),
        rule("dom", pred("domain", "example.com")),
    )
    m = meta("example.com")
    asked = r.route(m)
    assert asked == NeedsResolution(0)
    decision = r.route(m, start=asked.rule_index, resolution_failed=True)
    assert (decision.outbound, decision.rule_index) == ("dom", 2)


def test_failed_resolution_falls_back_when_only_ip_rules_remain() -> None:
    r = router(rule("lan", pred("dip", "geoip:private")), fallback="direct")
    assert r.route(meta("nx.invalid"), resolution_failed=True).outbound == "direct"


def test_source_ip_rules_never_need_resolution() -> None:
    r = router(rule("lan", pred("sip", "192.168.0.0/16")))
    assert r.route(meta("example.com", source="192.168.9.9")).outbound == "lan"


def test_start_out_of_range_is_rejected() -> None:
    with pytest.raises(ValueError):
        router(rule("x")).route(meta(), start=2)


def test_compiled_router_keeps_the_same_decision_objects() -> None:
    r = router(rule("a", pred("dport", "1")))
    assert r.route(meta(port=1)) is r.route(meta(port=1))
