"""Server side of an HTTP/1.1 forward proxy. Sans-I/O.

Theory of operation:
  * :class:`HttpProxyServerConnection` wraps an ``h11`` server connection.
    ``h11`` frames messages (bodies, chunked, keep-alive, pipelining); this
    module adds the proxy part: the request target becomes an
    :class:`~honk.core.net.Address`, absolute-form requests are rewritten to
    origin-form with hop-by-hop and ``Proxy-*`` headers removed, and
    ``Proxy-Authorization: Basic`` is checked when the inbound has users.
  * A request head may not exceed :data:`MAX_HEAD_SIZE` bytes. ``h11`` refuses
    an *incomplete* head past that size; a complete head that arrived in one
    read is measured here, so the limit holds however the bytes were split.
  * Errors: ``ClientProtocolError("http", reason)`` for malformed requests
    (``header-too-large``, ``bad-request``, ``bad-target``, ...),
    :class:`~honk.core.errors.AuthenticationFailed` for missing or wrong
    credentials. :func:`error_response` turns any typed error into the status
    the client should see (431, 400, 407, 403, 502, 504, ...).

Nothing here touches sockets, the event loop or the clock.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import h11

from honk.config.spec import InboundUser
from honk.core.errors import (
    AuthenticationFailed,
    Blocked,
    CapacityRefused,
    ClientProtocolError,
    DialError,
    DialTimeout,
    HonkError,
    NoRoute,
    NotSupported,
)
from honk.core.net import Address

__all__ = [
    "MAX_HEAD_SIZE",
    "HttpProxyServerConnection",
    "ProxyRequest",
    "basic_credentials",
    "check_basic_auth",
    "clean_headers",
    "error_response",
    "parse_absolute_target",
    "parse_authority",
    "status_for",
]

# A request or response head (request line + headers) larger than this is refused
# with 431: it bounds what one client can make us buffer before routing anything.
MAX_HEAD_SIZE = 64 * 1024  # bytes

PROTOCOL = "http"
REALM = "honk"

# RFC 9110 7.6.1 hop-by-hop fields, plus the de-facto Proxy-Connection. Transfer-
# Encoding is hop-by-hop as well, but it is framing: h11 re-applies (or drops) it
# for each side, so it is kept and h11 stays the only one deciding body framing.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)

NEED_DATA = h11.NEED_DATA
PAUSED = h11.PAUSED


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """A request head addressed to the proxy.

    ``tunnel`` is true for CONNECT; otherwise ``forward`` is the origin-form
    request to send upstream (hop-by-hop headers removed, Host set to the
    target). ``user`` is the authenticated user or ``None``; ``principal`` what the
    connection's authenticator returned for it (the inbound's principal), else ``None``.
    """

    method: bytes
    target: Address
    tunnel: bool
    forward: h11.Request | None
    user: str | None
    head_size: int  # bytes, as measured for MAX_HEAD_SIZE
    principal: object | None = None


# --- targets ---------------------------------------------------------------------


def parse_authority(authority: bytes, default_port: int | None = None) -> Address:
    """``host:port`` or ``[v6]:port`` → Address; the port is required unless defaulted."""
    try:
        text = authority.decode("ascii")
    except UnicodeDecodeError:
        raise ClientProtocolError(PROTOCOL, "bad-target", "non-ascii authority") from None
    if "@" in text or not text:
        raise ClientProtocolError(PROTOCOL, "bad-target", "userinfo or empty authority")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ClientProtocolError(PROTOCOL, "bad-target", "unclosed bracket")
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ClientProtocolError(PROTOCOL, "bad-target", "junk after bracket")
        port_text = rest[1:] if rest else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
        elif ":" in host:
            raise ClientProtocolError(PROTOCOL, "bad-target", "unbracketed IPv6")
    if not host:
        raise ClientProtocolError(PROTOCOL, "bad-target", "empty host")
    if port_text:
        if not port_text.isdigit() or len(port_text) > 5:
            raise ClientProtocolError(PROTOCOL, "bad-target", "bad port")
        port = int(port_text)
    elif default_port is not None:
        port = default_port
    else:
        raise ClientProtocolError(PROTOCOL, "bad-target", "missing port")
    if not 0 < port <= 65535:
        raise ClientProtocolError(PROTOCOL, "bad-target", "port out of range")
    try:
        return Address(host, port)
    except ValueError as exc:
        raise ClientProtocolError(PROTOCOL, "bad-target", str(exc)) from None


def parse_absolute_target(target: bytes) -> tuple[Address, bytes]:
    """``http://host[:port][/path][?query]`` → (address, origin-form path)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep:
        reason = "not-a-proxy-request" if target.startswith(b"/") or target == b"*" else "bad-target"
        raise ClientProtocolError(PROTOCOL, reason)
    if scheme.lower() != b"http":
        raise ClientProtocolError(PROTOCOL, "unsupported-scheme", scheme.decode("ascii", "replace"))
    cut = len(rest)
    for delim in (b"/", b"?", b"#"):
        at = rest.find(delim)
        if 0 <= at < cut:
            cut = at
    authority, path = rest[:cut], rest[cut:]
    path = path.split(b"#", 1)[0]
    if not path.startswith(b"/"):
        path = b"/" + path
    return parse_authority(authority, default_port=80), path


def _host_header(address: Address) -> bytes:
    host = f"[{address.host}]" if ":" in address.host else address.host
    if address.port != 80:
        host = f"{host}:{address.port}"
    return host.encode("ascii", "replace")


# --- headers ---------------------------------------------------------------------


def clean_headers(
    headers: Iterable[tuple[bytes, bytes]], *, drop: Iterable[bytes] = ()
) -> list[tuple[bytes, bytes]]:
    """Remove hop-by-hop fields, those named by ``Connection``, and ``drop``.

    Header names are compared lower-case; the original spelling is kept.
    """
    items = list(headers)
    named = set(HOP_BY_HOP) | {d.lower() for d in drop}
    for name, value in items:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b",") if token.strip())
    # Connection may not un-hop the framing fields h11 owns.
    named.discard(b"transfer-encoding")
    named.discard(b"content-length")
    return [(name, value) for name, value in items if name.lower() not in named]


def basic_credentials(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str]:
    """(username, password) of a ``Proxy-Authorization: Basic``; else ``AuthenticationFailed``."""
    value = next((v for n, v in headers if n.lower() == b"proxy-authorization"), None)
    if value is None:
        raise AuthenticationFailed("http proxy credentials missing")
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        raise AuthenticationFailed("http proxy credentials use an unsupported scheme")
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationFailed("http proxy credentials are not valid Basic") from None
    username, sep, password = decoded.partition(":")
    if not sep:
        raise AuthenticationFailed("http proxy credentials are not valid Basic")
    return username, password


def check_basic_auth(headers: Iterable[tuple[bytes, bytes]], users: Sequence[InboundUser]) -> str:
    """The user named by a valid ``Proxy-Authorization: Basic``; else ``AuthenticationFailed``."""
    username, password = basic_credentials(headers)
    ok = False
    for user in users:
        # compare every user in constant time so timing does not reveal names
        name_ok = hmac.compare_digest(user.username.encode(), username.encode())
        pass_ok = hmac.compare_digest(user.password.encode(), password.encode())
        ok |= name_ok and pass_ok
    if not ok:
        raise AuthenticationFailed(f"http proxy user {username!r} refused")
    return username


def _head_size(event: h11.Request) -> int:
    """Bytes of the head as sent, give or take optional whitespace h11 stripped."""
    size = len(event.method) + 1 + len(event.target) + 1 + len(b"HTTP/1.1") + 2 + 2
    for name, value in event.headers.raw_items():
        size += len(name) + 2 + len(value) + 2
    return size


# --- errors → responses ------------------------------------------------------------

_REASONS = {
    400: b"Bad Request",
    403: b"Forbidden",
    407: b"Proxy Authentication Required",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    504: b"Gateway Timeout",
}


def status_for(error: BaseException) -> int:
    """The HTTP status a client sees for a typed error.

    Blocked → 403; NoRoute → 502 (no leaf could carry it: a gateway problem,
    not a policy refusal); DialTimeout → 504; other DialError → 502;
    a local capacity refusal (a spent descriptor budget) → 503; NotSupported → 501; AuthenticationFailed → 407; an oversized head → 431;
    other client protocol errors → 400.
    """
    if isinstance(error, ClientProtocolError):
        return 431 if error.reason == "header-too-large" else 400
    if isinstance(error, AuthenticationFailed):
        return 407
    if isinstance(error, Blocked):
        return 403
    if isinstance(error, DialTimeout):
        return 504
    if isinstance(error, CapacityRefused):
        return 503
    if isinstance(error, DialError | NoRoute):
        return 502
    if isinstance(error, NotSupported):
        return 501
    if isinstance(error, HonkError):
        return 502
    return 500


def error_response(status: int) -> bytes:
    """A complete, body-less response that closes the connection."""
    lines = [
        b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error")),
        b"Connection: close",
        b"Content-Length: 0",
    ]
    if status == 407:
        lines.append(b'Proxy-Authenticate: Basic realm="%s"' % REALM.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


# RFC 9110 5.6.2 token characters, which a method consists of.
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_MAX_METHOD = 32  # bytes; longer than any real method

CONNECT_ESTABLISHED = h11.Response(status_code=200, reason=b"Connection established", headers=[])


# --- the server connection ---------------------------------------------------------


class HttpProxyServerConnection:
    """The client-facing side of one HTTP proxy connection.

    Call :meth:`receive_data` (``b""`` = EOF) and :meth:`next_event` like
    ``h11``; a request head comes out as :class:`ProxyRequest`, bodies as
    ``h11.Data``/``h11.EndOfMessage``; ``NEED_DATA``, ``PAUSED`` and
    ``h11.ConnectionClosed`` pass through. Send the answer with :meth:`send`
    (or :meth:`tunnel_established` for CONNECT) and call
    :meth:`start_next_cycle` before the next request on a kept-alive connection.
    """

    def __init__(
        self,
        users: Sequence[InboundUser] = (),
        *,
        authenticate: Callable[[str, str], object | None] | None = None,
    ) -> None:
        """``authenticate(username, password)``, when given, decides instead of ``users``:
        its result (``None`` = refused) becomes the request's ``principal``."""
        self._users = tuple(users)
        self._authenticate = authenticate
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_SIZE)
        # Bytes of the connection's first method token seen so far; None once it is
        # complete. Lets garbage be refused at once instead of after a whole head.
        self._method_probe: bytearray | None = bytearray()
        self._probe_error: ClientProtocolError | None = None
        self._eof = False

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the client; ``b""`` means EOF, and nothing may follow it."""
        if self._eof:
            if data:
                raise ClientProtocolError(PROTOCOL, "data-after-eof")
            return
        self._eof = not data
        if self._method_probe is not None and data:
            self._probe(data)
        self._h11.receive_data(data)

    def _probe(self, data: bytes) -> None:
        probe = self._method_probe
        assert probe is not None
        for byte in data:
            if byte == 0x20:  # SP ends the method
                self._method_probe = None
                if not probe:
                    self._probe_error = ClientProtocolError(PROTOCOL, "bad-request", "empty method")
                return
            if byte not in _TCHAR or len(probe) >= _MAX_METHOD:
                self._method_probe = None
                self._probe_error = ClientProtocolError(PROTOCOL, "bad-request", "not an HTTP request line")
                return
            probe.append(byte)

    def next_event(self) -> ProxyRequest | h11.Data | h11.EndOfMessage | h11.ConnectionClosed | type:
        if self._probe_error is not None:
            raise self._probe_error
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                raise ClientProtocolError(PROTOCOL, "header-too-large") from None
            raise ClientProtocolError(PROTOCOL, "bad-request", str(exc)) from None
        if isinstance(event, h11.Request):
            return self._proxy_request(event)
        return event

    def _proxy_request(self, event: h11.Request) -> ProxyRequest:
        size = _head_size(event)
        if size > MAX_HEAD_SIZE:
            raise ClientProtocolError(PROTOCOL, "header-too-large", f"{size} bytes")
        user, principal = self._authorize(event.headers.raw_items())
        if event.method == b"CONNECT":
            return ProxyRequest(
                event.method, parse_authority(event.target), True, None, user, size, principal
            )
        target, path = parse_absolute_target(event.target)
        headers = clean_headers(event.headers.raw_items(), drop=(b"host",))
        headers.insert(0, (b"Host", _host_header(target)))
        try:
            forward = h11.Request(method=event.method, target=path, headers=headers)
        except h11.LocalProtocolError as exc:
            raise ClientProtocolError(PROTOCOL, "bad-request", str(exc)) from None
        return ProxyRequest(event.method, target, False, forward, user, size, principal)

    def _authorize(self, headers: list[tuple[bytes, bytes]]) -> tuple[str | None, object | None]:
        if self._authenticate is not None:
            username, password = basic_credentials(headers)
            principal = self._authenticate(username, password)
            if principal is None:
                raise AuthenticationFailed(f"http proxy user {username!r} refused")
            return username, principal
        if self._users:
            return check_basic_auth(headers, self._users), None
        return None, None

    def send(self, event: h11.InformationalResponse | h11.Response | h11.Data | h11.EndOfMessage) -> bytes:
        """Serialise an answer event for the client (h11 applies framing)."""
        return self._h11.send(event) or b""

    def tunnel_established(self) -> bytes:
        """``200 Connection established`` for a CONNECT; the stream is raw after it."""
        return self.send(CONNECT_ESTABLISHED)

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        """Bytes received after the CONNECT head (pipelined payload), and EOF."""
        return self._h11.trailing_data

    @property
    def can_keep_alive(self) -> bool:
        """Whether another request may follow once the current cycle is done."""
        return self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE

    @property
    def response_started(self) -> bool:
        return self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE)

    @property
    def awaiting_request(self) -> bool:
        return self._h11.their_state is h11.IDLE

    def start_next_cycle(self) -> None:
        self._h11.start_next_cycle()
