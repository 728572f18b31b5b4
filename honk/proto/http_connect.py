"""The client side of an HTTP CONNECT tunnel (RFC 9110 section 9.3.6), without I/O.

:func:`connect_request` builds the request; :func:`parse_connect_response`
reads the proxy's response head from a buffer that may hold more (the glue
peeks, so bytes after the head stay in the socket for the relay) and reports
how long the head is. :func:`check_status` turns a refusal into a typed error:
``407`` (or ``401``, which some proxies send) → :class:`ProxyAuthFailed`; other non-2xx statuses →
:class:`TargetRefused` carrying the SOCKS5 reply a client should see.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from honk.core.errors import DialError, ProxyAuthFailed, TargetRefused
from honk.core.net import Address

__all__ = [
    "MAX_RESPONSE_HEAD",
    "ConnectResponse",
    "check_status",
    "connect_request",
    "parse_connect_response",
]

MAX_RESPONSE_HEAD = 16 * 1024  # bytes: a proxy's response head larger than this is garbage
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([^\r\n]*))?")

# HTTP refusals as SOCKS5 replies (RFC 1928 codes), for a SOCKS5 client behind honk.
_STATUS_REPLIES = {
    403: 0x02,  # forbidden by the proxy's rules: "not allowed by ruleset"
    404: 0x04,  # the proxy could not find the host
    405: 0x07,  # CONNECT not allowed
    502: 0x04,  # the proxy could not reach the target
    503: 0x05,  # the target (or the proxy's path to it) refused
    504: 0x06,  # the proxy's own connect timed out
}
GENERAL_FAILURE = 0x01


@dataclass(frozen=True, slots=True)
class ConnectResponse:
    status: int
    reason: str
    head_length: int  # bytes of the status line and headers, final CRLF CRLF included


def _authority(target: Address) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{host}:{target.port}"


def connect_request(target: Address, username: str | None = None, password: str | None = None) -> bytes:
    """``CONNECT host:port HTTP/1.1`` with Host and, with credentials, Basic proxy authorization."""
    authority = _authority(target)
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if username is not None:
        token = base64.b64encode(f"{username}:{password or ''}".encode()).decode("ascii")
        lines.append(f"Proxy-Authorization: Basic {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


def parse_connect_response(buf: bytes, outbound: str) -> ConnectResponse | None:
    """The response head at the start of ``buf``, or None while it is incomplete.

    Raises :class:`DialError` (phase ``handshake``) for bytes that are not an
    HTTP/1.x response or a head over :data:`MAX_RESPONSE_HEAD`.
    """
    end = buf.find(b"\r\n\r\n", 0, MAX_RESPONSE_HEAD + 4)
    if end < 0:
        if not b"HTTP/".startswith(bytes(buf[:5])):  # fail early on what cannot become a response
            raise DialError(outbound, "handshake", "HTTP proxy: the answer is not an HTTP response")
        if len(buf) >= MAX_RESPONSE_HEAD + 4:
            raise DialError(outbound, "handshake", "HTTP proxy: response head too large")
        return None
    head = buf[:end]
    line = head.split(b"\r\n", 1)[0]
    m = _STATUS_LINE.fullmatch(line)
    if m is None:
        raise DialError(outbound, "handshake", "HTTP proxy: malformed status line")
    reason = (m.group(2) or b"").decode("latin-1")
    return ConnectResponse(int(m.group(1)), reason, end + 4)


def check_status(response: ConnectResponse, outbound: str) -> None:
    """Nothing for 2xx; a typed error for everything else."""
    status = response.status
    if 200 <= status < 300:
        return
    text = f"HTTP proxy answered {status}" + (f" {response.reason}" if response.reason else "")
    if status in (401, 407):  # 407 by the RFC; some proxies (tinyproxy) answer 401
        raise ProxyAuthFailed(outbound, text)
    raise TargetRefused(outbound, _STATUS_REPLIES.get(status, GENERAL_FAILURE), text)
