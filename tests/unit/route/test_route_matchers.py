"""Each traffic matcher kind, positive and negated, through compiled predicates."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from helpers.geodata import geoip_bytes, geosite_bytes, write_geodata
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.core.net import Address, FlowMeta, Network
from honk.geo import dat
from honk.geo.assets import GeoAssets
from honk.route.matchers import FlowView, RouteCompileError, compile_predicate, describe_predicate
from honk.route.router import Router

KEYS = ("suffix", "full", "keyword", "regex", "geosite", "geoip")


def arg(text: str) -> MatchArg:
    key, sep, value = text.partition(":")
    if sep and key in KEYS:
        return MatchArg(key, value)
    return MatchArg("", text)


def pred(name: str, *args: str, negated: bool = False) -> Predicate:
    return Predicate(name, tuple(arg(a) for a in args), negated)


def flow(
    target: str = "example.com",
    port: int = 443,
    source: str = "192.168.1.10",
    sport: int = 50000,
    network: Network = Network.TCP,
    resolved: str | None = None,
) -> FlowView:
    return FlowView.of(
        FlowMeta(
            network=network,
            source=Address(source, sport),
            target=Address(target, port),
            inbound="lan",
            resolved=None if resolved is None else ipaddress.ip_address(resolved),
        )
    )


def holds(predicate: Predicate, view: FlowView, geo: GeoAssets | None = None) -> bool:
    """What the router does with a matcher: negation applied on top."""
    return compile_predicate(predicate, geo).match(view) is not predicate.negated


# --- domain ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("example.com", True),
        ("a.example.com", True),
        ("a.b.example.com", True),
        ("badexample.com", False),
        ("example.com.evil", False),
        ("com", False),
    ],
)
def test_bare_domain_is_a_suffix_on_a_label_boundary(host: str, expected: bool) -> None:
    assert holds(pred("domain", "example.com"), flow(host)) is expected


def test_suffix_key_behaves_like_a_bare_domain() -> None:
    p = pred("domain", "suffix:ads.example")
    assert holds(p, flow("x.ads.example"))
    assert not holds(p, flow("xads.example"))


def test_domain_matching_ignores_case_and_trailing_dot() -> None:
    assert holds(pred("domain", "Example.COM."), flow("WWW.example.com."))


def test_full_domain_matches_only_the_exact_name() -> None:
    p = pred("domain", "full:api.example.com")
    assert holds(p, flow("api.example.com"))
    assert not holds(p, flow("v2.api.example.com"))
    assert not holds(p, flow("example.com"))


def test_keyword_domain_matches_a_substring() -> None:
    p = pred("domain", "keyword:tracker")
    assert holds(p, flow("cdn-tracker1.example.net"))
    assert not holds(p, flow("example.net"))


def test_regex_domain_uses_search() -> None:
    p = pred("domain", r"regex:^bad[0-9]+\.example$")
    assert holds(p, flow("bad42.example"))
    assert not holds(p, flow("bad.example"))
    assert holds(pred("domain", r"regex:[0-9]{3}"), flow("a123b.example"))


def test_domain_arguments_are_alternatives() -> None:
    p = pred("domain", "full:a.test", "keyword:zzz", "suffix:org")
    assert holds(p, flow("a.test"))
    assert holds(p, flow("xzzzx.net"))
    assert holds(p, flow("wiki.org"))
    assert not holds(p, flow("b.test"))


def test_a_geosite_code_matches_its_list_by_suffix_full_keyword_and_regex(tmp_path) -> None:
    geo = GeoAssets(str(write_geodata(tmp_path)))
    p = pred("domain", "geosite:cn")
    for name in (
        "example.cn",
        "www.example.cn",
        "a.cn-shop.example",
        "www.cn-portal.example",
        "mycnkeywordsite.example",
        "cdn42.cn-video.example",
    ):
        assert holds(p, flow(name), geo), name
    for name in ("badexample.cn", "portal.cn-portal.example", "cdn.cn-video.example", "example.org"):
        assert not holds(p, flow(name), geo), name
    assert holds(pred("domain", "geosite:cn", negated=True), flow("example.org"), geo)


def test_a_geosite_attribute_keeps_only_the_entries_that_carry_it(tmp_path) -> None:
    geo = GeoAssets(str(write_geodata(tmp_path)))
    ads = pred("domain", "geosite:category-ads-all@ads")
    assert holds(ads, flow("x.ads.example"), geo)
    assert holds(ads, flow("pixel.cn-shop.example"), geo)
    assert not holds(ads, flow("tracker.example"), geo)  # listed without the attribute


def test_a_geodata_code_the_data_cannot_answer_refuses_to_compile(tmp_path) -> None:
    empty = GeoAssets(str(tmp_path / "nothing-here"))
    with pytest.raises(RouteCompileError, match="geosite.dat not found"):
        compile_predicate(pred("domain", "geosite:category-ads-all"), empty)
    geo = GeoAssets(str(write_geodata(tmp_path / "data")))
    with pytest.raises(RouteCompileError, match="no list 'xx'"):
        compile_predicate(pred("dip", "geoip:xx"), geo)


def test_domain_matcher_does_not_match_an_ip_literal_target() -> None:
    assert not holds(pred("domain", "keyword:1"), flow("10.1.1.1"))


def test_negated_domain_holds_for_an_unknown_domain() -> None:
    assert holds(pred("domain", "example.com", negated=True), flow("10.1.1.1"))


def test_negated_domain_fails_for_a_matching_domain() -> None:
    assert not holds(pred("domain", "example.com", negated=True), flow("a.example.com"))


def test_invalid_regex_is_a_compile_error() -> None:
    with pytest.raises(RouteCompileError):
        compile_predicate(pred("domain", "regex:(unclosed"))


# --- dip / sip -------------------------------------------------------------------


def test_dip_matches_ips_and_cidrs() -> None:
    p = pred("dip", "203.0.113.0/24", "198.51.100.7")
    assert holds(p, flow("203.0.113.200"))
    assert holds(p, flow("198.51.100.7"))
    assert not holds(p, flow("198.51.100.8"))


def test_dip_reads_the_resolved_ip_of_a_domain_target() -> None:
    p = pred("dip", "203.0.113.0/24")
    assert holds(p, flow("example.com", resolved="203.0.113.9"))
    assert not holds(p, flow("example.com", resolved="192.0.2.1"))


def test_dip_matches_ipv6_cidrs() -> None:
    p = pred("dip", "2001:db8:abcd::/48")
    assert holds(p, flow("2001:db8:abcd:12::1"))
    assert not holds(p, flow("2001:db8:abce::1"))
    assert not holds(p, flow("203.0.113.1"))


def test_dip_treats_an_ipv4_mapped_target_as_ipv4() -> None:
    assert holds(pred("dip", "10.0.0.0/8"), flow("::ffff:10.2.3.4"))


def test_ipv4_mapped_cidr_matches_plain_ipv4() -> None:
    assert holds(pred("dip", "::ffff:10.0.0.0/104"), flow("10.9.9.9"))


def test_cidr_with_host_bits_is_tolerated() -> None:
    assert holds(pred("dip", "10.1.2.3/8"), flow("10.200.0.1"))


def test_geoip_private_covers_both_families() -> None:
    p = pred("dip", "geoip:private")
    for private in (
        "10.0.0.1",
        "172.16.5.5",
        "192.168.0.1",
        "127.0.0.1",
        "169.254.1.1",
        "100.64.0.1",
        "fd00::1",
        "fe80::1",
        "::1",
    ):
        assert holds(p, flow(private)), private
    for public in ("8.8.8.8", "1.1.1.1", "2606:4700::1111"):
        assert not holds(p, flow(public)), public


def test_a_geoip_code_matches_its_networks_alongside_the_other_alternatives(tmp_path) -> None:
    geo = GeoAssets(str(write_geodata(tmp_path)))
    p = pred("dip", "geoip:cn", "203.0.113.0/24")
    for ip in ("198.51.100.7", "2001:db8:cc::1", "::ffff:198.51.100.9", "203.0.113.1"):
        assert holds(p, flow(ip), geo), ip
    for ip in ("192.0.2.1", "2001:db8:dd::1"):
        assert not holds(p, flow(ip), geo), ip


def test_a_reverse_match_geoip_list_matches_the_addresses_outside_it(tmp_path) -> None:
    geo = GeoAssets(str(write_geodata(tmp_path)))
    p = pred("dip", "geoip:not-cn")
    assert holds(p, flow("192.0.2.1"), geo)
    assert not holds(p, flow("198.51.100.1"), geo)


def test_geoip_private_stays_the_built_in_set_whatever_the_file_says(tmp_path) -> None:
    geo = GeoAssets(str(write_geodata(tmp_path)))  # the file's own "private" holds only 10/8
    assert holds(pred("dip", "geoip:private"), flow("192.168.1.1"), geo)


def test_ext_codes_read_lists_from_a_named_file(tmp_path) -> None:
    (tmp_path / "mine.dat").write_bytes(geosite_bytes({"games": [(dat.DOMAIN, "play.example", ())]}))
    (tmp_path / "mine-ip.dat").write_bytes(geoip_bytes({"office": (["192.0.2.0/28"], False)}))
    geo = GeoAssets(str(tmp_path))
    assert holds(Predicate("domain", (MatchArg("ext", "mine.dat:games"),)), flow("eu.play.example"), geo)
    assert holds(Predicate("dip", (MatchArg("ext", "mine-ip.dat:office"),)), flow("192.0.2.3"), geo)
    assert not holds(Predicate("dip", (MatchArg("ext", "mine-ip.dat:office"),)), flow("192.0.2.30"), geo)


def test_sip_reads_the_source_address() -> None:
    p = pred("sip", "10.10.10.24/32", "10.10.10.25/32")
    assert holds(p, flow("8.8.8.8", source="10.10.10.25"))
    assert not holds(p, flow("10.10.10.25", source="10.10.10.26"))


def test_negated_sip() -> None:
    p = pred("sip", "10.0.0.0/8", negated=True)
    assert holds(p, flow(source="192.168.1.1"))
    assert not holds(p, flow(source="10.1.1.1"))


def test_bad_cidr_is_a_compile_error() -> None:
    with pytest.raises(RouteCompileError):
        compile_predicate(pred("dip", "10.0.0.0/33"))


# --- ports ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "expected"),
    [(80, True), (443, True), (8079, False), (8080, True), (8085, True), (8090, True), (8091, False)],
)
def test_dport_matches_single_ports_and_inclusive_ranges(port: int, expected: bool) -> None:
    assert holds(pred("dport", "80", "443", "8080-8090"), flow(port=port)) is expected


def test_sport_reads_the_source_port() -> None:
    p = pred("sport", "1024-65535")
    assert holds(p, flow(sport=1024))
    assert not holds(p, flow(port=2000, sport=1023))


def test_negated_dport() -> None:
    assert holds(pred("dport", "53", negated=True), flow(port=443))
    assert not holds(pred("dport", "53", negated=True), flow(port=53))


@pytest.mark.parametrize("bad", ["http", "70000", "90-80", "-1"])
def test_bad_ports_are_compile_errors(bad: str) -> None:
    with pytest.raises(RouteCompileError):
        compile_predicate(pred("dport", bad))


# --- l4proto / ipversion ----------------------------------------------------------------


def test_l4proto_matches_the_network() -> None:
    assert holds(pred("l4proto", "udp"), flow(network=Network.UDP))
    assert not holds(pred("l4proto", "udp"), flow(network=Network.TCP))
    assert holds(pred("l4proto", "tcp", "udp"), flow(network=Network.TCP))
    assert holds(pred("l4proto", "tcp", negated=True), flow(network=Network.UDP))


@pytest.mark.parametrize(
    ("spelling", "target", "expected"),
    [
        ("4", "1.2.3.4", True),
        ("ipv4", "1.2.3.4", True),
        ("6", "1.2.3.4", False),
        ("ipv6", "2001:db8::1", True),
        ("4", "2001:db8::1", False),
    ],
)
def test_ipversion_reads_the_destination_family(spelling: str, target: str, expected: bool) -> None:
    assert holds(pred("ipversion", spelling), flow(target)) is expected


def test_ipversion_of_a_resolved_domain() -> None:
    assert holds(pred("ipversion", "6"), flow("example.com", resolved="2001:db8::5"))


def test_ipversion_of_an_ipv4_mapped_target_is_4() -> None:
    assert holds(pred("ipversion", "4"), flow("::ffff:1.2.3.4"))


# --- the host's own process ------------------------------------------------------------


def own_flow(process: str | None) -> FlowView:
    return dataclasses.replace(flow(), process=process)


def test_pname_matches_the_local_process_of_the_hosts_own_flow() -> None:
    rule = pred("pname", "NetworkManager", "curl")
    assert holds(rule, own_flow("curl"))
    assert not holds(rule, own_flow("wget"))
    assert not holds(rule, own_flow("Curl"))  # the kernel's name, compared exactly


def test_pname_compares_names_as_the_kernel_cuts_them() -> None:
    # the kernel keeps 15 characters: systemd-resolved runs as "systemd-resolve"
    assert holds(pred("pname", "systemd-resolved"), own_flow("systemd-resolve"))


def test_a_flow_without_a_local_process_never_matches_pname_so_its_negation_holds() -> None:
    assert not holds(pred("pname", "curl"), own_flow(None))
    assert holds(pred("pname", "curl", negated=True), own_flow(None))


def test_a_router_reads_processes_only_when_a_rule_names_one() -> None:
    def router(*predicates: Predicate) -> Router:
        return Router.compile(RoutingSpec((RuleSpec(predicates, "direct", False),), "proxy"))

    assert router(pred("dport", "53"), pred("pname", "curl", negated=True)).reads_process
    assert not router(pred("dport", "443")).reads_process


# --- not observable ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [("mac", "aa:bb:cc:dd:ee:ff"), ("dscp", "46")])
def test_unobservable_predicates_never_match_so_their_negation_holds(name: str, value: str) -> None:
    assert not holds(Predicate(name, (MatchArg("", value),)), flow())
    assert holds(Predicate(name, (MatchArg("", value),), negated=True), flow())


def test_unknown_predicate_is_a_compile_error() -> None:
    with pytest.raises(RouteCompileError):
        compile_predicate(pred("country", "cn"))


# --- rendering -------------------------------------------------------------------


def test_describe_predicate_renders_keys_values_and_negation() -> None:
    assert describe_predicate(pred("domain", "suffix:ads.example")) == "domain(suffix:ads.example)"
    assert describe_predicate(pred("dport", "22", "8000-8080", negated=True)) == "!dport(22,8000-8080)"


@settings(max_examples=200, deadline=None)
@given(
    keywords=st.lists(st.text("ab.c", min_size=1, max_size=4), min_size=9, max_size=30),
    host=st.from_regex(r"[abcd]{1,6}(\.[abcd]{1,6}){0,2}", fullmatch=True),
)
def test_many_keywords_match_exactly_what_a_substring_test_matches(keywords, host) -> None:
    """Past KEYWORD_SCAN_MAX the keywords are one trie-shaped expression: it must agree with
    testing each keyword as a substring, prefixes of one another included."""
    p = Predicate("domain", tuple(MatchArg("keyword", k) for k in keywords))
    expected = any(k.strip().lower() in host for k in keywords if k.strip())
    assert compile_predicate(p).match(flow(host)) is expected
