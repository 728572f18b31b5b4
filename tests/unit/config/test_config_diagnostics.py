"""Malformed input yields located diagnostics with stable codes, never secrets."""

from __future__ import annotations

import pytest
from config_helpers import run

from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_text
from honk.config.spec import DEFAULT_CHECK_TOLERANCE, PRECONNECT_AUTO, Policy

E, W = Severity.ERROR, Severity.WARNING

NODE = "node {\n    edge: 'socks5://bob:s3cretPW@10.0.0.1:1080'\n}\n"  # lines 1-3

# (id, format, text, severity, code, key path, line)
CASES = [
    (
        "unknown-policy-falls-back-to-selector",
        "dae",
        NODE + "group {\n    g {\n        policy: mystery(s3cretPW)\n    }\n}\n",
        W,
        "unknown-policy",
        "group.g.policy",
        6,
    ),
    (
        "unparseable-second-duration",
        "dae",
        "global {\n    check_interval: soon\n}\n",
        E,
        "invalid-value",
        "global.check_interval",
        2,
    ),
    (
        "unparseable-second-duration-is-reported-as-duration",
        "dae",
        "global {\n    check_interval: soon\n}\n",
        W,
        "invalid-duration",
        "global.check_interval",
        2,
    ),
    (
        "unparseable-millisecond-duration",
        "dae",
        "global {\n    check_tolerance: fast\n}\n",
        W,
        "invalid-duration",
        "global.check_tolerance",
        2,
    ),
    (
        "unterminated-quote",
        "dae",
        "experimental {\n    clash_api {\n        secret: 's3cretPW\n    }\n}\n",
        E,
        "unterminated-quote",
        "document",
        3,
    ),
    (
        "unknown-traffic-predicate",
        "dae",
        "routing {\n    dport(443) && domian(x) -> direct\n}\n",
        E,
        "unknown-traffic-predicate",
        "routing.rules[0]",
        2,
    ),
    (
        "negated-unknown-predicate",
        "dae",
        "routing {\n    dport(1) -> direct\n    !domian(x) -> direct\n}\n",
        E,
        "unknown-traffic-predicate",
        "routing.rules[1]",
        3,
    ),
    (
        "whitespace-before-matcher-paren",
        "dae",
        "routing {\n    dport (443) -> direct\n}\n",
        E,
        "unknown-traffic-predicate",
        "routing.rules[0]",
        2,
    ),
    (
        "trailing-matcher-text",
        "dae",
        "routing {\n    dport(443)junk -> direct\n}\n",
        E,
        "trailing-matcher-text",
        "routing.rules[0]",
        2,
    ),
    (
        "default-names-no-member",
        "dae",
        NODE + "group {\n    g {\n        filter: name(edge)\n        default: nosuch\n    }\n}\n",
        E,
        "unknown-default",
        "group.g.default",
        7,
    ),
    (
        "routing-to-missing-outbound",
        "dae",
        NODE + "routing {\n    dport(1) -> edge\n    dport(2) -> nowhere\n}\n",
        E,
        "unknown-outbound",
        "routing.rules[1]",
        6,
    ),
    (
        "fallback-to-missing-outbound",
        "dae",
        "routing {\n    fallback: nowhere\n}\n",
        E,
        "unknown-outbound",
        "routing.fallback",
        2,
    ),
    (
        "final-names-no-outbound",
        "dae",
        "group {\n    g {\n        final: nowhere\n    }\n}\n",
        E,
        "unknown-final",
        "group.g.final",
        3,
    ),
    (
        "glued-block-brace-is-only-an-info",
        "dae",
        "global{\n    log_level: info\n}\n",
        Severity.INFO,
        "block-delimiter-spacing",
        "document",
        1,
    ),
    (
        "unclosed-block",
        "dae",
        "global {\n    log_level: info\n\nrouting {\n    fallback: direct\n}\n",
        E,
        "unclosed-block",
        "global",
        1,
    ),
    (
        "invalid-filter-regex",
        "dae",
        NODE + "group {\n    g {\n        filter: name(regex: '(')\n    }\n}\n",
        E,
        "invalid-regex",
        "group.g.filter[0]",
        6,
    ),
    (
        "invalid-domain-regex",
        "dae",
        "routing {\n    domain(regex: 'a[') -> block\n}\n",
        E,
        "invalid-regex",
        "routing.rules[0]",
        2,
    ),
    (
        "port-out-of-range",
        "dae",
        "routing {\n    dport(70000) -> block\n}\n",
        E,
        "invalid-value",
        "routing.rules[0]",
        2,
    ),
    (
        "port-range-reversed",
        "dae",
        "routing {\n    sport(90-80) -> block\n}\n",
        E,
        "invalid-value",
        "routing.rules[0]",
        2,
    ),
    (
        "bad-cidr",
        "dae",
        "routing {\n    dip(10.0.0.0/33) -> block\n}\n",
        E,
        "invalid-value",
        "routing.rules[0]",
        2,
    ),
    (
        "bad-l4proto",
        "dae",
        "routing {\n    l4proto(sctp) -> block\n}\n",
        E,
        "invalid-value",
        "routing.rules[0]",
        2,
    ),
    (
        "reserved-node-name",
        "dae",
        "node {\n    direct: 'socks5://bob:s3cretPW@10.0.0.1:1080'\n}\n",
        E,
        "reserved-name",
        "node.direct",
        2,
    ),
    (
        "duplicate-group",
        "dae",
        "group {\n    g {\n    }\n    g {\n    }\n}\n",
        E,
        "duplicate-group",
        "group.g",
        4,
    ),
    (
        "group-name-collides-with-a-builtin",
        "dae",
        NODE + "group {\n    direct {\n    }\n}\n",
        E,
        "name-collision",
        "group.direct",
        5,
    ),
    (
        "unknown-scheme",
        "dae",
        "node {\n    x: 'foo://bob:s3cretPW@10.0.0.1:1080'\n}\n",
        E,
        "unknown-scheme",
        "node.x",
        2,
    ),
    (
        "unsupported-scheme",
        "dae",
        "node {\n    'tuic://YWVzOnMzY3JldFBX@h.example:8388#s3cretPW'\n}\n",
        E,
        "unsupported-scheme",
        "node[0]",
        2,
    ),
    (
        "socks5-needs-a-port",
        "dae",
        "node {\n    x: 'socks5://bob:s3cretPW@10.0.0.1'\n}\n",
        E,
        "missing-port",
        "node.x",
        2,
    ),
    (
        "duplicate-node-endpoint",
        "dae",
        "node {\n    a: 'socks5://bob:s3cretPW@10.0.0.1:1080'\n    b: 'socks5://bob:s3cretPW@10.0.0.1:1080'\n}\n",
        E,
        "duplicate-node",
        "node.b",
        3,
    ),
    (
        "duplicate-node-name",
        "dae",
        "node {\n    a: 'socks5://10.0.0.1:1080'\n    a: 'socks5://10.0.0.2:1080'\n}\n",
        W,
        "duplicate-name",
        "node.a",
        3,
    ),
    (
        "unsupported-inbound",
        "dae",
        "inbound {\n    t: 'tproxy://0.0.0.0:12345'\n}\n",
        E,
        "unsupported-inbound",
        "inbound.t",
        2,
    ),
    (
        "inbound-port-out-of-range",
        "dae",
        "inbound {\n    t: 'mixed://u:s3cretPW@127.0.0.1:65536'\n}\n",
        E,
        "invalid-port",
        "inbound.t",
        2,
    ),
    (
        "duplicate-inbound",
        "dae",
        "inbound {\n    t: 'mixed://127.0.0.1:1'\n    t: 'mixed://127.0.0.1:2'\n}\n",
        E,
        "duplicate-inbound",
        "inbound.t",
        3,
    ),
    (
        "bad-udp-check-port",
        "dae",
        "global {\n    udp_check_dns: 8.8.8.8:99999\n}\n",
        E,
        "invalid-value",
        "global.udp_check_dns",
        2,
    ),
    (
        "bad-udp-check-bracket",
        "dae",
        "global {\n    udp_check_dns: [2001:db8::1\n}\n",
        E,
        "invalid-value",
        "global.udp_check_dns",
        2,
    ),
    (
        "bad-log-level",
        "dae",
        "global {\n    log_level: chatty\n}\n",
        E,
        "invalid-value",
        "global.log_level",
        2,
    ),
    (
        "max-concurrent-dials-zero",
        "dae",
        "global {\n    max_concurrent_dials: 0\n}\n",
        E,
        "invalid-value",
        "global.max_concurrent_dials",
        2,
    ),
    (
        "preconnect-node-count-word",
        "dae",
        "global {\n    preconnect_node_count: someday\n}\n",
        E,
        "invalid-value",
        "global.preconnect_node_count",
        2,
    ),
    (
        "udp-warm-node-count-negative",
        "toml",
        "[global]\nudp_warm_node_count = -1\n",
        E,
        "invalid-value",
        "global.udp_warm_node_count",
        2,
    ),
    ("unmatched-close", "dae", "global {\n}\n}\n", W, "unmatched-close", "document", 3),
    ("rule-without-arrow", "dae", "routing {\n    dport(22)\n}\n", W, "missing-arrow", "routing.rules[0]", 2),
    ("unknown-section", "dae", "global {\n}\nplugins {\n    a: b\n}\n", W, "unknown-section", "plugins", 3),
    (
        "unknown-global-key",
        "dae",
        "global {\n    colour: s3cretPW\n}\n",
        W,
        "unknown-key",
        "global.colour",
        2,
    ),
    (
        "unknown-nested-block",
        "dae",
        "global {\n    extra {\n        log_level: chatty\n    }\n}\n",
        W,
        "unknown-block",
        "global.extra",
        2,
    ),
    (
        "unknown-subgroup",
        "dae",
        "group {\n    g {\n        filter: group(nosuch)\n    }\n}\n",
        W,
        "unknown-subgroup",
        "group.g.filter[0]",
        3,
    ),
    (
        "empty-subgroup",
        "dae",
        "group {\n    g {\n        filter: group()\n    }\n}\n",
        W,
        "empty-subgroup",
        "group.g.filter[0]",
        3,
    ),
    (
        "group-mixed-with-predicate",
        "dae",
        "group {\n    g {\n        filter: name(a)\n        filter: group(a) && name(b)\n    }\n}\n",
        W,
        "unparseable-filter",
        "group.g.filter[1]",
        4,
    ),
    (
        "subscription-url-not-http",
        "dae",
        "subscription {\n    paid: 'ftp://s3cretPW.example/sub'\n}\n",
        E,
        "invalid-subscription-url",
        "subscription.paid",
        2,
    ),
    ("empty-dae-document", "dae", "# nothing here\n", E, "empty-document", "document", 0),
    # structured formats
    (
        "toml-wrong-type",
        "toml",
        "[global]\nlog_level = 'info'\ncheck_interval = true\n",
        E,
        "invalid-type",
        "global.check_interval",
        3,
    ),
    (
        "toml-syntax-error",
        "toml",
        "[global]\nlog_level = 'info'\nsecret = s3cretPW\n",
        E,
        "syntax",
        "document",
        3,
    ),
    (
        "toml-bad-rule-line",
        "toml",
        "[routing]\nrules = [\n  'dport(1) -> direct',\n  'dport (2) -> direct',\n]\n",
        E,
        "unknown-traffic-predicate",
        "routing.rules[1]",
        4,
    ),
    (
        "toml-unknown-policy",
        "toml",
        "[group.g]\npolicy = 'mystery(s3cretPW)'\n",
        W,
        "unknown-policy",
        "group.g.policy",
        2,
    ),
    (
        "toml-bad-filter-regex",
        "toml",
        "[group.g]\nfilter = [\n  'name(a)',\n  'name(regex: \"(\")',\n]\n",
        E,
        "invalid-regex",
        "group.g.filter[1]",
        4,
    ),
    (
        "toml-unknown-key",
        "toml",
        "[experimental.clash_api]\nsecret = 's3cretPW'\ncolour = 1\n",
        W,
        "unknown-key",
        "experimental.clash_api.colour",
        3,
    ),
    ("toml-bad-group-id", "toml", "[group.g]\nid = 'not-a-uuid'\n", E, "invalid-value", "group.g.id", 2),
    (
        "toml-unknown-scheme",
        "toml",
        "[node.x]\nlink = 'foo://bob:s3cretPW@h:1'\n",
        E,
        "unknown-scheme",
        "node.x",
        2,
    ),
    (
        "json-wrong-type",
        "json",
        '{\n  "global": {\n    "max_concurrent_dials": "many"\n  }\n}\n',
        E,
        "invalid-value",
        "global.max_concurrent_dials",
        3,
    ),
    (
        "json-syntax-error",
        "json",
        '{\n  "global": {\n    "secret": s3cretPW\n  }\n}\n',
        E,
        "syntax",
        "document",
        3,
    ),
    (
        "json-missing-outbound",
        "json",
        '{"routing": {\n "rules": [\n  "dport(1) -> nowhere"\n ]\n}}',
        E,
        "unknown-outbound",
        "routing.rules[0]",
        3,
    ),
]


@pytest.mark.parametrize(
    ("fmt", "text", "severity", "code", "key_path", "line"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_malformed_input_yields_a_located_diagnostic(fmt, text, severity, code, key_path, line):
    outcome = run(text, fmt)
    found = [(d.severity, d.key_path, d.loc.line) for d in outcome.find(code)]
    assert (severity, key_path, line) in found, [str(d) for d in outcome.diagnostics]
    if any(d.severity is E for d in outcome.diagnostics):
        assert outcome.spec is None and outcome.error is not None
        assert outcome.error.diagnostics[0].severity is E  # errors first
    else:
        assert outcome.spec is not None
    outcome.assert_no_secret()


def test_unknown_policy_becomes_selector_and_names_the_group_not_the_argument():
    outcome = run("group {\n    hk {\n        policy: mystery(arg-text)\n    }\n}\n")
    assert outcome.spec is not None
    assert outcome.spec.group("hk").policy is Policy.SELECTOR
    (d,) = outcome.find("unknown-policy")
    assert "hk" in d.message and "arg-text" not in str(d) and "mystery" not in str(d)


def test_unparseable_millisecond_setting_keeps_its_default():
    outcome = run("global {\n    check_tolerance: fast\n}\n")
    assert outcome.spec is not None
    assert outcome.spec.global_.check_tolerance == DEFAULT_CHECK_TOLERANCE


def test_config_error_lists_every_diagnostic_errors_first():
    text = "global {\n    colour: x\n    check_interval: soon\n    log_level: chatty\n}\n"
    with pytest.raises(ConfigError) as info:
        from honk.config.load import load_text

        load_text(text, "dae")
    diags = info.value.diagnostics
    assert [d.severity for d in diags[:2]] == [E, E]
    assert {d.code for d in diags} >= {"unknown-key", "invalid-duration", "invalid-value"}
    assert len(info.value.errors) == 2


SECRET_INPUTS = [
    ("dae", "node {\n    'socks5://bob:s3cretPW@10.0.0.1:99999'\n}\n"),
    ("dae", "node {\n    e: 'vless://s3cretPW@h:443?pbk=s3cretPW#s3cretPW'\n}\n"),
    ("dae", "node {\n    e: socks5://bob:s3cretPW@[::1\n}\n"),
    ("dae", "inbound {\n    a: 'http://u:s3cretPW@127.0.0.1:1'\n}\n"),
    ("dae", "global {\n    check_interval: s3cretPW\n    udp_check_dns: s3cretPW:x\n}\n"),
    ("dae", "routing {\n    domain(regex: 's3cretPW(') && dip(s3cretPW) -> s3cretPW\n}\n"),
    (
        "dae",
        "experimental {\n    clash_api {\n        secret: 's3cretPW\n        default_mode: s3cretPW\n    }\n}\n",
    ),
    ("toml", "[experimental.clash_api]\nsecret = 's3cretPW\n"),
    ("toml", "[experimental.clash_api]\nsecret = 1\n[node]\nx = 'socks5://a:s3cretPW@h'\n"),
    ("json", '{"node": {"x": "socks5://a:s3cretPW@h:0"}, "global": {"data_dir": ""}}'),
]


@pytest.mark.parametrize(("fmt", "text"), SECRET_INPUTS)
def test_no_diagnostic_echoes_a_secret(fmt, text):
    outcome = run(text, fmt)
    assert outcome.diagnostics
    outcome.assert_no_secret()


def test_more_than_the_group_limit_is_an_error():
    from honk.config.spec import MAX_TOP_LEVEL_GROUPS

    body = "".join(f"    g{i} {{\n    }}\n" for i in range(MAX_TOP_LEVEL_GROUPS + 1))
    outcome = run("group {\n" + body + "}\n")
    assert [d.key_path for d in outcome.find("too-many-groups")] == [f"group.g{MAX_TOP_LEVEL_GROUPS}"]
    assert outcome.error is not None


def test_structured_only_group_keys_are_unknown_in_dae_but_read_in_toml():
    dae = run("group {\n    g {\n        tolerance: 10\n    }\n}\n")
    assert [d.key_path for d in dae.find("unknown-key")] == ["group.g.tolerance"]
    toml = run(
        "[group.g]\ntolerance = '10ms'\nidle_timeout = 60\nid = '9b2a1c3e-0000-4000-8000-000000000001'\n",
        "toml",
    )
    g = toml.spec.group("g")
    assert (g.tolerance, g.idle_timeout, str(g.id)) == (0.01, 60.0, "9b2a1c3e-0000-4000-8000-000000000001")


def test_selector_group_warns_that_check_url_is_ignored():
    outcome = run("group {\n    g {\n        check_url: 'https://a.example/'\n    }\n}\n")
    (d,) = outcome.find("ineffective-option")
    assert (d.key_path, d.loc.line) == ("group.g.check_url", 3)


@pytest.mark.parametrize(
    ("text", "preconnect", "udp_warm"),
    [
        ("global {\n}\n", PRECONNECT_AUTO, 0),  # the defaults: 'auto', and the UDP warm set off
        ("global {\n    preconnect_node_count: 'auto'\n    udp_warm_node_count: 3\n}\n", PRECONNECT_AUTO, 3),
        ("global {\n    preconnect_node_count: 0\n}\n", 0, 0),
        ("global {\n    preconnect_node_count: 12\n}\n", 12, 0),
    ],
)
def test_warm_up_counts_read_auto_zero_and_explicit_values(text, preconnect, udp_warm):
    spec = load_text(text + "routing {\n    fallback: direct\n}\n", "dae")
    assert (spec.global_.preconnect_node_count, spec.global_.udp_warm_node_count) == (preconnect, udp_warm)
    assert not spec.diagnostics  # documented keys: no unknown-key warning


def test_name_filter_is_the_filter_line_naming_those_nodes():
    from honk.config.spec import name_filter

    text = (
        "node {\n    a: 'socks5://127.0.0.1:1'\n    b: 'socks5://127.0.0.1:2'\n}\n"
        "group {\n    g {\n        filter: name(a, b)\n        policy: select\n    }\n}\n"
        "routing {\n    fallback: g\n}\n"
    )
    assert load_text(text, "dae").groups[0].filters == (name_filter("a", "b"),)
