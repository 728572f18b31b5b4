"""A tiny authoritative DNS responder on loopback UDP (and TCP: :class:`DnsResponder`), and the
wire codec tests use to talk to it.

Plain RFC 1035 messages built and parsed by hand, so tests need no DNS library. The
responder is a thread, like the origins in ``servers.py``, so it serves sync tests and
async tests on either event loop alike.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence

# RFC 1035 §4.1.1: the header is six 16-bit fields; the flag bits and RCODE values below.
HEADER = struct.Struct("!HHHHHH")  # id, flags, qdcount, ancount, nscount, arcount
FLAG_QR = 0x8000  # this message is a response
FLAG_AA = 0x0400  # authoritative answer
FLAG_TC = 0x0200  # truncated: the answer did not fit
FLAG_RD = 0x0100  # recursion desired (copied from the query)
FLAG_RA = 0x0080  # recursion available
OPCODE_MASK = 0x7800  # opcode bits; 0 is a standard query
RCODE_MASK = 0x000F
RCODE_NOERROR = 0
RCODE_FORMERR = 1
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4
# RFC 1035 §3.2.2 / §3.2.4: TYPE and CLASS values.
TYPE_A = 1
TYPE_AAAA = 28  # RFC 3596 §2.1
CLASS_IN = 1
# RFC 1035 §4.1.4: a label length with both top bits set is a compression pointer.
POINTER_BITS = 0xC0
# RFC 1035 §2.3.4: size limits.
MAX_LABEL = 63
MAX_NAME = 255
MAX_UDP_MESSAGE = 512
MAX_POINTER_HOPS = 32  # a bound on pointer chains, so a looping pointer is a format error

DEFAULT_TTL = 60  # seconds: what the responder puts in every answer


class DnsFormatError(ValueError):
    """A DNS message that does not parse as RFC 1035 wire format."""


def encode_name(name: str) -> bytes:
    """``name`` as a sequence of length-prefixed labels ending in the root label."""
    labels = [label for label in name.rstrip(".").split(".") if label] if name not in ("", ".") else []
    out = bytearray()
    for label in labels:
        raw = label.encode("idna")
        if len(raw) > MAX_LABEL:
            raise ValueError(f"DNS label longer than {MAX_LABEL} bytes: {label!r}")
        out += bytes((len(raw),)) + raw
    out += b"\x00"
    if len(out) > MAX_NAME:
        raise ValueError(f"DNS name longer than {MAX_NAME} bytes")
    return bytes(out)


def read_name(msg: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` (following compression pointers) and the offset just past it."""
    labels: list[str] = []
    end = -1  # where the name ends in place; set at the first pointer
    for _ in range(MAX_POINTER_HOPS):
        if offset >= len(msg):
            raise DnsFormatError("name runs past the end of the message")
        length = msg[offset]
        if length & POINTER_BITS == POINTER_BITS:
            if offset + 2 > len(msg):
                raise DnsFormatError("truncated compression pointer")
            if end < 0:
                end = offset + 2
            offset = struct.unpack_from("!H", msg, offset)[0] & 0x3FFF
            continue
        if length & POINTER_BITS:
            raise DnsFormatError(f"reserved label type 0x{length:02x}")
        offset += 1
        if length == 0:
            return ".".join(labels), (end if end >= 0 else offset)
        if offset + length > len(msg):
            raise DnsFormatError("label runs past the end of the message")
        labels.append(msg[offset : offset + length].decode("ascii", "replace"))
        offset += length
    raise DnsFormatError("too many compression pointers")


def build_query(name: str, qid: int, qtype: int = TYPE_A) -> bytes:
    """A standard recursive query for ``name`` with one question of ``qtype`` in class IN."""
    return HEADER.pack(qid, FLAG_RD, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def parse_answer(msg: bytes) -> tuple[int, int, list[str]]:
    """``(qid, rcode, ipv4s)`` of a response: the A records of its answer section, in order."""
    if len(msg) < HEADER.size:
        raise DnsFormatError(f"message shorter than the {HEADER.size}-byte header")
    qid, flags, qdcount, ancount, _, _ = HEADER.unpack_from(msg)
    if not flags & FLAG_QR:
        raise DnsFormatError("not a response (QR is clear)")
    offset = HEADER.size
    for _ in range(qdcount):
        _, offset = read_name(msg, offset)
        offset += 4  # QTYPE, QCLASS
    ips: list[str] = []
    for _ in range(ancount):
        _, offset = read_name(msg, offset)
        if offset + 10 > len(msg):
            raise DnsFormatError("truncated resource record")
        rtype, rclass, _ttl, rdlength = struct.unpack_from("!HHIH", msg, offset)
        offset += 10
        rdata = msg[offset : offset + rdlength]
        if len(rdata) != rdlength:
            raise DnsFormatError("truncated RDATA")
        offset += rdlength
        if rtype == TYPE_A and rclass == CLASS_IN and rdlength == 4:
            ips.append(str(ipaddress.IPv4Address(rdata)))
    return qid, flags & RCODE_MASK, ips


def build_response(
    query: bytes, records: Mapping[str, Sequence[str]], ttl: int = DEFAULT_TTL
) -> bytes | None:
    """The authoritative answer to ``query`` from ``records`` (lower-case name → IPv4s).

    A known name gets its A records (or no records, NOERROR, for any other type); an
    unknown name gets NXDOMAIN; a message with a readable header but an unreadable
    question gets FORMERR, a non-standard opcode NOTIMP. ``None`` means drop it: too
    short to hold an id, or itself a response.
    """
    if len(query) < HEADER.size:
        return None
    qid, flags, qdcount, _, _, _ = HEADER.unpack_from(query)
    if flags & FLAG_QR:
        return None
    base = FLAG_QR | FLAG_AA | FLAG_RA | (flags & (OPCODE_MASK | FLAG_RD))
    if flags & OPCODE_MASK:
        return HEADER.pack(qid, base | RCODE_NOTIMP, 0, 0, 0, 0)
    try:
        if qdcount != 1:
            raise DnsFormatError(f"{qdcount} questions")
        name, end = read_name(query, HEADER.size)
        if end + 4 > len(query):
            raise DnsFormatError("truncated question")
        qtype, qclass = struct.unpack_from("!HH", query, end)
    except DnsFormatError:
        return HEADER.pack(qid, base | RCODE_FORMERR, 0, 0, 0, 0)
    question = query[HEADER.size : end + 4]
    ips = records.get(name.lower().rstrip("."))
    if ips is None:
        return HEADER.pack(qid, base | RCODE_NXDOMAIN, 1, 0, 0, 0) + question
    answers = b""
    if qtype == TYPE_A and qclass == CLASS_IN:
        pointer = struct.pack("!H", (POINTER_BITS << 8) | HEADER.size)  # the question's name
        for ip in ips:
            answers += (
                pointer + struct.pack("!HHIH", TYPE_A, CLASS_IN, ttl, 4) + ipaddress.IPv4Address(ip).packed
            )
    count = len(answers) // 16  # each A record above is 16 bytes
    return HEADER.pack(qid, base | RCODE_NOERROR, 1, count, 0, 0) + question + answers


def truncate(reply: bytes) -> bytes:
    """``reply`` cut to its header and question, with TC set: what a server sends when the
    answer does not fit a UDP message (RFC 1035 §4.1.1)."""
    qid, flags, qdcount, _, _, _ = HEADER.unpack_from(reply)
    offset = HEADER.size
    for _ in range(qdcount):
        _, offset = read_name(reply, offset)
        offset += 4
    return HEADER.pack(qid, flags | FLAG_TC, qdcount, 0, 0, 0) + reply[HEADER.size : offset]


class UdpDnsResponder:
    """An authoritative DNS server on 127.0.0.1 UDP: A records for a few names, NXDOMAIN for the rest.

    ``records`` maps a name to one IPv4 or a list of them. Every well-formed query is
    counted (``queries`` in total, ``counts`` per lower-case name) before it is answered.
    """

    def __init__(
        self, records: Mapping[str, str | Sequence[str]], ttl: int = DEFAULT_TTL, *, port: int = 0
    ) -> None:
        self.records: dict[str, tuple[str, ...]] = {
            name.lower().rstrip("."): (ips,) if isinstance(ips, str) else tuple(ips)
            for name, ips in records.items()
        }
        for ips in self.records.values():
            for ip in ips:
                ipaddress.IPv4Address(ip)  # fail here, not in the serving thread
        self.ttl = ttl
        self.truncate_udp = False  # answer UDP with TC set and no records (a client must retry over TCP)
        self.counts: collections.Counter[str] = collections.Counter()
        self._cond = threading.Condition()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind(("127.0.0.1", port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = self._sock.getsockname()
        # Closing a socket does not wake a thread blocked on it; this pair does.
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="dns-responder", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def queries(self) -> int:
        with self._cond:
            return sum(self.counts.values())

    def wait_for_queries(self, n: int, timeout: float = 5.0) -> int:
        """Block until at least ``n`` queries arrived; the count, or AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (seen := sum(self.counts.values())) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"DNS responder saw {seen} of {n} queries within {timeout}s")
                self._cond.wait(left)
            return seen

    async def queried(self, n: int, timeout: float = 5.0) -> int:
        """:meth:`wait_for_queries` for async tests: waits in a thread so the loop keeps running."""
        return await asyncio.to_thread(self.wait_for_queries, n, timeout)

    def _serve(self) -> None:
        while True:
            readable, _, _ = select.select([self._sock, self._wake_r], [], [])
            if self._wake_r in readable:
                return
            try:
                query, peer = self._sock.recvfrom(MAX_UDP_MESSAGE)
            except OSError:
                continue
            reply = build_response(query, self.records, self.ttl)
            if reply is None:
                continue
            if self.truncate_udp:
                reply = truncate(reply)
            if reply[3] & RCODE_MASK in (RCODE_NOERROR, RCODE_NXDOMAIN):
                name, _ = read_name(query, HEADER.size)
                with self._cond:
                    self.counts[name.lower().rstrip(".")] += 1
                    self._cond.notify_all()
            with contextlib.suppress(OSError):
                self._sock.sendto(reply, peer)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5.0)
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self) -> UdpDnsResponder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TCP_READ_TIMEOUT = 5.0  # seconds a TCP client of the responder may stay silent
PORT_ATTEMPTS = 20  # pairs of ports tried before DnsResponder gives up on one free for UDP and TCP


class DnsResponder(UdpDnsResponder):
    """:class:`UdpDnsResponder` that also answers TCP DNS (RFC 1035 §4.2.2 length prefix,
    several queries per connection) on the same port; ``truncate_udp`` makes every UDP answer
    a truncated one. TCP queries are counted in ``tcp_counts``, apart from UDP's ``counts``."""

    def __init__(
        self,
        records: Mapping[str, str | Sequence[str]],
        ttl: int = DEFAULT_TTL,
        *,
        truncate_udp: bool = False,
    ) -> None:
        # The TCP port first, then UDP on the same number: a free TCP port is the scarcer one
        # (client connections hold ephemeral ports); a taken UDP twin means another pair.
        for attempt in range(PORT_ATTEMPTS):
            self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._tcp.bind(("127.0.0.1", 0))
            try:
                super().__init__(records, ttl, port=self._tcp.getsockname()[1])
            except OSError:
                self._tcp.close()
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                continue
            except BaseException:
                self._tcp.close()
                raise
            break
        self._tcp.listen(16)
        self.truncate_udp = truncate_udp
        self.tcp_counts: collections.Counter[str] = collections.Counter()
        self._tcp_wake_r, self._tcp_wake_w = socket.socketpair()
        self._tcp_thread = threading.Thread(target=self._serve_tcp, name="dns-responder-tcp", daemon=True)
        self._tcp_thread.start()

    @property
    def tcp_queries(self) -> int:
        with self._cond:
            return sum(self.tcp_counts.values())

    def _serve_tcp(self) -> None:
        while True:
            readable, _, _ = select.select([self._tcp, self._tcp_wake_r], [], [])
            if self._tcp_wake_r in readable:
                return
            try:
                conn, _ = self._tcp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(TCP_READ_TIMEOUT)
                self._answer_stream(conn)

    def _answer_stream(self, conn: socket.socket) -> None:
        try:
            while True:
                head = _recv_exact(conn, 2)
                if head is None:
                    return
                query = _recv_exact(conn, struct.unpack("!H", head)[0])
                if query is None:
                    return
                reply = build_response(query, self.records, self.ttl)
                if reply is None:
                    return
                if reply[3] & RCODE_MASK in (RCODE_NOERROR, RCODE_NXDOMAIN):
                    name, _ = read_name(query, HEADER.size)
                    with self._cond:
                        self.tcp_counts[name.lower().rstrip(".")] += 1
                        self._cond.notify_all()
                conn.sendall(struct.pack("!H", len(reply)) + reply)
        except OSError:
            return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._tcp_wake_w.send(b"x")
        self._tcp_thread.join(5.0)
        for s in (self._tcp, self._tcp_wake_r, self._tcp_wake_w):
            s.close()
        super().close()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None at EOF."""
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
