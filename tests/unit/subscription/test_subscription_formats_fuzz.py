"""Property: any body parses into nodes or raises SubscriptionError, and nothing else."""

from __future__ import annotations

import base64
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.subscription.formats import SUPPORTED_PROTOCOLS, ParsedBody, SubscriptionError, parse_body

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces that steer detection and the per-format parsers, mixed with anything.
_SYNTAX = st.sampled_from(
    [
        "socks5://",
        "ss://",
        "http://",
        "https://",
        "vmess://",
        "@",
        ":",
        "#",
        "?plugin=",
        "\n",
        "\r\n",
        "REMARKS=",
        "proxies:",
        "servers",
        "outbounds",
        "- ",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        ",",
        "&",
        "*a",
        "&a ",
        "aes-256-gcm",
        "127.0.0.1",
        "[::1]",
        "1080",
        "65536",
        "=",
        "\ufeff",
        "type: ss",
        "!!python/object",
    ]
)
_TEXT = st.lists(st.one_of(_SYNTAX, st.text(max_size=10)), max_size=40).map("".join)

_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "socks5",
            "http",
            "ss",
            "shadowsocks",
            "socks",
            "selector",
            "aes-128-gcm",
            "h.example",
            "::1",
            "1080",
            "0",
            "",
        ]
    ),
)
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "server",
                    "port",
                    "server_port",
                    "name",
                    "tag",
                    "password",
                    "username",
                    "cipher",
                    "method",
                    "plugin",
                    "plugin-opts",
                    "tls",
                    "sni",
                    "version",
                    "detour",
                    "proxies",
                    "servers",
                    "outbounds",
                    "x",
                ]
            ),
            inner,
            max_size=8,
        ),
    ),
    max_leaves=30,
)


# Entries close to valid ones, so admission (ids, duplicates, credentials) runs often.
def _mostly(valid: list, invalid: list) -> st.SearchStrategy:
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(invalid), _SCALAR)


_PORT = _mostly([1, 1080, "8388", 65535], [0, 70000, "x", 8388.0])
_CIPHER = _mostly(["aes-128-gcm", "AES-256-GCM", "chacha20-ietf-poly1305"], ["rc4", ""])
_ENTRY = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["socks5", "http", "ss", "shadowsocks", "socks", "vmess", "direct"]),
        "server": _mostly(["h.example", "127.0.0.1", "::1", "H2.example."], ["", "a b", "[::1]", "h:1"]),
        "port": _PORT,
        "server_port": _PORT,
        "password": _mostly(["pw", "s3cret", "x"], ["", 0]),
    },
    optional={
        "cipher": _CIPHER,
        "method": _CIPHER,
        "username": _SCALAR,
        "tls": st.booleans(),
        "plugin": _mostly(["", None], ["obfs"]),
        "name": _SCALAR,
        "tag": _SCALAR,
        "remarks": _SCALAR,
        "sni": _SCALAR,
    },
)


def _check(body: bytes) -> None:
    try:
        result = parse_body(body, "fuzz")
    except SubscriptionError as exc:
        assert exc.reason
        return
    assert isinstance(result, ParsedBody) and result.nodes
    assert len({n.id for n in result.nodes}) == len(result.nodes)
    assert all(n.subscription == "fuzz" and n.protocol in SUPPORTED_PROTOCOLS for n in result.nodes)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_parse_or_raise_subscription_error(body):
    _check(body)


@FUZZ
@given(_TEXT)
def test_random_text_parses_or_raises_subscription_error(text):
    _check(text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(_TEXT)
def test_random_text_as_base64_parses_or_raises_subscription_error(text):
    _check(base64.b64encode(text.encode("utf-8", "surrogatepass")))


@FUZZ
@given(_JSON)
def test_random_json_documents_parse_or_raise_subscription_error(doc):
    _check(json.dumps(doc).encode())


@FUZZ
@given(st.lists(_JSON, max_size=6), st.sampled_from(["proxies", "servers", "outbounds"]))
def test_random_structured_entries_parse_or_raise_subscription_error(entries, key):
    _check(json.dumps({key: entries}).encode())


@FUZZ
@given(st.lists(_ENTRY, max_size=8), st.sampled_from(["proxies", "servers", "outbounds"]))
def test_near_valid_entries_parse_or_raise_subscription_error(entries, key):
    _check(json.dumps({key: entries}).encode())


@FUZZ
@given(_JSON)
def test_random_yaml_ish_documents_parse_or_raise_subscription_error(doc):
    # JSON is YAML flow syntax; a block-style rendering exercises the YAML path too
    text = json.dumps(doc, indent=1).replace('"', "").replace(",", "")
    _check(("proxies:\n" + text).encode())
