"""The DNS wire format around dnspython: reading queries defensively, shaping replies.

Everything here is sans-I/O. A query that does not parse never raises out of
:func:`parse_query`: it becomes an error reply built from its raw header
(FORMERR, NOTIMP) or ``None`` (drop) when not even that can be answered.
"""

from __future__ import annotations

import ipaddress
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

__all__ = [
    "DnsQuery",
    "Verdict",
    "address_records",
    "classify",
    "header_reply",
    "min_answer_ttl",
    "negative_ttl",
    "parse_query",
    "render",
    "reply_to",
    "set_ttls",
]

HEADER = struct.Struct("!HHHHHH")  # RFC 1035 §4.1.1: id, flags, qdcount, ancount, nscount, arcount
FLAG_QR = 0x8000
FLAG_TC = 0x0200
FLAG_RD = 0x0100
FLAG_RA = 0x0080
OPCODE_MASK = 0x7800
TCP_MAX_MESSAGE = 65535  # RFC 1035 §4.2.2: the two-octet length prefix
TCP_LENGTH = struct.Struct("!H")  # RFC 1035 §4.2.2: TCP messages are prefixed by their length
QUERY_ID = struct.Struct("!H")  # the header's first field, the ID a reply must echo
UDP_MIN_PAYLOAD = 512  # RFC 1035 §4.2.1: what a client without EDNS accepts
# The UDP reply ceiling, whatever a client advertises: DNS flag day 2020's 1232 bytes keeps
# replies inside one unfragmented IPv6 packet (upstream honk clamps to 512..1232 as well).
UDP_MAX_PAYLOAD = 1232
# RFC 2308 §5: a negative answer lives as long as its SOA says; without one, this long.
NEGATIVE_DEFAULT_TTL = 60
NEGATIVE_MIN_TTL = 1  # seconds: upstream honk clamps negative lifetimes to 1..300
NEGATIVE_MAX_TTL = 300


@dataclass(frozen=True, slots=True)
class DnsQuery:
    """A well-formed standard query with one question."""

    message: dns.message.Message
    qname: str  # lower case, no trailing dot ('' for the root)
    qtype: int
    qclass: int

    @property
    def id(self) -> int:
        return self.message.id

    @property
    def udp_limit(self) -> int:
        """The largest UDP reply this client takes (its EDNS payload, clamped)."""
        if self.message.edns < 0:
            return UDP_MIN_PAYLOAD
        return max(UDP_MIN_PAYLOAD, min(self.message.payload, UDP_MAX_PAYLOAD))


def header_reply(wire: bytes, rcode: int) -> bytes | None:
    """A question-less reply carrying ``rcode`` built from ``wire``'s raw header, or None
    when the bytes hold no header or are themselves a response (never answer those)."""
    if len(wire) < HEADER.size:
        return None
    qid, flags = struct.unpack_from("!HH", wire)
    if flags & FLAG_QR:
        return None
    return HEADER.pack(qid, FLAG_QR | FLAG_RA | (flags & (OPCODE_MASK | FLAG_RD)) | (rcode & 0xF), 0, 0, 0, 0)


def parse_query(wire: bytes) -> DnsQuery | bytes | None:
    """The query in ``wire``; else the reply to send (FORMERR, NOTIMP), or None to drop it."""
    if len(wire) < HEADER.size or len(wire) > TCP_MAX_MESSAGE:
        return None
    flags = struct.unpack_from("!H", wire, 2)[0]
    if flags & FLAG_QR:
        return None
    if flags & OPCODE_MASK:
        return header_reply(wire, dns.rcode.NOTIMP)
    try:
        message = dns.message.from_wire(wire)
    except Exception:  # noqa: BLE001 - dnspython raises many types on hostile input; all mean FORMERR
        return header_reply(wire, dns.rcode.FORMERR)
    if len(message.question) != 1:
        return header_reply(wire, dns.rcode.FORMERR)
    question = message.question[0]
    qname = question.name.to_text(omit_final_dot=True).lower()
    return DnsQuery(message, "" if qname == "@" else qname, int(question.rdtype), int(question.rdclass))


def reply_to(query: DnsQuery, rcode: int = dns.rcode.NOERROR) -> bytes:
    """An answerless reply to ``query``: NOERROR is ``reject``'s empty answer, SERVFAIL a failure."""
    response = dns.message.make_response(query.message, recursion_available=True)
    response.set_rcode(rcode)
    return render(response, query, tcp=False)


def render(response: dns.message.Message, query: DnsQuery, *, tcp: bool) -> bytes:
    """``response`` as sent to the client of ``query``: its id and its question as asked (case
    included), recursive and not authoritative, EDNS only if the client used it, and cut down with TC for a
    UDP client's limit."""
    response.id = query.id
    response.question = list(query.message.question)
    response.flags &= ~dns.flags.AA  # honk forwards and caches: it is nobody's authority
    response.flags |= dns.flags.RA  # but it does recurse for its clients
    if query.message.flags & dns.flags.RD:
        response.flags |= dns.flags.RD
    else:
        response.flags &= ~dns.flags.RD
    if query.message.edns < 0 and response.edns >= 0:
        response.use_edns(False)
    limit = TCP_MAX_MESSAGE if tcp else query.udp_limit
    return response.to_wire(max_size=limit, prefer_truncation=True)


# --- reading answers ---------------------------------------------------------------------------


class Verdict:
    POSITIVE = "positive"  # NOERROR with answer records
    NEGATIVE = "negative"  # NXDOMAIN, or NOERROR without answers (NODATA)
    OTHER = "other"  # SERVFAIL, REFUSED, ...: never cached


def classify(response: dns.message.Message) -> str:
    rcode = response.rcode()
    if rcode == dns.rcode.NOERROR:
        return Verdict.POSITIVE if response.answer else Verdict.NEGATIVE
    if rcode == dns.rcode.NXDOMAIN:
        return Verdict.NEGATIVE
    return Verdict.OTHER


def _rrsets(response: dns.message.Message) -> Iterator[dns.rrset.RRset]:
    yield from response.answer
    yield from response.authority
    yield from response.additional


def min_answer_ttl(response: dns.message.Message) -> int:
    return min((rrset.ttl for rrset in response.answer), default=0)


def negative_ttl(response: dns.message.Message) -> int:
    """RFC 2308 §5: min(SOA TTL, SOA MINIMUM) of the authority's SOA, clamped."""
    for rrset in response.authority:
        if rrset.rdtype == dns.rdatatype.SOA and len(rrset):
            ttl = min(rrset.ttl, rrset[0].minimum)
            break
    else:
        ttl = NEGATIVE_DEFAULT_TTL
    return max(NEGATIVE_MIN_TTL, min(ttl, NEGATIVE_MAX_TTL))


def set_ttls(response: dns.message.Message, ttl: int) -> None:
    """Every record's TTL (the OPT pseudo-record is not among them) becomes ``ttl``."""
    for rrset in _rrsets(response):
        rrset.ttl = ttl


def address_records(
    response: dns.message.Message,
) -> Iterator[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str, int]]:
    """Each A/AAAA answer as (address, owner name lower-cased without the dot, TTL)."""
    for rrset in response.answer:
        if rrset.rdclass != dns.rdataclass.IN or rrset.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
            continue
        owner = rrset.name.to_text(omit_final_dot=True).lower()
        for rdata in rrset:
            yield ipaddress.ip_address(rdata.address), owner, rrset.ttl


def remaining_seconds(expires: float, now: float) -> int:
    """The whole seconds a record has left: rounded up, so an entry still alive never says 0."""
    return max(0, math.ceil(expires - now))


def response_header(wire: bytes) -> tuple[int, int] | None:
    """(id, flags) of a reply's raw header, or None when too short."""
    if len(wire) < HEADER.size:
        return None
    return struct.unpack_from("!HH", wire)


def parse_response(wire: bytes) -> dns.message.Message | None:
    try:
        return dns.message.from_wire(wire)
    except Exception:  # noqa: BLE001 - dnspython raises many types on hostile input; all mean "unusable"
        return None
