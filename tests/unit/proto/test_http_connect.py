"""The HTTP CONNECT request and response codec."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.core.errors import DialError, HonkError, ProxyAuthFailed, TargetRefused
from honk.core.net import Address
from honk.proto.http_connect import (
    MAX_RESPONSE_HEAD,
    ConnectResponse,
    check_status,
    connect_request,
    parse_connect_response,
)


def test_request_names_the_authority_and_carries_basic_credentials() -> None:
    request = connect_request(Address("example.com", 443), "alice", "pa:ss")
    token = base64.b64encode(b"alice:pa:ss").decode()
    assert (
        request
        == (
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n"
            f"Proxy-Authorization: Basic {token}\r\n\r\n"
        ).encode()
    )


def test_ipv6_targets_are_bracketed() -> None:
    assert connect_request(Address("::1", 80)).startswith(b"CONNECT [::1]:80 HTTP/1.1\r\nHost: [::1]:80\r\n")


def test_response_head_length_stops_before_tunnel_bytes() -> None:
    head = b"HTTP/1.1 200 Connection established\r\nVia: test\r\n\r\n"
    response = parse_connect_response(head + b"SSH-2.0-server\r\n", "n")
    assert response == ConnectResponse(200, "Connection established", len(head))
    check_status(response, "n")


def test_incomplete_head_asks_for_more() -> None:
    assert parse_connect_response(b"HTTP/1.1 200 OK\r\nVia: x\r\n", "n") is None
    assert parse_connect_response(b"HTT", "n") is None


@pytest.mark.parametrize(
    "garbage", [b"SSH-2.0-x\r\n", b"<html>\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"HTTP/1.1 20\r\n\r\n"]
)
def test_bytes_that_are_not_an_http_response_are_a_handshake_error(garbage: bytes) -> None:
    with pytest.raises(DialError) as info:
        parse_connect_response(garbage, "n")
    assert info.value.phase == "handshake"


def test_a_head_beyond_the_limit_is_refused() -> None:
    with pytest.raises(DialError, match="too large"):
        parse_connect_response(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_RESPONSE_HEAD // 6 + 1), "n")


@pytest.mark.parametrize("status", [407, 401])
def test_407_and_401_are_authentication_errors(status: int) -> None:
    with pytest.raises(ProxyAuthFailed):
        check_status(ConnectResponse(status, "Proxy Authentication Required", 10), "n")


@pytest.mark.parametrize(
    ("status", "reply"), [(403, 0x02), (502, 0x04), (503, 0x05), (504, 0x06), (500, 0x01)]
)
def test_other_refusals_carry_the_socks5_reply_a_client_should_see(status: int, reply: int) -> None:
    with pytest.raises(TargetRefused) as info:
        check_status(ConnectResponse(status, "", 10), "n")
    assert info.value.reply == reply


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=256))
def test_random_response_bytes_end_only_in_typed_errors(data: bytes) -> None:
    try:
        response = parse_connect_response(data, "n")
        if response is not None:
            assert response.head_length <= len(data)
            check_status(response, "n")
    except HonkError:
        pass
