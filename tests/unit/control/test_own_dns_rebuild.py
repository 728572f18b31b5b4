"""dae's node()/subnode() DNS rules in the desired state, the plan and the leaf build.

The upstream a node's server name is resolved by is part of the node's declaration, so a
reload that changes which upstream (or what that upstream is) rebuilds exactly the nodes it
affects, and the rebuilt leaf's connector resolves through it. Specs come from dae text.
"""

from __future__ import annotations

import asyncio
import ipaddress

import dns.message
import dns.rrset

from honk.config.load import load_text
from honk.control.desired import lower
from honk.control.plan import EMPTY, Build, Reuse, RunningState, plan
from honk.core.clock import FakeClock
from honk.dns.own import UpstreamResolver
from honk.outbound.registry import build_leaf

SERVER = "proxy.example.test"
TIMEOUT = 3.0  # seconds


def config(rules: str = "", upstream: str = "udp://192.0.2.53:53") -> str:
    return (
        "node {\n"
        f"    hk: 'socks5://{SERVER}:1080'\n"
        f"    us: 'socks5://us.example.test:1080'\n"
        "    ip: 'socks5://192.0.2.10:1080'\n"
        "}\n"
        "dns {\n"
        "    upstream {\n"
        f"        localdns: '{upstream}'\n"
        "    }\n"
        "    routing {\n"
        "        request {\n"
        f"{rules}"
        "            fallback: localdns\n"
        "        }\n"
        "    }\n"
        "}\n"
        "routing {\n    fallback: direct\n}\n"
    )


def steps(before: str, after: str) -> dict[str, str]:
    """outbound tag -> 'build' or 'reuse' going from config ``before`` to ``after``."""
    first = plan(EMPTY, lower(load_text(before, "dae")))
    running = RunningState(lower(load_text(before, "dae")), first.versions)
    second = plan(running, lower(load_text(after, "dae")))
    return {
        s.resource.tag: "build" if isinstance(s, Build) else "reuse"
        for s in second.steps
        if isinstance(s, Build | Reuse) and s.resource.kind == "outbound"
    }


def test_a_node_a_rule_selects_declares_the_upstream_that_resolves_its_server():
    desired = lower(load_text(config("            node(hk) -> localdns\n"), "dae"))
    hk, us, ip = (desired.outbound(t) for t in ("hk", "us", "ip"))
    assert hk is not None and hk.own_dns is not None and hk.own_dns.name == "localdns"
    assert us is not None and us.own_dns is None
    assert ip is not None and ip.own_dns is None


def test_adding_a_node_rule_rebuilds_only_the_nodes_it_selects():
    assert steps(config(), config("            node(hk) -> localdns\n")) == {
        "direct": "reuse",
        "block": "reuse",
        "hk": "build",
        "us": "reuse",
        "ip": "reuse",
    }


def test_removing_the_rule_rebuilds_the_node_back_onto_the_system_resolver():
    assert steps(config("            node(hk) -> localdns\n"), config())["hk"] == "build"


def test_changing_the_selected_upstream_s_address_rebuilds_the_node():
    rule = "            node(hk) -> localdns\n"
    assert steps(config(rule), config(rule, upstream="udp://192.0.2.54:53"))["hk"] == "build"


def test_an_unchanged_rule_reuses_the_node():
    rule = "            node(hk) -> localdns\n"
    assert steps(config(rule), config(rule))["hk"] == "reuse"


class Answering:
    """An exchanger answering every A question with 127.0.0.1 (and AAAA with nothing)."""

    async def exchange(self, destination, query, wire, client, *, tcp=False):  # noqa: ANN001, ANN201
        reply = dns.message.make_response(query)
        if query.question[0].rdtype == 1:
            reply.answer.append(dns.rrset.from_text(query.question[0].name, 60, "IN", "A", "127.0.0.1"))
        return reply


def test_a_built_leaf_s_connector_resolves_its_server_through_the_given_resolver():
    spec = load_text(config("            node(hk) -> localdns\n"), "dae")
    decl = lower(spec).outbound("hk")
    assert decl is not None and decl.own_dns is not None
    clock = FakeClock()
    resolver = UpstreamResolver(decl.own_dns, Answering(), clock, TIMEOUT)  # type: ignore[arg-type]
    leaf = build_leaf(decl.node, spec.global_, clock, {}, {}, resolver)
    addresses = asyncio.run(leaf.connector.resolve(SERVER, clock.now() + TIMEOUT))  # type: ignore[attr-defined]
    assert addresses == [ipaddress.ip_address("127.0.0.1")]
