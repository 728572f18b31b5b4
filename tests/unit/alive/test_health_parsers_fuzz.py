"""Fuzzing the health parsers: any text is a parsed value or a ValueError, never anything else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from honk.alive.checkurl import parse_check_url
from honk.config.dnstarget import dns_check_target, parse_dns_target

URLISH = st.text(alphabet=st.sampled_from("htps:/[]@?#.%-_ :aA1\\\t\x00é80"), max_size=40)


@settings(max_examples=500, deadline=None)
@given(st.one_of(URLISH, st.text(max_size=60)), st.sampled_from(["http", "https"]))
def test_any_check_url_text_parses_or_is_refused(text: str, scheme: str) -> None:
    try:
        url = parse_check_url(text, default_scheme=scheme)
    except ValueError as exc:
        assert len(text) < 12 or text not in str(exc)  # the refusal does not echo the URL
        return
    assert url.scheme in ("http", "https") and 0 < url.port <= 65535
    assert url.target.startswith("/") and "#" not in url.target
    assert "@" not in url.authority


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(st.text(alphabet=st.sampled_from("[]:.0123456789abcdef-_ "), max_size=30), st.text(max_size=30))
)
def test_any_dns_target_text_parses_or_is_refused(text: str) -> None:
    try:
        address = parse_dns_target(text)
    except ValueError:
        return
    assert 1 <= address.port <= 65535 and address.host


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("[]:.0123456789abc, "), max_size=20), max_size=4))
def test_the_picked_dns_target_is_one_of_the_entries_or_the_default(entries: list[str]) -> None:
    try:
        picked = dns_check_target(entries)
    except ValueError:
        return
    assert picked.port >= 1
