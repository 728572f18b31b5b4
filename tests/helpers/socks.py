"""A small blocking SOCKS5 client for driving honk from tests."""

from __future__ import annotations

import ipaddress
import socket
import struct


def socks5_connect(proxy: tuple[str, int], host: str, port: int, *, timeout: float = 5.0,
                   auth: tuple[str, str] | None = None) -> tuple[socket.socket, int]:
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
