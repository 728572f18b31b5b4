"""dae's DNS routing grammar as ``honk check`` reads it: every form of request and response rules,
``ipversion_prefer``, ``fixed_domain_ttl``, rules continued over lines, and the refusals located.

Each test names the public text it models: dae's docs/en/configuration/dns.md (daeuniverse/dae,
"Examples" and "Templates"), upstream honk's doc/en/reference/dns.md (Glassyiris/honk), or a
configuration of tests/corpus/dae. Names and addresses are the documentation ranges.
"""

from __future__ import annotations

import pytest

from honk.config.diagnostics import ConfigError, Diagnostic, Severity
from honk.config.load import load_text
from honk.config.spec import (
    DNS_QTYPE_ANY,
    DnsCondition,
    DnsOwnCall,
    DnsOwnRule,
    DnsRequestRule,
    DnsResponseRule,
    MatchArg,
    Spec,
)

A, AAAA, CNAME, HTTPS = 1, 28, 5, 65
E = Severity.ERROR


def load(text: str) -> tuple[Spec | None, tuple[Diagnostic, ...]]:
    try:
        spec = load_text(text, "dae")
    except ConfigError as exc:
        return None, exc.diagnostics
    return spec, spec.diagnostics


def errors(text: str) -> list[tuple[str, str, int]]:
    spec, diags = load(text)
    assert spec is None, "expected the file to be refused"
    return [(d.code, d.key_path, d.loc.line) for d in diags if d.severity is E]


UPSTREAMS = """\
    upstream {
        alidns: 'udp://dns.example.com:53'
        googledns: 'tcp+udp://dns.example.net:53'
    }
"""


def dns(request: str = "", response: str = "", head: str = "") -> str:
    """A dae file: ``head`` and the two upstreams, then the routing blocks (the first request rule on line 8);
    a request block without a fallback ends with ``fallback: alidns`` (the upstream block
    replaces the built-in one a fallback would name)."""
    if "fallback:" not in request and "default:" not in request:
        request += "            fallback: alidns\n"
    resp = f"        response {{\n{response}        }}\n" if response else ""
    return (
        f"dns {{\n{head}{UPSTREAMS}    routing {{\n        request {{\n{request}"
        f"        }}\n{resp}    }}\n}}\n"
    )


def qname(*args: tuple[str, str], negated: bool = False) -> DnsCondition:
    return DnsCondition("qname", names=tuple(MatchArg(k, v) for k, v in args), negated=negated)


# --- dae's docs/en/configuration/dns.md, "Examples" --------------------------------------------

DAE_EXAMPLE = """\
dns {
    # the docs' comment: AAAA answers are emptied when the name is known to have A records
    ipversion_prefer: 4

    fixed_domain_ttl {
        ddns.example.org: 10
        test.example.org: 3600
    }

    #bind: '127.0.0.1:5353'

    upstream {
        alidns: 'udp://dns.example.com:53'
        googledns: 'tcp+udp://dns.example.net:53'
    }
    routing {
        request {
            qname(geosite:category-ads-all) -> reject
            qname(geosite:google@cn) -> alidns # see the attributes of domain-list-community
            qname(suffix: abc.example, keyword: google) -> googledns
            qname(full: ok.example, regex: '^yes') -> googledns
            qtype(a, aaaa) -> alidns
            qtype(cname) -> googledns
            qtype(https) -> reject

            # sub(my_sub) -> googledns
            fallback: asis
        }
        response {
            upstream(googledns) -> accept
            ip(geoip:private) && !qname(geosite:cn) -> googledns
            fallback: accept
        }
    }
}
"""


def test_dae_docs_dns_example_loads_with_every_rule_as_written(geodata):
    """dae docs/en/configuration/dns.md, Examples: geosite with @attr, suffix/keyword/full/regex,
    qtype names, reject/asis, upstream() and ip(geoip:) && !qname(geosite:) on responses."""
    spec, diags = load(DAE_EXAMPLE)
    assert spec is not None and not diags
    d = spec.dns
    assert d.ipversion_prefer == 4
    assert d.fixed_domain_ttl == (("ddns.example.org", 10), ("test.example.org", 3600))
    assert d.request_rules == (
        DnsRequestRule((qname(("geosite", "category-ads-all")),), "reject"),
        DnsRequestRule((qname(("geosite", "google@cn")),), "alidns"),
        DnsRequestRule((qname(("suffix", "abc.example"), ("keyword", "google")),), "googledns"),
        DnsRequestRule((qname(("full", "ok.example"), ("regex", "^yes")),), "googledns"),
        DnsRequestRule((DnsCondition("qtype", qtypes=(A, AAAA)),), "alidns"),
        DnsRequestRule((DnsCondition("qtype", qtypes=(CNAME,)),), "googledns"),
        DnsRequestRule((DnsCondition("qtype", qtypes=(HTTPS,)),), "reject"),
    )
    assert d.request_fallback == "asis"
    assert d.response_rules == (
        DnsResponseRule((DnsCondition("upstream", upstreams=("googledns",)),), "accept"),
        DnsResponseRule(
            (DnsCondition("ip", ips=(MatchArg("geoip", "private"),)), qname(("geosite", "cn"), negated=True)),
            "googledns",
        ),
    )
    assert d.response_fallback == "accept"


def test_dae_docs_templates_split_by_request_and_requery_on_a_polluted_response(geodata):
    """dae docs/en/configuration/dns.md, Templates: `qname(geosite:cn) -> alidns` with
    `fallback: googledns`, and the response template that re-asks googledns."""
    spec, diags = load(dns("            qname(geosite:cn) -> alidns\n            fallback: googledns\n"))
    assert spec is not None and not diags
    assert spec.dns.request_rules == (DnsRequestRule((qname(("geosite", "cn")),), "alidns"),)
    assert spec.dns.request_fallback == "googledns"
    spec, diags = load(
        dns(
            "            fallback: alidns\n",
            "            upstream(googledns) -> accept\n"
            "            ip(geoip:private) && !qname(geosite:cn) -> googledns\n"
            "            fallback: accept\n",
        )
    )
    assert spec is not None and not diags
    assert [r.action for r in spec.dns.response_rules] == ["accept", "googledns"]


def test_default_is_dae_s_other_name_for_a_fallback():
    """dae docs/en/configuration/dns.md, Templates: "fallback is also called default"."""
    spec, _ = load(dns("            default: googledns\n", "            default: reject\n"))
    assert (spec.dns.request_fallback, spec.dns.response_fallback) == ("googledns", "reject")


# --- every argument form ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("qname(example.com)", qname(("suffix", "example.com"))),  # bare: a suffix (upstream honk)
        ("qname(suffix: Example.COM.)", qname(("suffix", "example.com"))),
        ("qname(full: a.example.com)", qname(("full", "a.example.com"))),
        ("qname(keyword: ads)", qname(("keyword", "ads"))),
        ("qname(contains: ads)", qname(("keyword", "ads"))),  # dae's alias, as routing reads it
        ("qname(regex: '^cdn[0-9]+\\.')", qname(("regex", "^cdn[0-9]+\\."))),
        ("qname(geosite: CN)", qname(("geosite", "cn"))),
        ("qname(geosite:category-ads-all@ads)", qname(("geosite", "category-ads-all@ads"))),
        ("qname(ext: geosite.dat:GitHub)", qname(("ext", "geosite.dat:github"))),
        ("!qname(geosite:cn)", qname(("geosite", "cn"), negated=True)),
        ("qtype(A, aaaa, 65, *)", DnsCondition("qtype", qtypes=(A, AAAA, HTTPS, DNS_QTYPE_ANY))),
        (
            "sip(192.168.50.0/24, 100.64.0.1)",
            DnsCondition("sip", ips=(MatchArg("", "192.168.50.0/24"), MatchArg("", "100.64.0.1"))),
        ),
        ("sip(geoip: lan)", DnsCondition("sip", ips=(MatchArg("geoip", "lan"),))),
    ],
)
def test_every_request_condition_form_is_read_as_routing_reads_its_arguments(condition, expected, geodata):
    """dae docs/en/configuration/dns.md ("Available functions ... qname, qtype") and upstream
    honk's doc/en/reference/dns.md (its Conditions table, sip included)."""
    spec, diags = load(dns(f"            {condition} -> googledns\n"))
    assert spec is not None and not diags, diags
    assert spec.dns.request_rules == (DnsRequestRule((expected,), "googledns"),)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("upstream(alidns, googledns)", DnsCondition("upstream", upstreams=("alidns", "googledns"))),
        (
            "ip(192.0.2.0/24, 2001:db8::1)",
            DnsCondition("ip", ips=(MatchArg("", "192.0.2.0/24"), MatchArg("", "2001:db8::1"))),
        ),
        ("ip(geoip: cn)", DnsCondition("ip", ips=(MatchArg("geoip", "cn"),))),
        ("!ip(geoip:private)", DnsCondition("ip", ips=(MatchArg("geoip", "private"),), negated=True)),
        ("qname(geosite:cn)", qname(("geosite", "cn"))),
        ("qtype(aaaa)", DnsCondition("qtype", qtypes=(AAAA,))),
    ],
)
def test_every_response_condition_form_is_read(condition, expected, geodata):
    """dae docs/en/configuration/dns.md: "Available functions: qname, qtype, upstream, ip"."""
    spec, diags = load(dns("            fallback: alidns\n", f"            {condition} -> reject\n"))
    assert spec is not None and not diags, diags
    assert spec.dns.response_rules == (DnsResponseRule((expected,), "reject"),)


# --- rules over several lines -----------------------------------------------------------------


def test_a_rule_continues_over_lines_as_a_routing_rule_does(geodata):
    """The corpus file with 23 errors from one DNS rule laid out over lines (issue 35): '&&' at a
    line's end or head, an argument list left open, '->' on the next line; the rule keeps its
    first line."""
    spec, diags = load(
        dns(
            "            qname(geosite:cn,\n"
            "                  suffix: example.com) &&\n"
            "            qtype(a, aaaa)\n"
            "                -> alidns\n"
            "            qtype(https)\n"
            "            && !qname(full: keep.example.com) -> reject\n"
            "            fallback: googledns\n",
            "            ip(geoip:private)\n"
            "                && !qname(geosite:cn)\n"
            "                -> googledns\n"
            "            fallback: accept\n",
        )
    )
    assert spec is not None and not diags, diags
    first, second = spec.dns.request_rules
    assert first == DnsRequestRule(
        (qname(("geosite", "cn"), ("suffix", "example.com")), DnsCondition("qtype", qtypes=(A, AAAA))),
        "alidns",
    )
    assert first.loc.line == 8
    assert second.action == "reject" and second.loc.line == 12
    (rule,) = spec.dns.response_rules
    assert rule.action == "googledns" and rule.loc.line == 17


# --- ipversion_prefer, fixed_domain_ttl ---------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("4", 4), ("6", 6), ("'6'", 6)])
def test_ipversion_prefer_takes_4_or_6(value, expected):
    """dae docs/en/configuration/dns.md: `ipversion_prefer: 4` (upstream honk: 4 or 6)."""
    spec, _ = load(dns("            fallback: alidns\n", head=f"    ipversion_prefer: {value}\n"))
    assert spec.dns.ipversion_prefer == expected


def test_without_ipversion_prefer_both_families_are_answered_as_asked():
    spec, _ = load(dns("            fallback: alidns\n"))
    assert spec.dns.ipversion_prefer is None


def test_ipversion_prefer_refuses_anything_but_4_or_6_at_its_line():
    assert errors(dns("            fallback: alidns\n", head="    ipversion_prefer: 5\n")) == [
        ("invalid-value", "dns.ipversion_prefer", 2)
    ]


# --- dae's internal selectors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            "sub(my_sub) -> googledns",
            DnsOwnRule("sub", (DnsOwnCall((MatchArg("tag", "my_sub"),)),), "googledns"),
        ),
        ("sub() -> googledns", DnsOwnRule("sub", (DnsOwnCall(),), "googledns")),
        (
            "sub(regex: '^paid', link_keyword: provider) -> alidns",
            DnsOwnRule(
                "sub",
                (DnsOwnCall((MatchArg("tag_regex", "^paid"), MatchArg("link_keyword", "provider"))),),
                "alidns",
            ),
        ),
        (
            "node(name_keyword: hk) -> googledns",
            DnsOwnRule("node", (DnsOwnCall((MatchArg("name_keyword", "hk"),)),), "googledns"),
        ),
        (
            "node(hk-01, name_regex: '^jp') -> googledns",
            DnsOwnRule(
                "node", (DnsOwnCall((MatchArg("name", "hk-01"), MatchArg("name_regex", "^jp"))),), "googledns"
            ),
        ),
        (
            "subnode(subtag: my_sub, name_keyword: hk) -> alidns",
            DnsOwnRule(
                "subnode",
                (DnsOwnCall((MatchArg("subtag", "my_sub"), MatchArg("name_keyword", "hk"))),),
                "alidns",
            ),
        ),
        (
            "subnode(my_sub) && !subnode(regex: 'x$') -> alidns",
            DnsOwnRule(
                "subnode",
                (
                    DnsOwnCall((MatchArg("subtag", "my_sub"),)),
                    DnsOwnCall((MatchArg("subtag_regex", "x$"),), negated=True),
                ),
                "alidns",
            ),
        ),
    ],
)
def test_dae_s_own_lookup_selectors_are_kept_with_their_arguments_keyed_as_dae_keys_them(rule, expected):
    """dae docs/en/configuration/dns.md and example.dae: sub()/node()/subnode() pick the upstream of
    dae's own lookups; component/daedns/router.go names their keys (a bare argument is the tag,
    the name or the subtag; ``regex`` is ``tag_regex``/``subtag_regex``)."""
    spec, diags = load(dns(f"            {rule}\n            fallback: alidns\n"))
    assert spec is not None and spec.dns.request_rules == () and diags == ()
    assert spec.dns.own_rules == (expected,)
    assert spec.dns.own_rules[0].loc.line == 8


@pytest.mark.parametrize(
    ("rule", "code"),
    [
        ("node(subtag: my_sub) -> alidns", "invalid-value"),  # a subnode key
        ("sub(name: x) -> alidns", "invalid-value"),
        ("node(name_regex: '(') -> alidns", "invalid-regex"),
        ("sub(my_sub) && node(hk) -> alidns", "invalid-rule"),
        ("node(hk) -> asis", "unknown-dns-upstream"),  # plain upstream targets only
    ],
)
def test_an_own_lookup_selector_dae_would_refuse_is_refused_at_its_line(rule, code):
    assert errors(dns(f"            {rule}\n")) == [(code, "dns.routing.request[0]", 8)]


def test_an_own_lookup_selector_mixed_with_qname_or_naming_no_upstream_is_refused():
    """dae docs/en/configuration/dns.md: they "cannot be mixed with qname/qtype in the same rule"
    and "must target names defined in dns.upstream"."""
    assert errors(dns("            sub(my_sub) && qname(example.com) -> googledns\n")) == [
        ("invalid-rule", "dns.routing.request[0]", 8)
    ]
    assert errors(dns("            node(name_keyword: hk) -> nowhere\n")) == [
        ("unknown-dns-upstream", "dns.routing.request[0]", 8)
    ]


# --- refusals, located --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_rule", "response_rule", "code", "path", "line"),
    [
        ("ip(192.0.2.1) -> alidns", "", "invalid-value", "dns.routing.request[0]", 8),
        ("upstream(alidns) -> alidns", "", "invalid-value", "dns.routing.request[0]", 8),
        ("fallback: alidns", "sip(192.0.2.1) -> accept", "invalid-value", "dns.routing.response[0]", 11),
        ("fallback: alidns", "asis", "missing-arrow", "dns.routing.response[0]", 11),
        (
            "fallback: alidns",
            "qname(example.com) -> asis",
            "unknown-dns-upstream",
            "dns.routing.response[0]",
            11,
        ),
        (
            "fallback: alidns",
            "upstream(nowhere) -> accept",
            "unknown-dns-upstream",
            "dns.routing.response[0]",
            11,
        ),
        ("fallback: alidns", "ip(not-an-ip) -> accept", "invalid-value", "dns.routing.response[0]", 11),
        ("domain(example.com) -> alidns", "", "unknown-dns-condition", "dns.routing.request[0]", 8),
        ("qname() -> alidns", "", "invalid-value", "dns.routing.request[0]", 8),
        ("qname(geosite: nosuchlist) -> alidns", "", "geodata-unknown-code", "dns.routing.request[0]", 8),
        (
            "fallback: alidns",
            "ip(geoip: nosuchlist) -> accept",
            "geodata-unknown-code",
            "dns.routing.response[0]",
            11,
        ),
    ],
)
def test_a_real_mistake_is_refused_with_its_key_path_and_line(
    request_rule, response_rule, code, path, line, geodata
):
    found = errors(
        dns(f"            {request_rule}\n", f"            {response_rule}\n" if response_rule else "")
    )
    assert found == [(code, path, line)]


def test_a_geosite_code_without_its_data_file_refuses_the_file(no_geodata):
    """As routing's geodata check does (honk.config.geodata): a rule that would match nothing."""
    assert errors(dns("            qname(geosite:cn) -> alidns\n")) == [
        ("geodata-missing", "dns.routing.request[0]", 8)
    ]


def test_an_upstream_may_not_be_named_after_a_response_action():
    found = errors("dns {\n    upstream {\n        accept: 'udp://192.0.2.53:53'\n    }\n}\n")
    assert ("invalid-value", "dns.upstream.accept", 3) in found
