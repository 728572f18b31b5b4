"""dae's sub()/node()/subnode() rules (honk.dns.own): which upstream resolves the daemon's own
lookups, and the resolver that asks it. A fake exchanger stands for the upstreams, a FakeClock
for time.

The matching cases are dae's component/daedns/router.go and router_test.go: arguments are
alternatives, ``&&`` joins calls, subnode rules come before node rules and only for nodes from a
subscription, sub rules only for subscription fetches, and no match means no rule (never the
request fallback).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from honk.config.links import parse_node_link
from honk.config.load import load_text
from honk.config.spec import DnsSpec, DnsUpstreamSpec, NodeSpec, SubscriptionSpec
from honk.core.clock import FakeClock
from honk.core.errors import DialError, DialTimeout
from honk.core.net import Address
from honk.dns.own import OwnLookups, UpstreamResolver, node_upstream, subscription_upstream
from honk.dns.upstream import Destination, ExchangeFailed
from honk.outbound.direct import DirectOutbound
from honk.route.resolve import ResolveError, ResolveTimeout

TIMEOUT = 3.0  # seconds a fake lookup may take
ANSWER_TTL = 60
SERVER = "proxy.example.test"
UPSTREAMS = ("nodedns", "subnodedns", "subdns", "fallbackdns")


def dns_spec(*rules: str) -> DnsSpec:
    """A dns section with four upstreams, ``rules`` in its request block and a fallback upstream."""
    upstreams = "".join(f"        {name}: 'udp://192.0.2.{i + 1}:53'\n" for i, name in enumerate(UPSTREAMS))
    body = "".join(f"            {r}\n" for r in rules)
    text = (
        f"dns {{\n    upstream {{\n{upstreams}    }}\n    routing {{\n        request {{\n{body}"
        "            fallback: fallbackdns\n        }\n    }\n}\n"
    )
    spec = load_text(text, "dae").dns
    assert spec is not None
    return spec


def node(name: str, subscription: str = "", host: str = SERVER) -> NodeSpec:
    return NodeSpec(name=name, protocol="socks5", host=host, port=1080, subscription=subscription)


def chosen(spec: DnsSpec, n: NodeSpec) -> str | None:
    upstream = node_upstream(spec, n)
    return upstream.name if upstream is not None else None


def chosen_for_sub(spec: DnsSpec, name: str, url: str = "https://sub.example.test/list") -> str | None:
    upstream = subscription_upstream(spec, SubscriptionSpec(name, url))
    return upstream.name if upstream is not None else None


# --- node() ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "name", "expected"),
    [
        ("node(hk-01) -> nodedns", "hk-01", "nodedns"),
        ("node(hk-01) -> nodedns", "hk-011", None),  # a bare name is the whole name
        ("node(name: hk-01) -> nodedns", "hk-01", "nodedns"),
        ("node(name_keyword: hk) -> nodedns", "tokyo-hk-2", "nodedns"),
        ("node(name_keyword: hk) -> nodedns", "tokyo-2", None),
        ("node(name_regex: '^jp-\\d+$') -> nodedns", "jp-12", "nodedns"),
        ("node(name_regex: 'jp') -> nodedns", "my-jp-node", "nodedns"),  # a search, as regexp2's MatchString
        ("node(name_regex: '^jp') -> nodedns", "my-jp-node", None),
        ("node() -> nodedns", "anything", "nodedns"),
        ("!node(name_keyword: hk) -> nodedns", "jp-1", "nodedns"),
        ("!node(name_keyword: hk) -> nodedns", "hk-1", None),
    ],
)
def test_a_node_rule_matches_each_argument_form_as_dae_does(rule, name, expected):
    assert chosen(dns_spec(rule), node(name)) == expected


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("node(link_keyword: 'edge.example.test') -> nodedns", "nodedns"),
        ("node(link_keyword: vmess) -> nodedns", None),
        ("node(link_regex: '^socks5://[^@]+@') -> nodedns", "nodedns"),
        ("subnode(link_keyword: socks5) -> nodedns", "nodedns"),
    ],
)
def test_link_keys_test_the_nodes_share_link_as_written(rule, expected):
    n = parse_node_link("socks5://user:pw@edge.example.test:1080#hk-1")
    assert n.link == "socks5://user:pw@edge.example.test:1080#hk-1"
    n = dataclasses.replace(n, subscription="paid") if rule.startswith("subnode") else n
    assert chosen(dns_spec(rule), n) == expected


def test_a_node_call_s_arguments_are_alternatives_even_across_keys():
    spec = dns_spec("node(hk-01, name_keyword: jp) -> nodedns")
    assert chosen(spec, node("hk-01")) == "nodedns"
    assert chosen(spec, node("osaka-jp")) == "nodedns"
    assert chosen(spec, node("us-1")) is None


def test_calls_joined_by_and_must_all_match():
    spec = dns_spec("node(name_keyword: hk) && !node(name_keyword: slow) -> nodedns")
    assert chosen(spec, node("hk-fast")) == "nodedns"
    assert chosen(spec, node("hk-slow")) is None


def test_the_first_matching_rule_wins():
    spec = dns_spec("node(name_keyword: hk) -> nodedns", "node() -> subdns")
    assert chosen(spec, node("hk-1")) == "nodedns"
    assert chosen(spec, node("us-1")) == "subdns"


def test_no_matching_rule_means_the_ordinary_resolver_not_the_request_fallback():
    spec = dns_spec("node(hk-01) -> nodedns")
    assert spec.request_fallback == "fallbackdns"
    assert chosen(spec, node("us-1")) is None


def test_a_node_whose_server_is_an_ip_literal_looks_nothing_up():
    assert chosen(dns_spec("node() -> nodedns"), node("hk-01", host="192.0.2.7")) is None


def test_without_own_rules_or_a_dns_section_no_node_has_an_upstream():
    assert node_upstream(None, node("hk-01")) is None
    assert chosen(dns_spec("qname(example.test) -> nodedns"), node("hk-01")) is None


# --- subnode() ------------------------------------------------------------------------------


def test_a_subnode_rule_is_checked_before_node_rules_written_above_it():
    """router_test.go TestRouterMatchNodeUpstreamPrefersSubNodeOverNode."""
    spec = dns_spec("node(hk-01) -> nodedns", "subnode(subtag: my_sub, name: hk-01) -> subnodedns")
    assert chosen(spec, node("hk-01", subscription="my_sub")) == "subnodedns"
    assert chosen(spec, node("hk-01")) == "nodedns"


def test_a_catch_all_subnode_matches_only_nodes_from_a_subscription():
    """router_test.go TestRouterMatchNodeUpstreamCatchAllSubNodeOnlyMatchesSubscriptionNodes."""
    spec = dns_spec("node() -> nodedns", "subnode() -> subnodedns")
    assert chosen(spec, node("hk-01", subscription="my_sub")) == "subnodedns"
    assert chosen(spec, node("manual-node")) == "nodedns"


@pytest.mark.parametrize(
    ("rule", "subscription", "name", "expected"),
    [
        ("subnode(my_sub) -> subnodedns", "my_sub", "x", "subnodedns"),
        ("subnode(subtag: my_sub) -> subnodedns", "other", "x", None),
        ("subnode(subtag_regex: '^paid') -> subnodedns", "paid-2", "x", "subnodedns"),
        ("subnode(regex: '^paid') -> subnodedns", "free", "x", None),
        ("subnode(name_keyword: hk) -> subnodedns", "any", "hk-1", "subnodedns"),
        ("subnode(name_regex: '^hk') -> subnodedns", "any", "jp-1", None),
        ("subnode(name: hk-1) -> subnodedns", "any", "hk-1", "subnodedns"),
        ("!subnode(my_sub) -> subnodedns", "other", "x", "subnodedns"),
    ],
)
def test_a_subnode_rule_matches_each_argument_form_as_dae_does(rule, subscription, name, expected):
    assert chosen(dns_spec(rule), node(name, subscription=subscription)) == expected


def test_a_subnode_rule_never_matches_a_node_declared_in_the_file():
    assert chosen(dns_spec("!subnode(my_sub) -> subnodedns"), node("x")) is None


def test_a_subscription_node_no_subnode_rule_matches_goes_on_to_the_node_rules():
    spec = dns_spec("subnode(other) -> subnodedns", "node(name_keyword: hk) -> nodedns")
    assert chosen(spec, node("hk-1", subscription="my_sub")) == "nodedns"


# --- sub() ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "name", "url", "expected"),
    [
        ("sub() -> subdns", "any", "https://a.example.test/", "subdns"),
        ("sub(my_sub) -> subdns", "my_sub", "https://a.example.test/", "subdns"),
        ("sub(tag: my_sub) -> subdns", "their_sub", "https://a.example.test/", None),
        ("sub(tag_regex: 'sub$') -> subdns", "their_sub", "https://a.example.test/", "subdns"),
        (
            "sub(link_keyword: special-provider) -> subdns",
            "x",
            "https://special-provider.example.test/s",
            "subdns",
        ),
        ("sub(link_regex: '^https://b\\.') -> subdns", "x", "https://a.example.test/", None),
    ],
)
def test_a_sub_rule_matches_a_subscription_by_tag_or_url(rule, name, url, expected):
    """router_test.go TestRouterMatchSubscriptionUpstream."""
    assert chosen_for_sub(dns_spec(rule), name, url) == expected


def test_sub_and_node_rules_each_select_only_their_own_lookups():
    """router_test.go TestRouterDoesNotInheritSubscriptionSelectorToNodes."""
    spec = dns_spec("sub(my_sub) -> subdns", "node(my_sub) -> nodedns")
    assert chosen(spec, node("hk-01", subscription="my_sub")) is None
    assert chosen_for_sub(spec, "my_sub") == "subdns"
    assert chosen_for_sub(dns_spec("node() -> nodedns", "subnode() -> subnodedns"), "my_sub") is None


# --- the resolver ---------------------------------------------------------------------------


def answer(
    query: dns.message.Message, *addresses: str, rcode: int = dns.rcode.NOERROR
) -> dns.message.Message:
    reply = dns.message.make_response(query)
    reply.set_rcode(rcode)
    question = query.question[0]
    matching = [
        a for a in addresses if ipaddress.ip_address(a).version == (6 if question.rdtype == 28 else 4)
    ]
    if matching:
        reply.answer.append(
            dns.rrset.from_text(
                question.name, ANSWER_TTL, "IN", dns.rdatatype.to_text(question.rdtype), *matching
            )
        )
    return reply


class FakeExchanger:
    """Answers each A/AAAA question from ``addresses`` (or ``fail``: raise it; ``hang``: never)."""

    def __init__(
        self,
        *addresses: str,
        fail: Exception | None = None,
        rcode: int = dns.rcode.NOERROR,
        hang: bool = False,
    ) -> None:
        self.addresses = addresses
        self.fail = fail
        self.rcode = rcode
        self.hang = hang
        self.asked: list[tuple[Destination, str, str]] = []
        self.both_asked: asyncio.Event | None = None  # set once A and AAAA were both asked

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        question = query.question[0]
        assert wire == query.to_wire() and client is None
        self.asked.append((destination, question.name.to_text(), dns.rdatatype.to_text(question.rdtype)))
        if self.hang:
            if len(self.asked) == len(("A", "AAAA")) and self.both_asked is not None:
                self.both_asked.set()
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail
        return answer(query, *self.addresses, rcode=self.rcode)


UPSTREAM = DnsUpstreamSpec("nodedns", "tcp", "192.0.2.53", 5353, "proxy-group")


def resolver(exchanger: FakeExchanger, clock: FakeClock | None = None) -> UpstreamResolver:
    return UpstreamResolver(UPSTREAM, exchanger, clock or FakeClock(), TIMEOUT)  # type: ignore[arg-type]


def test_the_resolver_asks_a_and_aaaa_of_the_chosen_upstream_as_the_dns_service_would():
    exchanger = FakeExchanger("2001:db8::1", "127.0.0.1")
    addresses = asyncio.run(resolver(exchanger)(SERVER))
    assert addresses == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("2001:db8::1")]
    destination = Destination("nodedns", "tcp", Address("192.0.2.53", 5353), "proxy-group")
    assert sorted(exchanger.asked, key=lambda a: a[2]) == [
        (destination, f"{SERVER}.", "A"),
        (destination, f"{SERVER}.", "AAAA"),
    ]


def test_the_resolver_returns_distinct_addresses_in_answer_order_ipv4_first():
    exchanger = FakeExchanger("10.0.0.2", "10.0.0.1", "10.0.0.2", "2001:db8::2")
    addresses = asyncio.run(resolver(exchanger)(SERVER))
    assert [str(a) for a in addresses] == ["10.0.0.2", "10.0.0.1", "2001:db8::2"]


def test_an_ip_literal_is_returned_without_a_lookup():
    exchanger = FakeExchanger()
    assert asyncio.run(resolver(exchanger)("192.0.2.9")) == [ipaddress.ip_address("192.0.2.9")]
    assert exchanger.asked == []


def test_one_family_failing_still_gives_the_other_s_addresses():
    class HalfBroken(FakeExchanger):
        async def exchange(self, destination, query, wire, client, *, tcp=False):  # noqa: ANN001, ANN202
            if query.question[0].rdtype == dns.rdatatype.AAAA:
                raise ExchangeFailed("closed")
            return await super().exchange(destination, query, wire, client)

    assert asyncio.run(resolver(HalfBroken("127.0.0.1"))(SERVER)) == [ipaddress.ip_address("127.0.0.1")]


@pytest.mark.parametrize(
    ("exchanger", "error"),
    [
        (FakeExchanger(), ResolveError),  # NOERROR without an address
        (FakeExchanger(rcode=dns.rcode.NXDOMAIN), ResolveError),
        (FakeExchanger(fail=ExchangeFailed("dial-connect")), ResolveError),
        (FakeExchanger(fail=ExchangeFailed("timeout")), ResolveTimeout),
    ],
)
def test_a_failed_lookup_raises_the_ordinary_resolver_s_errors(exchanger, error):
    with pytest.raises(error) as caught:
        asyncio.run(resolver(exchanger)(SERVER))
    assert caught.value.host == SERVER and "nodedns" in str(caught.value)


def test_a_lookup_past_its_deadline_on_the_injected_clock_is_a_resolve_timeout():
    async def scenario() -> None:
        clock = FakeClock()
        exchanger = FakeExchanger(hang=True)
        exchanger.both_asked = asyncio.Event()
        lookup = asyncio.ensure_future(resolver(exchanger, clock)(SERVER))
        await exchanger.both_asked.wait()
        clock.advance(TIMEOUT)
        with pytest.raises(ResolveTimeout):
            await lookup

    asyncio.run(scenario())


def test_a_direct_dial_through_the_resolver_fails_in_the_resolve_phase_as_with_the_system_resolver():
    async def scenario() -> None:
        clock = FakeClock()
        outbound = DirectOutbound(
            clock, TIMEOUT, name="hk-01", resolver=resolver(FakeExchanger(rcode=dns.rcode.NXDOMAIN), clock)
        )
        with pytest.raises(DialError) as caught:
            await outbound.connect(Address(SERVER, 1080), clock.now() + TIMEOUT)
        assert caught.value.phase == "resolve" and not isinstance(caught.value, DialTimeout)

    asyncio.run(scenario())


def test_own_lookups_hands_out_a_resolver_only_for_what_a_rule_selects():
    spec = dns_spec("node(hk-01) -> nodedns", "sub(paid) -> subdns")
    own = OwnLookups(spec, FakeExchanger(), FakeClock(), TIMEOUT)  # type: ignore[arg-type]
    hk = own.for_node(node("hk-01"))
    assert isinstance(hk, UpstreamResolver) and hk.upstream == spec.upstream("nodedns")
    assert own.for_node(node("us-01")) is None
    paid = own.for_subscription(SubscriptionSpec("paid", "https://sub.example.test/"))
    assert isinstance(paid, UpstreamResolver) and paid.upstream == spec.upstream("subdns")
    assert own.for_subscription(SubscriptionSpec("free", "https://sub.example.test/")) is None
