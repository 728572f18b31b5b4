"""The Trojan client codec: password hash, request bytes, the CONNECT stream's watch, UDP framing, typed failures."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.proto.trojan import (
    MAX_UDP_PAYLOAD,
    TrojanClient,
    TrojanCommand,
    TrojanError,
    TrojanProtocolError,
    TrojanStreamWatch,
    TrojanUdpDecoder,
    encode_udp_packet,
    password_hash,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# FIPS 180-4 example: SHA-224("abc")
ABC_HASH = b"23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7"


def test_password_hash_is_56_lower_case_hex_bytes_of_sha224() -> None:
    assert password_hash("abc") == ABC_HASH
    assert len(password_hash("another")) == 56


def test_connect_request_to_a_domain_is_hash_crlf_command_socks_address_crlf() -> None:
    header = TrojanClient("abc", TrojanCommand.CONNECT, Address("example.com", 443)).request_header()
    assert header == ABC_HASH + b"\r\n" + b"\x01" + b"\x03\x0bexample.com\x01\xbb" + b"\r\n"


def test_udp_associate_request_uses_command_3_and_socks_ipv6_type_4() -> None:
    header = TrojanClient("abc", TrojanCommand.UDP_ASSOCIATE, Address("::1", 53)).request_header()
    assert header == ABC_HASH + b"\r\n\x03\x04" + bytes(15) + b"\x01\x00\x35\r\n"


def test_client_repr_hides_the_password_and_its_hash() -> None:
    text = repr(TrojanClient("abc", TrojanCommand.CONNECT, Address("example.com", 443)))
    assert "abc" not in text.replace("example", "") and ABC_HASH.decode() not in text


def test_udp_packet_is_address_length_crlf_payload() -> None:
    packet = encode_udp_packet(Address("8.8.8.8", 53), b"\x12\x34query")
    assert packet == b"\x01\x08\x08\x08\x08\x00\x35" + b"\x00\x07" + b"\r\n" + b"\x12\x34query"


def test_udp_packet_above_v2rays_limit_is_refused() -> None:
    encode_udp_packet(Address("1.1.1.1", 53), bytes(MAX_UDP_PAYLOAD))
    with pytest.raises(ValueError):
        encode_udp_packet(Address("1.1.1.1", 53), bytes(MAX_UDP_PAYLOAD + 1))


PACKETS = [
    (Address("8.8.8.8", 53), b"answer one"),
    (Address("dns.example", 5353), b""),
    (Address("2001:db8::53", 53), b"z" * 600),
]


def test_udp_stream_split_at_every_byte_yields_the_same_packets() -> None:
    wire = b"".join(encode_udp_packet(a, p) for a, p in PACKETS)
    for cut in range(len(wire) + 1):
        dec = TrojanUdpDecoder()
        got = dec.feed(wire[:cut]) + dec.feed(wire[cut:]) if 0 < cut < len(wire) else dec.feed(wire)
        assert got == PACKETS, cut
        assert not dec.pending
    dec = TrojanUdpDecoder()
    one_by_one = [p for i in range(len(wire)) for p in dec.feed(wire[i : i + 1])]
    assert one_by_one == PACKETS


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"\x02\x00\x00\x00\x00\x00\x35\x00\x01\r\nx", "bad-address-type"),
        (b"\x03\x00\x00\x35\x00\x01\r\nx", "empty-domain"),
        (b"\x01\x08\x08\x08\x08\x00\x35\x00\x01XXx", "missing-crlf"),
    ],
)
def test_malformed_udp_frames_are_typed_protocol_errors(wire: bytes, reason: str) -> None:
    dec = TrojanUdpDecoder()
    with pytest.raises(TrojanProtocolError) as info:
        dec.feed(wire)
    assert info.value.reason == reason
    assert isinstance(info.value, HonkError)
    assert dec.failed
    with pytest.raises(TrojanProtocolError):
        dec.feed(encode_udp_packet(Address("1.1.1.1", 1), b"ok"))


def test_a_bad_frame_after_good_ones_fails_the_decoder() -> None:
    dec = TrojanUdpDecoder()
    good = encode_udp_packet(Address("1.1.1.1", 53), b"ok")
    assert dec.feed(good) == [(Address("1.1.1.1", 53), b"ok")]
    with pytest.raises(TrojanProtocolError):
        dec.feed(good + b"\x09")


# --- CONNECT -----------------------------------------------------------------------


def test_the_connect_stream_passes_the_servers_bytes_through_unchanged() -> None:
    watch = TrojanStreamWatch()
    data = b"HTTP/1.1 200 OK\r\n"
    assert watch.feed(data) is data  # no copy on the data path
    assert watch.seen


def test_eof_before_any_byte_is_closed_before_data() -> None:
    watch = TrojanStreamWatch()
    with pytest.raises(TrojanError) as info:
        watch.feed(b"")
    assert info.value.reason == "closed-before-data"
    assert not isinstance(info.value, TrojanProtocolError)  # nothing was malformed: the server said nothing
    assert isinstance(info.value, HonkError)


def test_eof_after_the_first_byte_is_a_clean_end() -> None:
    watch = TrojanStreamWatch()
    watch.feed(b"x")
    assert watch.feed(b"") == b""


# --- UDP ---------------------------------------------------------------------------


def test_eof_inside_a_udp_packet_is_truncated_packet_and_a_clean_eof_is_not() -> None:
    wire = encode_udp_packet(Address("1.1.1.1", 53), b"ok")
    dec = TrojanUdpDecoder()
    assert dec.feed(wire[:-1]) == []
    with pytest.raises(TrojanProtocolError) as info:
        dec.feed(b"")
    assert info.value.reason == "truncated-packet"
    clean = TrojanUdpDecoder()
    clean.feed(wire)
    assert clean.feed(b"") == []


_addresses = st.one_of(
    st.ip_addresses().map(lambda ip: Address(str(ip), 53)),
    st.from_regex(r"[a-z0-9]{1,20}(\.[a-z]{2,6})?", fullmatch=True).map(lambda h: Address(h, 443)),
)


@FUZZ
@given(st.lists(st.tuples(_addresses, st.binary(max_size=64)), max_size=6), st.integers(1, 9))
def test_udp_packets_round_trip_in_any_split(packets: list[tuple[Address, bytes]], step: int) -> None:
    wire = b"".join(encode_udp_packet(a, p) for a, p in packets)
    dec = TrojanUdpDecoder()
    got: list[tuple[Address, bytes]] = []
    for i in range(0, len(wire), step):
        got += dec.feed(wire[i : i + step])
    assert got == packets


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_random_bytes_into_the_udp_decoder_raise_only_typed_errors(chunks: list[bytes]) -> None:
    dec = TrojanUdpDecoder()
    try:
        for chunk in [*chunks, b""]:
            dec.feed(chunk)
    except TrojanProtocolError:
        assert dec.failed
