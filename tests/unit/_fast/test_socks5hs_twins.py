"""The SOCKS5 fast-path handshake kernel (honk._fast.socks5hs): the C the relay engine's worker
runs (``socks5hs.h`` through ``socks5hs_c``) and its pure-Python twin judge every byte string
alike, accept exactly the handshakes honk's full codec (honk.proto.socks5) reads as a no-auth
CONNECT with the same target and length, and reply from one errno table."""

from __future__ import annotations

import errno
import importlib
import os
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS
from honk._fast.socks5hs_py import ERRNO_REPLIES
from honk.core.errors import DialError
from honk.core.net import Address
from honk.proto import socks5

IMPLS = [pytest.param("py", id="py")]
if not NO_EXTENSIONS:  # the twin run has no compiled module to compare
    IMPLS.append(pytest.param("c", id="c", marks=pytest.mark.compiled))


@pytest.fixture(params=IMPLS)
def hs(request):
    return importlib.import_module(f"honk._fast.socks5hs_{request.param}")


def twins():
    """Both implementations, for the properties that compare them (the twin alone on a twin run)."""
    return [importlib.import_module(f"honk._fast.socks5hs_{impl.values[0]}") for impl in IMPLS]


def _address(draw_kind: str, value: str) -> bytes:
    if draw_kind == "ipv4":
        return b"\x01" + socket.inet_pton(socket.AF_INET, value)
    if draw_kind == "ipv6":
        return b"\x04" + socket.inet_pton(socket.AF_INET6, value)
    raw = value.encode("ascii")
    return b"\x03" + bytes((len(raw),)) + raw


@st.composite
def handshakes(draw):
    """(greeting, request, early payload, host, port) of a handshake the fast path serves."""
    methods = draw(st.lists(st.integers(0, 255), min_size=0, max_size=8))
    methods.insert(draw(st.integers(0, len(methods))), 0)  # "no authentication" among them
    kind = draw(st.sampled_from(["ipv4", "ipv6", "domain"]))
    if kind == "ipv4":
        host = str(draw(st.ip_addresses(v=4)))
    elif kind == "ipv6":
        host = socket.inet_ntop(socket.AF_INET6, draw(st.ip_addresses(v=6)).packed)
    else:
        host = draw(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255))
    port = draw(st.integers(0, 65535))
    greeting = bytes((5, len(methods), *methods))
    request = bytes((5, 1, 0)) + _address(kind, host) + port.to_bytes(2, "big")
    payload = draw(st.binary(max_size=64))
    return greeting, request, payload, host, port


def test_a_no_auth_connect_is_served_with_its_target(hs):
    data = b"\x05\x02\x02\x00" + b"\x05\x01\x00\x03\x0bexample.com\x01\xbb" + b"GET /"
    off = hs.greeting(data)
    assert off == 4
    end = hs.request(data, off)
    assert end == len(data) - len(b"GET /")
    assert hs.target(data, off) == ("example.com", 443)


@pytest.mark.parametrize(
    "data",
    [
        b"\x05",  # a greeting split over reads
        b"\x05\x02\x00",  # NMETHODS says two, one came
        b"\x05\x01\x02",  # username/password only: the codec refuses it
        b"\x04\x01\x00",  # SOCKS4
        b"GET / HTTP/1.1\r\n",
    ],
)
def test_greetings_outside_the_common_case_are_handed_over(hs, data):
    assert hs.greeting(data) == hs.HANDOVER


@pytest.mark.parametrize(
    ("request_bytes", "verdict"),
    [
        (b"", "more"),  # nothing after the greeting yet
        (b"\x05\x01\x00\x01\x7f\x00", "handover"),  # split over reads
        (b"\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50", "handover"),  # BIND
        (b"\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x50", "handover"),  # UDP ASSOCIATE
        (b"\x05\x01\x00\x05\x7f\x00\x00\x01\x00\x50", "handover"),  # an unknown address type
        (b"\x05\x01\x00\x03\x00\x00\x50", "handover"),  # an empty domain
        (b"\x05\x01\x00\x03\x03a b\x00\x50", "handover"),  # a space: the codec says bad-domain
        (b"\x05\x01\x00\x03\x02\xc3\xa9\x00\x50", "handover"),  # not ASCII
        (b"\x05\x01\x01\x01\x7f\x00\x00\x01\x00\x50", "handover"),  # RSV not zero
    ],
)
def test_requests_outside_the_common_case_are_handed_over(hs, request_bytes, verdict):
    data = b"\x05\x01\x00" + request_bytes
    assert hs.request(data, 3) == (hs.MORE if verdict == "more" else hs.HANDOVER)


@settings(max_examples=300)
@given(data=st.binary(max_size=40), off=st.integers(0, 40))
def test_both_implementations_judge_any_bytes_alike(data, off):
    off = min(off, len(data))
    verdicts = {(impl.greeting(data), impl.request(data, off)) for impl in twins()}
    assert len(verdicts) == 1


@settings(max_examples=300)
@given(handshakes())
def test_what_the_fast_path_serves_the_full_codec_reads_alike(shake):
    greeting, request, payload, host, port = shake
    data = greeting + request + payload
    for impl in twins():
        assert impl.greeting(data) == len(greeting)
        assert impl.request(data, len(greeting)) == len(greeting) + len(request)
        assert impl.target(data, len(greeting)) == (host, port)
    conn = socks5.Socks5ServerConnection(require_auth=False)
    conn.receive_data(data)
    assert isinstance(conn.next_event(), socks5.Greeting)
    event = conn.next_event()
    assert event == socks5.Request(socks5.Command.CONNECT, Address(host, port))
    assert conn.trailing_data() == (payload, False)


@settings(max_examples=300)
@given(prefix=st.binary(min_size=1, max_size=30))
def test_a_prefix_of_a_handshake_is_never_served_short(prefix):
    """A truncated request never yields an end beyond the bytes read, nor a target."""
    for impl in twins():
        off = impl.greeting(prefix)
        if off == impl.HANDOVER:
            continue
        end = impl.request(prefix, off)
        assert end <= len(prefix)
        if end <= 0:
            with pytest.raises(ValueError):
                impl.target(prefix, off)


def test_the_errno_table_is_one_for_engines_and_codec():
    for err in range(0, 200):
        codes = {impl.errno_reply(err) for impl in twins()}
        assert codes == {ERRNO_REPLIES.get(err, 0)}
        assert {impl.reply_code(err) for impl in twins()} == {ERRNO_REPLIES.get(err, 1)}
        if err in ERRNO_REPLIES:
            failure = DialError("node", "connect", "failed")
            failure.__cause__ = OSError(err, os.strerror(err))
            assert socks5.reply_for(failure) == ERRNO_REPLIES[err]
    assert ERRNO_REPLIES[errno.ECONNREFUSED] == socks5.Reply.CONNECTION_REFUSED
    assert ERRNO_REPLIES[errno.ETIMEDOUT] == socks5.Reply.TTL_EXPIRED


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_reply_carries_the_bound_address_as_the_codec_encodes_it(hs, family, host):
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        bound = Address(host, sock.getsockname()[1])
        assert hs.build_reply(0, sock.fileno()) == socks5.build_reply(0, bound)
    assert hs.build_reply(5) == socks5.build_reply(5, None) == b"\x05\x05\x00\x01" + bytes(6)
