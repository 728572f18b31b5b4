"""A small blocking SOCKS5 client for driving honk from tests."""

from __future__ import annotations

import ipaddress
import socket
import struct


def socks5_connect(
    proxy: tuple[str, int], host: str, port: int, *, timeout: float = 5.0, auth: tuple[str, str] | None = None
) -> tuple[socket.socket, int]:
    """Open a CONNECT through ``proxy``; return the socket and the reply code (0 = success).

    On a non-zero reply the socket is still returned (the proxy closes it).
    """
    sock = socket.create_connection(proxy, timeout=timeout)
    method = 0x02 if auth else 0x00
    sock.sendall(bytes([5, 1, method]))
    ver, chosen = recv_exact(sock, 2)
    if chosen == 0xFF:
        return sock, 0xFF
    if chosen == 0x02:
        user, password = (a.encode() for a in auth)  # type: ignore[union-attr]
        sock.sendall(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        _, status = recv_exact(sock, 2)
        if status != 0:
            return sock, 0xFF
    sock.sendall(bytes([5, 1, 0]) + encode_address(host, port))
    head = recv_exact(sock, 4)
    rep, atyp = head[1], head[3]
    if atyp == 1:
        recv_exact(sock, 4 + 2)
    elif atyp == 4:
        recv_exact(sock, 16 + 2)
    elif atyp == 3:
        (n,) = recv_exact(sock, 1)
        recv_exact(sock, n + 2)
    return sock, rep


def encode_address(host: str, port: int) -> bytes:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.encode("idna")
        return bytes([3, len(name)]) + name + struct.pack("!H", port)
    kind = 1 if ip.version == 4 else 4
    return bytes([kind]) + ip.packed + struct.pack("!H", port)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from a blocking socket; ConnectionError at an early EOF."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"proxy closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


# RFC 1928 §5, §7: address types, and the header of an unfragmented UDP datagram (RSV, FRAG 0).
ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6 = 0x01, 0x03, 0x04
UDP_HEADER_PREFIX = b"\x00\x00\x00"


def read_address(data: bytes, offset: int) -> tuple[str, int, int]:
    """host, port and the offset past a SOCKS5 address (ATYP, address, port) at ``offset``."""
    atyp = data[offset]
    if atyp == ATYP_IPV4:
        host, end = str(ipaddress.IPv4Address(data[offset + 1 : offset + 5])), offset + 5
    elif atyp == ATYP_IPV6:
        host, end = str(ipaddress.IPv6Address(data[offset + 1 : offset + 17])), offset + 17
    elif atyp == ATYP_DOMAIN:
        n = data[offset + 1]
        host, end = data[offset + 2 : offset + 2 + n].decode(), offset + 2 + n
    else:
        raise AssertionError(f"unknown SOCKS5 address type {atyp}")
    return host, struct.unpack_from("!H", data, end)[0], end + 2


def socks5_udp_exchange(
    proxy: tuple[str, int], target: tuple[str, int], payload: bytes, *, timeout: float = 5.0
) -> bytes:
    """Send ``payload`` to ``target`` through a SOCKS5 UDP association (no auth) and return the reply.

    The control connection stays open for the whole exchange: closing it ends the association.
    """
    with (
        socket.create_connection(proxy, timeout=timeout) as control,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
    ):
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(timeout)
        control.sendall(bytes((5, 1, 0)))  # version 5, one method: no auth
        assert recv_exact(control, 2) == bytes((5, 0))
        control.sendall(bytes((5, 3, 0)) + encode_address(*udp.getsockname()))  # UDP ASSOCIATE
        head = recv_exact(control, 4)
        assert head[1] == 0, f"UDP ASSOCIATE refused with reply {head[1]}"
        tail = recv_exact(control, {ATYP_IPV4: 6, ATYP_IPV6: 18}[head[3]])
        relay_host, relay_port, _ = read_address(head[3:4] + tail, 0)
        if ipaddress.ip_address(relay_host).is_unspecified:
            relay_host = proxy[0]  # "the proxy's own address"
        udp.sendto(UDP_HEADER_PREFIX + encode_address(*target) + payload, (relay_host, relay_port))
        datagram, _ = udp.recvfrom(65535)
        assert datagram[:3] == UDP_HEADER_PREFIX
        source_host, source_port, offset = read_address(datagram, 3)
        assert (source_host, source_port) == target, "the reply names the target as its source"
        return datagram[offset:]
