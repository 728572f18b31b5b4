"""``ipversion_prefer``: dae's rule (docs/en/configuration/dns.md). With ``ipversion_prefer: 4``
an AAAA answer is replaced by an empty NOERROR reply only when the name is known to have A
records: a live cached A answer holds one, or the A exchange in flight brings one within 50 ms
(RFC 8305's resolution delay). honk never asks for the preferred family itself; ``6`` swaps the
families. Sans-I/O: a fake upstream answers dnspython messages."""

from __future__ import annotations

import asyncio

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

from honk.config.spec import DnsSpec, DnsUpstreamSpec
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.dns.service import DnsService
from honk.dns.upstream import Destination

CLIENT = Address("192.168.1.10", 5353)
DUAL_STACK = {"A": ["192.0.2.10"], "AAAA": ["2001:db8::10"]}


class FakeUpstream:
    """Answers A and AAAA from ``records`` (a type missing: NODATA); a type listed in ``held``
    waits for its event; ``on_answer`` runs when a type is answered."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = records
        self.held: dict[str, asyncio.Event] = {}
        self.on_answer: dict[str, asyncio.Event] = {}  # type -> an event set when it is answered
        self.asked: list[str] = []

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        question = query.question[0]
        kind = dns.rdatatype.to_text(question.rdtype)
        self.asked.append(kind)
        if kind in self.held:
            await self.held[kind].wait()
        reply = dns.message.make_response(query)
        if self.records.get(kind):
            reply.answer.append(dns.rrset.from_text(question.name, 60, "IN", kind, *self.records[kind]))
        if kind in self.on_answer:
            self.on_answer[kind].set()
        return reply


def make(prefer: int | None, records: dict[str, list[str]] | None = None) -> tuple[DnsService, FakeUpstream]:
    upstream = FakeUpstream(DUAL_STACK if records is None else records)
    spec = DnsSpec(upstreams=(DnsUpstreamSpec("default", "udp", "192.0.2.53"),), ipversion_prefer=prefer)
    return DnsService(spec, None, FakeClock(), exchanger=upstream), upstream  # type: ignore[arg-type]


async def ask(service: DnsService, qtype: str, name: str = "www.example.com") -> dns.message.Message:
    reply = await service.handle(dns.message.make_query(name, qtype, use_edns=False).to_wire(), CLIENT, None)
    assert reply is not None
    return dns.message.from_wire(reply)


def empty_noerror(reply: dns.message.Message) -> bool:
    return reply.rcode() == dns.rcode.NOERROR and reply.answer == []


async def test_prefer_4_empties_aaaa_when_a_cached_a_answer_has_records():
    service, upstream = make(4)
    assert (await ask(service, "A")).answer
    assert empty_noerror(await ask(service, "AAAA"))
    assert upstream.asked == ["A"]  # the emptied AAAA never reached the upstream


async def test_prefer_4_passes_aaaa_unchanged_when_no_a_answer_is_known():
    service, upstream = make(4)
    reply = await ask(service, "AAAA")
    assert [r.address for rrset in reply.answer for r in rrset] == ["2001:db8::10"]
    assert upstream.asked == ["AAAA"]  # honk does not ask for A itself


async def test_prefer_4_passes_aaaa_when_the_known_a_answer_has_no_records():
    service, _ = make(4, {"AAAA": ["2001:db8::10"]})  # an IPv6-only name: A is NODATA
    assert (await ask(service, "A")).answer == []
    assert (await ask(service, "AAAA")).answer


async def test_prefer_4_waits_for_the_a_exchange_in_flight_and_empties_aaaa_when_it_brings_records():
    service, upstream = make(4)
    upstream.held["A"] = asyncio.Event()
    a_query = asyncio.ensure_future(ask(service, "A"))
    upstream.on_answer["AAAA"] = upstream.held["A"]  # the A answer lands right after the AAAA one
    aaaa = await ask(service, "AAAA")
    assert empty_noerror(aaaa)
    assert (await a_query).answer


async def test_prefer_4_answers_aaaa_as_sent_when_the_a_exchange_does_not_land_in_time():
    service, upstream = make(4)
    upstream.held["A"] = asyncio.Event()
    a_query = asyncio.ensure_future(ask(service, "A"))
    aaaa = await ask(service, "AAAA")  # waits PREFERRED_FAMILY_WAIT for A, then gives up
    assert aaaa.answer
    upstream.held["A"].set()
    await a_query


async def test_prefer_6_swaps_the_families():
    service, upstream = make(6)
    assert (await ask(service, "AAAA")).answer
    assert empty_noerror(await ask(service, "A"))
    assert upstream.asked == ["AAAA"]


async def test_other_types_and_the_preferred_family_are_never_emptied():
    service, _ = make(4, {"A": ["192.0.2.10"], "AAAA": ["2001:db8::10"], "TXT": ["hello"]})
    await ask(service, "A")
    assert (await ask(service, "A")).answer
    assert (await ask(service, "TXT")).rcode() == dns.rcode.NOERROR


async def test_without_ipversion_prefer_both_families_are_answered():
    service, _ = make(None)
    await ask(service, "A")
    assert (await ask(service, "AAAA")).answer
