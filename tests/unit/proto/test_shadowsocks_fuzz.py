"""Properties: arbitrary bytes and arbitrary ss:// text end in typed errors only."""

from __future__ import annotations

import base64
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.config.links import LinkError, parse_node_link
from honk.proto.shadowsocks import (
    CIPHERS,
    ShadowsocksAuthError,
    ShadowsocksProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    decode_address,
    master_key,
    open_packet,
)

TYPED = (ShadowsocksAuthError, ShadowsocksProtocolError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_ciphers = st.sampled_from(sorted(CIPHERS))
_chunks = st.lists(st.binary(max_size=120), max_size=8)


def _master(cipher: str) -> bytes:
    return master_key("fuzz", CIPHERS[cipher].key_size)


@FUZZ
@given(_ciphers, _chunks)
def test_random_bytes_into_a_stream_decryptor_raise_only_typed_errors(cipher, chunks):
    dec = StreamDecryptor(cipher, _master(cipher))
    try:
        for chunk in chunks:
            dec.feed(chunk)
    except TYPED:
        assert dec.failed


@FUZZ
@given(_ciphers, st.binary(max_size=200))
def test_random_bytes_into_open_packet_raise_only_typed_errors(cipher, packet):
    try:
        plain = open_packet(cipher, _master(cipher), packet)
    except TYPED:
        return
    raise AssertionError(f"{len(plain)} random bytes authenticated")


@FUZZ
@given(st.binary(max_size=40), st.integers(0, 8))
def test_random_bytes_decode_as_an_address_or_raise_a_protocol_error(data, offset):
    try:
        _, end = decode_address(data, offset)
    except ShadowsocksProtocolError:
        return
    assert offset < end <= len(data)


@FUZZ
@given(
    _ciphers,
    st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=5),
    st.data(),
)
def test_a_mutated_stream_yields_a_prefix_of_the_plaintext_then_a_typed_error(cipher, messages, data):
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    wire = bytearray(b"".join(enc.encrypt(m) for m in messages))
    op = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    i = data.draw(st.integers(0, len(wire) - 1))
    if op == "flip":
        wire[i] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del wire[i:]
    else:
        wire[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    splits = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    dec = StreamDecryptor(cipher, master)
    out = b""
    raised = False
    try:
        for a, b in zip([0, *splits], [*splits, len(wire)], strict=True):
            out += dec.feed(bytes(wire[a:b]))
    except TYPED:
        raised = True
    plaintext = b"".join(messages)
    assert plaintext.startswith(out)  # nothing unauthenticated ever comes out
    if op == "flip":
        assert raised
    elif op == "truncate":  # a cut stream is incomplete, not wrong
        assert not raised and len(out) < len(plaintext)


# --- share links -----------------------------------------------------------------

_LINK_PIECES = st.sampled_from(
    [
        "@",
        ":",
        "/",
        "?",
        "#",
        "=",
        "&",
        "%",
        "%40",
        "%3A",
        "[",
        "]",
        "::1",
        "plugin=",
        "plugin=obfs-local",
        "aes-128-gcm",
        "AES-256-GCM",
        "chacha20-ietf-poly1305",
        "rc4-md5",
        "2022-blake3-aes-128-gcm",
        "127.0.0.1",
        "h.example",
        "8388",
        "0",
        "65536",
        "==",
        "+",
        "_",
        "-",
    ]
)
_LINK_TEXT = st.lists(st.one_of(_LINK_PIECES, st.text(max_size=6)), max_size=14).map("".join)


def _b64(text: str, urlsafe: bool) -> str:
    raw = text.encode("utf-8")
    return (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()


@st.composite
def _ss_links(draw) -> str:
    form = draw(st.sampled_from(["text", "userinfo-b64", "whole-b64"]))
    inner = draw(_LINK_TEXT)
    if form == "text":
        body = inner
    elif form == "userinfo-b64":
        body = _b64(inner, draw(st.booleans())).rstrip("=" * draw(st.integers(0, 2))) + "@" + draw(_LINK_TEXT)
    else:
        body = _b64(inner, draw(st.booleans()))
    return draw(st.sampled_from(["ss://", "SS://", "ss:/", ""])) + body + draw(_LINK_TEXT)


@st.composite
def _near_valid_ss_links(draw) -> str:
    """Well-formed links in each form with random parts, then a random cut or insertion."""
    method = draw(st.sampled_from(["aes-128-gcm", "AES-256-GCM", "chacha20-ietf-poly1305", "rc4-md5", ""]))
    password = draw(st.text(max_size=10))
    host = draw(st.sampled_from(["127.0.0.1", "[::1]", "h.example", "", "::1"]))
    port = draw(st.sampled_from(["8388", "1", "65535", "0", "65536", "", "x"]))
    form = draw(st.sampled_from(["sip002-b64", "sip002-plain", "whole-b64"]))
    if form == "sip002-b64":
        body = _b64(f"{method}:{password}", draw(st.booleans())) + f"@{host}:{port}"
    elif form == "sip002-plain":
        body = f"{method}:{quote(password, safe='')}@{host}:{port}"
    else:
        body = _b64(f"{method}:{password}@{host}:{port}", draw(st.booleans()))
    tail = draw(st.sampled_from(["", "/", "/?plugin=", "/?plugin=v2ray-plugin%3Bserver", "?x=1", "#name"]))
    link = "ss://" + body + tail
    i = draw(st.integers(0, len(link)))
    if draw(st.booleans()):
        link = link[:i] + draw(_LINK_TEXT) + link[i:]
    return link


def _check_link(link: str) -> None:
    try:
        node = parse_node_link(link)
    except LinkError as exc:
        assert exc.code and exc.message
        return
    assert node.protocol in {"ss", "socks5", "http", "https"}
    if node.protocol == "ss":
        assert node.encryption in CIPHERS and node.password and 1 <= node.port <= 65535


@FUZZ
@given(_ss_links())
def test_random_ss_link_text_parses_or_raises_only_link_error(link):
    _check_link(link)


@FUZZ
@given(_near_valid_ss_links())
def test_near_valid_ss_links_parse_or_raise_only_link_error(link):
    _check_link(link)


@FUZZ
@given(st.text(max_size=80))
def test_arbitrary_text_as_a_share_link_parses_or_raises_only_link_error(link):
    _check_link(link)
