"""Which local process owns a socket: what ``pname(...)`` rules match on the host's own flows.

A flow of the host's own (``wan_interface``) reaches the transparent listener with the
process's socket address as its source. The kernel's socket tables (``/proc/net/tcp``,
``tcp6``, ``udp``, ``udp6``: the reader's network namespace) give the socket's inode; the
process is the one holding a descriptor ``socket:[inode]`` (``/proc/<pid>/fd``); its name is
``/proc/<pid>/comm``, which is what dae's ``pname`` compares: the executable's name cut to
``COMM_MAX`` characters. A LAN client's flow has no local socket: the answer is None.

Addresses are compared in the tables' own text (hex, each 32-bit word in host byte order), so a
lookup is a scan of lines, not a parse of each. The scans block: the caller runs them in a
thread, and only when the rules read a process name at all.
"""

from __future__ import annotations

import ipaddress
import os
import struct

from honk.core.net import Address, Network

__all__ = ["COMM_MAX", "comm_name", "process_name", "socket_inode"]

COMM_MAX = 15  # TASK_COMM_LEN (16) less its NUL: the kernel keeps this much of a process's name
PROC = "/proc"
_TABLES = {Network.TCP: ("net/tcp", "net/tcp6"), Network.UDP: ("net/udp", "net/udp6")}
_WILD4 = "00000000"
_WILD6 = "0" * 32
_TCP_LISTEN = "0A"  # a listening socket: its local address is never a flow's source


def comm_name(name: str) -> str:
    """``name`` as the kernel keeps a process's name (what ``pname`` arguments are compared as)."""
    return name[:COMM_MAX]


def _words(packed: bytes) -> str:
    """An address as the socket tables print it: each 32-bit word in host byte order, in hex."""
    return "".join(f"{word:08X}" for word in struct.unpack(f"={len(packed) // 4}I", packed))


def _forms(host: str, port: int) -> tuple[str, str]:
    """``host:port`` as it appears in the IPv4 and the IPv6 tables (an IPv4 address in the
    IPv6 table is a dual-stack socket's mapped one); "" where it cannot appear."""
    ip = ipaddress.ip_address(host)
    if ip.version == 4:
        mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
        return f"{_words(ip.packed)}:{port:04X}", f"{_words(mapped.packed)}:{port:04X}"
    if ip.ipv4_mapped is not None:
        return _forms(str(ip.ipv4_mapped), port)
    return "", f"{_words(ip.packed)}:{port:04X}"


def socket_inode(network: Network, source: Address, target: Address, proc: str = PROC) -> int | None:
    """The inode of this host's socket with local address ``source`` talking to ``target``
    (a UDP socket may be unconnected or bound to any address), or None: no such socket."""
    try:
        sources = _forms(source.host, source.port)
        targets = _forms(target.host, target.port)
    except ValueError:
        return None
    for table, local, remote, wild in zip(_TABLES[network], sources, targets, (_WILD4, _WILD6), strict=True):
        if not local:
            continue
        port = local[-5:]  # ":PPPP"
        try:
            with open(os.path.join(proc, table), encoding="ascii") as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) < 10 or not fields[1].endswith(port):
                        continue
                    if network is Network.TCP:
                        if fields[1] == local and fields[2] == remote and fields[3] != _TCP_LISTEN:
                            return int(fields[9])
                    elif fields[1] in (local, f"{wild}{port}") and fields[2] in (remote, f"{wild}:0000"):
                        return int(fields[9]) or None
        except OSError:
            continue
    return None


def _holder(inode: int, proc: str) -> int | None:
    """The process holding a descriptor of socket ``inode`` (the first found), or None."""
    wanted = f"socket:[{inode}]"
    try:
        pids = [entry.name for entry in os.scandir(proc) if entry.name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            with os.scandir(fd_dir) as fds:
                for fd in fds:
                    try:
                        if os.readlink(fd.path) == wanted:
                            return int(pid)
                    except OSError:
                        continue  # closed meanwhile
        except OSError:
            continue  # gone, or not ours to read
    return None


def process_name(network: Network, source: Address, target: Address, proc: str = PROC) -> str | None:
    """The name of the local process whose socket ``source`` talks to ``target``, or None (a
    LAN client, or a socket closed before the lookup)."""
    inode = socket_inode(network, source, target, proc)
    if not inode:
        return None
    pid = _holder(inode, proc)
    if pid is None:
        return None
    try:
        with open(os.path.join(proc, str(pid), "comm"), encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n") or None
    except OSError:
        return None
