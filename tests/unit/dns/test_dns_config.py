"""The dns section: upstream honk's keys, defaults and spellings, and every refusal located."""

from __future__ import annotations

import json

import pytest

from honk.config.diagnostics import ConfigError, Diagnostic, Severity
from honk.config.load import load_text
from honk.config.spec import (
    DNS_QTYPE_ANY,
    DnsBindSpec,
    DnsCondition,
    DnsRequestRule,
    DnsSpec,
    DnsUpstreamSpec,
    MatchArg,
    Spec,
)

E = Severity.ERROR


def load(text: str, fmt: str = "dae") -> tuple[Spec | None, tuple[Diagnostic, ...]]:
    try:
        spec = load_text(text, fmt)
    except ConfigError as exc:
        return None, exc.diagnostics
    return spec, spec.diagnostics


def only_error(text: str, fmt: str = "dae") -> Diagnostic:
    spec, diags = load(text, fmt)
    assert spec is None, "expected the file to be refused"
    errors = [d for d in diags if d.severity is E]
    assert len(errors) == 1, errors
    return errors[0]


def dns(body: str, before: str = "") -> str:
    """A dae file whose dns section holds ``body``; the section opens on line ``1 + before's lines``."""
    return f"{before}dns {{\n{body}}}\n"


# --- presence and defaults ------------------------------------------------------------------


def test_a_file_without_a_dns_section_has_no_dns_spec():
    spec, _ = load("global {\n}\n")
    assert spec is not None and spec.dns is None


def test_an_empty_dns_section_takes_upstreams_defaults():
    spec, diags = load(dns(""))
    assert spec is not None and spec.dns == DnsSpec()
    assert not [d for d in diags if d.code == "not-yet-supported"]
    d = spec.dns
    assert d.bind is None
    assert d.upstreams == (DnsUpstreamSpec("default", "udp", "223.5.5.5", 53),)
    assert (d.request_fallback, d.response_fallback) == ("default", "accept")
    assert (d.optimistic_cache, d.optimistic_cache_ttl, d.max_cache_size) == (True, 600, 10000)
    assert d.fixed_domain_ttl == ()


FULL_DAE = """\
node {
    edge: 'socks5://127.0.0.1:1080'
}
dns {
    bind: 'tcp+udp://127.0.0.1:5353'
    use_host: false
    upstream {
        default: 'udp://223.5.5.5:53'
        proxied: 'tcp://1.1.1.1' -> edge
        plain: 8.8.8.8
    }
    routing {
        request {
            qname(suffix: ads.example, keyword: track) && !qtype(aaaa) -> reject
            qname(lan, full: router.home) -> asis
            qtype(https, 65, *) -> proxied
            fallback: default
        }
        response {
            fallback: accept
        }
    }
    optimistic_cache: true
    optimistic_cache_ttl: 300
    max_cache_size: 5000
    fixed_domain_ttl {
        DDNS.example.org.: 10
        nocache.test: 0
    }
}
"""

FULL_TOML = """\
[node]
edge = "socks5://127.0.0.1:1080"

[dns]
bind = "tcp+udp://127.0.0.1:5353"
use_host = false
optimistic_cache = true
optimistic_cache_ttl = 300
max_cache_size = 5000

[dns.upstream]
default = "udp://223.5.5.5:53"
proxied = { url = "tcp://1.1.1.1", outbound = "edge" }
plain = "8.8.8.8"

[dns.routing.request]
rules = [
    "qname(suffix: ads.example, keyword: track) && !qtype(aaaa) -> reject",
    "qname(lan, full: router.home) -> asis",
    "qtype(https, 65, *) -> proxied",
]
fallback = "default"

[dns.routing.response]
fallback = "accept"

[dns.fixed_domain_ttl]
"DDNS.example.org." = 10
"nocache.test" = 0
"""

FULL_SPEC = DnsSpec(
    bind=DnsBindSpec("127.0.0.1", 5353, udp=True, tcp=True),
    upstreams=(
        DnsUpstreamSpec("default", "udp", "223.5.5.5", 53),
        DnsUpstreamSpec("proxied", "tcp", "1.1.1.1", 53, outbound="edge"),
        DnsUpstreamSpec("plain", "udp", "8.8.8.8", 53),
    ),
    request_rules=(
        DnsRequestRule(
            (
                DnsCondition(
                    "qname", names=(MatchArg("suffix", "ads.example"), MatchArg("keyword", "track"))
                ),
                DnsCondition("qtype", qtypes=(28,), negated=True),
            ),
            "reject",
        ),
        DnsRequestRule(
            (DnsCondition("qname", names=(MatchArg("suffix", "lan"), MatchArg("full", "router.home"))),),
            "asis",
        ),
        DnsRequestRule((DnsCondition("qtype", qtypes=(65, 65, DNS_QTYPE_ANY)),), "proxied"),
    ),
    optimistic_cache_ttl=300,
    max_cache_size=5000,
    fixed_domain_ttl=(("ddns.example.org", 10), ("nocache.test", 0)),
)


def test_the_documented_keys_build_the_dns_spec():
    spec, diags = load(FULL_DAE)
    assert spec is not None, diags
    assert spec.dns == FULL_SPEC


def test_dae_toml_and_json_spellings_give_equal_dns_specs():
    import tomllib

    as_json = json.dumps(tomllib.loads(FULL_TOML))
    specs = [load(FULL_DAE)[0], load(FULL_TOML, "toml")[0], load(as_json, "json")[0]]
    assert all(s is not None for s in specs)
    assert specs[0].dns == specs[1].dns == specs[2].dns == FULL_SPEC


def test_dns_sections_of_included_files_merge_in_order(tmp_path):
    (tmp_path / "main.dae").write_text("include {\n    more.dae\n}\ndns {\n    optimistic_cache_ttl: 5\n}\n")
    (tmp_path / "more.dae").write_text(
        "dns {\n    upstream {\n        default: 9.9.9.9\n    }\n    optimistic_cache_ttl: 7\n}\n"
    )
    from honk.config.load import load_file

    spec = load_file(tmp_path / "main.dae")
    assert spec.dns is not None
    assert spec.dns.optimistic_cache_ttl == 7  # the later scalar wins
    assert spec.dns.upstreams == (DnsUpstreamSpec("default", "udp", "9.9.9.9", 53),)


# --- bind ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:1053", DnsBindSpec("127.0.0.1", 1053)),
        ("[::1]:1053", DnsBindSpec("::1", 1053)),
        ("udp://localhost:1053", DnsBindSpec("localhost", 1053)),
        ("tcp://127.0.0.1:53", DnsBindSpec("127.0.0.1", 53, udp=False, tcp=True)),
        ("tcp+udp://:1053", DnsBindSpec("", 1053, udp=True, tcp=True)),
        ("TCP+UDP://[::]:0", DnsBindSpec("::", 0, udp=True, tcp=True)),
    ],
)
def test_bind_forms_select_host_port_and_transports(text, expected):
    spec, diags = load(dns(f"    bind: '{text}'\n"))
    assert spec is not None, diags
    assert spec.dns.bind == expected


def test_an_empty_bind_disables_the_listener():
    spec, _ = load(dns("    bind: ''\n"))
    assert spec.dns.bind is None


@pytest.mark.parametrize(
    "text",
    [
        "localhost:1053",  # a hostname needs a scheme
        "udp://127.0.0.1",  # every form needs a port
        "127.0.0.1",
        "udp://user@127.0.0.1:53",
        "udp://127.0.0.1:53/path",
        "udp://127.0.0.1:53?x=1",
        "udp://127.0.0.1:53#frag",
        "udp://127.0.0.1\\:53",
        "udp://[fe80::1%eth0]:53",
        "udp://[::1:53",
        "udp://::1:53",
        "https://127.0.0.1:53",
        "udp://127.0.0.1:65536",
        "udp://127.0.0.1:0x35",
        "udp://bad_host!:53",
    ],
)
def test_malformed_binds_are_refused_at_the_bind_line(text):
    d = only_error(dns(f"    optimistic_cache: true\n    bind: '{text}'\n"))
    assert (d.code, d.key_path, d.loc.line) == ("invalid-value", "dns.bind", 3)


# --- upstreams --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("1.1.1.1", ("udp", "1.1.1.1", 53)),
        ("1.1.1.1:5353", ("udp", "1.1.1.1", 5353)),
        ("dns.Example.", ("udp", "dns.example", 53)),
        ("udp://[2001:db8::1]", ("udp", "2001:db8::1", 53)),
        ("udp://[2001:db8::1]:54", ("udp", "2001:db8::1", 54)),
        ("2001:db8::1", ("udp", "2001:db8::1", 53)),
        ("tcp://dns.example:5353", ("tcp", "dns.example", 5353)),
        ("tcp+udp://9.9.9.9", ("udp", "9.9.9.9", 53)),
    ],
)
def test_upstream_uris_default_to_udp_port_53(uri, expected):
    spec, diags = load(dns(f"    upstream {{\n        default: '{uri}'\n    }}\n"))
    assert spec is not None, diags
    (upstream,) = spec.dns.upstreams
    assert (upstream.protocol, upstream.host, upstream.port) == expected


def test_the_first_upstream_block_replaces_the_builtin_default():
    spec, _ = load(dns("    upstream {\n        default: 'tcp://9.9.9.9'\n    }\n"))
    assert spec.dns.upstreams == (DnsUpstreamSpec("default", "tcp", "9.9.9.9", 53),)


def test_arrow_and_legacy_outbound_forms_force_a_node_or_group():
    text = dns(
        "    upstream {\n        default: 'udp://1.1.1.1' -> direct\n"
        "        old: 'udp://8.8.8.8' outbound: block\n    }\n"
    )
    spec, diags = load(text)
    assert spec is not None, diags
    assert [u.outbound for u in spec.dns.upstreams] == ["direct", "block"]


@pytest.mark.parametrize("scheme", ["tcp+udp", "udp+tcp"])
def test_both_spellings_of_tcp_and_udp_read_as_udp_with_tcp_on_truncation(scheme):
    spec, diags = load(dns(f"    upstream {{\n        default: '{scheme}://192.0.2.53:53'\n    }}\n"))
    assert spec is not None, diags
    assert [(u.protocol, u.port) for u in spec.dns.upstreams] == [("udp", 53)]


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        ("tls", ("tls", 853)),
        ("https", ("https", 443)),
        ("h3", ("h3", 443)),
        ("http3", ("h3", 443)),
        ("quic", ("quic", 853)),
    ],
)
def test_encrypted_upstreams_load_with_their_default_ports(scheme, expected):
    spec, diags = load(dns(f"    upstream {{\n        default: '{scheme}://dns.example' -> direct\n    }}\n"))
    assert spec is not None, diags
    (upstream,) = spec.dns.upstreams
    assert (upstream.protocol, upstream.port) == expected


@pytest.mark.parametrize(
    "uri", ["ftp://1.1.1.1", "udp://", "udp://1.1.1.1:99999", "udp://1.1.1.1/dns", "a b"]
)
def test_malformed_upstream_uris_are_refused_at_their_line(uri):
    d = only_error(dns(f"    upstream {{\n        default: '{uri}'\n    }}\n"))
    assert (d.code, d.key_path, d.loc.line) == ("invalid-value", "dns.upstream.default", 3)


def test_a_forced_outbound_must_name_a_node_or_group():
    d = only_error(dns("    upstream {\n        default: '1.1.1.1' -> nowhere\n    }\n"))
    assert (d.code, d.key_path, d.loc.line) == ("unknown-outbound", "dns.upstream.default", 3)


def test_an_upstream_declared_twice_is_refused_at_the_second():
    d = only_error(dns("    upstream {\n        default: 1.1.1.1\n        default: 8.8.8.8\n    }\n"))
    assert (d.code, d.loc.line) == ("duplicate-upstream", 4)


@pytest.mark.parametrize("name", ["reject", "asis"])
def test_builtin_action_names_cannot_name_an_upstream(name):
    spec, diags = load(dns(f"    upstream {{\n        default: 1.1.1.1\n        {name}: 8.8.8.8\n    }}\n"))
    assert spec is None
    assert [(d.code, d.key_path) for d in diags if d.severity is E] == [
        ("invalid-value", f"dns.upstream.{name}")
    ]


def test_an_upstream_block_without_default_needs_its_own_fallback():
    d = only_error(dns("    upstream {\n        other: 1.1.1.1\n    }\n"))
    assert (d.code, d.key_path, d.loc.line) == ("unknown-dns-upstream", "dns.upstream", 2)
    spec, _ = load(
        dns(
            "    upstream {\n        other: 1.1.1.1\n    }\n"
            "    routing {\n        request {\n            fallback: other\n        }\n    }\n"
        )
    )
    assert spec is not None and spec.dns.request_fallback == "other"


# --- routing --------------------------------------------------------------------------------


def rules(*lines: str, response: str = "") -> str:
    body = "".join(f"            {line}\n" for line in lines)
    resp = f"        response {{\n            {response}\n        }}\n" if response else ""
    return dns(f"    routing {{\n        request {{\n{body}        }}\n{resp}    }}\n")


@pytest.mark.parametrize(
    ("rule", "code"),
    [
        ("qname(regex: '(') -> reject", "invalid-regex"),
        ("qname(ext: nolist) -> reject", "invalid-value"),
        ("sip(not-an-address) -> reject", "invalid-value"),
        ("ip(10.0.0.0/8) -> reject", "invalid-value"),
        ("upstream(default) -> reject", "invalid-value"),
        ("domain(example.com) -> reject", "unknown-dns-condition"),
        ("qtype(bogus) -> reject", "invalid-value"),
        ("qtype(70000) -> reject", "invalid-value"),
        ("qname(example.com) reject", "missing-arrow"),
        ("qname(example.com) -> nowhere", "unknown-dns-upstream"),
    ],
)
def test_request_rules_honk_cannot_follow_are_refused_at_their_line(rule, code):
    d = only_error(rules("qtype(a) -> default", rule))
    assert (d.code, d.key_path, d.loc.line) == (code, "dns.routing.request[1]", 5)


def test_request_fallback_accepts_reject_asis_or_an_upstream():
    for action in ("reject", "asis", "default"):
        spec, _ = load(rules(f"fallback: {action}"))
        assert spec.dns.request_fallback == action
    d = only_error(rules("fallback: nowhere"))
    assert (d.code, d.key_path, d.loc.line) == ("unknown-dns-upstream", "dns.routing.request.fallback", 4)


def test_an_unclosed_condition_is_refused_at_its_line_as_an_unclosed_routing_matcher_is():
    _, diags = load(rules("qtype(a) -> default", "qname(example.com -> reject"))
    errors = {(d.code, d.key_path, d.loc.line) for d in diags if d.severity is E}
    assert errors == {
        ("unterminated-matcher", "document", 5),
        ("unterminated-matcher", "dns.routing.request[1]", 5),
    }


def test_response_rules_and_every_response_fallback_are_read():
    spec, _ = load(rules(response="upstream(default) -> accept"))
    assert [r.action for r in spec.dns.response_rules] == ["accept"]
    for action in ("accept", "reject", "default"):
        spec, _ = load(rules(response=f"fallback: {action}"))
        assert spec.dns.response_fallback == action
    d = only_error(rules(response="fallback: nowhere"))
    assert (d.code, d.key_path) == ("unknown-dns-upstream", "dns.routing.response.fallback")


# --- the other keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("use_host: true", "not-yet-supported"),
        ("ipversion_prefer: 5", "invalid-value"),
        ("optimistic_cache_ttl: soon", "invalid-value"),
        ("optimistic_cache_ttl: 1.5", "invalid-value"),
        ("max_cache_size: many", "invalid-value"),
    ],
)
def test_unsupported_or_malformed_settings_are_refused_at_their_line(line, code):
    d = only_error(dns(f"    optimistic_cache: true\n    {line}\n"))
    assert (d.code, d.key_path, d.loc.line) == (code, f"dns.{line.split(':')[0]}", 3)


def test_cache_ttl_reads_durations_and_a_zero_cache_size_becomes_one_with_a_warning():
    spec, diags = load(
        dns("    optimistic_cache_ttl: 10m\n    max_cache_size: 0\n    optimistic_cache: false\n")
    )
    assert (spec.dns.optimistic_cache_ttl, spec.dns.max_cache_size, spec.dns.optimistic_cache) == (
        600,
        1,
        False,
    )
    (warning,) = [d for d in diags if d.key_path == "dns.max_cache_size"]
    assert warning.severity is Severity.WARNING and warning.loc.line == 3


@pytest.mark.parametrize("value", ["-1", "soon", "3.5"])
def test_a_fixed_domain_ttl_must_be_whole_seconds(value):
    d = only_error(dns(f"    fixed_domain_ttl {{\n        a.test: 1\n        b.test: {value}\n    }}\n"))
    assert (d.code, d.key_path, d.loc.line) == ("invalid-value", "dns.fixed_domain_ttl.b.test", 4)


def test_unknown_dns_keys_warn_and_the_file_loads():
    spec, diags = load(dns("    colour: blue\n"))
    assert spec is not None
    (d,) = [d for d in diags if d.code == "unknown-key"]
    assert (d.key_path, d.loc.line) == ("dns.colour", 2)


def test_toml_errors_are_located_too():
    text = '[dns.upstream]\ndefault = "1.1.1.1"\nsecure = "tls://1.1.1.1?sni=x"\n'
    d = only_error(text, "toml")
    assert (d.code, d.key_path, d.loc.line) == ("invalid-value", "dns.upstream.secure", 3)
