"""The Subscription-Userinfo header providers send (traffic used and left, expiry): parsed into
the four known keys, with anything malformed left out rather than failing the fetch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from honk.subscription.fetch import USAGE_KEYS, parse_userinfo


def test_the_four_known_keys_are_read_in_any_order_and_case():
    header = b"upload=455727941; Download=6174315083; total=1073741824000; expire=1767225600"
    assert parse_userinfo(header) == {
        "upload": 455727941,
        "download": 6174315083,
        "total": 1073741824000,
        "expire": 1767225600,
    }


def test_unknown_keys_and_malformed_values_are_left_out():
    assert parse_userinfo(b"upload=1; remark=vip; download=-5; total=1e9; expire=") == {"upload": 1}
    assert parse_userinfo(b"nothing useful") is None
    assert parse_userinfo(b"") is None


@given(st.binary(max_size=200))
def test_any_header_value_parses_to_known_keys_with_non_negative_integers(value):
    usage = parse_userinfo(value)
    assert usage is None or (set(usage) <= set(USAGE_KEYS) and all(v >= 0 for v in usage.values()))
