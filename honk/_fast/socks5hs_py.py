"""The SOCKS5 fast-path handshake in pure Python: the twin of ``socks5hs.h`` / ``socks5hs_c``.

A client's first bytes are judged in two steps, as the relay engine reads them:
:func:`greeting` (a complete greeting offering "no authentication" → the offset of the
request), then :func:`request` (one complete CONNECT to an IPv4, IPv6 or printable-ASCII
domain target → its end; the bytes after it are the client's early payload). Anything else
is :data:`HANDOVER`: :mod:`honk.proto.socks5` reads the same bytes again and answers them.

:data:`ERRNO_REPLIES` is honk's one errno → reply table: the engines' refusals and
:func:`honk.proto.socks5.reply_for` both read it (the compiled engine through the C twin,
which the tests hold to this table).
"""

from __future__ import annotations

import errno
import socket
import struct

__all__ = [
    "ERRNO_REPLIES",
    "HANDOVER",
    "MORE",
    "build_reply",
    "errno_reply",
    "greeting",
    "reply_code",
    "request",
    "target",
]

MORE = 0  # nothing after the greeting yet: read on
HANDOVER = -1  # not the common case: Python's codec serves the client
GENERAL_FAILURE = 1  # the reply for an error the table does not name

# errno of a failed connect -> SOCKS5 reply code (RFC 1928 §6)
ERRNO_REPLIES = {
    errno.ECONNREFUSED: 5,  # connection refused
    errno.ENETUNREACH: 3,  # network unreachable
    errno.ENETDOWN: 3,
    errno.EHOSTUNREACH: 4,  # host unreachable
    errno.EHOSTDOWN: 4,
    errno.ETIMEDOUT: 6,  # TTL expired: the dial timed out
}

_NO_AUTH = 0
_CONNECT = 1
_ATYP_IPV4, _ATYP_DOMAIN, _ATYP_IPV6 = 1, 3, 4


def errno_reply(err: int) -> int:
    """The reply code for a connect that failed with ``err``; 0 when the table has none."""
    return ERRNO_REPLIES.get(err, 0)


def reply_code(err: int) -> int:
    """What the engines reply for a connect that failed with ``err`` (0x01 when unnamed)."""
    return ERRNO_REPLIES.get(err, GENERAL_FAILURE)


def greeting(data: bytes | bytearray | memoryview) -> int:
    """The request's offset when ``data`` starts with one complete greeting offering
    "no authentication", else :data:`HANDOVER`."""
    if len(data) < 2 or data[0] != 5 or len(data) < 2 + data[1]:
        return HANDOVER
    return 2 + data[1] if _NO_AUTH in data[2 : 2 + data[1]] else HANDOVER


def request(data: bytes | bytearray | memoryview, off: int) -> int:
    """The end of the CONNECT at ``data[off:]`` the fast path serves, :data:`MORE` when
    nothing follows the greeting yet, else :data:`HANDOVER`."""
    if off < 0 or off > len(data):
        raise ValueError("off: outside the data")
    n = len(data)
    if n == off:
        return MORE
    if n < off + 5 or data[off] != 5 or data[off + 1] != _CONNECT or data[off + 2] != 0:
        return HANDOVER
    atyp = data[off + 3]
    if atyp == _ATYP_IPV4:
        end = off + 4 + 4 + 2
    elif atyp == _ATYP_IPV6:
        end = off + 4 + 16 + 2
    elif atyp == _ATYP_DOMAIN:
        alen = data[off + 4]
        end = off + 5 + alen + 2
        if alen == 0 or n < end:
            return HANDOVER
        if any(c <= 0x20 or c >= 0x7F for c in data[off + 5 : off + 5 + alen]):
            return HANDOVER  # Python's codec says bad-domain
    else:
        return HANDOVER
    return HANDOVER if n < end else end


def target(data: bytes | bytearray | memoryview, off: int) -> tuple[str, int]:
    """The host text and port of the request at ``data[off:]`` that :func:`request` accepts."""
    if off < 0 or request(data, off) <= 0:
        raise ValueError("target: not a request the fast path accepts")
    atyp = data[off + 3]
    if atyp == _ATYP_IPV4:
        return socket.inet_ntop(socket.AF_INET, bytes(data[off + 4 : off + 8])), _port(data, off + 8)
    if atyp == _ATYP_IPV6:
        return socket.inet_ntop(socket.AF_INET6, bytes(data[off + 4 : off + 20])), _port(data, off + 20)
    alen = data[off + 4]
    return bytes(data[off + 5 : off + 5 + alen]).decode("ascii"), _port(data, off + 5 + alen)


def _port(data: bytes | bytearray | memoryview, at: int) -> int:
    return int(data[at]) << 8 | int(data[at + 1])


def build_reply(code: int, fd: int = -1) -> bytes:
    """A reply with ``code``; BND is ``fd``'s local address when ``fd`` >= 0 and it has one,
    else 0.0.0.0:0 (what honk's failures carry)."""
    if fd >= 0:
        sock = socket.socket(fileno=fd)
        try:
            family = sock.family
            local = sock.getsockname()
        except OSError:
            local = None
        finally:
            sock.detach()
        if local is not None and family == socket.AF_INET6:
            return bytes((5, code, 0, 4)) + socket.inet_pton(family, local[0]) + struct.pack("!H", local[1])
        if local is not None and family == socket.AF_INET:
            return bytes((5, code, 0, 1)) + socket.inet_aton(local[0]) + struct.pack("!H", local[1])
    return bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))
