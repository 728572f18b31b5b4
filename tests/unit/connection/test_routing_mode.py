"""The Clash mode: rule routing by default, everything to GLOBAL's choice in global mode, and
everything direct in direct mode, decided per flow without touching the plane."""

from __future__ import annotations

import pytest

from honk.config.load import load_text
from honk.connection.dispatch import Dispatcher
from honk.connection.mode import RoutingMode
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.net import Address, FlowMeta, Network

CONFIG = """
node {
    a: 'socks5://127.0.0.1:1080'
    b: 'socks5://127.0.0.1:1081'
}
group {
    proxy {
        filter: name(a, b)
    }
}
routing {
    dport(22) -> block
    fallback: proxy
}
"""


def dispatcher(mode: RoutingMode) -> Dispatcher:
    clock = FakeClock()
    spec = load_text(CONFIG, "dae")
    d = Dispatcher(
        build_plane(spec, clock, 1), ConnectionTracker(clock), clock, spec.global_, SystemResolver(clock, 1.0)
    )
    d.mode = mode
    return d


def meta(port: int = 443) -> FlowMeta:
    return FlowMeta(
        network=Network.TCP,
        inbound="lan",
        source=Address("127.0.0.1", 5000),
        target=Address("example.com", port),
    )


def test_rule_mode_routes_by_the_rules():
    d = dispatcher(RoutingMode("rule"))
    assert d.route_now(meta(22)).leaf.name == "block"
    routed = d.route_now(meta())
    assert routed.chain == ("proxy", "a") and routed.rule == "fallback"


def test_direct_mode_sends_every_flow_direct_whatever_the_rules_say():
    d = dispatcher(RoutingMode("Direct"))
    for port in (22, 443):
        routed = d.route_now(meta(port))
        assert routed.leaf.name == "direct" and routed.rule == "mode(direct)"


async def test_global_mode_sends_every_flow_to_the_global_choice():
    mode = RoutingMode("global")
    d = dispatcher(mode)
    assert (await d.route(meta(22))).leaf.name == "direct"  # GLOBAL serves direct until chosen
    mode.global_choice = "proxy"
    routed = await d.route(meta(22))
    assert routed.chain == ("proxy", "a") and routed.rule == "mode(global)"
    mode.global_choice = "b"
    assert d.route_now(meta()).leaf.name == "b"
    mode.set("rule")
    assert d.route_now(meta(22)).leaf.name == "block"


def test_an_unknown_mode_is_refused():
    mode = RoutingMode()
    with pytest.raises(ValueError, match="rule, global, direct"):
        mode.set("script")
    assert mode.mode == "rule"
