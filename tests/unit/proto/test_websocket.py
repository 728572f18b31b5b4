"""The WebSocket client codec, pinned to RFC 6455's own examples where it has them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.core.errors import HonkError
from honk.proto.websocket import (
    SEND_FRAME,
    WebSocketError,
    WsDecoder,
    WsEncoder,
    client_handshake,
    parse_handshake_response,
)

RFC_KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3
RFC_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
RFC_MASK = bytes.fromhex("37fa213d")  # RFC 6455 section 5.7


def _response(accept: str = RFC_ACCEPT, status: str = "101 Switching Protocols") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
    ).encode()


def _server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        return struct.pack("!BB", first, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", first, 126, n) + payload
    return struct.pack("!BBQ", first, 127, n) + payload


def test_upgrade_request_carries_host_path_key_and_version() -> None:
    request, key = client_handshake("cdn.example", "ray", RFC_KEY)
    assert key == RFC_KEY
    assert request == (
        b"GET /ray HTTP/1.1\r\nHost: cdn.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )


def test_the_rfc_accept_value_completes_the_handshake_and_the_head_length_excludes_frames() -> None:
    head = _response()
    assert parse_handshake_response(head + b"\x82\x00", RFC_KEY) == len(head)
    assert parse_handshake_response(head[:20], RFC_KEY) is None


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (_response(status="403 Forbidden"), "handshake-status"),
        (_response(accept="AAAAAAAAAAAAAAAAAAAAAAAAAAA="), "handshake-accept"),
        (b"SSH-2.0-OpenSSH\r\n", "handshake-malformed"),
        (b"HTTP/1.1 101 OK\r\nConnection: Upgrade\r\n\r\n", "handshake-malformed"),
    ],
)
def test_a_refused_or_foreign_answer_is_a_typed_error(response: bytes, reason: str) -> None:
    with pytest.raises(WebSocketError) as info:
        parse_handshake_response(response, RFC_KEY)
    assert info.value.reason == reason


def test_client_frames_are_masked_as_in_the_rfc_example() -> None:
    frame = WsEncoder(random=lambda n: RFC_MASK).binary(b"Hello")
    assert frame == bytes.fromhex("8285") + RFC_MASK + bytes.fromhex("7f9f4d5158")


@pytest.mark.parametrize("size", [125, 126, 65535, 65536, SEND_FRAME + 1])
def test_lengths_use_the_short_16_and_64_bit_forms_and_split_at_the_send_frame(size: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    wire = WsEncoder(random=lambda n: b"\x00\x00\x00\x00").binary(data)
    # with a zero mask the payload is readable: strip each frame's head and compare
    got, pos = b"", 0
    while pos < len(wire):
        n = wire[pos + 1] & 0x7F
        pos += 2
        if n == 126:
            n, pos = struct.unpack_from("!H", wire, pos)[0], pos + 2
        elif n == 127:
            n, pos = struct.unpack_from("!Q", wire, pos)[0], pos + 8
        pos += 4  # the mask
        got += wire[pos : pos + n]
        pos += n
    assert got == data


def test_server_frames_become_bytes_pings_are_answered_and_close_is_reported() -> None:
    decoder = WsDecoder()
    stream = (
        _server_frame(0x2, b"first ", fin=False)
        + _server_frame(0x9, b"ping!")
        + _server_frame(0x0, b"second")
        + _server_frame(0x8, struct.pack("!H", 1001))
        + _server_frame(0x2, b"after close")
    )
    events = decoder.feed(stream)
    assert events.data == b"first second"
    assert events.pongs == (b"ping!",)
    assert events.closed == 1001 and decoder.closed
    assert decoder.feed(b"\x82\x01x").data == b""  # nothing after a close


@pytest.mark.parametrize("size", [0, 1, 125, 126, 70000])
def test_any_split_of_the_server_stream_gives_the_same_bytes(size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    stream = _server_frame(0x2, payload) + _server_frame(0x2, b"tail")
    for cut in sorted({0, 1, 2, 3, 4, 9, 10, len(stream) // 2, len(stream) - 1}):
        decoder = WsDecoder()
        got = decoder.feed(stream[:cut]).data + decoder.feed(stream[cut:]).data
        assert got == payload + b"tail"


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\x82\x81\x00\x00\x00\x00x", "masked-server-frame"),
        (b"\xc2\x01x", "reserved-bits"),
        (b"\x83\x01x", "bad-opcode"),
        (b"\x09\x01x", "bad-control-frame"),  # a fragmented ping
        (b"\x89\x7e\x00\x80" + b"x" * 128, "bad-control-frame"),  # a ping over 125 bytes
        (b"\x82\x7f" + struct.pack("!Q", 1 << 40), "frame-too-large"),
    ],
)
def test_frames_the_rfc_forbids_are_typed_errors(frame: bytes, reason: str) -> None:
    with pytest.raises(WebSocketError) as info:
        WsDecoder().feed(frame)
    assert info.value.reason == reason


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_server_bytes_give_bytes_or_typed_errors_only(data: bytes) -> None:
    try:
        WsDecoder().feed(data)
    except HonkError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_handshake_answers_give_a_length_none_or_typed_errors_only(data: bytes) -> None:
    try:
        length = parse_handshake_response(data, RFC_KEY)
    except HonkError:
        return
    assert length is None or length <= len(data)
