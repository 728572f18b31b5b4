"""Arbitrary client bytes end a handshake with a typed error, never with anything else."""

from __future__ import annotations

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.spec import InboundUser
from honk.core.errors import AuthenticationFailed, ClientGone, ClientProtocolError
from honk.inbound.http import HttpProxyServerConnection, ProxyRequest
from honk.proto.socks5 import (
    NEED_DATA,
    Credentials,
    Greeting,
    Request,
    Socks5ServerConnection,
    parse_udp_datagram,
)

TYPED = (ClientProtocolError, ClientGone, AuthenticationFailed)

# Chunks that start like real handshakes often, so the fuzzer gets past the first byte.
_socks_prefixes = st.sampled_from(
    [b"", b"\x05", b"\x05\x01\x00", b"\x05\x01\x02\x01\x03bob\x02pw\x05\x01\x00"]
)
_http_prefixes = st.sampled_from(
    [b"", b"GET http://a.test/ HTTP/1.1\r\n", b"CONNECT a.test:443 HTTP/1.1\r\n"]
)
# Data chunks are never empty: to these codecs b"" is EOF, which the ``eof`` flag sends last.
_chunks = st.lists(st.binary(min_size=1, max_size=300), max_size=8)


def _drive_socks5(conn: Socks5ServerConnection) -> None:
    while True:
        event = conn.next_event()
        if event is NEED_DATA or isinstance(event, Request):
            return
        if isinstance(event, Credentials):
            conn.auth_result(event.username, event.password == "pw")
        else:
            assert isinstance(event, Greeting)


@settings(max_examples=400, deadline=None)
@given(prefix=_socks_prefixes, chunks=_chunks, require_auth=st.booleans(), eof=st.booleans())
def test_socks5_server_survives_arbitrary_bytes(prefix, chunks, require_auth, eof):
    conn = Socks5ServerConnection(require_auth=require_auth)
    try:
        for chunk in [prefix, *chunks] if prefix else chunks:
            conn.receive_data(chunk)
            _drive_socks5(conn)
        if eof:
            conn.receive_data(b"")
            _drive_socks5(conn)
    except TYPED:
        pass


@settings(max_examples=400, deadline=None)
@given(prefix=_http_prefixes, chunks=_chunks, with_users=st.booleans(), eof=st.booleans())
def test_http_proxy_server_survives_arbitrary_bytes(prefix, chunks, with_users, eof):
    users = (InboundUser("bob", "pw"),) if with_users else ()
    conn = HttpProxyServerConnection(users)
    try:
        for chunk in ([prefix] if prefix else []) + chunks + ([b""] if eof else []):
            conn.receive_data(chunk)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA or isinstance(event, ProxyRequest | h11.ConnectionClosed):
                    break
    except TYPED:
        pass


@given(data=st.binary(max_size=600))
def test_socks5_udp_header_parser_refuses_with_a_typed_error(data):
    try:
        parse_udp_datagram(data)
    except ClientProtocolError:
        pass
