"""The VLESS client codec: request bytes, response header, UDP packets, typed failures."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.proto.vless import (
    AddressFormatError,
    VlessClient,
    VlessCommand,
    VlessProtocolError,
    VlessResponseDecoder,
    VlessUdpDecoder,
    encode_port_address,
    encode_udp_packet,
    parse_port_address,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ID = "27848739-7e62-4138-9fd3-098a63964b6b"
ID_BYTES = bytes.fromhex("278487397e6241389fd3098a63964b6b")


# --- request -----------------------------------------------------------------------


def test_tcp_request_to_a_domain_is_version_uuid_no_addons_command_port_then_domain() -> None:
    header = VlessClient(ID, VlessCommand.TCP, Address("example.com", 443)).request_header()
    assert header == b"\x00" + ID_BYTES + b"\x00" + b"\x01" + b"\x01\xbb" + b"\x02\x0bexample.com"


def test_udp_request_to_ipv4_uses_vless_address_type_1() -> None:
    header = VlessClient(uuid.UUID(ID), VlessCommand.UDP, Address("8.8.4.4", 53)).request_header()
    assert header == b"\x00" + ID_BYTES + b"\x00\x02" + b"\x00\x35" + b"\x01\x08\x08\x04\x04"


def test_ipv6_target_uses_vless_address_type_3_not_the_socks5_4() -> None:
    header = VlessClient(ID, VlessCommand.TCP, Address("2001:db8::1", 80)).request_header()
    assert header[18:] == b"\x01" + b"\x00\x50" + b"\x03" + bytes.fromhex("20010db8000000000000000000000001")


def test_mux_request_carries_no_target() -> None:
    header = VlessClient(ID, VlessCommand.MUX, None).request_header()
    assert header == b"\x00" + ID_BYTES + b"\x00\x03"


def test_a_tcp_request_without_a_target_is_refused() -> None:
    with pytest.raises(ValueError):
        VlessClient(ID, VlessCommand.TCP, None)


def test_a_malformed_uuid_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError) as info:
        VlessClient("not-a-uuid-secret", VlessCommand.TCP, Address("a.b", 1))
    assert "secret" not in str(info.value)


def test_client_repr_hides_the_uuid() -> None:
    client = VlessClient(ID, VlessCommand.TCP, Address("example.com", 443))
    assert ID not in repr(client) and ID.replace("-", "") not in repr(client)


@pytest.mark.parametrize(
    "address",
    [Address("example.com", 443), Address("10.1.2.3", 0), Address("::1", 65535), Address("a", 9)],
)
def test_port_address_round_trips(address: Address) -> None:
    raw = b"junk" + encode_port_address(address)
    assert parse_port_address(raw, 4) == (address, len(raw))


def test_port_address_cut_short_anywhere_asks_for_more() -> None:
    raw = encode_port_address(Address("example.com", 443))
    for cut in range(len(raw)):
        assert parse_port_address(raw[:cut], 0) is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x00\x50\x04" + bytes(4), "bad-address-type"),
        (b"\x00\x50\x02\x00", "empty-domain"),
        (b"\x00\x50\x02\x02a b", "bad-domain"),
    ],
)
def test_malformed_port_address_is_a_typed_error(raw: bytes, reason: str) -> None:
    with pytest.raises(AddressFormatError) as info:
        parse_port_address(raw, 0)
    assert info.value.reason == reason


# --- response ----------------------------------------------------------------------


def test_response_header_is_stripped_and_the_payload_passes_through() -> None:
    dec = VlessResponseDecoder()
    assert dec.feed(b"\x00\x00HTTP/1.1 200") == b"HTTP/1.1 200"
    assert dec.header_done
    assert dec.feed(b" OK") == b" OK"


def test_response_addons_are_skipped() -> None:
    assert VlessResponseDecoder().feed(b"\x00\x03abcpayload") == b"payload"


def test_response_split_at_every_byte_yields_the_same_payload() -> None:
    wire = b"\x00\x02xyhello"
    for cut in range(len(wire) + 1):
        dec = VlessResponseDecoder()
        out = dec.feed(wire[:cut]) if cut else b""
        out += dec.feed(wire[cut:]) if cut < len(wire) else b""
        assert out == b"hello", cut
    dec = VlessResponseDecoder()
    assert b"".join(dec.feed(wire[i : i + 1]) for i in range(len(wire))) == b"hello"


def test_wrong_response_version_is_a_protocol_error_and_sticks() -> None:
    dec = VlessResponseDecoder()
    with pytest.raises(VlessProtocolError) as info:
        dec.feed(b"HTTP/1.1 400 Bad Request\r\n")  # a server speaking something else
    assert info.value.reason == "bad-version"
    assert isinstance(info.value, HonkError)
    with pytest.raises(VlessProtocolError):
        dec.feed(b"\x00\x00")


@pytest.mark.parametrize("partial", [b"\x00", b"\x00\x04ab"])
def test_eof_inside_the_response_header_is_truncated_header(partial: bytes) -> None:
    dec = VlessResponseDecoder()
    assert dec.feed(partial) == b""
    with pytest.raises(VlessProtocolError) as info:
        dec.feed(b"")
    assert info.value.reason == "truncated-header"


def test_eof_before_any_response_byte_is_no_response_and_sticks() -> None:
    dec = VlessResponseDecoder()  # how v2ray answers an unknown UUID: a close, not one byte
    with pytest.raises(VlessProtocolError) as info:
        dec.feed(b"")
    assert info.value.reason == "no-response"
    assert dec.failed
    with pytest.raises(VlessProtocolError) as again:
        dec.feed(b"\x00\x00")
    assert again.value.reason == "no-response"


def test_eof_after_the_header_is_a_clean_end() -> None:
    dec = VlessResponseDecoder()
    dec.feed(b"\x00\x00")
    assert dec.feed(b"") == b""


# --- UDP ---------------------------------------------------------------------------


def test_udp_packet_is_length_prefixed_big_endian() -> None:
    assert encode_udp_packet(b"\xab" * 258) == b"\x01\x02" + b"\xab" * 258
    assert encode_udp_packet(b"") == b"\x00\x00"


def test_oversized_udp_packet_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_udp_packet(bytes(65536))


def test_udp_stream_split_at_every_byte_yields_the_same_packets() -> None:
    packets = [b"dns query", b"", b"x" * 300]
    wire = b"".join(encode_udp_packet(p) for p in packets)
    for cut in range(len(wire) + 1):
        dec = VlessUdpDecoder()
        got = dec.feed(wire[:cut]) + dec.feed(wire[cut:]) if 0 < cut < len(wire) else dec.feed(wire)
        assert got == packets, cut
        assert not dec.pending


def test_eof_inside_a_udp_packet_is_truncated_packet() -> None:
    dec = VlessUdpDecoder()
    assert dec.feed(b"\x00\x05abc") == []
    with pytest.raises(VlessProtocolError) as info:
        dec.feed(b"")
    assert info.value.reason == "truncated-packet"
    with pytest.raises(VlessProtocolError):
        dec.feed(b"\x00\x00")


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_udp_packets_round_trip_in_any_split(packets: list[bytes]) -> None:
    wire = b"".join(encode_udp_packet(p) for p in packets)
    dec = VlessUdpDecoder()
    got: list[bytes] = []
    for i in range(0, len(wire), 7):
        got += dec.feed(wire[i : i + 7])
    assert got == packets


# --- fuzz --------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=6), st.booleans())
def test_random_bytes_into_the_response_decoder_raise_only_typed_errors(
    chunks: list[bytes], eof: bool
) -> None:
    dec = VlessResponseDecoder()
    try:
        for chunk in chunks + ([b""] if eof else []):
            dec.feed(chunk)
    except VlessProtocolError:
        assert dec.failed


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_random_bytes_into_the_udp_decoder_raise_only_typed_errors(chunks: list[bytes]) -> None:
    dec = VlessUdpDecoder()
    try:
        for chunk in [*chunks, b""]:
            dec.feed(chunk)
    except VlessProtocolError as exc:
        assert exc.reason == "truncated-packet"


@FUZZ
@given(st.binary(max_size=40), st.integers(0, 6))
def test_random_bytes_parse_as_a_port_address_or_raise_a_typed_error(data: bytes, offset: int) -> None:
    try:
        parsed = parse_port_address(data, offset)
    except AddressFormatError:
        return
    if parsed is not None:
        assert offset < parsed[1] <= len(data)
