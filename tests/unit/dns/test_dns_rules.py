"""DNS request routing: first match wins; qname suffix/keyword/full (routing's domain matcher), qtype,
negation, AND."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from honk.config.spec import DNS_QTYPE_ANY, DnsCondition, DnsRequestRule, MatchArg
from honk.dns.rules import RequestRouter, condition_holds

A, AAAA, HTTPS = 1, 28, 65


def qname(*args: tuple[str, str], negated: bool = False) -> DnsCondition:
    return DnsCondition("qname", names=tuple(MatchArg(k, v) for k, v in args), negated=negated)


def qtype(*types: int, negated: bool = False) -> DnsCondition:
    return DnsCondition("qtype", qtypes=types, negated=negated)


def qname_matches(key: str, value: str, name: str) -> bool:
    return condition_holds(qname((key, value)), name, A)


def test_a_suffix_matches_on_label_boundaries_only():
    assert qname_matches("suffix", "example.com", "example.com")
    assert qname_matches("suffix", "example.com", "www.example.com")
    assert not qname_matches("suffix", "example.com", "badexample.com")
    assert not qname_matches("suffix", "www.example.com", "example.com")


def test_keyword_is_a_substring_and_full_the_exact_name():
    assert qname_matches("keyword", "ads", "myads.example")
    assert not qname_matches("keyword", "ads", "example.com")
    assert qname_matches("full", "a.example", "a.example")
    assert not qname_matches("full", "a.example", "b.a.example")


def test_arguments_are_alternatives_and_negation_inverts_the_condition():
    cond = qname(("full", "a.test"), ("suffix", "b.test"))
    assert condition_holds(cond, "a.test", A) and condition_holds(cond, "x.b.test", A)
    assert not condition_holds(cond, "c.test", A)
    assert condition_holds(qname(("full", "a.test"), negated=True), "c.test", A)
    assert not condition_holds(qtype(A, AAAA, negated=True), "c.test", AAAA)


def test_qtype_star_matches_every_type():
    assert condition_holds(qtype(DNS_QTYPE_ANY), "x", 12345)


def test_the_first_rule_whose_conditions_all_hold_decides_else_the_fallback():
    router = RequestRouter(
        [
            DnsRequestRule((qname(("suffix", "ads.test")), qtype(AAAA, negated=True)), "reject"),
            DnsRequestRule((qname(("suffix", "ads.test")),), "other"),
            DnsRequestRule((qtype(HTTPS),), "reject"),
        ],
        "default",
    )
    assert router.decide("x.ads.test", A) == "reject"
    assert router.decide("x.ads.test", AAAA) == "other"  # the AND failed, the next rule matched
    assert router.decide("example.com", HTTPS) == "reject"
    assert router.decide("example.com", A) == "default"


labels = st.text(alphabet="abcdefghij-", min_size=1, max_size=6)
names = st.lists(labels, min_size=1, max_size=4).map(".".join)


@given(names, names)
def test_suffix_means_equal_or_ends_with_dot_suffix(name, suffix):
    expected = name == suffix or name.endswith("." + suffix)
    assert qname_matches("suffix", suffix, name) is expected
    assert qname_matches("suffix", suffix, f"sub.{suffix}")
