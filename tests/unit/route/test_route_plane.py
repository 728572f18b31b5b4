"""Plane: build from a Spec, decide a flow through routing, DNS and groups."""

from __future__ import annotations

import ipaddress

import pytest

from honk.config.spec import (
    FilterTerm,
    GroupSpec,
    MatchArg,
    NodeFilter,
    NodeSpec,
    Predicate,
    RoutingSpec,
    RuleSpec,
    Spec,
)
from honk.connection.plane import Decision, build_plane
from honk.core.clock import FakeClock
from honk.core.errors import NoRoute
from honk.core.net import Address, FlowMeta, Network
from honk.route.resolve import ResolveError


class FakeResolver:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str) -> list:
        self.asked.append(host)
        if host not in self.answers:
            raise ResolveError(host, "no such name")
        return [ipaddress.ip_address(a) for a in self.answers[host]]


def rule(outbound: str, name: str, value: str, key: str = "", must: bool = False) -> RuleSpec:
    return RuleSpec((Predicate(name, (MatchArg(key, value),)),), outbound, must)


SPEC = Spec(
    nodes=(NodeSpec("hk-1", "socks5", "127.0.0.1", 1080), NodeSpec("hk-2", "socks5", "127.0.0.1", 1081)),
    groups=(
        GroupSpec(
            "proxy",
            filters=(NodeFilter((FilterTerm("name", (MatchArg("keyword", "hk"),)),)),),
            has_filter_lines=True,
        ),
        GroupSpec("empty", has_filter_lines=True),
    ),
    routing=RoutingSpec(
        rules=(
            rule("block", "domain", "ads.example", key="suffix"),
            rule("direct", "dip", "private", key="geoip", must=True),
            rule("empty", "dport", "25"),
        ),
        fallback="proxy",
    ),
)


def meta(target: str, port: int = 443) -> FlowMeta:
    return FlowMeta(Network.TCP, Address("192.168.1.2", 40000), Address(target, port), "lan")


async def test_decide_resolves_a_group_to_its_leaf_with_the_chain() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    resolver = FakeResolver({"example.com": ["93.184.216.34"]})
    decision = await plane.decide(meta("example.com"), resolver)
    assert isinstance(decision, Decision)
    assert decision.route.rule == "fallback"
    assert decision.selection.chain == ("proxy", "hk-1")
    assert decision.resolved == ipaddress.ip_address("93.184.216.34")


async def test_decide_skips_dns_when_an_earlier_rule_decides() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    resolver = FakeResolver({})
    decision = await plane.decide(meta("x.ads.example"), resolver)
    assert decision.selection.chain == ("block",)
    assert resolver.asked == []


async def test_decide_uses_the_resolved_ip_for_dip_rules() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    resolver = FakeResolver({"nas.lan": ["192.168.1.5"]})
    decision = await plane.decide(meta("nas.lan"), resolver)
    assert (decision.route.outbound, decision.route.must) == ("direct", True)
    assert resolver.asked == ["nas.lan"]


async def test_decide_after_failed_resolution_skips_ip_rules() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    decision = await plane.decide(meta("nx.invalid"), FakeResolver({}))
    assert decision.route.outbound == "proxy"
    assert decision.resolved is None


async def test_decide_raises_no_route_for_an_empty_group_without_final() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    assert (await plane.decide(meta("10.9.9.9", 25), FakeResolver({}))).route.outbound == "direct"
    with pytest.raises(NoRoute):
        await plane.decide(meta("8.8.8.8", 25), FakeResolver({}))


async def test_decide_literal_ip_never_calls_the_resolver() -> None:
    plane = build_plane(SPEC, FakeClock(), generation=1)
    resolver = FakeResolver({})
    assert (await plane.decide(meta("10.1.1.1"), resolver)).route.outbound == "direct"
    assert resolver.asked == []


def test_build_plane_carries_selector_choices_from_the_previous_plane() -> None:
    first = build_plane(SPEC, FakeClock(), generation=1)
    first.groups.select("proxy", "hk-2")
    second = build_plane(SPEC, FakeClock(), generation=2, previous=first)
    assert second.generation == 2
    assert second.groups.resolve("proxy", Network.TCP).chain == ("proxy", "hk-2")
    assert second.outbounds is not first.outbounds
    assert second.spec is SPEC


def test_build_plane_warns_about_route_targets_that_name_nothing(caplog: pytest.LogCaptureFixture) -> None:
    spec = Spec(routing=RoutingSpec(fallback="nowhere"))
    build_plane(spec, FakeClock(), generation=1)
    assert "nowhere" in caplog.text
