"""Hypothesis: the compiled router agrees with a naive reference evaluator."""

from __future__ import annotations

import dataclasses
import ipaddress
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.core.net import Address, FlowMeta, Network
from honk.route.matchers import PRIVATE_CIDRS
from honk.route.router import NeedsResolution, Router

HOSTS = [
    "example.com",
    "a.example.com",
    "badexample.com",
    "ads.example",
    "x.ads.example",
    "tracker.net",
    "bad42.example",
    "com",
]
IPS = [
    "10.1.2.3",
    "192.168.1.1",
    "8.8.8.8",
    "203.0.113.5",
    "2001:db8::1",
    "fd00::5",
    "::ffff:10.9.9.9",
    "2606:4700::1",
]
PORTS = [22, 80, 443, 1500, 8085, 9999]

DOMAIN_ARGS = (
    [MatchArg("", s) for s in ("example.com", "com", "ads.example", "net")]
    + [MatchArg("suffix", s) for s in ("example.com", "example")]
    + [MatchArg("full", h) for h in ("example.com", "x.ads.example")]
    + [MatchArg("keyword", k) for k in ("ads", "exa", "bad", "track")]
    + [MatchArg("regex", r) for r in (r"^bad[0-9]+", r"\.net$", r"^a\.")]
)
CIDR_ARGS = [
    MatchArg("", c)
    for c in ("10.0.0.0/8", "192.168.0.0/16", "203.0.113.0/24", "2001:db8::/32", "fc00::/7", "8.8.8.8")
] + [MatchArg("geoip", "private")]
PORT_ARGS = [MatchArg("", p) for p in ("22", "80", "443", "1000-2000", "8080-8090")]

PRIVATE = [ipaddress.ip_network(c) for c in PRIVATE_CIDRS]


def args_of(pool: list[MatchArg]) -> st.SearchStrategy[tuple[MatchArg, ...]]:
    return st.lists(st.sampled_from(pool), min_size=1, max_size=3).map(tuple)


predicates = st.one_of(
    st.builds(Predicate, st.just("domain"), args_of(DOMAIN_ARGS), st.booleans()),
    st.builds(Predicate, st.sampled_from(["dip", "sip"]), args_of(CIDR_ARGS), st.booleans()),
    st.builds(Predicate, st.sampled_from(["dport", "sport"]), args_of(PORT_ARGS), st.booleans()),
    st.builds(
        Predicate, st.just("l4proto"), args_of([MatchArg("", "tcp"), MatchArg("", "udp")]), st.booleans()
    ),
    st.builds(
        Predicate, st.just("ipversion"), args_of([MatchArg("", "4"), MatchArg("", "6")]), st.booleans()
    ),
    st.builds(
        Predicate, st.sampled_from(["pname", "mac", "dscp"]), args_of([MatchArg("", "x")]), st.booleans()
    ),
)
rules = st.lists(
    st.builds(
        RuleSpec,
        st.lists(predicates, min_size=1, max_size=3).map(tuple),
        st.sampled_from(["a", "b", "c"]),
        st.booleans(),
    ),
    max_size=8,
)


@dataclasses.dataclass(frozen=True)
class Case:
    meta: FlowMeta
    answer: str | None  # what the resolver would return for a domain target; None = failure


@st.composite
def cases(draw: st.DrawFn) -> Case:
    network = draw(st.sampled_from(list(Network)))
    source = Address(draw(st.sampled_from(IPS)), draw(st.sampled_from(PORTS)))
    port = draw(st.sampled_from(PORTS))
    if draw(st.booleans()):
        return Case(FlowMeta(network, source, Address(draw(st.sampled_from(IPS)), port), "lan"), None)
    host = draw(st.sampled_from(HOSTS))
    mode = draw(st.sampled_from(["pre-resolved", "on-demand", "fails"]))
    ip = draw(st.sampled_from(IPS))
    resolved = ipaddress.ip_address(ip) if mode == "pre-resolved" else None
    answer = ip if mode == "on-demand" else None
    return Case(FlowMeta(network, source, Address(host, port), "lan", resolved=resolved), answer)


# --- the reference: obvious, slow, written from the rules' wording ---------------------


def unmapped(ip):
    return ip.ipv4_mapped if ip is not None and ip.version == 6 and ip.ipv4_mapped else ip


def ref_domain(arg: MatchArg, host: str) -> bool:
    if arg.key in ("", "suffix"):
        return host == arg.value or host.endswith("." + arg.value)
    if arg.key == "full":
        return host == arg.value
    if arg.key == "keyword":
        return arg.value in host
    return re.search(arg.value, host, re.IGNORECASE) is not None


def ref_ip(arg: MatchArg, ip) -> bool:
    if arg.key == "geoip":
        return any(ip in net for net in PRIVATE if net.version == ip.version)
    net = ipaddress.ip_network(arg.value)
    return net.version == ip.version and ip in net


def ref_port(arg: MatchArg, port: int) -> bool:
    low, _, high = arg.value.partition("-")
    return int(low) <= port <= int(high or low)


def ref_predicate(p: Predicate, meta: FlowMeta, dst) -> bool:
    """Truth of a predicate with negation applied; dst None = resolution failed."""
    if p.name in ("dip", "ipversion") and dst is None:
        return False  # the failed-resolution rule: never matches either way
    if p.name == "domain":
        host = meta.target.host if meta.target.is_domain else None
        hit = host is not None and any(ref_domain(a, host) for a in p.args)
    elif p.name == "dip":
        hit = any(ref_ip(a, dst) for a in p.args)
    elif p.name == "sip":
        hit = any(ref_ip(a, unmapped(meta.source.ip)) for a in p.args)
    elif p.name == "dport":
        hit = any(ref_port(a, meta.target.port) for a in p.args)
    elif p.name == "sport":
        hit = any(ref_port(a, meta.source.port) for a in p.args)
    elif p.name == "l4proto":
        hit = any(a.value == meta.network.value for a in p.args)
    elif p.name == "ipversion":
        hit = any(int(a.value) == dst.version for a in p.args)
    else:
        hit = False
    return hit != p.negated


def reference(spec: RoutingSpec, case: Case) -> tuple[str, int | None, bool]:
    meta = case.meta
    if meta.destination_ip is not None:
        dst = meta.destination_ip
    else:
        dst = None if case.answer is None else ipaddress.ip_address(case.answer)
    dst = unmapped(dst)
    for index, r in enumerate(spec.rules):
        if all(ref_predicate(p, meta, dst) for p in r.predicates):
            return r.outbound, index, r.must
    return spec.fallback, None, False


def drive(router: Router, case: Case) -> tuple[str, int | None, bool]:
    meta = case.meta
    result = router.route(meta)
    if isinstance(result, NeedsResolution):
        if case.answer is not None:
            result = router.route(
                dataclasses.replace(meta, resolved=ipaddress.ip_address(case.answer)), start=result.rule_index
            )
        else:
            result = router.route(meta, start=result.rule_index, resolution_failed=True)
    assert not isinstance(result, NeedsResolution)
    return result.outbound, result.rule_index, result.must


@settings(max_examples=400, deadline=None)
@given(rules, cases())
def test_compiled_router_agrees_with_the_reference_evaluator(rule_list: list[RuleSpec], case: Case) -> None:
    spec = RoutingSpec(rules=tuple(rule_list), fallback="fallback-target")
    assert drive(Router.compile(spec), case) == reference(spec, case)


@settings(max_examples=200, deadline=None)
@given(rules, cases())
def test_router_asks_for_resolution_only_for_domain_targets_without_an_ip(
    rule_list: list[RuleSpec], case: Case
) -> None:
    result = Router.compile(RoutingSpec(rules=tuple(rule_list))).route(case.meta)
    if isinstance(result, NeedsResolution):
        assert case.meta.destination_ip is None
        assert any(p.name in ("dip", "ipversion") for p in rule_list[result.rule_index].predicates)
