"""The kernel rule table: only the expressible prefix of the rules, expanded into entries the
classifier walks first-match; and, for any packet, the kernel never picks a group that the
userspace router would not pick for the same rule."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.core.net import Address, FlowMeta, Network
from honk.ebpf.kernel_rules import (
    BYPASS_ORDER,
    DEFAULT_BYPASS,
    FAMILY_ANY,
    FAMILY_V4,
    FAMILY_V6,
    KERNEL_RULES_MAX,
    L4_ANY,
    L4_TCP,
    L4_UDP,
    NOT_A_GROUP,
    RULE_STRUCT,
    KernelRule,
    compile_kernel_rules,
)
from honk.ebpf.slots import GroupLayout
from honk.route.matchers import PRIVATE_CIDRS
from honk.route.router import RouteDecision, Router

LAYOUT = GroupLayout(("g0", "g1", "g2"), {})


def p(name: str, *values: str, negated: bool = False) -> Predicate:
    args = []
    for value in values:
        key, sep, rest = value.partition(":")
        args.append(MatchArg(key, rest) if sep and key == "geoip" else MatchArg("", value))
    return Predicate(name, tuple(args), negated)


def rule(outbound: str, *predicates: Predicate) -> RuleSpec:
    return RuleSpec(tuple(predicates), outbound)


def table(*rules: RuleSpec, limit: int = KERNEL_RULES_MAX, bypass=()):
    return compile_kernel_rules(RoutingSpec(rules), LAYOUT, bypass=bypass, limit=limit)


def net(text: str):
    return ipaddress.ip_network(text)


def test_only_the_rules_before_the_first_userspace_only_rule_reach_the_kernel():
    compiled = table(
        rule("g0", p("dip", "192.0.2.0/24")),
        rule("direct", p("domain", "example.com")),
        rule("g1", p("dport", "443")),  # expressible, but after a domain rule: never in the kernel
    )
    assert compiled.rules == 1
    assert "rule 1" in compiled.stopped and "domain" in compiled.stopped
    assert [e.order for e in compiled.entries] == [0]


@pytest.mark.parametrize(
    "predicate",
    [
        p("sip", "10.0.0.0/8"),
        p("sport", "1234"),
        p("pname", "curl"),
        p("mac", "aa:bb:cc:dd:ee:ff"),
        p("dscp", "4"),
        p("dip", "192.0.2.1", negated=True),
        p("domain", "example.com", negated=True),
    ],
)
def test_a_predicate_about_other_facts_or_a_negated_dip_stops_the_table(predicate):
    compiled = table(rule("g0", p("dport", "80")), rule("g1", p("l4proto", "udp"), predicate), rule("g2"))
    assert compiled.rules == 1 and [e.order for e in compiled.entries] == [0]


def test_a_rule_with_several_cidrs_expands_to_one_entry_each_with_the_rules_order():
    compiled = table(rule("g1", p("dip", "192.0.2.7/24", "2001:db8::/32", "198.51.100.9")), rule("g0"))
    first = [e for e in compiled.entries if e.order == 0]
    assert [(e.family, e.network) for e in first] == [
        (FAMILY_V4, net("192.0.2.0/24")),
        (FAMILY_V6, net("2001:db8::/32")),
        (FAMILY_V4, net("198.51.100.9/32")),
    ]
    assert {e.target for e in first} == {1}
    assert [(e.order, e.family, e.network) for e in compiled.entries[3:]] == [(1, FAMILY_ANY, None)]


def test_ports_merge_and_multiply_with_cidrs_and_a_protocol_pair_is_any():
    compiled = table(
        rule(
            "g0",
            p("dip", "192.0.2.0/24", "203.0.113.0/24"),
            p("dport", "53", "8000-8080", "8081-9000"),
            p("l4proto", "tcp", "udp"),
        )
    )
    assert [(str(e.network), e.dport_low, e.dport_high, e.l4proto) for e in compiled.entries] == [
        ("192.0.2.0/24", 53, 53, L4_ANY),
        ("192.0.2.0/24", 8000, 9000, L4_ANY),
        ("203.0.113.0/24", 53, 53, L4_ANY),
        ("203.0.113.0/24", 8000, 9000, L4_ANY),
    ]


def test_negated_ports_protocols_and_versions_become_their_complements():
    (entry,) = table(
        rule(
            "g0",
            p("dport", "0-1023", negated=True),
            p("l4proto", "tcp", negated=True),
            p("ipversion", "4", negated=True),
        )
    ).entries
    assert (entry.dport_low, entry.dport_high, entry.l4proto, entry.family) == (
        1024,
        65535,
        L4_UDP,
        FAMILY_V6,
    )
    (tcp,) = table(rule("g0", p("l4proto", "tcp"))).entries
    assert (tcp.l4proto, tcp.family, tcp.network) == (L4_TCP, FAMILY_ANY, None)


def test_a_rule_that_can_never_match_adds_no_entry_and_the_table_goes_on():
    compiled = table(
        rule("g0", p("l4proto", "tcp", "udp", negated=True)),
        rule(
            "g2",
            p("dport", "80"),
            p("dport", "81"),
        ),
        rule("g0", p("dport", "22")),
    )
    assert compiled.rules == 3 and [e.order for e in compiled.entries] == [2]


def test_a_geoip_list_is_left_to_the_router_and_ends_the_kernel_table():
    """geoip:cn is a geodata list the router's matcher reads: the kernel stops before it, it
    never skips the rule as one that matches nothing."""
    compiled = table(
        rule("g0", p("dport", "22")), rule("g1", p("dip", "geoip:cn")), rule("g0", p("dport", "80"))
    )
    assert compiled.rules == 1 and [e.order for e in compiled.entries] == [0]
    assert compiled.stopped is not None and "decided in userspace" in compiled.stopped


def test_ipversion_filters_the_cidrs_and_two_dips_intersect():
    compiled = table(rule("g0", p("ipversion", "6"), p("dip", "192.0.2.0/24", "2001:db8::/32")))
    assert [e.network for e in compiled.entries] == [net("2001:db8::/32")]
    both = table(rule("g0", p("dip", "192.0.2.0/24", "10.0.0.0/8"), p("dip", "192.0.2.128/25", "0.0.0.0/0")))
    assert sorted(str(e.network) for e in both.entries) == ["10.0.0.0/8", "192.0.2.0/24", "192.0.2.128/25"]


def test_geoip_private_and_ipv4_mapped_cidrs_are_read_as_the_router_reads_them():
    private = table(rule("g0", p("dip", "geoip:private"))).entries
    assert [str(e.network) for e in private] == list(PRIVATE_CIDRS)
    (mapped,) = table(rule("g0", p("dip", "::ffff:192.0.2.0/120"))).entries
    assert (mapped.family, mapped.network) == (FAMILY_V4, net("192.0.2.0/24"))


def test_group_targets_are_layout_ordinals_and_direct_block_and_nodes_pass():
    compiled = table(
        rule("g2", p("dport", "1")),
        rule("direct", p("dport", "2")),
        rule("block", p("dport", "3")),
        rule("node-a", p("dport", "4")),
        rule("g0", p("dport", "5")),
    )
    assert [e.target for e in compiled.entries] == [2, NOT_A_GROUP, NOT_A_GROUP, NOT_A_GROUP, 0]


def test_the_table_stops_before_a_rule_that_does_not_fit_whole():
    cidrs = [f"192.0.2.{i}" for i in range(6)]
    compiled = table(rule("g0", p("dip", *cidrs[:3])), rule("g1", p("dip", *cidrs)), rule("g2"), limit=8)
    assert compiled.rules == 1 and len(compiled.entries) == 3 and "limit of 8" in compiled.stopped
    exact = table(rule("g0", p("dip", *cidrs[:2])), rule("g1", p("dip", *cidrs)), limit=8)
    assert exact.rules == 2 and len(exact.entries) == 8 and exact.stopped is None
    assert table(*[rule("g0", p("dport", str(i))) for i in range(500)]).rules == KERNEL_RULES_MAX


def test_the_bypass_comes_first_and_passes():
    compiled = compile_kernel_rules(RoutingSpec((rule("g0", p("l4proto", "udp")),)), LAYOUT)
    bypass = compiled.entries[: len(DEFAULT_BYPASS)]
    assert [str(e.network) for e in bypass] == list(DEFAULT_BYPASS)
    assert {(e.order, e.target, e.l4proto) for e in bypass} == {(BYPASS_ORDER, NOT_A_GROUP, L4_ANY)}
    assert compiled.entries[-1].order == 0


def test_an_entry_packs_as_the_classifiers_struct():
    entry = KernelRule(3, FAMILY_V6, net("2001:db8::/33"), L4_UDP, 1000, 2000, 7)
    raw = entry.pack()
    assert len(raw) == RULE_STRUCT.size == 44
    addr, mask, family, plen, l4, _, low, high, target = RULE_STRUCT.unpack(raw)
    assert addr == net("2001:db8::/33").network_address.packed
    assert mask == b"\xff" * 4 + b"\x80" + b"\0" * 11
    assert (family, plen, l4, low, high, target) == (6, 33, 17, 1000, 2000, 7)
    v4 = KernelRule(0, FAMILY_V4, net("192.0.2.0/24"), L4_ANY, 0, 65535, NOT_A_GROUP).pack()
    assert v4[:16] == bytes([192, 0, 2, 0]) + bytes(12) and v4[16:32] == b"\xff\xff\xff\0" + bytes(12)


# --- the kernel never disagrees with the router --------------------------------------------------


def kernel_pick(
    entries: tuple[KernelRule, ...], family: int, l4: int, ip: bytes, dport: int
) -> KernelRule | None:
    """The classifier's walk, on the packed entries."""
    words = ip.ljust(16, b"\0")
    for entry in entries:
        addr, mask, e_family, _, e_l4, _, low, high, _ = RULE_STRUCT.unpack(entry.pack())
        if e_family and e_family != family or e_l4 and e_l4 != l4 or not low <= dport <= high:
            continue
        if all(w & m == a for w, m, a in zip(words, mask, addr, strict=True)):
            return entry
    return None


ADDRESSES = [
    "192.0.2.1",
    "192.0.2.200",
    "198.51.100.7",
    "10.1.2.3",
    "2001:db8::1",
    "2001:db8:8000::5",
    "fe80::1",
]
PREDICATES = st.one_of(
    st.builds(
        lambda v, n: p("dip", *v, negated=n),
        st.lists(
            st.sampled_from(
                [
                    "192.0.2.0/24",
                    "192.0.2.128/25",
                    "2001:db8::/33",
                    "10.0.0.0/8",
                    "geoip:private",
                    "::ffff:198.51.100.0/120",
                ]
            ),
            max_size=3,
        ),
        st.sampled_from([False, False, False, True]),
    ),
    st.builds(
        lambda v, n: p("dport", *v, negated=n),
        st.lists(st.sampled_from(["53", "80", "443", "1000-2000", "1500-3000"]), min_size=1, max_size=3),
        st.booleans(),
    ),
    st.builds(
        lambda v, n: p("l4proto", *v, negated=n),
        st.lists(st.sampled_from(["tcp", "udp"]), max_size=2),
        st.booleans(),
    ),
    st.builds(lambda v, n: p("ipversion", v, negated=n), st.sampled_from(["4", "6"]), st.booleans()),
    st.just(p("domain", "example.com")),
)
RULES = st.lists(
    st.tuples(st.sampled_from(["g0", "g1", "g2", "direct", "node-a"]), st.lists(PREDICATES, max_size=3)).map(
        lambda t: rule(t[0], *t[1])
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    rules=RULES,
    address=st.sampled_from(ADDRESSES),
    network=st.sampled_from([Network.TCP, Network.UDP]),
    dport=st.sampled_from([53, 80, 443, 999, 1000, 1700, 2500, 3001]),
    limit=st.sampled_from([4, 64]),
)
def test_the_kernel_picks_a_group_only_where_the_router_picks_it_by_the_same_rule(
    rules, address, network, dport, limit
):
    routing = RoutingSpec(tuple(rules))
    compiled = compile_kernel_rules(routing, LAYOUT, bypass=(), limit=limit)
    ip = ipaddress.ip_address(address)
    meta = FlowMeta(network, Address("192.0.2.99", 40000), Address(address, dport), "lan")
    decision = Router.compile(routing).route(meta)
    assert isinstance(decision, RouteDecision)
    picked = kernel_pick(
        compiled.entries, ip.version, L4_TCP if network is Network.TCP else L4_UDP, ip.packed, dport
    )
    if picked is not None:  # the kernel decides: exactly the router's rule
        assert picked.order == decision.rule_index
        expected = LAYOUT.ordinal(decision.outbound) if decision.outbound in LAYOUT.groups else NOT_A_GROUP
        assert picked.target == expected
    else:  # the kernel passes: the router's rule is not in the table, or it targets nothing
        assert decision.rule_index is None or decision.rule_index >= compiled.rules
