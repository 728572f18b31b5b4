"""Cache hits answered from bytes (honk/dns/fastwire.py) answer exactly as the dnspython path does.

The main property is differential: two services over identical fake clocks and upstreams, one
with the bytes path switched off, are asked the same generated queries (names in mixed case,
A/AAAA/CNAME, EDNS or not, any id and RD bit, UDP or TCP) after caching the same generated
replies (several answers, CNAME chains, compressed names, NXDOMAIN/NODATA with an SOA,
additional records, an upstream OPT), at several elapsed times. Their answers must be the same
bytes, and their counters, cache order and learned names the same. The query reader is fuzzed:
whatever it accepts dnspython reads the same way, and nothing makes it raise.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from honk.config.spec import DnsCondition, DnsRequestRule, DnsSpec, DnsUpstreamSpec, MatchArg
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.dns import fastwire, wire
from honk.dns.service import MAX_QUERIES_IN_FLIGHT, DnsService
from honk.dns.upstream import Destination

CLIENT = Address("192.168.1.10", 5353)
INTERCEPTED = Address("192.168.1.1", 53)
UPSTREAMS = (DnsUpstreamSpec("default", "udp", "192.0.2.53"), DnsUpstreamSpec("other", "udp", "192.0.2.54"))
# AAAA questions go to "other", names under blocked.test are rejected: the rules decide first.
RULES = (
    DnsRequestRule((DnsCondition("qname", names=(MatchArg("suffix", "blocked.test"),)),), "reject"),
    DnsRequestRule((DnsCondition("qtype", qtypes=(28,)),), "other"),
)
SHUFFLE_SEED = 35
EQUIVALENCE_EXAMPLES = 250  # generated hits compared with the dnspython path (each suite run; the seeds vary)
PRIVATE_OPTION = 65001  # RFC 6891 §9: the local/experimental option code range


class Upstream:
    """Answers every query with ``build(query)``: a fresh message, as from the network."""

    timeout = 5.0

    def __init__(self, build: Callable[[dns.message.Message], dns.message.Message]) -> None:
        self.build = build
        self.calls = 0

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        data: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        self.calls += 1
        reply = dns.message.from_wire(self.build(query).to_wire(max_size=wire.TCP_MAX_MESSAGE))
        reply.id = query.id
        return reply


def services(
    dns_spec: DnsSpec, build: Callable[[dns.message.Message], dns.message.Message]
) -> tuple[DnsService, DnsService, FakeClock, FakeClock]:
    """(with the bytes path, without it, their clocks)."""
    fast_clock, slow_clock = FakeClock(), FakeClock()
    fast = DnsService(dns_spec, None, fast_clock, exchanger=Upstream(build))  # type: ignore[arg-type]
    slow = DnsService(dns_spec, None, slow_clock, exchanger=Upstream(build))  # type: ignore[arg-type]
    slow._fast_hit = lambda *_args: None  # type: ignore[method-assign]
    return fast, slow, fast_clock, slow_clock


def same_state(fast: DnsService, slow: DnsService) -> None:
    assert fast.stats.queries == slow.stats.queries
    assert (fast.cache.hits, fast.cache.misses, fast.cache.expirations) == (
        slow.cache.hits,
        slow.cache.misses,
        slow.cache.expirations,
    )
    assert list(fast.cache._entries) == list(slow.cache._entries)  # the same LRU order
    assert fast.learning._table == slow.learning._table  # OrderedDicts: order and expiries


async def alike(
    fast: DnsService,
    slow: DnsService,
    raw: bytes,
    original: Address | None = None,
    tcp: bool = False,
    *,
    from_bytes: bool = True,
) -> bytes | None:
    """Both services' answer to ``raw`` (``from_bytes``: the first one's must come from bytes), which
    must be the same bytes; dnspython shuffles RRsets, so both shuffle from the same seed."""
    state = random.getstate()
    try:
        random.seed(SHUFFLE_SEED)
        first = (
            fast._fast_hit(raw, CLIENT, original, tcp)
            if from_bytes
            else await fast.handle(raw, CLIENT, original, tcp=tcp)
        )
        assert first is not None
        random.seed(SHUFFLE_SEED)
        assert first == await slow.handle(raw, CLIENT, original, tcp=tcp)
    finally:
        random.setstate(state)
    return first


def make_query(
    name: str,
    qtype: int,
    qid: int,
    *,
    rd: bool = True,
    edns: bool = False,
    payload: int = 1232,
    options: tuple[dns.edns.Option, ...] = (),
    flags: int = 0,
) -> bytes:
    q = dns.message.make_query(
        name, qtype, use_edns=0 if edns else False, payload=payload, options=list(options)
    )
    q.id = qid
    q.flags |= flags
    if not rd:
        q.flags &= ~dns.flags.RD
    return q.to_wire()


# --- generated names, queries and replies ----------------------------------------------------

LABEL = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


@st.composite
def cased(draw: st.DrawFn, name: str) -> str:
    """``name`` with each letter's case drawn."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))


@st.composite
def replies(draw: st.DrawFn) -> Callable[[dns.message.Message], dns.message.Message]:
    """An upstream: positive (a CNAME chain, then addresses of the asked type), NXDOMAIN or NODATA
    with an SOA, with authority and additional records, maybe an OPT option, in any case."""
    kind = draw(st.sampled_from(["positive", "positive", "nxdomain", "nodata"]))
    chain = draw(st.lists(st.tuples(LABEL, st.sampled_from(["cdn.test", "edge.example.net"])), max_size=3))
    # up to 45 addresses: past 512 bytes, and 1232
    count = draw(st.one_of(st.integers(min_value=1, max_value=4), st.integers(min_value=5, max_value=45)))
    ttl = draw(st.integers(min_value=0, max_value=86_400))
    soa = (draw(st.integers(min_value=0, max_value=7200)), draw(st.integers(min_value=0, max_value=7200)))
    nameservers = draw(st.sampled_from([(), ("ns1.cdn.test.",), ("ns1.cdn.test.", "ns2.cdn.test.")]))
    option = draw(st.booleans())
    owner_case = draw(st.booleans())
    flags = draw(st.sampled_from([0, dns.flags.AA, dns.flags.AD, dns.flags.AA | dns.flags.AD]))

    def build(query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        reply.flags |= flags  # AA: honk clears it; AD: passed on
        if option and reply.edns >= 0:
            reply.use_edns(0, 0, 1232, options=[dns.edns.GenericOption(PRIVATE_OPTION, b"honk")])
        question = query.question[0]
        owner = dns.name.from_text(question.name.to_text().upper() if owner_case else question.name.to_text())
        if kind != "positive":
            if kind == "nxdomain":
                reply.set_rcode(dns.rcode.NXDOMAIN)
            reply.authority.append(
                dns.rrset.from_text(
                    "test.", soa[0], "IN", "SOA", f"ns.test. admin.test. 1 3600 600 86400 {soa[1]}"
                )
            )
            return reply
        for label, zone in chain:
            target = dns.name.from_text(f"{label}.{zone}")
            reply.answer.append(dns.rrset.from_text(owner, ttl, "IN", "CNAME", target.to_text()))
            owner = target
        if question.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            kind_text = dns.rdatatype.to_text(question.rdtype)
            ips = [
                f"10.{i // 250}.{i % 250}.1" if kind_text == "A" else f"2001:db8::{i + 1:x}"
                for i in range(count)
            ]
            reply.answer.append(dns.rrset.from_text(owner, ttl, "IN", kind_text, *ips))
        elif not chain:
            reply.answer.append(dns.rrset.from_text(owner, ttl, "IN", "CNAME", "alias.cdn.test."))
        if nameservers:  # two NS records: not prepared (their order is not a matter of swapping bytes)
            reply.authority.append(dns.rrset.from_text("cdn.test.", ttl, "IN", "NS", *nameservers))
            reply.additional.append(dns.rrset.from_text("ns1.cdn.test.", ttl, "IN", "A", "192.0.2.1"))
        return reply

    return build


@st.composite
def asked(draw: st.DrawFn, name: str) -> dict[str, object]:
    return {
        "name": draw(cased(name)),
        "qid": draw(st.integers(min_value=0, max_value=0xFFFF)),
        "rd": draw(st.booleans()),
        "edns": draw(st.booleans()),
        "payload": draw(st.sampled_from([0, 512, 600, 1232, 4096])),
        "tcp": draw(st.booleans()),
        "options": draw(
            st.sampled_from(
                [
                    (),
                    (dns.edns.GenericOption(PRIVATE_OPTION, b"client"),),
                    (dns.edns.GenericOption(dns.edns.OptionType.PADDING, bytes(8)),),
                ]
            )
        ),
        "flags": draw(st.sampled_from([0, dns.flags.AD, dns.flags.CD])),
    }


@settings(
    max_examples=EQUIVALENCE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
)
@given(
    data=st.data(),
    build=replies(),
    labels=st.lists(LABEL, min_size=1, max_size=4),
    zone=st.sampled_from(["example.com", "shop.test", "example.com", "blocked.test"]),
    qtype=st.sampled_from([dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.CNAME]),
    cache_ttl=st.sampled_from([0, 600]),
    fixed=st.sampled_from([None, None, 30, 0]),
    asis=st.booleans(),
    prefer=st.sampled_from([None, 4]),
    steps=st.lists(
        st.one_of(st.floats(min_value=0, max_value=20), st.floats(min_value=0, max_value=400)),
        min_size=1,
        max_size=4,
    ),
)
def test_a_hit_from_bytes_is_the_same_answer_and_the_same_bookkeeping_as_through_dnspython(
    data, build, labels, zone, qtype, cache_ttl, fixed, asis, prefer, steps
):
    name = ".".join([*labels, zone])
    dns_spec = DnsSpec(
        upstreams=UPSTREAMS,
        request_rules=RULES,
        request_fallback="asis" if asis else "default",
        optimistic_cache_ttl=cache_ttl,
        ipversion_prefer=prefer,
        fixed_domain_ttl=() if fixed is None else ((name, fixed),),
    )
    fast, slow, fast_clock, slow_clock = services(dns_spec, build)
    original = INTERCEPTED if asis else None
    taken = 0

    async def both(query: dict[str, object]) -> None:
        nonlocal taken
        raw = make_query(
            query["name"],
            qtype,
            query["qid"],
            rd=query["rd"],
            edns=query["edns"],
            payload=query["payload"],
            options=query["options"] if query["edns"] else (),
            flags=query["flags"],
        )
        hits = fast.stats.queries.total()
        seed = data.draw(
            st.integers(min_value=0, max_value=2**32)
        )  # dnspython shuffles RRsets: both the same way
        random.seed(seed)
        from_bytes = (
            fast._fast_hit(raw, CLIENT, original, query["tcp"]) if fast.spec.optimistic_cache else None
        )
        if from_bytes is None:
            from_bytes = await fast.handle(raw, CLIENT, original, tcp=query["tcp"])
        else:
            taken += 1
            assert fast.stats.queries.total() == hits + 1
        random.seed(seed)
        through_dnspython = await slow.handle(raw, CLIENT, original, tcp=query["tcp"])
        assert from_bytes == through_dnspython
        same_state(fast, slow)

    async def run() -> None:
        await both(data.draw(asked(name)))  # the miss that caches the reply
        for step in steps:
            fast_clock.advance(step)
            slow_clock.advance(step)
            await both(data.draw(asked(name)))

    asyncio.run(run())
    event(f"answered from bytes: {'yes' if taken else 'no'}")


async def test_a_hit_never_parses_nor_renders_a_message_with_dnspython(monkeypatch):
    fast, _, clock, _ = services(DnsSpec(upstreams=UPSTREAMS), lambda q: address_reply(q, "10.0.0.7"))
    await fast.handle(make_query("www.example.com", dns.rdatatype.A, 1), CLIENT, None)
    clock.advance(100)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("dnspython parsed or rendered a message on a hit")

    raw = make_query("WWW.example.COM", dns.rdatatype.A, 77, edns=True)
    monkeypatch.setattr(dns.message, "from_wire", refuse)
    monkeypatch.setattr(dns.message.Message, "to_wire", refuse)
    data = await fast.handle(raw, CLIENT, None)
    monkeypatch.undo()
    reply = dns.message.from_wire(data)
    assert reply.id == 77 and reply.question[0].name.to_text() == "WWW.example.COM."
    assert [rrset.ttl for rrset in reply.answer] == [500] and reply.edns == -1  # the upstream sent no OPT
    assert fast.stats.queries[("default", "cached")] == 1 and fast.cache.hits == 1
    assert fast.learned_names("10.0.0.7") == ("www.example.com",)


def address_reply(query: dns.message.Message, *ips: str) -> dns.message.Message:
    reply = dns.message.make_response(query)
    reply.answer.append(dns.rrset.from_text(query.question[0].name, 60, "IN", "A", *ips))
    return reply


async def test_an_answer_too_big_for_a_udp_client_takes_the_normal_path_and_is_truncated():
    many = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(60)]
    fast, slow, _, _ = services(DnsSpec(upstreams=UPSTREAMS), lambda q: address_reply(q, *many))
    raw = make_query("big.test", dns.rdatatype.A, 5)
    await alike(fast, slow, raw, tcp=True, from_bytes=False)
    assert fast._fast_hit(raw, CLIENT, None, False) is None
    assert fast.stats.queries[("default", "cached")] == 0 and fast.cache.hits == 0  # nothing counted
    udp = await alike(fast, slow, raw, from_bytes=False)
    assert dns.message.from_wire(udp).flags & dns.flags.TC
    await alike(fast, slow, raw, tcp=True)
    same_state(fast, slow)


async def test_the_opt_record_follows_the_client_not_the_first_asker():
    def with_option(query: dns.message.Message) -> dns.message.Message:
        reply = address_reply(query, "10.0.0.8")
        if reply.edns >= 0:
            reply.use_edns(0, 0, 1232, options=[dns.edns.GenericOption(PRIVATE_OPTION, b"x")])
        return reply

    fast, slow, _, _ = services(DnsSpec(upstreams=UPSTREAMS), with_option)
    await alike(fast, slow, make_query("opt.test", dns.rdatatype.A, 1, edns=True), from_bytes=False)
    for edns in (False, True):
        from_bytes = await alike(fast, slow, make_query("OPT.test", dns.rdatatype.A, 2, edns=edns))
        assert (dns.message.from_wire(from_bytes).edns >= 0) == edns
    same_state(fast, slow)


async def test_the_family_ipversion_prefer_may_empty_takes_the_normal_path():
    def dual(query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        q = query.question[0]
        text = "192.0.2.10" if q.rdtype == dns.rdatatype.A else "2001:db8::10"
        reply.answer.append(dns.rrset.from_text(q.name, 60, "IN", dns.rdatatype.to_text(q.rdtype), text))
        return reply

    fast, slow, _, _ = services(DnsSpec(upstreams=UPSTREAMS, ipversion_prefer=4), dual)
    aaaa, a = make_query("dual.test", dns.rdatatype.AAAA, 3), make_query("dual.test", dns.rdatatype.A, 4)
    for raw in (aaaa, a, aaaa, a):
        for service in (fast, slow):
            await service.handle(raw, CLIENT, None)
    assert fast._fast_hit(aaaa, CLIENT, None, False) is None
    assert fast._fast_hit(a, CLIENT, None, False) is not None
    assert dns.message.from_wire(await fast.handle(aaaa, CLIENT, None)).answer == []  # emptied, as before
    await slow.handle(a, CLIENT, None)
    await slow.handle(aaaa, CLIENT, None)
    same_state(fast, slow)


async def test_rejected_and_destinationless_queries_are_left_to_the_normal_path():
    rules = (DnsRequestRule((DnsCondition("qname", names=(MatchArg("suffix", "ads.test"),)),), "reject"),)
    fast, _, _, _ = services(
        DnsSpec(upstreams=UPSTREAMS, request_rules=rules, request_fallback="asis"),
        lambda q: address_reply(q, "10.0.0.9"),
    )
    await fast.handle(make_query("x.test", dns.rdatatype.A, 1), CLIENT, INTERCEPTED)
    assert fast._fast_hit(make_query("x.test", dns.rdatatype.A, 2), CLIENT, INTERCEPTED, False) is not None
    assert (
        fast._fast_hit(make_query("x.test", dns.rdatatype.A, 2), CLIENT, None, False) is None
    )  # asis, no destination
    assert fast._fast_hit(make_query("x.ads.test", dns.rdatatype.A, 2), CLIENT, INTERCEPTED, False) is None


async def test_an_expired_entry_is_left_to_the_normal_path_and_counted_once():
    fast, slow, fast_clock, slow_clock = services(
        DnsSpec(upstreams=UPSTREAMS), lambda q: address_reply(q, "10.0.0.1")
    )
    raw = make_query("expire.test", dns.rdatatype.A, 1)
    await alike(fast, slow, raw, from_bytes=False)
    fast_clock.advance(600)
    slow_clock.advance(600)
    assert fast._fast_hit(raw, CLIENT, None, False) is None
    await alike(fast, slow, raw, from_bytes=False)
    assert fast.cache.expirations == 1 and fast.cache.misses == 2  # the first ask, then the expired one
    same_state(fast, slow)


# --- the query reader --------------------------------------------------------------------------


def header(qid: int = 1, flags: int = 0x0100, qd: int = 1, an: int = 0, ns: int = 0, ar: int = 0) -> bytes:
    return struct.pack("!HHHHHH", qid, flags, qd, an, ns, ar)


QUESTION = b"\x03www\x07example\x03com\x00\x00\x01\x00\x01"
OPT = b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00"  # root, OPT, payload 1232, no options


def test_a_plain_query_is_read_with_its_case_edns_and_limit():
    q = fastwire.read_query(header(qid=9, ar=1) + b"\x03WwW\x07example\x03COM\x00\x00\x1c\x00\x01" + OPT)
    assert q is not None
    assert (q.id, q.rd, q.qname, q.qtype, q.qclass, q.edns, q.udp_limit) == (
        9,
        0x0100,
        "www.example.com",
        28,
        1,
        True,
        1232,
    )
    assert q.name == b"\x03WwW\x07example\x03COM\x00"
    plain = fastwire.read_query(header(flags=0) + QUESTION)
    assert plain is not None and (plain.rd, plain.edns, plain.udp_limit) == (0, False, 512)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(header(qd=2) + QUESTION + QUESTION, id="two-questions"),
        pytest.param(header(qd=0), id="no-question"),
        pytest.param(header() + b"\xc0\x0c\x00\x01\x00\x01", id="compressed-question"),
        pytest.param(header(flags=0x1100) + QUESTION, id="opcode-status"),
        pytest.param(header(flags=0x8100) + QUESTION, id="a-response"),
        pytest.param(header(flags=0x0300) + QUESTION, id="truncated"),
        pytest.param(
            header(an=1) + QUESTION + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\x0a\x00\x00\x01",
            id="an-answer",
        ),
        pytest.param(header(ar=2) + QUESTION + OPT + OPT, id="two-additional"),
        pytest.param(
            header(ar=1) + QUESTION + b"\x00\x00\x01\x00\x01\x00\x00\x00\x00\x00\x04\x0a\x00\x00\x01",
            id="additional-not-opt",
        ),
        pytest.param(
            header(ar=1) + QUESTION + b"\x03key\x00\x00\xfa\x00\xff\x00\x00\x00\x00\x00\x00", id="tsig"
        ),
        pytest.param(
            header(ar=1)
            + QUESTION
            + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x0c\x00\x0a\x00\x08"
            + b"\x01" * 8,
            id="cookie-option",
        ),
        pytest.param(
            header(ar=1) + QUESTION + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x05\xfd\xe9\x00\x09\x00",
            id="option-overruns",
        ),
        pytest.param(header() + QUESTION + b"\x00", id="trailing-byte"),
        pytest.param(header() + QUESTION[:-1], id="short-question"),
        pytest.param(header() + b"\x03w w\x07example\x03com\x00\x00\x01\x00\x01", id="escaped-octet"),
        pytest.param(header() + b"\x40" + b"a" * 64 + b"\x00\x00\x01\x00\x01", id="extended-label"),
        pytest.param(
            header()
            + b"\x3f"
            + b"a" * 63
            + b"\x3f"
            + b"b" * 63
            + b"\x3f"
            + b"c" * 63
            + b"\x3f"
            + b"d" * 63
            + b"\x00\x00\x01\x00\x01",
            id="name-over-255",
        ),
        pytest.param(b"\x00\x01\x01", id="no-header"),
        pytest.param(header() + b"\x00\x00\x02\x00\x01", id="the-root"),
    ],
)
def test_unusual_queries_are_not_read_and_go_the_normal_way(raw):
    assert fastwire.read_query(raw) is None


def test_every_option_dnspython_validates_sends_the_query_the_normal_way():
    assert {int(code) for code in dns.edns._type_to_class} <= fastwire.DNSPYTHON_VALIDATED_OPTIONS


def agrees_with_dnspython(raw: bytes) -> None:
    q = fastwire.read_query(raw)
    if q is None:
        return
    parsed = wire.parse_query(raw)
    assert isinstance(parsed, wire.DnsQuery), "dnspython refuses a query read from bytes"
    assert (q.id, q.qname, q.qtype, q.qclass) == (parsed.id, parsed.qname, parsed.qtype, parsed.qclass)
    assert (q.edns, q.udp_limit, q.rd) == (
        parsed.message.edns >= 0,
        parsed.udp_limit,
        parsed.message.flags & dns.flags.RD,
    )
    assert dns.message.from_wire(raw).question[0].name.to_wire() == q.name  # the case as written


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise_out_of_the_query_reader(data):
    agrees_with_dnspython(data)
    agrees_with_dnspython(header() + data)
    agrees_with_dnspython(header(ar=1) + QUESTION + data)


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=80), st.integers(min_value=0, max_value=255)), max_size=4
    ),
    st.booleans(),
)
def test_mutated_queries_are_read_as_dnspython_reads_them_or_not_at_all(changes, edns):
    data = bytearray(
        make_query(
            "Fuzz.Example",
            dns.rdatatype.A,
            4242,
            edns=edns,
            options=(dns.edns.GenericOption(PRIVATE_OPTION, b"ab"),) if edns else (),
        )
    )
    for at, value in changes:
        data[at % len(data)] = value
    agrees_with_dnspython(bytes(data))


# --- the cached reply's form -------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=200))
def test_malformed_replies_are_never_prepared_nor_raise(noise, at):
    reply = address_reply(dns.message.make_query("www.example.com", "A"), "10.0.0.1", "10.0.0.2")
    reply.authority.append(dns.rrset.from_text("example.com.", 60, "IN", "NS", "ns.example.com."))
    data = bytearray(reply.to_wire())
    data[at % len(data) : at % len(data) + len(noise)] = noise
    fastwire.prepare(bytes(data), "www.example.com")
    fastwire.prepare(noise, "www.example.com")


def test_a_pointer_loop_or_forward_pointer_in_an_owner_is_refused():
    reply = address_reply(dns.message.make_query("a.test", "A"), "10.0.0.1")
    data = bytearray(reply.to_wire())
    answer_owner = data.index(b"\xc0\x0c")
    data[answer_owner : answer_owner + 2] = struct.pack("!H", 0xC000 | answer_owner)  # points at itself
    assert fastwire.prepare(bytes(data), "a.test") is None
    assert fastwire.prepare(reply.to_wire(), "a.test") is not None


def test_prepare_finds_every_ttl_but_the_opts_and_the_addresses_to_learn():
    query = dns.message.make_query("www.shop.test", "A", use_edns=0)
    reply = dns.message.make_response(query)
    reply.answer.append(dns.rrset.from_text("www.shop.test.", 60, "IN", "CNAME", "Edge.CDN.test."))
    reply.answer.append(dns.rrset.from_text("Edge.CDN.test.", 60, "IN", "A", "10.0.0.1", "10.0.0.2"))
    reply.additional.append(dns.rrset.from_text("ns.cdn.test.", 60, "IN", "AAAA", "2001:db8::1"))
    form = fastwire.prepare(reply.to_wire(), "www.shop.test")
    assert form is not None and len(form.ttls) == 4 and form.plain_end < len(form.wire)
    assert sorted((str(ip), names) for ip, names in form.learned) == [  # in the order dnspython shuffled them
        ("10.0.0.1", ("www.shop.test", "edge.cdn.test")),
        ("10.0.0.2", ("www.shop.test", "edge.cdn.test")),
    ]
    assert len(form.shuffled) == 1 and len(form.shuffled[0][0]) == 2  # the two A records, not the lone AAAA


def test_an_rrset_in_two_pieces_or_with_a_record_twice_is_not_prepared():
    query = dns.message.make_query("split.test", "A")
    pieces = dns.message.make_response(query)  # built by hand: dnspython would join them when reading
    pieces.answer.append(dns.rrset.from_text("split.test.", 60, "IN", "A", "10.0.0.1"))
    pieces.answer.append(dns.rrset.from_text("split.test.", 60, "IN", "TXT", "between"))
    pieces.answer.append(dns.rrset.from_text("split.test.", 60, "IN", "A", "10.0.0.2"))
    assert fastwire.prepare(pieces.to_wire(), "split.test") is None
    twice = dns.message.make_response(query)
    twice.answer.append(dns.rrset.from_text("split.test.", 60, "IN", "A", "10.0.0.1"))
    twice.answer.append(dns.rrset.from_text("split.test.", 60, "IN", "A", "10.0.0.1"))
    assert fastwire.prepare(twice.to_wire(), "split.test") is None
    joined = dns.message.from_wire(pieces.to_wire())
    assert fastwire.prepare(joined.to_wire(), "split.test") is not None


async def test_answer_now_serves_a_hit_without_a_task_and_leaves_a_miss_to_handle():
    fast, _slow, _, _ = services(DnsSpec(upstreams=UPSTREAMS), lambda q: address_reply(q, "10.0.0.9"))
    raw = make_query("now.test", dns.rdatatype.A, 7)
    assert fast.answer_now(raw, CLIENT, None) is None  # a miss: nothing counted, handle() asks
    assert fast.cache.misses == 0 and fast.stats.queries[("default", "cached")] == 0
    await fast.handle(raw, CLIENT, None)
    answer = fast.answer_now(raw, CLIENT, None)
    assert answer is not None and [rd.address for rd in dns.message.from_wire(answer).answer[0]] == [
        "10.0.0.9"
    ]
    assert fast.stats.queries[("default", "cached")] == 1
    fast._in_flight = MAX_QUERIES_IN_FLIGHT  # an overloaded service answers nothing early: handle() refuses
    assert fast.answer_now(raw, CLIENT, None) is None
