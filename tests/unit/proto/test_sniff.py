"""Sniffing a domain from a flow's first bytes: real ClientHellos (Python's TLS stack), real
QUIC Initials (aioquic's client, QUIC v1 and v2), the RFC 9001 Appendix A key derivation,
and any bytes at all never raising."""

from __future__ import annotations

import pytest
from helpers.hello import client_hello
from hypothesis import given
from hypothesis import strategies as st

from honk.proto.sniff import (
    NEED_MORE,
    QUIC_V1,
    QUIC_V2,
    QuicSniffer,
    client_initial_keys,
    sniff_http,
    sniff_quic,
    sniff_tls,
)


def quic_initial_datagrams(server_name: str, version: int = QUIC_V1) -> list[bytes]:
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    config = QuicConfiguration(
        is_client=True, server_name=server_name, alpn_protocols=["h3"], supported_versions=[version]
    )
    connection = QuicConnection(configuration=config)
    connection.connect(("192.0.2.1", 443), now=0.0)
    return [data for data, _ in connection.datagrams_to_send(now=0.0)]


def test_rfc9001_appendix_a_client_initial_keys():
    keys = client_initial_keys(bytes.fromhex("8394c8f03e515708"))
    assert keys.key.hex() == "1f369613dd76d5467730efcbe3b1a22d"
    assert keys.iv.hex() == "fa044b2f42a3fd3b46fb255c"
    assert keys.hp.hex() == "9f50449e04a0e810283a1e9933adedd2"


def test_the_sni_of_a_real_client_hello_is_found_and_its_prefixes_ask_for_more():
    hello = client_hello("Blocked.Test")
    assert sniff_tls(hello) == "blocked.test"
    for cut in (1, 5, 40, len(hello) - 1):
        assert sniff_tls(hello[:cut]) == NEED_MORE


def test_a_client_hello_split_over_two_records_is_reassembled():
    hello = client_hello("split.example")
    body = hello[5:]
    half = len(body) // 2
    records = b"\x16\x03\x01" + half.to_bytes(2, "big") + body[:half]
    records += b"\x16\x03\x01" + (len(body) - half).to_bytes(2, "big") + body[half:]
    assert sniff_tls(records) == "split.example"


def test_tls_without_a_server_name_and_other_protocols_name_nothing():
    assert sniff_tls(client_hello(None)) is None
    assert sniff_tls(b"SSH-2.0-OpenSSH_9.2\r\n") is None
    assert sniff_tls(b"\x16\x02\x00") is None  # not TLS 1.x


def test_the_http_host_is_found_without_its_port():
    assert sniff_http(b"GET / HTTP/1.1\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n") == "example.com"
    assert sniff_http(b"POST /x HTTP/1.1\r\nhost:api.test\r\n\r\nbody") == "api.test"
    assert sniff_http(b"GET / HTTP/1.1\r\nHost: api") == NEED_MORE
    assert sniff_http(b"GE") == NEED_MORE
    assert sniff_http(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n") is None
    assert sniff_http(b"\x16\x03\x01") is None
    assert sniff_http(b"GET / HTTP/1.0\r\n\r\n") is None


@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2])
def test_the_sni_of_a_real_quic_initial_is_recovered(version):
    datagrams = quic_initial_datagrams("quic.blocked.test", version)
    sniffer = QuicSniffer()
    found = None
    for datagram in datagrams:
        found = sniffer.feed(datagram)
        if found != NEED_MORE:
            break
    assert found == "quic.blocked.test"


def test_a_client_hello_spread_over_several_initials_asks_for_the_rest():
    name = "long." + "x" * 60 + ".test"
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    config = QuicConfiguration(
        is_client=True, server_name=name, alpn_protocols=[f"h3-{i:03d}" for i in range(400)]
    )
    connection = QuicConnection(configuration=config)
    connection.connect(("192.0.2.1", 443), now=0.0)
    datagrams = [data for data, _ in connection.datagrams_to_send(now=0.0)]
    assert len(datagrams) >= 2, "the ClientHello needs more than one Initial"
    sniffer = QuicSniffer()
    assert [sniffer.feed(d) for d in datagrams[:-1]] == [NEED_MORE] * (len(datagrams) - 1)
    assert sniffer.feed(datagrams[-1]) == name
    late = QuicSniffer()  # the second datagram first: a gap until the first arrives
    assert late.feed(datagrams[1]) == NEED_MORE


def test_a_tampered_or_foreign_datagram_names_nothing():
    datagram = bytearray(quic_initial_datagrams("x.test")[0])
    datagram[100] ^= 0xFF  # inside the sealed payload: the AEAD tag no longer verifies
    assert sniff_quic(bytes(datagram)) is None
    assert sniff_quic(b"\x40" + bytes(30)) is None  # a short header
    assert sniff_quic(b"") is None


@given(st.binary(max_size=2048))
def test_any_bytes_give_a_domain_need_more_or_none_and_never_raise(data):
    for sniff in (sniff_tls, sniff_http, sniff_quic):
        result = sniff(data)
        assert result is None or isinstance(result, str)


HELLO = client_hello("fuzz.test")
INITIAL = quic_initial_datagrams("fuzz.test")[0]


@given(st.integers(0, len(HELLO) - 1), st.integers(1, 255), st.integers(1, len(HELLO)))
def test_a_damaged_or_cut_client_hello_never_raises(index, flip, cut):
    damaged = bytearray(HELLO)
    damaged[index] ^= flip
    for data in (bytes(damaged), bytes(damaged[:cut])):
        result = sniff_tls(data)
        assert result is None or isinstance(result, str)


@given(st.integers(0, len(INITIAL) - 1), st.integers(1, 255))
def test_a_damaged_quic_initial_never_raises(index, flip):
    damaged = bytearray(INITIAL)
    damaged[index] ^= flip
    result = sniff_quic(bytes(damaged))
    assert result is None or result in ("fuzz.test", NEED_MORE)
