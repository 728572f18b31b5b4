"""Score target normalization and cell keys (GH-K-02, GH-K-03)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk.alive.outcome import Family
from honk.group.score.keys import ScoreTarget, target_family


def test_domain_targets_normalize_case_and_one_trailing_dot():
    assert ScoreTarget.parse("Example.COM.:443") == ScoreTarget.parse("example.com:443")
    assert ScoreTarget.parse("Example.COM.:443").text == "example.com:443"
    assert ScoreTarget.parse("example.com:80") != ScoreTarget.parse("example.com:443")


def test_only_ascii_letters_are_lowercased():
    assert ScoreTarget.of("ÄBC.Example", 1).host == "Äbc.example"


def test_a_name_with_an_empty_label_is_refused():
    for host in ("example.com..", ".", ""):
        with pytest.raises(ValueError):
            ScoreTarget.of(host, 443)


def test_ip_targets_keep_the_socket_address_in_compressed_form():
    target = ScoreTarget.parse("[2001:DB8:0:0::1]:443")
    assert target.text == "[2001:db8::1]:443"
    assert target.ip == ipaddress.ip_address("2001:db8::1")
    assert ScoreTarget.parse("192.0.2.1:53").text == "192.0.2.1:53"
    assert ScoreTarget.parse("[2001:db8::1]:443") != ScoreTarget.parse("[2001:db8::1]:80")


def test_ipv6_zone_ids_are_stripped():
    assert ScoreTarget.parse("[fe80::1%eth0]:443") == ScoreTarget.parse("[fe80::1]:443")
    assert ScoreTarget.of("fe80::1%2", 443).text == "[fe80::1]:443"


def test_a_name_that_is_an_ip_once_its_dot_is_gone_is_that_ip():
    assert ScoreTarget.of("192.0.2.1.", 80) == ScoreTarget.of("192.0.2.1", 80)


def test_bad_targets_are_refused():
    for text in ("example.com", "::1:443", "[example.com]:443", "a b:1", "x:65536", "x:-1", "[::1]443"):
        with pytest.raises(ValueError):
            ScoreTarget.parse(text)


def test_target_family_prefers_the_destination_actually_used():
    domain = ScoreTarget.parse("example.com:443")
    assert target_family(domain) is None
    assert domain.family(ipaddress.ip_address("2001:db8::1")) is Family.V6
    assert ScoreTarget.parse("192.0.2.1:443").family() is Family.V4
    assert target_family(None) is None


def test_the_repr_hides_the_target():
    assert "example" not in repr(ScoreTarget.parse("example.com:443"))


_hosts = st.one_of(
    st.text(alphabet="abcXYZ019-.", min_size=1, max_size=20),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda ip: f"[{ip}]"),
    st.ip_addresses(v=6).map(lambda ip: f"{ip}%eth0"),
)


@given(_hosts, st.integers(0, 65535))
def test_normalization_is_idempotent(host, port):
    try:
        target = ScoreTarget.of(host, port)
    except ValueError:
        return
    again = ScoreTarget.parse(target.text)
    assert again == target
    assert again.text == target.text
    assert ScoreTarget.of(target.host, port) == target
