"""The SOCKS5 client handshake codec, driven by hand-written server bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.core.errors import DialError, HonkError, ProxyAuthFailed, TargetRefused
from honk.core.net import Address
from honk.proto.socks5 import Command
from honk.proto.socks5_client import Socks5ClientHandshake, encode_userpass

TARGET = Address("example.com", 443)
SUCCESS_V4 = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90"  # bound 127.0.0.1:8080


def _run(handshake: Socks5ClientHandshake, server: bytes, *, step: int | None = None) -> list[bytes]:
    """Feed ``server`` as the handshake asks (never more than it wants); returns what it sent."""
    sent = [handshake.initial()]
    pos = 0
    while not handshake.done:
        want = handshake.wanted
        take = want if step is None else min(step, want)
        chunk = server[pos : pos + take]
        assert chunk, "the handshake wanted more than the server sent"
        pos += len(chunk)
        out = handshake.feed(chunk)
        if out:
            sent.append(out)
    assert pos == len(server), "the handshake must not consume bytes past the reply"
    return sent


def test_no_auth_connect_sends_greeting_then_request_and_reads_the_bound_address() -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET)
    sent = _run(handshake, b"\x05\x00" + SUCCESS_V4)
    assert sent == [b"\x05\x01\x00", b"\x05\x01\x00\x03\x0bexample.com\x01\xbb"]
    assert handshake.bound == Address("127.0.0.1", 8080)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_reply_split_anywhere_reads_the_same(step: int) -> None:
    domain_reply = b"\x05\x00\x00\x03\x09proxy.lan\x04\x38"
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET, "user", "pw")
    _run(handshake, b"\x05\x02\x01\x00" + domain_reply, step=step)
    assert handshake.bound == Address("proxy.lan", 1080)


def test_credentials_are_sent_when_the_server_picks_user_password() -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, Address("10.0.0.1", 80), "alice", "s3cret")
    sent = _run(handshake, b"\x05\x02" + b"\x01\x00" + SUCCESS_V4)
    assert sent[0] == b"\x05\x01\x02"
    assert sent[1] == b"\x01\x05alice\x06s3cret"
    assert sent[2] == b"\x05\x01\x00\x01\x0a\x00\x00\x01\x00\x50"


def test_ipv6_bound_address_is_read_in_full() -> None:
    reply = b"\x05\x00\x00\x04" + bytes(15) + b"\x01" + b"\x00\x35"
    handshake = Socks5ClientHandshake("n", Command.UDP_ASSOCIATE, Address("0.0.0.0", 0))
    _run(handshake, b"\x05\x00" + reply)
    assert handshake.bound == Address("::1", 53)


def test_refused_credentials_are_an_authentication_error() -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET, "alice", "wrong")
    with pytest.raises(ProxyAuthFailed) as info:
        _run(handshake, b"\x05\x02\x01\x01")
    assert info.value.phase == "auth" and "wrong" not in str(info.value)


def test_no_acceptable_method_without_credentials_says_authentication_is_required() -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET)
    with pytest.raises(ProxyAuthFailed, match="requires authentication"):
        _run(handshake, b"\x05\xff")


@pytest.mark.parametrize("code", range(1, 9))
def test_every_failure_reply_is_a_target_refusal_with_its_code(code: int) -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET)
    with pytest.raises(TargetRefused) as info:
        _run(handshake, b"\x05\x00" + bytes([5, code, 0, 1]))
    assert info.value.reply == code and info.value.phase == "target"


@pytest.mark.parametrize(
    "server",
    [
        b"\x04\x00",  # SOCKS4 answer
        b"\x05\x02",  # user/pass chosen but never offered
        b"\x05\x00\x05\x00\x01\x07",  # reserved byte set
        b"\x05\x00\x05\x00\x00\x09",  # unknown address type
        b"\x05\x00\x04\x00\x00\x01",  # reply version 4
    ],
)
def test_malformed_server_bytes_are_a_handshake_error(server: bytes) -> None:
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET)
    with pytest.raises(DialError) as info:
        _run(handshake, server)
    assert info.value.phase == "handshake"
    with pytest.raises(ValueError):
        handshake.feed(b"\x00")  # a failed handshake takes nothing more


def test_credentials_longer_than_255_bytes_are_refused_before_sending() -> None:
    with pytest.raises(ValueError):
        encode_userpass("u" * 256, "p")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.booleans())
def test_random_server_bytes_end_only_in_typed_errors(server: bytes, credentials: bool) -> None:
    user = ("u", "p") if credentials else (None, None)
    handshake = Socks5ClientHandshake("n", Command.CONNECT, TARGET, *user)
    handshake.initial()
    pos = 0
    try:
        while not handshake.done and pos < len(server):
            chunk = server[pos : pos + handshake.wanted]
            pos += len(chunk)
            handshake.feed(chunk)
    except HonkError:
        return
    assert handshake.done or pos == len(server)
