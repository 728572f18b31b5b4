"""The sans-I/O HTTP proxy server side: targets, rewriting, limits, Basic auth."""

from __future__ import annotations

import base64

import h11
import pytest

from honk.config.spec import InboundUser
from honk.core.errors import (
    AuthenticationFailed,
    Blocked,
    ClientProtocolError,
    DialError,
    DialTimeout,
    NoRoute,
)
from honk.core.net import Address
from honk.inbound.http import (
    MAX_HEAD_SIZE,
    HttpProxyServerConnection,
    ProxyRequest,
    clean_headers,
    error_response,
    parse_absolute_target,
    parse_authority,
    status_for,
)


def _first(raw: bytes, users=()) -> ProxyRequest:
    conn = HttpProxyServerConnection(users)
    conn.receive_data(raw)
    event = conn.next_event()
    assert isinstance(event, ProxyRequest)
    return event


def test_http_connect_authority_form_becomes_a_tunnel_target() -> None:
    req = _first(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")

    assert req.tunnel
    assert req.target == Address("example.com", 443)
    assert req.forward is None


def test_http_connect_to_bracketed_ipv6_parses() -> None:
    req = _first(b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n")

    assert req.target == Address("::1", 8443)


def test_http_connect_keeps_pipelined_bytes_as_trailing_data() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n\x16\x03\x01hello")
    conn.next_event()
    conn.next_event()

    out = conn.tunnel_established()

    assert out == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert conn.trailing_data == (b"\x16\x03\x01hello", False)


@pytest.mark.parametrize(
    "authority", [b"example.com", b"example.com:", b"example.com:99999", b"::1:80", b"[::1", b"u@h:1"]
)
def test_http_connect_authority_without_a_valid_port_or_host_is_a_bad_target(authority: bytes) -> None:
    with pytest.raises(ClientProtocolError) as info:
        parse_authority(authority)

    assert info.value.reason == "bad-target"


def test_http_absolute_form_is_rewritten_to_origin_form_with_host_set() -> None:
    req = _first(
        b"GET http://Example.COM:8080/a/b?q=1#frag HTTP/1.1\r\n"
        b"Host: wrong.example\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"Accept: */*\r\n\r\n"
    )

    assert not req.tunnel
    assert req.target == Address("example.com", 8080)
    assert req.forward is not None
    assert req.forward.target == b"/a/b?q=1"
    headers = dict(req.forward.headers)
    assert headers[b"host"] == b"example.com:8080"
    assert headers[b"accept"] == b"*/*"
    assert b"proxy-connection" not in headers


def test_http_absolute_form_without_path_or_port_defaults_to_slash_and_80() -> None:
    assert parse_absolute_target(b"http://example.com") == (Address("example.com", 80), b"/")
    assert parse_absolute_target(b"http://example.com?x") == (Address("example.com", 80), b"/?x")


def test_http_hop_by_hop_and_proxy_headers_are_removed_but_framing_is_kept() -> None:
    req = _first(
        b"POST http://h.test/ HTTP/1.1\r\n"
        b"Host: h.test\r\n"
        b"Connection: keep-alive, X-Secret-Hop\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"X-Secret-Hop: 1\r\n"
        b"TE: trailers\r\n"
        b"Upgrade: websocket\r\n"
        b"Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"
        b"Transfer-Encoding: chunked\r\n"
        b"X-Kept: yes\r\n\r\n"
    )

    names = {name for name, _ in req.forward.headers}
    assert names == {b"host", b"transfer-encoding", b"x-kept"}


def test_http_clean_headers_keeps_original_order_and_spelling() -> None:
    cleaned = clean_headers([(b"X-A", b"1"), (b"Connection", b"close"), (b"Content-Length", b"3")])

    assert cleaned == [(b"X-A", b"1"), (b"Content-Length", b"3")]


def test_http_origin_form_request_to_the_proxy_is_refused() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: proxy\r\n\r\n")

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "not-a-proxy-request"


def test_http_https_absolute_form_is_an_unsupported_scheme() -> None:
    with pytest.raises(ClientProtocolError) as info:
        parse_absolute_target(b"https://example.com/")

    assert info.value.reason == "unsupported-scheme"


def test_http_garbage_is_a_bad_request() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(bytes(range(1, 256)) * 4 + b"\r\n\r\n")

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-request"


def test_http_incomplete_head_over_limit_is_header_too_large() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(b"GET http://a.test/ HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD_SIZE)

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "header-too-large"
    assert status_for(info.value) == 431


def test_http_complete_head_over_limit_in_one_read_is_header_too_large() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(
        b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Big: " + b"a" * MAX_HEAD_SIZE + b"\r\n\r\n"
    )

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "header-too-large"


def test_http_head_just_under_limit_is_accepted() -> None:
    start = b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Big: "
    filler = MAX_HEAD_SIZE - len(start) - 4 - 16
    req = _first(start + b"a" * filler + b"\r\n\r\n")

    assert req.head_size <= MAX_HEAD_SIZE


USERS = (InboundUser("alice", "s3cret"), InboundUser("bob", "pw"))


def _basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_http_basic_auth_with_right_credentials_names_the_user() -> None:
    req = _first(
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nProxy-Authorization: "
        + _basic("bob", "pw")
        + b"\r\n\r\n",
        USERS,
    )

    assert req.user == "bob"


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"Proxy-Authorization: " + _basic("alice", "wrong") + b"\r\n",
        b"Proxy-Authorization: Bearer abc\r\n",
        b"Proxy-Authorization: Basic !!notbase64\r\n",
    ],
    ids=["missing", "wrong-password", "other-scheme", "bad-base64"],
)
def test_http_basic_auth_refusals_raise_authentication_failed_answered_by_407(header: bytes) -> None:
    conn = HttpProxyServerConnection(USERS)
    conn.receive_data(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n" + header + b"\r\n")

    with pytest.raises(AuthenticationFailed) as info:
        conn.next_event()

    response = error_response(status_for(info.value))
    assert response.startswith(b"HTTP/1.1 407 ")
    assert b'Proxy-Authenticate: Basic realm="honk"' in response


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (Blocked("x"), 403),
        (NoRoute("x"), 502),
        (DialTimeout("direct", "connect", "slow"), 504),
        (DialError("direct", "connect", "refused"), 502),
        (ClientProtocolError("http", "bad-request"), 400),
    ],
)
def test_http_status_for_each_typed_error(error: Exception, status: int) -> None:
    assert status_for(error) == status
    assert error_response(status).startswith(b"HTTP/1.1 %d " % status)


def test_http_keep_alive_cycle_yields_a_second_request() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(
        b"GET http://a.test/1 HTTP/1.1\r\nHost: a.test\r\n\r\nGET http://b.test/2 HTTP/1.1\r\nHost: b.test\r\n\r\n"
    )
    first = conn.next_event()
    assert isinstance(conn.next_event(), h11.EndOfMessage)
    conn.send(h11.Response(status_code=204, headers=[]))
    conn.send(h11.EndOfMessage())
    assert conn.can_keep_alive
    conn.start_next_cycle()

    second = conn.next_event()

    assert (first.target, second.target) == (Address("a.test", 80), Address("b.test", 80))


def test_http_garbage_is_refused_before_a_line_ends() -> None:
    conn = HttpProxyServerConnection()
    conn.receive_data(b"GE\x00\xff" + b"x" * 100)

    with pytest.raises(ClientProtocolError) as info:
        conn.next_event()

    assert info.value.reason == "bad-request"


def test_http_request_split_inside_the_method_still_parses() -> None:
    conn = HttpProxyServerConnection()
    for piece in (b"CON", b"NECT a.test:1 HTTP/1.1\r\n", b"Host: a.test:1\r\n\r\n"):
        conn.receive_data(piece)

    assert conn.next_event().target == Address("a.test", 1)
