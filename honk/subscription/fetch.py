"""One subscription download: an HTTP/1.1 GET through an outbound, TLS, redirects, bounds.

Theory of operation:
  * The connection is dialled through an honk outbound (``dial(Address, deadline)``,
    for example ``DirectOutbound.dial_tcp``). A framed stream (a Shadowsocks
    detour) is turned into a plain socket by the relay engine
    (:func:`honk.relay.native.framed_socket`), so TLS and HTTP run over it as
    over any other.
  * ``https`` runs stdlib TLS on that socket through asyncio, verifying the
    certificate against ``ssl_context`` (the system store by default) and the
    URL's host. h11 writes the request and parses the response, so
    ``Content-Length``, chunked and read-until-close bodies all work.
  * The body is counted while it arrives and the download stops as soon as it
    passes ``max_bytes`` (a declared ``Content-Length`` over it stops it
    before the first body byte).
  * Redirects (301, 302, 303, 307, 308) are followed for at most
    :data:`MAX_REDIRECTS` hops, each on a new connection. A hop from ``https``
    to another scheme fails, as does a hop to a loopback, private, link-local
    or unspecified IP literal other than the configured URL's own host. A
    host name that resolves to such an address is not detected.
  * One deadline on the injected clock covers every hop: dial, TLS, request
    and body.

Errors are :class:`SubscriptionFetchError` with a static ``reason``; neither the
URL (it often holds a token) nor any response text is put in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import ssl
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit

import h11

from honk import __version__
from honk.config.validate import FILE_SCHEME  # its path made absolute when the config was read
from honk.core.clock import Clock, timeout_at
from honk.core.errors import DialTimeout, HonkError
from honk.core.net import Address
from honk.outbound.base import DialedStream
from honk.relay.native import framed_socket
from honk.subscription.formats import MAX_BODY_BYTES

__all__ = [
    "FILE_SCHEME",
    "MAX_REDIRECTS",
    "USER_AGENT",
    "Dial",
    "FetchResult",
    "SubscriptionFetchError",
    "fetch",
    "read_local",
]

USER_AGENT = f"honk/{__version__}"  # the default User-Agent (upstream subscription reference)
MAX_REDIRECTS = 5  # "At most 5 hops" (upstream subscription reference)
READ_CHUNK = 64 * 1024  # bytes asked of the socket per read
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}

# (target, absolute deadline on the dialer's clock) -> a connected stream; Outbound.dial_tcp is one.
Dial = Callable[[Address, float], Awaitable[DialedStream]]


class SubscriptionFetchError(HonkError):
    """A download failed. ``reason`` is a static slug:

    ``invalid-url``, ``invalid-request`` (a User-Agent HTTP cannot carry), ``dial-failed``, ``tls``,
    ``connection``, ``timeout``, ``malformed-response``, ``http-status``
    (``status`` says which), ``unsupported-encoding``, ``body-too-large``,
    ``too-many-redirects``, ``redirect-invalid``, ``redirect-scheme``,
    ``redirect-downgrade``, ``redirect-private-address``; for a ``file://`` list,
    ``file-unreadable``.
    """

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(f"subscription fetch failed: {reason}" + (f" (HTTP {status})" if status else ""))
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class FetchResult:
    body: bytes
    status: int  # the final response's status (2xx)
    redirects: int  # hops followed
    # the provider's Subscription-Userinfo: upload, download, total (bytes), expire (unix s); None: not sent
    usage: dict[str, int] | None = None


USAGE_KEYS = ("upload", "download", "total", "expire")


def parse_userinfo(value: bytes) -> dict[str, int] | None:
    """``upload=1; download=2; total=3; expire=4`` (the de facto Subscription-Userinfo header)
    as its known keys with non-negative integer values; anything else in it is ignored.
    None when no known key has a usable value."""
    out: dict[str, int] = {}
    for part in value.decode("latin-1").split(";"):
        key, _, number = part.partition("=")
        key, number = key.strip().lower(), number.strip()
        if key in USAGE_KEYS and number.isdigit() and len(number) <= 20:
            out[key] = int(number)
    return out or None


@dataclass(frozen=True, slots=True)
class _Url:
    url: str
    scheme: str  # "http" | "https"
    host: str  # unbracketed, lower case
    port: int
    target: str  # path and query, never empty

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class _Redirect:
    location: str


def _parse_url(url: str, reason: str) -> _Url:
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise SubscriptionFetchError(reason)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SubscriptionFetchError(reason) from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise SubscriptionFetchError(reason)
    host = parts.hostname
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")  # an internationalised name as DNS and Host need it
        except UnicodeError:
            raise SubscriptionFetchError(reason) from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    # Only what HTTP cannot carry raw (non-ASCII) is escaped; the URL's own escapes stay as written.
    target = quote(target, safe=string.punctuation)
    return _Url(url, scheme, host, port or DEFAULT_PORTS[scheme], target)


def _internal_literal(host: str) -> bool:
    """Whether ``host`` is an IP literal a public subscription should not redirect to."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified


def _check_redirect(current: _Url, location: str, configured: _Url) -> _Url:
    try:
        joined = urljoin(current.url, location.strip())
        scheme = urlsplit(joined).scheme.lower()
    except ValueError:
        raise SubscriptionFetchError("redirect-invalid") from None
    if scheme not in DEFAULT_PORTS:
        raise SubscriptionFetchError("redirect-scheme")
    nxt = _parse_url(joined, "redirect-invalid")
    if current.scheme == "https" and nxt.scheme != "https":
        raise SubscriptionFetchError("redirect-downgrade")
    if _internal_literal(nxt.host) and nxt.host != configured.host:
        raise SubscriptionFetchError("redirect-private-address")
    return nxt


async def fetch(
    url: str,
    *,
    dial: Dial,
    clock: Clock,
    deadline: float,
    user_agent: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    max_bytes: int = MAX_BODY_BYTES,
) -> FetchResult:
    """GET ``url`` and return the body of the final 2xx response.

    ``deadline`` is absolute on ``clock`` and bounds the whole download;
    ``user_agent`` None sends :data:`USER_AGENT`. Raises
    :class:`SubscriptionFetchError`.
    """
    configured = _parse_url(url, "invalid-url")
    context = ssl_context or ssl.create_default_context()
    try:
        async with timeout_at(clock, deadline):
            current = configured
            for hop in itertools.count():
                outcome = await _get(current, dial, deadline, user_agent or USER_AGENT, context, max_bytes)
                if isinstance(outcome, FetchResult):
                    return dataclasses.replace(outcome, redirects=hop)
                if hop == MAX_REDIRECTS:
                    raise SubscriptionFetchError("too-many-redirects")
                current = _check_redirect(current, outcome.location, configured)
    except TimeoutError:
        raise SubscriptionFetchError("timeout") from None
    raise AssertionError("unreachable")  # itertools.count() never ends


async def _get(
    url: _Url, dial: Dial, deadline: float, user_agent: str, context: ssl.SSLContext, max_bytes: int
) -> FetchResult | _Redirect:
    try:
        stream = await dial(Address(url.host, url.port), deadline)
    except DialTimeout:
        raise SubscriptionFetchError("timeout") from None
    except (HonkError, OSError) as exc:
        raise SubscriptionFetchError("dial-failed") from exc
    sock = stream.sock
    if stream.framing is not None:  # a Shadowsocks detour: the relay engine frames a plain socket
        try:
            sock = framed_socket(sock, stream.framing)
        except (OSError, ValueError) as exc:
            sock.close()
            raise SubscriptionFetchError("dial-failed") from exc
    tls = url.scheme == "https"
    try:
        reader, writer = await asyncio.open_connection(
            sock=sock,
            ssl=context if tls else None,
            server_hostname=url.host if tls else None,
            limit=READ_CHUNK,
        )
    except BaseException as exc:
        sock.close()  # a no-op once a transport took the socket over
        if isinstance(exc, ssl.SSLError | ssl.CertificateError):
            raise SubscriptionFetchError("tls") from None
        if isinstance(exc, OSError):
            raise SubscriptionFetchError("connection") from None
        raise
    try:
        return await _exchange(url, reader, writer, user_agent, max_bytes)
    except h11.LocalProtocolError:
        raise SubscriptionFetchError("invalid-request") from None
    except h11.ProtocolError:
        raise SubscriptionFetchError("malformed-response") from None
    except (ssl.SSLError, ssl.CertificateError):
        raise SubscriptionFetchError("tls") from None
    except OSError:
        raise SubscriptionFetchError("connection") from None
    finally:
        with contextlib.suppress(Exception):
            writer.transport.abort()  # nothing more is read or written; no need for a clean close


async def _exchange(
    url: _Url, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, user_agent: str, max_bytes: int
) -> FetchResult | _Redirect:
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=url.target,
        headers=[
            ("Host", url.authority),
            ("User-Agent", user_agent.encode("utf-8")),
            ("Accept", "*/*"),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
        ],
    )
    writer.write(conn.send(request) + conn.send(h11.EndOfMessage()))
    await writer.drain()
    status = 0
    chunks: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(READ_CHUNK))
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {name.lower(): value for name, value in event.headers}
            if status in REDIRECT_STATUSES and b"location" in headers:
                return _Redirect(headers[b"location"].decode("latin-1"))
            if not 200 <= status < 300:
                raise SubscriptionFetchError("http-status", status=status)
            usage = (
                parse_userinfo(headers[b"subscription-userinfo"])
                if b"subscription-userinfo" in headers
                else None
            )
            if headers.get(b"content-encoding", b"identity").strip().lower() != b"identity":
                raise SubscriptionFetchError("unsupported-encoding")
            length = headers.get(b"content-length")
            if length is not None and int(length) > max_bytes:  # h11 has checked it is a number
                raise SubscriptionFetchError("body-too-large")
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > max_bytes:
                raise SubscriptionFetchError("body-too-large")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return FetchResult(b"".join(chunks), status, 0, usage)
        elif isinstance(event, h11.ConnectionClosed):
            raise SubscriptionFetchError("connection")
        # h11.InformationalResponse (1xx): keep reading


def read_local(url: str) -> FetchResult:
    """A ``file://`` subscription's body, read as a download is received: at most
    :data:`~honk.subscription.formats.MAX_BODY_BYTES`. Blocking: run it in a thread."""
    try:
        with open(url[len(FILE_SCHEME) :], "rb") as fh:
            body = fh.read(MAX_BODY_BYTES + 1)
    except OSError:
        raise SubscriptionFetchError("file-unreadable") from None
    if len(body) > MAX_BODY_BYTES:
        raise SubscriptionFetchError("body-too-large")
    return FetchResult(body=body, status=200, redirects=0)
