"""dae lexical rules, scalar readers and expression details."""

from __future__ import annotations

import pytest
from config_helpers import run

from honk.config.diagnostics import Severity
from honk.config.expr import split_arg
from honk.config.spec import MatchArg, Policy
from honk.config.values import parse_bool, parse_millis, parse_seconds, split_list, unquote


def _rules(text: str):
    outcome = run("routing {\n" + text + "\n}\n")
    assert outcome.spec is not None, [str(d) for d in outcome.diagnostics]
    return outcome.spec.routing.rules


def test_glued_hash_is_data_and_spaced_hash_is_a_comment():
    outcome = run(
        "node {\n"
        "    socks5://10.0.0.1:1080#hk1 # a comment\n"
        "    socks5://10.0.0.2:1080#hk2#note\n"
        "}\n"
        "# a whole-line comment { with a brace\n"
        "group {\n    g {\n        filter: name(hk1)#glued\n    }\n}\n"
    )
    spec = outcome.spec
    assert spec is not None
    assert [n.name for n in spec.nodes] == ["hk1", "hk2#note"]
    # the glued '#' stays in the filter, which then fails to parse as one term
    assert outcome.find("unparseable-filter")


def test_value_is_everything_after_the_first_colon():
    spec = run("experimental {\n    clash_api {\n        external_controller: 127.0.0.1:53\n    }\n}\n").spec
    assert spec.clash_api.external_controller == "127.0.0.1:53"


def test_quoted_braces_are_data():
    spec = run("experimental {\n    clash_api {\n        secret: 'a}b{c'\n    }\n}\nglobal {\n}\n").spec
    assert spec.clash_api.secret == "a}b{c"


def test_a_quoted_group_name_may_hold_spaces_and_loses_its_quotes():
    spec = run(
        "node { a: 'socks5://127.0.0.1:9' }\n"
        "group { '🇯🇵 Japan 04' { filter: name(a) } \"My Proxy\" { filter: name(a) } }\n"
        "routing { fallback: 'My Proxy' }\n"
    ).spec
    assert [g.name for g in spec.groups] == ["🇯🇵 Japan 04", "My Proxy"]
    assert spec.routing.fallback == "My Proxy"


def test_an_api_listen_address_that_is_not_host_port_is_an_error_naming_the_key():
    outcome = run("experimental {\n    clash_api {\n        external_controller: 9090\n    }\n}\n")
    assert outcome.spec is None
    [error] = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert error.key_path == "experimental.clash_api.external_controller" and error.loc.line == 3


def test_one_line_blocks_and_compact_empty_blocks():
    spec = run("global { log_level: warn }\ngroup { a {} b {} }\n").spec
    assert spec.global_.log_level == "warn"
    assert [g.name for g in spec.groups] == ["a", "b"]


def test_matcher_arguments_may_span_lines():
    (rule,) = _rules("    dport(\n        80,\n        443\n    ) && l4proto(tcp) -> direct")
    assert rule.predicates[0].args == (MatchArg("", "80"), MatchArg("", "443"))
    assert rule.loc.line == 2


def test_single_and_double_quotes_keep_separators_literal():
    (rule,) = _rules("    pname('a' , \"b\", 'c,d', \"e)f\", 'g && h', 'i -> j') -> direct")
    assert [a.value for a in rule.predicates[0].args] == ["a", "b", "c,d", "e)f", "g && h", "i -> j"]


def test_only_recognised_prefixes_split_an_argument():
    assert split_arg("2001:db8::/32") == MatchArg("", "2001:db8::/32")
    assert split_arg("suffix: example.com") == MatchArg("suffix", "example.com")
    assert split_arg("'suffix: x'") == MatchArg("", "suffix: x")
    (rule,) = _rules("    dip(2001:db8::/32) && mac(00:11:22:33:44:55) -> block")
    assert rule.predicates[0].args == (MatchArg("", "2001:db8::/32"),)
    assert rule.predicates[1].args == (MatchArg("", "00:11:22:33:44:55"),)


def test_must_is_an_outbound_parameter_and_any_other_parenthesis_stays_in_the_name():
    must, spaced, quoted = _rules(
        "    dport(1) -> direct(must)\n    dport(2) -> direct( must )\n    dport(3) -> 'direct'"
    )
    assert must.must and must.outbound == "direct"
    assert spaced.must and spaced.outbound == "direct"  # dae skips the spaces
    assert not quoted.must and quoted.outbound == "direct"
    outcome = run("routing {\n    dport(1) -> direct(fast)\n}\n")
    assert outcome.find("unknown-outbound")


def test_bare_prefix_matchers_and_default_alias(geodata):
    outcome = run(
        "routing {\n    !geosite:cn -> block\n    domain:example.com -> direct\n    default: block\n}\n"
    )
    spec = outcome.spec
    first, second = spec.routing.rules
    assert first.predicates[0].name == "domain" and first.predicates[0].negated
    assert first.predicates[0].args == (MatchArg("geosite", "cn"),)
    assert second.predicates[0].args == (MatchArg("", "example.com"),)
    assert spec.routing.fallback == "block"


def test_arguments_are_normalised_so_formats_compare_equal():
    (rule,) = _rules(
        "    l4proto(TCP) && ipversion(ipv6) && dport(0080) && mac(AA-BB-CC-DD-EE-0F) && dip(10.1.2.3/8) -> direct"
    )
    values = [p.args[0].value for p in rule.predicates]
    assert values == ["tcp", "6", "80", "aa:bb:cc:dd:ee:0f", "10.0.0.0/8"]


def test_unquoted_apostrophe_inside_a_bare_value_is_literal():
    spec = run("global {\n    data_dir: /tmp/don't\n}\n").spec
    assert spec.global_.data_dir == "/tmp/don't"


def test_relative_data_dir_is_resolved_against_the_base_directory(tmp_path):
    spec = run("global {\n    data_dir: ./state\n}\n", base_dir=str(tmp_path)).spec
    assert spec.global_.data_dir == str(tmp_path / "state")


def test_empty_http_method_means_head():
    spec = run("global {\n    tcp_check_http_method: ''\n}\n").spec
    assert spec.global_.tcp_check_http_method == "HEAD"


def test_policy_spellings_are_case_insensitive_with_one_suffix():
    text = (
        "group {\n    a {\n        policy: Fixed(0)\n    }\n    b {\n        policy: ROUND_ROBIN\n    }\n}\n"
    )
    spec = run(text).spec
    assert [g.policy for g in spec.groups] == [Policy.SELECTOR, Policy.LOADBALANCE]


def test_filter_lines_build_filters_and_subgroups():
    text = (
        "node {\n    edge: socks5://10.0.0.1:1\n}\n"
        "group {\n    hk {\n    }\n    jp {\n    }\n"
        "    g {\n        filter: group('hk,jp')\n        filter: group(hk|jp)\n"
        "        filter: subtag(paid) && !name(keyword: 'x', regex: '^y')\n        filter: name(direct)\n"
        "        default: direct\n    }\n}\n"
    )
    outcome = run(text)
    g = outcome.spec.group("g")
    assert g.subgroups == ("hk", "jp", "hk", "jp")
    assert g.has_filter_lines
    assert g.filters[0].terms[0].kind == "subtag"
    assert g.filters[0].terms[1].negated
    assert g.filters[0].terms[1].args == (MatchArg("keyword", "x"), MatchArg("regex", "^y"))


def test_builtins_join_a_group_only_when_spelled_exactly():
    text = "group {\n    g {\n        filter: name(keyword: dir)\n        default: direct\n    }\n}\n"
    assert run(text).find("unknown-default")


def test_group_without_filters_contains_every_node():
    text = "node {\n    edge: socks5://10.0.0.1:1\n}\ngroup {\n    g {\n        default: edge\n    }\n}\n"
    assert run(text).spec is not None


@pytest.mark.parametrize(
    ("text", "value", "code"),
    [
        ("true", True, None),
        ("Yes", True, None),
        ("1", True, None),
        ("on", True, None),
        ("false", False, None),
        ("no", False, None),
        ("0", False, None),
        ("OFF", False, None),
        ("t", False, "legacy-bool-shorthand"),
        ("y", False, "legacy-bool-shorthand"),
        ("f", False, "legacy-bool-shorthand"),
        ("n", False, "legacy-bool-shorthand"),
        ("maybe", False, "invalid-bool"),
    ],
)
def test_lenient_booleans(text, value, code):
    assert parse_bool(text) == (value, code)


def test_boolean_settings_report_shorthands():
    text = "experimental {\n    cache_file {\n        enabled: y\n        store_dns: maybe\n    }\n}\n"
    outcome = run(text)
    assert outcome.spec is not None
    assert [d.code for d in outcome.diagnostics] == ["legacy-bool-shorthand", "invalid-bool"]
    assert all(d.severity is Severity.WARNING for d in outcome.diagnostics)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("30s", 30.0),
        ("1.5m", 90.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
        ("1m30s", 90.0),
        (".5s", 0.5),
    ],
)
def test_second_durations(text, seconds):
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "", "5 minutes", "-1s", "1d", "nan"])
def test_unparseable_second_durations(text):
    assert parse_seconds(text) is None


@pytest.mark.parametrize(
    ("text", "seconds"), [("50", 0.05), ("50ms", 0.05), ("1.5s", 1.5), ("1.9ms", 0.001), ("0", 0.0)]
)
def test_millisecond_durations_truncate_fractional_milliseconds(text, seconds):
    assert parse_millis(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "1m", "1h", "-5", ""])
def test_unparseable_millisecond_durations(text):
    assert parse_millis(text) is None


def test_list_items_are_split_before_unquoting():
    assert split_list("'eth0', \"eth1\" ,eth2,,") == (["eth0", "eth1", "eth2"], False)
    assert split_list("'a,b'") == (["a,b"], True)


def test_whole_quoted_check_list_is_split_with_a_note():
    outcome = run("global {\n    tcp_check_url: 'http://a.example/,http://b.example/'\n}\n")
    assert outcome.spec.global_.tcp_check_url == ("http://a.example/", "http://b.example/")
    assert outcome.find("legacy-quoted-list")


def test_unquote_removes_one_enclosing_pair_only():
    assert unquote(" 'a' ") == "a"
    assert unquote("'a' 'b'") == "'a' 'b'"
    assert unquote("\"'a'\"") == "'a'"
    assert unquote("don't") == "don't"
