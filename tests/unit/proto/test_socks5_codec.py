"""The sans-I/O SOCKS5 server codec: greetings, auth, requests, replies, UDP headers."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk.core.errors import (
    AuthenticationFailed,
    Blocked,
    ClientGone,
    ClientProtocolError,
    DialError,
    DialTimeout,
    NoRoute,
    NotSupported,
)
from honk.core.net import Address
from honk.proto import socks5
from honk.proto.socks5 import (
    NEED_DATA,
    Command,
    Credentials,
    Greeting,
    Reply,
    Request,
    Socks5ServerConnection,
    build_reply,
    build_udp_datagram,
    encode_address,
    parse_udp_datagram,
    reply_for,
)


def _request(cmd: int, address: bytes) -> bytes:
    return bytes((5, cmd, 0)) + address


IPV4_REQ = _request(1, b"\x01\x7f\x00\x00\x01\x00\x50")
DOMAIN_REQ = _request(1, b"\x03\x0bexample.com\x01\xbb")
IPV6_REQ = _request(1, b"\x04" + b"\x00" * 15 + b"\x01" + b"\x1f\x90")


def _events(conn: Socks5ServerConnection) -> list:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
    return out


@pytest.mark.parametrize(
    ("raw", "target"),
    [
        (IPV4_REQ, Address("127.0.0.1", 80)),
        (DOMAIN_REQ, Address("example.com", 443)),
        (IPV6_REQ, Address("::1", 8080)),
    ],
    ids=["ipv4", "domain", "ipv6"],
)
def test_socks5_connect_request_parses_every_address_type(raw: bytes, target: Address) -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + raw)

    events = _events(conn)

    assert events == [Greeting((0,), 0), Request(Command.CONNECT, target)]
    assert conn.data_to_send() == b"\x05\x00"


def test_socks5_reply_success_carries_bound_address_and_marks_done() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + IPV4_REQ)
    _events(conn)
    conn.data_to_send()

    conn.reply(Reply.SUCCEEDED, Address("10.0.0.1", 4321))

    assert conn.data_to_send() == b"\x05\x00\x00\x01\x0a\x00\x00\x01\x10\xe1"
    assert conn.done


def test_socks5_pipelined_payload_after_request_is_left_as_trailing_data() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + IPV4_REQ + b"GET / HTTP/1.0\r\n\r\n")
    _events(conn)

    assert conn.trailing_data() == (b"GET / HTTP/1.0\r\n\r\n", False)


def test_socks5_server_without_users_refuses_client_offering_only_userpass() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x02")

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "no-acceptable-method"
    assert conn.data_to_send() == b"\x05\xff"


def test_socks5_server_with_users_refuses_client_offering_only_noauth() -> None:
    conn = Socks5ServerConnection(require_auth=True)
    conn.receive_data(b"\x05\x01\x00")

    with pytest.raises(ClientProtocolError):
        conn.next_event()

    assert conn.data_to_send() == b"\x05\xff"


def test_socks5_userpass_success_answers_status_zero_then_accepts_request() -> None:
    conn = Socks5ServerConnection(require_auth=True)
    conn.receive_data(b"\x05\x02\x00\x02" + b"\x01\x05alice\x06s3cret")

    assert conn.next_event() == Greeting((0, 2), 2)
    creds = conn.next_event()
    assert creds == Credentials("alice", "s3cret")
    assert "s3cret" not in repr(creds)
    conn.auth_result("alice", True)
    conn.receive_data(DOMAIN_REQ)

    assert conn.next_event() == Request(Command.CONNECT, Address("example.com", 443))
    assert conn.data_to_send() == b"\x05\x02\x01\x00"
    assert conn.username == "alice"


def test_socks5_userpass_failure_answers_status_one_and_raises_authentication_failed() -> None:
    conn = Socks5ServerConnection(require_auth=True)
    conn.receive_data(b"\x05\x01\x02\x01\x05alice\x05wrong")
    _events(conn)

    with pytest.raises(AuthenticationFailed):
        conn.auth_result("alice", False)

    assert conn.data_to_send() == b"\x05\x02\x01\x01"
    with pytest.raises(ClientProtocolError):
        conn.next_event()


def test_socks5_bad_auth_subnegotiation_version_is_a_protocol_error() -> None:
    conn = Socks5ServerConnection(require_auth=True)
    conn.receive_data(b"\x05\x01\x02\x05\x01a\x01b")
    conn.next_event()

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-auth-version"


@pytest.mark.parametrize("first", [b"\x04", b"\x04\x01", b"GET / HTTP/1.1\r\n"])
def test_socks5_bad_version_in_greeting_is_refused(first: bytes) -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(first)

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.protocol == "socks5"
    assert info.value.reason == "bad-version"


def test_socks5_bad_version_in_request_is_refused() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + b"\x04\x01\x00\x01\x7f\x00\x00\x01\x00\x50")
    conn.next_event()

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-version"


def test_socks5_unknown_command_answers_reply_seven() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + _request(9, b"\x01\x7f\x00\x00\x01\x00\x50"))
    conn.next_event()
    conn.data_to_send()

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-command"
    assert conn.data_to_send()[:2] == b"\x05\x07"


def test_socks5_bind_is_parsed_for_the_caller_to_refuse_with_reply_seven() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + _request(2, b"\x01\x7f\x00\x00\x01\x00\x50"))
    events = _events(conn)
    conn.data_to_send()

    conn.reply(Reply.COMMAND_NOT_SUPPORTED)

    assert events[-1].command is Command.BIND
    assert conn.data_to_send() == b"\x05\x07\x00\x01\x00\x00\x00\x00\x00\x00"
    assert not conn.done


def test_socks5_unknown_address_type_answers_reply_eight() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + _request(1, b"\x07\x00\x00"))
    conn.next_event()
    conn.data_to_send()

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-address-type"
    assert conn.data_to_send()[:2] == b"\x05\x08"


def test_socks5_empty_domain_is_refused() -> None:
    conn = Socks5ServerConnection(require_auth=False)
    conn.receive_data(b"\x05\x01\x00" + _request(1, b"\x03\x00\x00\x50"))
    conn.next_event()

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "empty-domain"


FULL_AUTH_HANDSHAKE = b"\x05\x01\x02" + b"\x01\x03bob\x02pw" + DOMAIN_REQ


@pytest.mark.parametrize("cut", range(1, len(FULL_AUTH_HANDSHAKE)))
def test_socks5_truncated_at_every_byte_needs_more_then_fails_on_eof(cut: int) -> None:
    conn = Socks5ServerConnection(require_auth=True)
    conn.receive_data(FULL_AUTH_HANDSHAKE[:cut])
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            break
        if isinstance(event, Credentials):
            conn.auth_result(event.username, True)
        assert not isinstance(event, Request)

    conn.receive_data(b"")

    with pytest.raises((ClientProtocolError, ClientGone)) as info:
        conn.next_event()
    boundary = cut in (3, 3 + 8)  # right after the greeting or the credentials
    if boundary:
        assert isinstance(info.value, ClientGone)
    else:
        assert isinstance(info.value, ClientProtocolError)
        assert info.value.reason == "truncated"


def test_socks5_full_handshake_fed_one_byte_at_a_time_yields_the_same_events() -> None:
    conn = Socks5ServerConnection(require_auth=True)
    events = []
    for byte in FULL_AUTH_HANDSHAKE:
        conn.receive_data(bytes((byte,)))
        for event in _events(conn):
            events.append(event)
            if isinstance(event, Credentials):
                conn.auth_result(event.username, True)

    assert events == [
        Greeting((2,), 2),
        Credentials("bob", "pw"),
        Request(Command.CONNECT, Address("example.com", 443)),
    ]


@pytest.mark.parametrize("code", list(Reply))
def test_socks5_reply_builder_covers_every_reply_code(code: Reply) -> None:
    raw = build_reply(code)

    assert raw == bytes((5, int(code), 0, 1, 0, 0, 0, 0, 0, 0))


def test_socks5_reply_builder_encodes_ipv6_and_domain_bound_addresses() -> None:
    assert (
        build_reply(Reply.SUCCEEDED, Address("::1", 1))
        == b"\x05\x00\x00\x04" + b"\x00" * 15 + b"\x01\x00\x01"
    )
    assert build_reply(Reply.SUCCEEDED, Address("a.b", 2)) == b"\x05\x00\x00\x03\x03a.b\x00\x02"


_hosts = st.one_of(
    st.ip_addresses().map(str),
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]{2,6}){1,3}", fullmatch=True),
)


@given(host=_hosts, port=st.integers(0, 65535), payload=st.binary(max_size=512))
def test_socks5_udp_header_round_trips(host: str, port: int, payload: bytes) -> None:
    address = Address(host, port)

    datagram = parse_udp_datagram(build_udp_datagram(address, payload))

    assert datagram.frag == 0
    assert datagram.address == address
    assert datagram.payload == payload


def test_socks5_udp_fragment_number_is_reported_for_the_caller_to_drop() -> None:
    raw = b"\x00\x00\x01" + encode_address(Address("127.0.0.1", 53)) + b"x"

    assert parse_udp_datagram(raw).frag == 1


@pytest.mark.parametrize("raw", [b"", b"\x00\x00", b"\x01\x00\x00\x01", b"\x00\x00\x00\x01\x7f\x00"])
def test_socks5_udp_short_or_reserved_header_is_refused(raw: bytes) -> None:
    with pytest.raises(ClientProtocolError):
        parse_udp_datagram(raw)


def _dial_error(code: int) -> DialError:
    try:
        raise OSError(code, "x")
    except OSError as exc:
        try:
            raise DialError("direct", "connect", "failed") from exc
        except DialError as err:
            return err


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (Blocked("x"), Reply.NOT_ALLOWED),
        (NoRoute("x"), Reply.NOT_ALLOWED),
        (DialTimeout("direct", "connect", "slow"), Reply.TTL_EXPIRED),
        (_dial_error(errno.ECONNREFUSED), Reply.CONNECTION_REFUSED),
        (_dial_error(errno.ENETUNREACH), Reply.NETWORK_UNREACHABLE),
        (_dial_error(errno.EHOSTUNREACH), Reply.HOST_UNREACHABLE),
        (_dial_error(errno.EACCES), Reply.GENERAL_FAILURE),
        (DialError("direct", "resolve", "nx"), Reply.HOST_UNREACHABLE),
        (NotSupported("x"), Reply.COMMAND_NOT_SUPPORTED),
    ],
)
def test_socks5_reply_code_for_each_routing_and_dial_error(error: Exception, code: Reply) -> None:
    assert reply_for(error) == code


def test_socks5_reply_code_uses_an_errno_attribute_on_the_dial_error() -> None:
    err = DialError("direct", "connect", "refused")
    err.errno = errno.ECONNREFUSED  # type: ignore[attr-defined]

    assert reply_for(err) == Reply.CONNECTION_REFUSED


def test_socks5_port_is_big_endian() -> None:
    assert encode_address(Address("1.2.3.4", 0x1234))[-2:] == struct.pack("!H", 0x1234)
    assert socks5.parse_address(b"\x01\x01\x02\x03\x04\x12\x34", 0) == (Address("1.2.3.4", 0x1234), 7)
