"""Socket options of transparent proxying that Python 3.11's ``socket`` module does not export,
and the small helpers the transparent inbounds build on.

* ``IP_TRANSPARENT``/``IPV6_TRANSPARENT``: a socket may bind and accept addresses that are not
  the host's own. A TPROXY listener needs it (its accepted sockets' local address is the
  original destination), and so does a UDP reply socket bound to the original destination.
* ``IP_RECVORIGDSTADDR``/``IPV6_RECVORIGDSTADDR``: each datagram received on a TPROXY UDP socket
  carries its original destination as ancillary data (a ``sockaddr_in``/``sockaddr_in6``).
* ``SO_ORIGINAL_DST``/``IP6T_SO_ORIGINAL_DST``: the destination a REDIRECT (DNAT) rule rewrote,
  read from conntrack through ``getsockopt`` on the accepted TCP socket (UDP has none).

A dual-stack ``AF_INET6`` socket sees IPv4 peers as ``::ffff:a.b.c.d``; :func:`unmap` turns them
back into IPv4 text so routing and logs see one spelling.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

__all__ = [
    "IP6T_SO_ORIGINAL_DST",
    "IPV6_ORIGDSTADDR",
    "IPV6_RECVORIGDSTADDR",
    "IPV6_TRANSPARENT",
    "IP_ORIGDSTADDR",
    "IP_RECVORIGDSTADDR",
    "IP_TRANSPARENT",
    "ORIGDST_CMSG_SPACE",
    "SOL_IPV6",
    "SO_ORIGINAL_DST",
    "family_of",
    "original_dst",
    "origdst_from_ancdata",
    "parse_sockaddr",
    "set_linger_reset",
    "set_transparent",
    "transparent_socket",
    "unmap",
]

# <linux/in.h>, <linux/in6.h>, <linux/netfilter_ipv4.h>, <linux/netfilter_ipv6/ip6_tables.h>
IP_TRANSPARENT = 19
IP_RECVORIGDSTADDR = 20
IP_ORIGDSTADDR = IP_RECVORIGDSTADDR  # the cmsg type equals the option
IPV6_TRANSPARENT = 75
IPV6_RECVORIGDSTADDR = 74
IPV6_ORIGDSTADDR = IPV6_RECVORIGDSTADDR
SO_ORIGINAL_DST = 80
IP6T_SO_ORIGINAL_DST = 80
SOL_IPV6 = socket.IPPROTO_IPV6  # Python 3.11 has no socket.SOL_IPV6

SOCKADDR_IN_SIZE = 16
SOCKADDR_IN6_SIZE = 28
# room for one original-destination control message of either family
ORIGDST_CMSG_SPACE = socket.CMSG_SPACE(SOCKADDR_IN6_SIZE)

_LINGER_RESET = struct.pack("ii", 1, 0)  # l_onoff=1, l_linger=0: close() sends RST


def unmap(host: str) -> str:
    """``::ffff:a.b.c.d`` as ``a.b.c.d``; other addresses in canonical text (scope id dropped)."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def family_of(host: str) -> int:
    """``AF_INET6`` for an IPv6 literal, else ``AF_INET``."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def set_transparent(sock: socket.socket) -> None:
    """``IP_TRANSPARENT`` (and ``IPV6_TRANSPARENT`` on an IPv6 socket, which serves both families
    when dual-stack). Raises PermissionError without CAP_NET_ADMIN."""
    if sock.family == socket.AF_INET6:
        sock.setsockopt(SOL_IPV6, IPV6_TRANSPARENT, 1)
    sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)


def transparent_socket(
    family: int,
    kind: int,
    local: tuple[str, int],
    *,
    dual_stack: bool = False,
    recv_origdst: bool = False,
    reuse_port: bool = False,
) -> socket.socket:
    """A non-blocking transparent socket bound to ``local`` (``SO_REUSEADDR``).

    ``dual_stack``: an ``AF_INET6`` socket that also serves IPv4 (``IPV6_V6ONLY`` off);
    ``recv_origdst``: datagrams carry their original destination (both families' options on an
    IPv6 socket: IPv4 datagrams of a dual-stack socket report it at the IPv4 level)."""
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(SOL_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        set_transparent(sock)
        if recv_origdst:
            sock.setsockopt(socket.SOL_IP, IP_RECVORIGDSTADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(SOL_IPV6, IPV6_RECVORIGDSTADDR, 1)
        sock.setblocking(False)
        sock.bind(local)
    except BaseException:
        sock.close()
        raise
    return sock


def parse_sockaddr(raw: bytes) -> tuple[str, int] | None:
    """(host, port) of a kernel ``sockaddr_in``/``sockaddr_in6``; None if it is neither."""
    if len(raw) < 2:
        return None
    (family,) = struct.unpack_from("=H", raw)
    if family == socket.AF_INET and len(raw) >= 8:
        port, packed = struct.unpack_from("!H4s", raw, 2)
        return socket.inet_ntop(socket.AF_INET, packed), port
    if family == socket.AF_INET6 and len(raw) >= 24:
        (port,) = struct.unpack_from("!H", raw, 2)
        return unmap(socket.inet_ntop(socket.AF_INET6, raw[8:24])), port
    return None


def origdst_from_ancdata(ancdata: list[tuple[int, int, bytes]]) -> tuple[str, int] | None:
    """The original destination in ``recvmsg``'s ancillary data (IPv4 or IPv6), or None."""
    for level, kind, data in ancdata:
        if (level, kind) in ((socket.SOL_IP, IP_ORIGDSTADDR), (SOL_IPV6, IPV6_ORIGDSTADDR)):
            return parse_sockaddr(data)
    return None


def original_dst(sock: socket.socket) -> tuple[str, int]:
    """The destination a REDIRECT rule rewrote, for an accepted TCP socket. Raises OSError
    (``ENOENT``: the connection was not redirected)."""
    if sock.family == socket.AF_INET6:
        peer = sock.getpeername()[0]
        if ipaddress.IPv6Address(peer.split("%", 1)[0]).ipv4_mapped is None:
            return (
                parse_sockaddr(sock.getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST, SOCKADDR_IN6_SIZE)) or _bad()
            )
    return parse_sockaddr(sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, SOCKADDR_IN_SIZE)) or _bad()


def _bad() -> tuple[str, int]:
    raise OSError("the kernel returned no usable original destination")


def set_linger_reset(sock: socket.socket) -> None:
    """Make ``close()`` reset the connection (``SO_LINGER`` 0): a refused flow's client learns at once."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
