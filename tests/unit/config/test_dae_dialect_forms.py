"""Forms of real dae configurations honk reads as dae does: statements continued over lines,
a '{' glued to its block name, dae's outbound spellings (must_x, must_rules, mark) and its
numbers and matcher aliases (the corpus under tests/corpus/dae: test_dae_corpus.py)."""

from __future__ import annotations

import ipaddress

import pytest
from config_helpers import run

from honk.config.diagnostics import Severity, SourceLoc
from honk.config.expr import MUST_RULES, parse_go_uint, parse_rule
from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.config.tree import Sink
from honk.core.net import Address, FlowMeta, Network
from honk.route.router import NeedsResolution, RouteDecision, Router

NODE = "node {\n    n1: 'socks5://192.0.2.1:1080'\n}\n"  # lines 1-3


def _problems(outcome) -> list[str]:
    return [str(d) for d in outcome.diagnostics if d.severity is not Severity.INFO]


def _rules(body: str):
    outcome = run(NODE + "routing {\n" + body + "\n}\n")  # the body starts on line 5
    assert outcome.spec is not None and not _problems(outcome), _problems(outcome)
    return outcome.spec.routing.rules


def _filters(body: str):
    outcome = run(NODE + "group {\n    g {\n" + body + "\n    }\n}\n")  # the body starts on line 6
    assert outcome.spec is not None and not _problems(outcome), _problems(outcome)
    return outcome.spec.groups[0].filters


def _pred(name: str, *values: str, key: str = "", negated: bool = False) -> Predicate:
    return Predicate(name, tuple(MatchArg(key, v) for v in values), negated)


def _error_lines(outcome, code: str) -> list[int]:
    return [d.loc.line for d in outcome.diagnostics if d.code == code and d.severity is Severity.ERROR]


# --- statements continued over lines ---------------------------------------------------------


def test_a_rule_whose_and_ends_a_line_continues_on_the_next():
    (rule,) = _rules("    dport(443) &&\n        !sip(192.0.2.0/24) -> n1")
    assert rule.predicates == (_pred("dport", "443"), _pred("sip", "192.0.2.0/24", negated=True))
    assert rule.outbound == "n1" and rule.loc.line == 5


def test_a_line_that_starts_with_and_continues_the_rule_before_it():
    (rule,) = _rules("    dip(192.0.2.1)\n\n        # the port\n        && dport(53) -> direct")
    assert rule.predicates == (_pred("dip", "192.0.2.1"), _pred("dport", "53"))
    assert rule.loc.line == 5


def test_a_rule_whose_arrow_ends_a_line_takes_its_outbound_from_the_next():
    first, second = _rules("    l4proto(udp) && dport(443) ->\n        block\n    dport(1) -> n1")
    assert first.predicates == (_pred("l4proto", "udp"), _pred("dport", "443"))
    assert first.outbound == "block" and first.loc.line == 5
    assert second.outbound == "n1" and second.loc.line == 7


def test_a_line_that_starts_with_an_arrow_gives_the_rule_before_it_its_outbound():
    (rule,) = _rules("    domain(suffix: example.com) &&\n        dport(443)\n        -> n1")
    assert rule.predicates == (_pred("domain", "example.com", key="suffix"), _pred("dport", "443"))
    assert rule.outbound == "n1" and rule.loc.line == 5


def test_the_docs_rule_continued_over_lines_excludes_what_its_negation_names():
    (rule,) = _rules(
        "    domain(suffix: example.com) &&\n"
        "        !domain(suffix: a.example.com,\n"
        "                suffix: b.example.com\n"
        "            ) -> n1"
    )
    assert rule.predicates[1] == _pred("domain", "a.example.com", "b.example.com", key="suffix", negated=True)


def test_a_rule_continued_until_its_block_ends_is_an_error_at_its_first_line():
    outcome = run("routing {\n    dport(1) -> direct\n    dport(53) &&\n\n}\n")
    assert outcome.spec is None
    assert _error_lines(outcome, "unterminated-statement") == [3]
    outcome = run("routing {\n    dport(53) ->\n}\n")
    assert _error_lines(outcome, "unterminated-statement") == [2]


def test_a_rule_continued_at_the_end_of_the_document_is_an_error_at_its_first_line():
    outcome = run("routing {\n    dport(53) &&")
    assert _error_lines(outcome, "unterminated-statement") == [2]


def test_a_filter_continued_by_a_line_that_starts_with_and_keeps_every_term():
    (f,) = _filters(
        "        filter: name(keyword: 'n')\n"
        "            && !name(keyword: 'IPLC')\n"
        "        policy: min_moving_avg"
    )
    assert [(t.kind, t.args[0].value, t.negated) for t in f.terms] == [
        ("name", "n", False),
        ("name", "IPLC", True),
    ]


def test_a_filter_whose_and_ends_a_line_continues_on_the_next():
    (f,) = _filters(
        "        filter: name(n1) &&\n            # not this one\n            !name(keyword: 'x')"
    )
    assert [(t.args[0].value, t.negated) for t in f.terms] == [("n1", False), ("x", True)]


def test_a_filter_continued_until_its_block_ends_is_an_error_at_its_line():
    outcome = run(NODE + "group {\n    g {\n        filter: name(n1) &&\n    }\n}\n")
    assert outcome.spec is None
    assert _error_lines(outcome, "unterminated-statement") == [6]


def test_only_filters_continue_in_a_group_and_only_with_and():
    outcome = run(
        NODE + "group {\n    g {\n        policy: min_avg10\n        && name(n1)\n"
        "        filter: name(n1)\n        -> x\n    }\n}\n"
    )
    assert [d.loc.line for d in outcome.find("invalid-statement")] == [7, 9]
    assert outcome.spec is not None and len(outcome.spec.groups[0].filters) == 1


def test_a_fallback_is_not_continued():
    outcome = run("routing {\n    fallback: direct\n    && dport(1) -> block\n}\n")
    assert outcome.spec is None and outcome.find("invalid-rule")
    assert outcome.find("invalid-rule")[0].loc.line == 3


# --- a '{' glued to its block name --------------------------------------------------------------


def test_a_brace_glued_to_a_block_name_opens_the_block():
    outcome = run(
        "global{\n    log_level: warn\n}\nnode{\n    n1: 'socks5://192.0.2.1:1080'\n}\n"
        "group{\n    hk{\n        filter: name(n1)\n    }\n}\nrouting{\n    dport(1) -> hk\n    fallback: direct\n}\n"
    )
    assert outcome.spec is not None and not _problems(outcome), _problems(outcome)
    spec = outcome.spec
    assert spec.global_.log_level == "warn"
    assert [n.name for n in spec.nodes] == ["n1"] and [g.name for g in spec.groups] == ["hk"]
    assert [r.outbound for r in spec.routing.rules] == ["hk"]
    assert [d.loc.line for d in outcome.find("block-delimiter-spacing")] == [1, 4, 7, 8, 12]


def test_glued_braces_in_quotes_or_parentheses_stay_data():
    (rule,) = _rules("    pname('a{') && pname(b{) -> direct")
    assert [p.args[0].value for p in rule.predicates] == ["a{", "b{"]


def test_a_subscription_block_opens_with_its_tag_colon_brace_spaced_or_glued():
    outcome = run(
        "subscription {\n    paid: {\n        url: 'https://example.com/a'\n    }\n"
        "    free:{\n        url: 'https://example.com/b'\n    }\n}\n"
    )
    assert outcome.spec is not None and not _problems(outcome), _problems(outcome)
    assert [(s.name, s.url) for s in outcome.spec.subscriptions] == [
        ("paid", "https://example.com/a"),
        ("free", "https://example.com/b"),
    ]


# --- dae's outbound spellings ------------------------------------------------------------------


def test_must_direct_means_direct_with_must():
    (rule,) = _rules("    dport(53) -> must_direct")
    assert (rule.outbound, rule.must) == ("direct", True)


def test_must_before_a_node_or_group_name_means_it_with_must():
    outcome = run(
        NODE + "group {\n    my_group {\n        filter: name(n1)\n    }\n}\n"
        "routing {\n    dport(1) -> must_my_group\n    dport(2) -> must_n1\n}\n"
    )
    rules = outcome.spec.routing.rules
    assert [(r.outbound, r.must) for r in rules] == [("my_group", True), ("n1", True)]


def test_a_must_prefix_is_stripped_even_before_a_group_called_so():
    outcome = run(
        NODE + "group {\n    must_x {\n        filter: name(n1)\n    }\n}\n"
        "routing {\n    dport(1) -> must_x\n}\n"
    )
    assert outcome.spec is None
    [error] = outcome.find("unknown-outbound")
    assert error.loc.line == 10  # dae reads `-> must_x` as `-> x(must)`: there is no group x


def test_must_rules_is_kept_as_its_marker_outbound():
    (rule, after) = _rules("    pname(mosdns) -> must_rules\n    dport(53) -> direct")
    assert (rule.outbound, rule.must, rule.mark) == (MUST_RULES, False, None)
    assert (after.outbound, after.must) == ("direct", False)


def test_must_rules_names_no_outbound_for_a_fallback():
    outcome = run("routing {\n    fallback: must_rules\n}\n")
    assert outcome.find("unknown-outbound")


@pytest.mark.parametrize(
    ("outbound", "name", "must", "mark"),
    [
        ("direct(mark: 0x800)", "direct", False, 0x800),
        ("direct(mark: 2048)", "direct", False, 2048),
        ("direct(mark:0o4000)", "direct", False, 2048),
        ("direct(mark: 0b1)", "direct", False, 1),
        ("my_group(must, mark: 0xffffffff)", "my_group", True, 0xFFFFFFFF),
        ("must_my_group(mark: '16')", "my_group", True, 16),
        ("direct(must)", "direct", True, None),
    ],
)
def test_a_per_rule_mark_is_read_into_the_rule_in_any_base(outbound, name, must, mark):
    sink = Sink()
    rule = parse_rule(f"dport(1) -> {outbound}", "routing.rules[0]", SourceLoc("f", 1), sink)
    assert not sink.items
    assert (rule.outbound, rule.must, rule.mark) == (name, must, mark)


def test_a_per_rule_mark_on_direct_is_accepted_into_the_routing():
    outcome = run(
        "routing {\n    dport(1) -> direct(mark: 0x800)\n    dport(2) -> must_direct(mark: 2048)\n}\n"
    )
    assert [(r.outbound, r.must, r.mark) for r in outcome.spec.routing.rules] == [
        ("direct", False, 0x800),
        ("direct", True, 0x800),
    ]


def test_the_fallback_takes_must_and_a_mark_as_a_rule_does():
    outcome = run("routing {\n    dport(1) -> block\n    fallback: direct(mark: 0x100, must)\n}\n")
    routing = outcome.spec.routing
    assert (routing.fallback, routing.fallback_must, routing.fallback_mark) == ("direct", True, 0x100)
    outcome = run(NODE + "routing {\n    dport(1) -> block\n    fallback: n1(mark: 512)\n}\n")
    [error] = outcome.find("unsupported-mark")
    assert (error.key_path, error.loc.line) == ("routing.fallback", 6)


def test_a_per_rule_mark_on_another_outbound_is_a_located_error():
    outcome = run(NODE + "routing {\n    dport(1) -> direct\n    dport(2) -> n1(mark: 0x800)\n}\n")
    assert outcome.spec is None
    [error] = outcome.find("unsupported-mark")
    assert (error.key_path, error.loc.line, error.severity) == ("routing.rules[1]", 6, Severity.ERROR)
    assert "direct only" in error.message and "'n1'" in error.message


def test_a_mark_that_is_not_a_32_bit_number_is_an_invalid_value():
    for mark in ("0x100000000", "0x", "-1", "08"):
        outcome = run(f"routing {{\n    dport(1) -> direct(mark: {mark})\n}}\n")
        assert [d.loc.line for d in outcome.find("invalid-value")] == [2], mark


def test_the_same_dae_outbounds_read_alike_from_toml():
    outcome = run('[routing]\nrules = ["dport(1) -> must_direct", "dport(2) -> must_rules"]\n', "toml")
    assert [(r.outbound, r.must) for r in outcome.spec.routing.rules] == [
        ("direct", True),
        (MUST_RULES, False),
    ]
    outcome = run('[routing]\nrules = ["dport(3) -> direct(mark: 0x10)"]\n', "toml")
    assert [r.mark for r in outcome.spec.routing.rules] == [0x10]


# --- the router and must_rules --------------------------------------------------------------


def _flow(port: int, host: str = "192.0.2.80", resolved: str | None = None) -> FlowMeta:
    ip = ipaddress.ip_address(resolved) if resolved is not None else None
    return FlowMeta(Network.TCP, Address("192.0.2.10", 40000), Address(host, port), "lan", resolved=ip)


def _router(*rules: RuleSpec) -> Router:
    return Router.compile(RoutingSpec(rules, "proxy"))


def test_the_router_never_ends_its_search_at_a_must_rules_rule():
    router = _router(
        RuleSpec((_pred("dport", "53"),), MUST_RULES),
        RuleSpec((_pred("dport", "53"),), "direct"),
    )
    assert router.route(_flow(53)) == RouteDecision("direct", "dport(53)", True, 1)
    assert router.route(_flow(80)) == RouteDecision("proxy", "fallback", False, None)


def test_a_must_rules_rule_that_holds_makes_the_fallback_must():
    router = _router(
        RuleSpec((_pred("dport", "53"),), MUST_RULES), RuleSpec((_pred("dport", "1"),), "direct")
    )
    decision = router.route(_flow(53))
    assert (decision.outbound, decision.must, decision.rule_index) == ("proxy", True, None)


def test_a_search_resumed_after_resolution_keeps_the_must_of_an_earlier_must_rules_rule():
    router = _router(
        RuleSpec((_pred("dport", "443"),), MUST_RULES),
        RuleSpec((_pred("dip", "192.0.2.0/24"),), "direct"),
    )
    asked = router.route(_flow(443, host="example.com"))
    assert asked == NeedsResolution(1)
    resumed = router.route(_flow(443, host="example.com", resolved="192.0.2.9"), start=asked.rule_index)
    assert (resumed.outbound, resumed.must) == ("direct", True)
    failed = router.route(_flow(443, host="example.com"), start=1, resolution_failed=True)
    assert (failed.outbound, failed.must) == ("proxy", True)
    other = router.route(_flow(80, host="example.com", resolved="192.0.2.9"), start=1)
    assert (other.outbound, other.must) == ("direct", False)


# --- numbers and matcher names ----------------------------------------------------------------


@pytest.mark.parametrize("written", ["4", "0x4", "0X04", "0b100", "0B1_00", "0o4", "04", "0_4"])
def test_dscp_reads_a_number_in_every_base_go_reads(written):
    (rule,) = _rules(f"    dscp({written}) -> direct")
    assert rule.predicates == (_pred("dscp", "4"),)


def test_dscp_with_a_leading_zero_is_octal_as_in_go():
    (rule,) = _rules("    dscp(010, 0x3f) -> direct")
    assert rule.predicates == (_pred("dscp", "8", "63"),)


@pytest.mark.parametrize("written", ["64", "0x40", "08", "0x", "-1", "+4", "4.0", "1__0", "_4", "4_", "0b2"])
def test_dscp_outside_0_to_63_or_not_a_go_number_is_invalid(written):
    outcome = run(f"routing {{\n    dscp({written}) -> direct\n}}\n")
    assert [d.loc.line for d in outcome.find("invalid-value")] == [2]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("00", 0),
        ("0x_ff", 255),
        ("0o17", 15),
        ("017", 15),
        ("0b1010", 10),
        ("1_000", 1000),
        ("255", 255),
    ],
)
def test_numbers_are_read_as_go_strconv_reads_base_zero(text, value):
    assert parse_go_uint(text, 8 if value < 256 else 16) == value


def test_a_number_too_wide_for_its_bits_is_refused():
    with pytest.raises(ValueError):
        parse_go_uint("256", 8)


def test_ip_and_port_are_dae_names_of_dip_and_dport():
    alias, plain = _rules(
        "    ip(192.0.2.1) && !port(53) -> direct\n    dip(192.0.2.1) && !dport(53) -> direct"
    )
    assert alias == plain
    assert [p.name for p in alias.predicates] == ["dip", "dport"]


def test_a_domain_contains_argument_is_dae_name_of_keyword():
    alias, plain = _rules("    domain(contains: example) -> direct\n    domain(keyword: example) -> direct")
    assert alias == plain


def test_tos_is_no_dae_matcher():
    # dae named its DSCP matcher tos(...) for a few commits before v0.4.0rc1 renamed it; no release had it
    outcome = run("routing {\n    tos(4) -> direct\n}\n")
    assert [d.loc.line for d in outcome.find("unknown-traffic-predicate")] == [2]


def test_a_must_prefixed_fallback_names_its_outbound_and_makes_the_fallback_must():
    """dae strips ``must_`` from the fallback too (config/patch.go)."""
    spec = run(NODE + "routing {\n    dport(22) -> n1\n    fallback: must_direct\n}\n").spec
    assert spec is not None
    assert (spec.routing.fallback, spec.routing.fallback_must) == ("direct", True)
    meta = FlowMeta(Network.TCP, Address("192.168.1.2", 40000), Address("192.0.2.9", 443), "lan")
    decision = Router.compile(spec.routing).route(meta)
    assert (decision.outbound, decision.must) == ("direct", True)


@pytest.mark.parametrize(
    "line",
    [
        "allow_insecure: true",
        "tls_implementation: utls",
        "tls_fragment: true",
        "mptcp: true",
        "fallback_resolver: '8.8.8.8:53'",
        "disable_thp: true",
        "bpf_conn_state_map_size: 65536",
    ],
)
def test_a_dae_key_honk_does_not_honour_is_a_counted_warning_saying_what_honk_does(line):
    outcome = run(f"global {{\n    {line}\n}}\n" + NODE + "routing {\n    fallback: n1\n}\n")
    assert outcome.spec is not None
    [warning] = [d for d in outcome.diagnostics if d.severity is Severity.WARNING]
    assert (warning.code, warning.key_path, warning.loc.line) == (
        "not-honoured",
        f"global.{line.split(':')[0]}",
        2,
    )


def test_dae_defaults_of_those_keys_are_what_honk_does_and_pass_quietly():
    outcome = run(
        "global {\n    allow_insecure: false\n    tls_implementation: tls\n    mptcp: false\n"
        "    tls_fragment: false\n}\n" + NODE + "routing {\n    fallback: n1\n}\n"
    )
    assert outcome.spec is not None and _problems(outcome) == []


def test_a_node_chain_is_refused_for_what_it_is_not_for_a_bracket():
    """dae chains nodes with an arrow between links; honk says it does not chain yet (the
    message used to be a misleading 'an IPv6 address must be bracketed')."""
    outcome = run(
        "node {\n    chained: 'socks5://192.0.2.1:1080 -> ss://YWVzLTEyOC1nY206cHc@192.0.2.2:8388'\n}\n"
        "routing {\n    fallback: direct\n}\n"
    )
    [error] = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert (error.code, error.key_path, error.loc.line) == ("unsupported-node-chain", "node.chained", 2)
    assert "bracketed" not in error.message


def test_a_bare_ext_matcher_is_a_located_error_not_a_crash():
    outcome = run('routing {\n    ext:"a.dat:cn" -> direct\n    fallback: direct\n}\n')
    assert outcome.error is not None
    [found] = outcome.find("unknown-traffic-predicate")
    assert found.loc.line == 2 and "domain(ext: …) or dip(ext: …)" in found.message
