"""Cache hits on bytes: a query read and a cached reply answered without dnspython.

Why: a router's DNS load is mostly cache hits, and through dnspython a hit costs
parsing the query, parsing the cached reply and rendering the answer, well over
half of what the service spends on it. A cached reply is honk's own rendering
(``Message.to_wire`` in :mod:`honk.dns.service`), so what the slow path would make
of it is known in advance: the same bytes with the client's id, RD bit and
question (its letter case too: DNS 0x20), every record's TTL set to the time the
entry has left, the OPT record dropped for a client without EDNS, and the records
of each RRset in a fresh random order (dnspython shuffles every RRset it renders,
so a client taking the first address spreads over all of them).

Two halves, both sans-I/O and pure Python over :mod:`struct` (RFC 1035 §4.1,
RFC 6891 §6.1):

* :func:`read_query` accepts only the plain case, a standard query with one
  uncompressed question and at most one OPT record, and returns None for
  anything else (more questions, records in other sections, opcode, QR, TC,
  TSIG, EDNS options dnspython validates, trailing bytes, the root, names
  dnspython would escape in text, malformed bytes). It never raises; None only
  means "take the normal path", which answers or refuses it as before;
* :func:`prepare` walks a reply about to be cached once (names with their
  compression pointers, bounded) and records where its question ends, the
  offset of every TTL field, where its OPT record starts (dnspython renders it
  last), where the rdata of each A/AAAA RRset of several records lie (same-sized
  and name-free, so shuffling them is shuffling the records, with the same
  ``random.shuffle`` calls dnspython makes) and the addresses the service teaches
  :class:`DomainLearning` on a hit; :meth:`FastReply.answer` then builds a
  hit's bytes with ``pack_into``. A reply holding another RRset of several
  records (NS, MX, TXT...: their names may be compressed against each other, so
  their order is not a matter of swapping bytes), or an RRset dnspython would
  join or deduplicate when reading, is not prepared.

An answer larger than a UDP client takes is not answered here: the normal path
truncates it as it always did.
"""

from __future__ import annotations

import ipaddress
import random
import struct
from dataclasses import dataclass

from honk.core.net import IPAddress
from honk.dns.wire import (
    FLAG_QR,
    FLAG_RA,
    FLAG_RD,
    FLAG_TC,
    HEADER,
    OPCODE_MASK,
    UDP_MAX_PAYLOAD,
    UDP_MIN_PAYLOAD,
)

__all__ = [
    "DNSPYTHON_VALIDATED_OPTIONS",
    "FastQuery",
    "FastReply",
    "prepare",
    "read_query",
]

FLAG_AA = 0x0400  # RFC 1035 §4.1.1: authoritative answer
FIXED = struct.Struct("!HHIH")  # RFC 1035 §4.1.3: TYPE, CLASS, TTL, RDLENGTH after the owner name
QUESTION_TAIL = struct.Struct("!HH")  # RFC 1035 §4.1.2: QTYPE, QCLASS after the name
OPTION_HEAD = struct.Struct("!HH")  # RFC 6891 §6.1.2: OPTION-CODE, OPTION-LENGTH
ID_FLAGS = struct.Struct("!HH")
COUNT = struct.Struct("!H")
TTL = struct.Struct("!I")
TTL_OFFSET = 4  # a TTL's place after the owner name: TYPE and CLASS come first
FIXED_SIZE = FIXED.size  # 10
ARCOUNT_OFFSET = 10  # the header's last field
MAX_NAME_WIRE = 255  # RFC 1035 §3.1: a name's octets, length bytes included
MAX_LABEL = 63  # RFC 1035 §2.3.4; 0x40 and 0x80 are other label types, 0xC0 a pointer
POINTER = 0xC0  # RFC 1035 §4.1.4: the two high bits of a compression pointer
POINTER_MASK = 0x3FFF
MAX_POINTERS = 64  # pointers followed for one name: more is a loop
ROOT = 0  # the root label: one zero octet
TYPE_A = 1
TYPE_AAAA = 28
TYPE_OPT = 41  # RFC 6891 §6.1.1
TYPE_TSIG = 250  # RFC 8945: a signed message is never answered from bytes
CLASS_IN = 1
ADDRESS_SIZES = {TYPE_A: 4, TYPE_AAAA: 16}
OPT_FIXED_SIZE = 1 + FIXED_SIZE  # the root owner and the fixed fields
# The largest query read here: a header, a 255-octet name, QTYPE/QCLASS and an OPT record with
# a few options; a longer one takes the normal path.
MAX_FAST_QUERY = 512
# EDNS options whose content dnspython parses and may refuse (FORMERR on the normal path):
# NSID, ECS, COOKIE, EDE, Report-Channel, EDE language, the three filtering options. A query
# carrying one takes the normal path; a test keeps this set a superset of dnspython's registry.
DNSPYTHON_VALIDATED_OPTIONS = frozenset({3, 8, 10, 15, 18, 22, 23, 24, 25})
# Label octets dnspython writes as themselves in a name's text (dns.name._escapeify): printable
# ASCII but space and ``"().;\@$``. A name with any other octet takes the normal path, so the
# text read here is exactly the one the request rules and the cache key get there.
TEXT_AS_IS = bytes(c for c in range(0x21, 0x7F) if c not in b'"().;\\@$')


class FastQuery:
    """A plain standard query as read from its bytes."""

    __slots__ = ("id", "rd", "question", "name", "qname", "qtype", "qclass", "edns", "udp_limit")

    def __init__(
        self,
        qid: int,
        rd: int,
        question: bytes,
        name: bytes,
        qname: str,
        qtype: int,
        qclass: int,
        edns: bool,
        udp_limit: int,
    ) -> None:
        self.id = qid
        self.rd = rd  # the RD bit as it sits in the flags (0 or FLAG_RD)
        self.question = question  # the question section as the client wrote it
        self.name = name  # its name's octets, letter case included
        self.qname = qname  # lower case, no trailing dot: the cache key's name
        self.qtype = qtype
        self.qclass = qclass
        self.edns = edns
        self.udp_limit = udp_limit  # as DnsQuery.udp_limit


def _labels(data: bytes, pos: int, end: int) -> int:
    """Where the uncompressed name at ``pos`` ends (after its root label), or -1: a pointer, another
    label type, a length past ``end`` or beyond :data:`MAX_NAME_WIRE`, or an octet outside
    :data:`TEXT_AS_IS`."""
    start = pos
    while pos < end:
        length = data[pos]
        if length == ROOT:
            pos += 1
            return pos if pos - start <= MAX_NAME_WIRE else -1
        if length > MAX_LABEL:
            return -1
        label_end = pos + 1 + length
        if label_end > end or data[pos + 1 : label_end].translate(None, TEXT_AS_IS):
            return -1
        pos = label_end
    return -1


def _text(name: bytes) -> str:
    """The lower-case text of a name checked by :func:`_labels`, not the root."""
    labels, pos = [], 0
    while length := name[pos]:
        labels.append(name[pos + 1 : pos + 1 + length])
        pos += 1 + length
    return b".".join(labels).decode("ascii").lower()


def read_query(raw: bytes) -> FastQuery | None:
    """The plain query in ``raw``, or None: anything else goes the normal way. Never raises."""
    size = len(raw)
    if size < HEADER.size or size > MAX_FAST_QUERY:
        return None
    qid, flags, qdcount, ancount, nscount, arcount = HEADER.unpack_from(raw)
    if flags & (FLAG_QR | OPCODE_MASK | FLAG_TC) or qdcount != 1 or ancount or nscount or arcount > 1:
        return None
    name_end = _labels(raw, HEADER.size, size)
    question_end = name_end + QUESTION_TAIL.size
    if name_end <= HEADER.size + 1 or question_end > size:  # malformed, or the root (its key name is '.')
        return None
    qtype, qclass = QUESTION_TAIL.unpack_from(raw, name_end)
    edns, limit = False, UDP_MIN_PAYLOAD
    if arcount:
        options = question_end + OPT_FIXED_SIZE
        if options > size or raw[question_end] != ROOT:
            return None
        rtype, payload, _ttl, rdlength = FIXED.unpack_from(raw, question_end + 1)
        if rtype != TYPE_OPT or options + rdlength != size:
            return None
        pos = options
        while pos < size:
            if pos + OPTION_HEAD.size > size:
                return None
            code, length = OPTION_HEAD.unpack_from(raw, pos)
            if code in DNSPYTHON_VALIDATED_OPTIONS:
                return None
            pos += OPTION_HEAD.size + length
        if pos != size:
            return None
        edns, limit = True, max(UDP_MIN_PAYLOAD, min(payload, UDP_MAX_PAYLOAD))
    elif question_end != size:
        return None
    name = raw[HEADER.size : name_end]
    return FastQuery(
        qid, flags & FLAG_RD, raw[HEADER.size : question_end], name, _text(name), qtype, qclass, edns, limit
    )


# --- cached replies ------------------------------------------------------------------------------


def _skip_name(data: bytes, pos: int, end: int) -> int:
    """Where the (possibly compressed) name at ``pos`` ends in place, or -1 when malformed."""
    start = pos
    while pos < end:
        length = data[pos]
        if length == ROOT:
            return pos + 1
        if length & POINTER == POINTER:
            return pos + 2 if pos + 2 <= end else -1
        if length > MAX_LABEL or pos - start + 1 + length > MAX_NAME_WIRE:
            return -1
        pos += 1 + length
    return -1


def _owner_text(data: bytes, pos: int) -> str | None:
    """The lower-case text of the name at ``pos`` ('' for the root), compression pointers followed
    (only backwards, at most :data:`MAX_POINTERS`); None when malformed or when dnspython would
    escape an octet."""
    labels: list[bytes] = []
    hops = octets = 0
    while pos < len(data):
        length = data[pos]
        if length == ROOT:
            return b".".join(labels).decode("ascii").lower()
        if length & POINTER == POINTER:
            if pos + 2 > len(data) or hops >= MAX_POINTERS:
                return None
            target = COUNT.unpack_from(data, pos)[0] & POINTER_MASK
            if target >= pos:
                return None
            pos, hops = target, hops + 1
            continue
        label = data[pos + 1 : pos + 1 + length]
        octets += 1 + length
        if (
            length > MAX_LABEL
            or len(label) != length
            or octets >= MAX_NAME_WIRE
            or label.translate(None, TEXT_AS_IS)
        ):
            return None
        labels.append(label)
        pos += 1 + length
    return None


@dataclass(frozen=True, slots=True)
class FastReply:
    """A cached reply made ready for answers from bytes (see :func:`prepare`)."""

    wire: bytes  # the reply as cached, OPT record (if any) last
    flags: int  # its header flags
    arcount: int
    name: bytes  # its question's name, lower case (a hit's question must be the same name)
    qtype: int
    qclass: int
    question_end: int
    plain_end: int  # where the OPT record starts (len(wire) without one)
    ttls: tuple[int, ...]  # the offset of every record's TTL field, OPT's aside
    shuffled: tuple[
        tuple[tuple[int, ...], int], ...
    ]  # each A/AAAA RRset of 2+ records: (rdata offsets, size)
    learned: tuple[tuple[IPAddress, tuple[str, ...]], ...]  # each A/AAAA answer: (address, names to learn)

    def answer(self, query: FastQuery, ttl: int, tcp: bool) -> bytes | None:
        """This reply for ``query``, every TTL ``ttl``: what :func:`honk.dns.wire.render` makes of it
        — or None when the question differs or the answer does not fit a UDP client (the normal
        path truncates)."""
        if query.name.lower() != self.name or query.qtype != self.qtype or query.qclass != self.qclass:
            return None
        end = len(self.wire) if query.edns else self.plain_end
        if not tcp and end > query.udp_limit:
            return None
        out = bytearray(self.wire[:end])
        out[HEADER.size : self.question_end] = query.question  # same length: the same name, its own case
        ID_FLAGS.pack_into(out, 0, query.id, (self.flags & ~(FLAG_AA | FLAG_RD)) | FLAG_RA | query.rd)
        if end != len(self.wire):
            COUNT.pack_into(out, ARCOUNT_OFFSET, self.arcount - 1)
        pack = TTL.pack_into
        for offset in self.ttls:
            pack(out, offset, ttl)
        for offsets, size in self.shuffled:
            rdatas = [out[offset : offset + size] for offset in offsets]
            random.shuffle(rdatas)
            for offset, rdata in zip(offsets, rdatas, strict=True):
                out[offset : offset + size] = rdata
        return bytes(out)


def prepare(wire: bytes, qname: str) -> FastReply | None:
    """``wire`` (a reply honk rendered, about to be cached for the name ``qname``) ready for
    :meth:`FastReply.answer`, or None when anything in it is not the plain case (more than one
    question, a compressed question, a TSIG, an OPT record that is not the last, a malformed
    record, an owner dnspython would write with escapes, an RRset of several records that are not
    addresses): its hits go the normal way."""
    size = len(wire)
    if size < HEADER.size:
        return None
    _qid, flags, qdcount, ancount, nscount, arcount = HEADER.unpack_from(wire)
    if not flags & FLAG_QR or qdcount != 1:
        return None
    name_end = _labels(wire, HEADER.size, size)
    question_end = name_end + QUESTION_TAIL.size
    if name_end < 0 or question_end > size:
        return None
    qtype, qclass = QUESTION_TAIL.unpack_from(wire, name_end)
    ttls: list[int] = []
    learned: list[tuple[IPAddress, tuple[str, ...]]] = []
    shuffled: list[tuple[tuple[int, ...], int]] = []
    rrset: tuple[object, ...] | None = None  # (section, owner, type, class) of the records in ``rdatas``
    rdatas: list[int] = []
    closed: set[tuple[object, ...] | None] = set()
    plain_end = size
    pos = question_end
    for index in range(ancount + nscount + arcount):
        owner = pos
        pos = _skip_name(wire, pos, size)
        if pos < 0 or pos + FIXED_SIZE > size:
            return None
        rtype, rclass, _ttl, rdlength = FIXED.unpack_from(wire, pos)
        rdata = pos + FIXED_SIZE
        if rdata + rdlength > size or rtype == TYPE_TSIG:
            return None
        if rtype == TYPE_OPT:
            if index < ancount + nscount or wire[owner] != ROOT or rdata + rdlength != size:
                return None
            plain_end = owner
            pos = rdata + rdlength
            continue
        text = _owner_text(wire, owner)
        if text is None:
            return None
        ttls.append(pos + TTL_OFFSET)
        address_size = ADDRESS_SIZES.get(rtype) if rclass == CLASS_IN else None
        if address_size is not None and address_size != rdlength:
            return None  # dnspython refuses it: the normal path answers SERVFAIL
        section = 0 if index < ancount else 1 if index < ancount + nscount else 2
        key = (section, text, rtype, rclass)
        if key != rrset:
            if key in closed or not _close(wire, rrset, rdatas, shuffled):
                return None  # an RRset in two pieces: dnspython would join them
            closed.add(rrset)
            rrset, rdatas = key, []
        rdatas.append(rdata)
        if section == 0 and address_size is not None:
            if not text:
                return None  # an address of the root: not worth dnspython's text for it
            address = ipaddress.ip_address(wire[rdata : rdata + rdlength])
            learned.append((address, (qname, text) if text != qname else (qname,)))
        pos = rdata + rdlength
    if pos != size or not _close(wire, rrset, rdatas, shuffled):
        return None
    return FastReply(
        wire,
        flags,
        arcount,
        wire[HEADER.size : name_end].lower(),
        qtype,
        qclass,
        question_end,
        plain_end,
        tuple(ttls),
        tuple(shuffled),
        tuple(learned),
    )


def _close(
    wire: bytes,
    rrset: tuple[object, ...] | None,
    rdatas: list[int],
    shuffled: list[tuple[tuple[int, ...], int]],
) -> bool:
    """Close an RRset of ``prepare``: one of several addresses joins ``shuffled``; False for one of
    several records of another type, or with a record twice (dnspython would keep one): not prepared."""
    if rrset is None or len(rdatas) < 2:
        return True
    _section, _owner, rtype, rclass = rrset
    if rclass != CLASS_IN or rtype not in ADDRESS_SIZES:
        return False
    size = ADDRESS_SIZES[rtype]  # type: ignore[index]
    if len({wire[offset : offset + size] for offset in rdatas}) != len(rdatas):
        return False
    shuffled.append((tuple(rdatas), size))
    return True
