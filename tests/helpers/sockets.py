"""Connected socket pairs and resets for relay tests."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator


def tcp_pair(listener: socket.socket | None = None) -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking TCP sockets on loopback (through ``listener`` if given)."""
    if listener is None:
        with socket.create_server(("127.0.0.1", 0)) as own:
            return tcp_pair(own)
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def unix_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking Unix stream sockets (no ephemeral ports used up)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN (SO_LINGER on, zero timeout)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` on a blocking socket and read back as many bytes (fewer at EOF)."""
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def open_fds() -> int:
    """How many file descriptors this process has open (leak checks)."""
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A loopback port whose listener's backlog is full: a connect to it never completes."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    try:
        for _ in range(8):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(full.getsockname())
            fillers.append(s)
        yield full.getsockname()[1]
    finally:
        for s in fillers:
            s.close()
        full.close()
