"""DnsService without sockets: a fake exchanger stands for the upstreams, a FakeClock for time."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.config.spec import DnsCondition, DnsRequestRule, DnsSpec, DnsUpstreamSpec, MatchArg
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.dns import service as service_module
from honk.dns.service import DnsService
from honk.dns.upstream import Destination, ExchangeFailed

ANSWER_TTL = 60  # what the fake upstream puts in its records


class FakeExchanger:
    """Answers with ``answer(destination, query)`` (a message, or an exception to raise)."""

    timeout = 5.0

    def __init__(self, answer: Callable[[Destination, dns.message.Message], object] | None = None) -> None:
        self.answer = answer or address_answer("10.0.0.1")
        self.calls: list[tuple[Destination, str, bool]] = []
        self.gate: asyncio.Event | None = None  # set: exchanges wait for it

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        self.calls.append((destination, query.question[0].name.to_text(), tcp))
        if self.gate is not None:
            await self.gate.wait()
        result = self.answer(destination, query)
        if isinstance(result, Exception):
            raise result
        reply = dns.message.from_wire(result.to_wire())  # a fresh object, as from the network
        reply.id = query.id
        return reply


def address_answer(*ips: str, ttl: int = ANSWER_TTL) -> Callable[[Destination, dns.message.Message], object]:
    def answer(_destination: Destination, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        q = query.question[0]
        kind = "AAAA" if q.rdtype == dns.rdatatype.AAAA else "A"
        wanted = [ip for ip in ips if (":" in ip) == (kind == "AAAA")]
        if wanted:
            reply.answer.append(dns.rrset.from_text(q.name, ttl, "IN", kind, *wanted))
        return reply

    return answer


def negative_answer(
    rcode: int, soa_ttl: int, minimum: int
) -> Callable[[Destination, dns.message.Message], object]:
    def answer(_destination: Destination, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        reply.set_rcode(rcode)
        reply.authority.append(
            dns.rrset.from_text(
                "test.", soa_ttl, "IN", "SOA", f"ns.test. admin.test. 1 3600 600 86400 {minimum}"
            )
        )
        return reply

    return answer


def spec(**overrides: object) -> DnsSpec:
    base = {
        "upstreams": (
            DnsUpstreamSpec("default", "udp", "192.0.2.53"),
            DnsUpstreamSpec("other", "udp", "192.0.2.54"),
        )
    }
    base.update(overrides)
    return DnsSpec(**base)  # type: ignore[arg-type]


def make(
    dns_spec: DnsSpec | None = None, exchanger: FakeExchanger | None = None, clock: FakeClock | None = None
) -> tuple[DnsService, FakeExchanger, FakeClock]:
    clock = clock or FakeClock()
    exchanger = exchanger or FakeExchanger()
    return DnsService(dns_spec or spec(), None, clock, exchanger=exchanger), exchanger, clock  # type: ignore[arg-type]


def query(name: str = "www.example.com", qtype: str = "A", qid: int = 4242, *, edns: bool = False) -> bytes:
    q = dns.message.make_query(name, qtype, use_edns=0 if edns else False)
    q.id = qid
    return q.to_wire()


async def ask(
    service: DnsService,
    name: str = "www.example.com",
    qtype: str = "A",
    qid: int = 4242,
    *,
    original: Address | None = None,
    tcp: bool = False,
) -> dns.message.Message:
    reply = await service.handle(query(name, qtype, qid), Address("192.168.1.10", 5353), original, tcp=tcp)
    assert reply is not None
    return dns.message.from_wire(reply)


def ttls(reply: dns.message.Message) -> set[int]:
    return {rrset.ttl for section in (reply.answer, reply.authority) for rrset in section}


def addresses(reply: dns.message.Message) -> list[str]:
    return [r.address for rrset in reply.answer for r in rrset]


# --- answers, ids, TTLs ----------------------------------------------------------------------


async def test_a_miss_is_answered_with_the_queries_id_and_question_and_the_cache_ttl():
    service, exchanger, _ = make()
    reply = await ask(service, "WwW.Example.COM", qid=777)
    assert reply.id == 777
    assert reply.question[0].name.to_text() == "WwW.Example.COM."  # as asked, case included
    assert addresses(reply) == ["10.0.0.1"]
    assert ttls(reply) == {600}  # optimistic_cache_ttl, also on the wire
    assert not reply.flags & dns.flags.AA and reply.flags & dns.flags.RA
    ((destination, _, tcp),) = exchanger.calls
    assert (destination.label, destination.address, tcp) == ("default", Address("192.0.2.53", 53), False)


async def test_a_hit_does_not_reach_the_upstream_and_its_ttls_count_down():
    service, exchanger, clock = make()
    await ask(service)
    clock.advance(100)
    reply = await ask(service, "WWW.example.com", qid=9)
    assert len(exchanger.calls) == 1
    assert reply.id == 9 and reply.question[0].name.to_text() == "WWW.example.com."
    assert ttls(reply) == {500}
    clock.advance(500)
    await ask(service)
    assert len(exchanger.calls) == 2  # expired: asked again


async def test_a_zero_cache_ttl_keeps_the_answers_own_lowest_ttl():
    service, exchanger, clock = make(spec(optimistic_cache_ttl=0))
    assert ttls(await ask(service)) == {ANSWER_TTL}
    clock.advance(ANSWER_TTL - 1)
    assert ttls(await ask(service)) == {1}
    clock.advance(1)
    await ask(service)
    assert len(exchanger.calls) == 2


async def test_fixed_domain_ttl_overrides_and_zero_never_caches():
    service, exchanger, clock = make(spec(fixed_domain_ttl=(("ddns.test", 10), ("nocache.test", 0))))
    assert ttls(await ask(service, "ddns.test")) == {10}
    assert ttls(await ask(service, "sub.ddns.test")) == {600}  # exact names only
    assert ttls(await ask(service, "nocache.test")) == {ANSWER_TTL}  # passed through as sent
    await ask(service, "nocache.test")
    assert [c[1] for c in exchanger.calls].count("nocache.test.") == 2
    clock.advance(10)
    await ask(service, "ddns.test")
    assert [c[1] for c in exchanger.calls].count("ddns.test.") == 2


async def test_with_the_cache_off_every_query_is_exchanged_and_ttls_pass_through():
    service, exchanger, _ = make(spec(optimistic_cache=False))
    assert ttls(await ask(service)) == {ANSWER_TTL}
    await ask(service)
    assert len(exchanger.calls) == 2 and len(service.cache) == 0


async def test_nxdomain_is_cached_for_its_soa_negative_ttl_clamped():
    service, exchanger, clock = make(exchanger=FakeExchanger(negative_answer(dns.rcode.NXDOMAIN, 3600, 900)))
    reply = await ask(service, "missing.test")
    assert reply.rcode() == dns.rcode.NXDOMAIN and ttls(reply) == {300}  # min(3600, 900) clamped to 300
    clock.advance(299)
    assert ttls(await ask(service, "missing.test")) == {1}
    assert len(exchanger.calls) == 1


async def test_servfail_from_upstream_is_passed_on_and_not_cached():
    def servfail(_d: Destination, q: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(q)
        reply.set_rcode(dns.rcode.SERVFAIL)
        return reply

    service, exchanger, _ = make(exchanger=FakeExchanger(servfail))
    assert (await ask(service)).rcode() == dns.rcode.SERVFAIL
    await ask(service)
    assert len(exchanger.calls) == 2


async def test_cache_entries_are_kept_apart_by_selected_upstream():
    rules = (DnsRequestRule((DnsCondition("qtype", qtypes=(28,)),), "other"),)
    service, exchanger, _ = make(
        spec(request_rules=rules), FakeExchanger(address_answer("10.0.0.1", "2001:db8::1"))
    )
    await ask(service, qtype="A")
    await ask(service, qtype="AAAA")
    await ask(service, qtype="A")
    await ask(service, qtype="AAAA")
    assert [c[0].label for c in exchanger.calls] == ["default", "other"]


async def test_identical_queries_in_flight_share_one_exchange():
    service, exchanger, _ = make()
    exchanger.gate = asyncio.Event()
    first = asyncio.ensure_future(ask(service, qid=1))
    second = asyncio.ensure_future(ask(service, qid=2))
    await asyncio.sleep(0)
    exchanger.gate.set()
    a, b = await asyncio.gather(first, second)
    assert len(exchanger.calls) == 1
    assert (a.id, b.id) == (1, 2) and addresses(a) == addresses(b) == ["10.0.0.1"]


# --- actions --------------------------------------------------------------------------------


async def test_reject_answers_an_empty_noerror_without_asking_anyone():
    rules = (DnsRequestRule((DnsCondition("qname", names=(MatchArg("suffix", "ads.test"),)),), "reject"),)
    service, exchanger, _ = make(spec(request_rules=rules))
    reply = await ask(service, "x.ads.test", qid=31)
    assert (reply.id, reply.rcode(), reply.answer) == (31, dns.rcode.NOERROR, [])
    assert exchanger.calls == []


async def test_asis_asks_the_intercepted_destination_and_fails_without_one():
    service, exchanger, _ = make(spec(request_fallback="asis"))
    assert (await ask(service)).rcode() == dns.rcode.SERVFAIL  # the standalone listener has no destination
    assert exchanger.calls == []
    first, second = Address("192.168.1.1", 53), Address("192.168.1.2", 53)
    await ask(service, original=first, tcp=True)
    await ask(service, original=first)
    await ask(service, original=second)
    calls = [(c[0].label, c[0].address, c[0].protocol, c[2]) for c in exchanger.calls]
    assert calls == [("asis", first, "tcp", True), ("asis", second, "udp", False)]  # cached per destination


async def test_a_failed_exchange_is_servfail_and_told_at_info_once_per_streak(caplog):
    outcomes: list[object] = [
        ExchangeFailed("timeout"),
        ExchangeFailed("timeout"),
        None,
        ExchangeFailed("refused"),
    ]

    def answer(d: Destination, q: dns.message.Message) -> object:
        outcome = outcomes.pop(0)
        return outcome if outcome is not None else address_answer("10.0.0.1")(d, q)

    service, _, _ = make(spec(optimistic_cache=False), FakeExchanger(answer))
    with caplog.at_level(logging.DEBUG, logger="honk.dns"):
        replies = [await ask(service) for _ in range(4)]
    assert [r.rcode() for r in replies] == [
        dns.rcode.SERVFAIL,
        dns.rcode.SERVFAIL,
        dns.rcode.NOERROR,
        dns.rcode.SERVFAIL,
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [m.split(" upstream=")[0] for m in infos] == [
        "dns upstream failing",
        "dns upstream answering again",
        "dns upstream failing",
    ]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("dns exchange failed" in m and "reason=timeout" in m for m in debug) == 2


async def test_response_fallback_reject_answers_empty_after_asking():
    service, exchanger, _ = make(spec(response_fallback="reject"))
    reply = await ask(service)
    assert (reply.rcode(), reply.answer, len(exchanger.calls)) == (dns.rcode.NOERROR, [], 1)


# --- learning ---------------------------------------------------------------------------------


async def test_returned_addresses_are_learned_for_the_lifetime_the_client_got():
    service, _, clock = make(spec(optimistic_cache_ttl=0), FakeExchanger(address_answer("10.0.0.1", ttl=120)))
    await ask(service, "Learn.Test")
    assert service.learning.learned_names("10.0.0.1") == ("learn.test",)
    clock.advance(119)
    assert service.learned_names("10.0.0.1") == ("learn.test",)
    clock.advance(1)
    assert service.learning.learned_names("10.0.0.1") == ()


async def test_a_cname_chain_teaches_both_the_asked_name_and_the_owner():
    def cname(_d: Destination, q: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(q)
        reply.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "CNAME", "edge.cdn.test."))
        reply.answer.append(dns.rrset.from_text("edge.cdn.test.", 60, "IN", "AAAA", "2001:db8::5"))
        return reply

    service, _, _ = make(exchanger=FakeExchanger(cname))
    await ask(service, "www.shop.test", "AAAA")
    assert set(service.learning.learned_names("2001:db8::5")) == {"www.shop.test", "edge.cdn.test"}


# --- reloads --------------------------------------------------------------------------------


async def test_a_rebuilt_service_keeps_learning_and_the_cache_of_unchanged_upstreams():
    service, exchanger, _ = make()
    rules = (DnsRequestRule((DnsCondition("qname", names=(MatchArg("full", "b.test"),)),), "other"),)
    service = service.rebuilt(spec(request_rules=rules))
    await ask(service, "a.test")
    await ask(service, "b.test")
    changed = spec(
        request_rules=rules,
        upstreams=(
            DnsUpstreamSpec("default", "udp", "192.0.2.53"),
            DnsUpstreamSpec("other", "tcp", "192.0.2.99"),
        ),
    )
    rebuilt = service.rebuilt(changed)
    assert rebuilt.learning is service.learning and rebuilt.cache is service.cache
    await ask(rebuilt, "a.test")  # default is unchanged: still cached
    await ask(rebuilt, "b.test")  # other changed: asked again, at its new address
    assert [(c[1], c[0].address.host) for c in exchanger.calls] == [
        ("a.test.", "192.0.2.53"),
        ("b.test.", "192.0.2.54"),
        ("b.test.", "192.0.2.99"),
    ]


async def test_a_rebuilt_service_resizes_the_shared_cache():
    service, _, _ = make()
    for i in range(5):
        await ask(service, f"n{i}.test")
    rebuilt = service.rebuilt(spec(max_cache_size=2))
    assert len(rebuilt.cache) == 2


# --- the wire ---------------------------------------------------------------------------------


async def test_an_answer_too_big_for_a_udp_client_is_truncated_and_whole_over_tcp():
    many = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(60)]  # 60 A records: about 1 KB
    service, _, _ = make(exchanger=FakeExchanger(address_answer(*many)))
    over_udp = await ask(service)
    assert over_udp.flags & dns.flags.TC and len(addresses(over_udp)) < 60
    over_tcp = await ask(service, tcp=True)
    assert not over_tcp.flags & dns.flags.TC and len(addresses(over_tcp)) == 60


async def test_malformed_queries_get_formerr_notimp_or_are_dropped():
    service, exchanger, _ = make()
    client = Address("192.168.1.10", 1)
    assert await service.handle(b"\x12\x34\x01", client, None) is None  # no header
    response = query()[:2] + b"\x81\x00" + query()[4:]
    assert await service.handle(response, client, None) is None  # a response: never answered
    garbage = struct.pack("!HHHHHH", 99, 0x0100, 1, 0, 0, 0) + b"\xff\xff"
    formerr = dns.message.from_wire(await service.handle(garbage, client, None))
    assert (formerr.id, formerr.rcode()) == (99, dns.rcode.FORMERR)
    two = dns.message.make_query("a.test", "A")
    two.question.append(dns.message.make_query("b.test", "A").question[0])
    assert (
        dns.message.from_wire(await service.handle(two.to_wire(), client, None)).rcode() == dns.rcode.FORMERR
    )
    status = bytearray(query())
    status[2] |= 0x10  # opcode 2 (STATUS)
    notimp = await service.handle(bytes(status), client, None)
    assert notimp[3] & 0xF == dns.rcode.NOTIMP
    assert exchanger.calls == []


async def test_queries_beyond_the_in_flight_bound_are_refused_at_once(monkeypatch):
    monkeypatch.setattr(service_module, "MAX_QUERIES_IN_FLIGHT", 1)
    service, exchanger, _ = make()
    exchanger.gate = asyncio.Event()
    first = asyncio.ensure_future(ask(service, qid=1))
    await asyncio.sleep(0)
    refused = await ask(service, "other.test", qid=2)
    assert (refused.id, refused.rcode()) == (2, dns.rcode.REFUSED)
    exchanger.gate.set()
    assert (await first).rcode() == dns.rcode.NOERROR


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600))
def test_random_bytes_never_raise_out_of_the_service(data):
    service, _, _ = make()

    async def one() -> bytes | None:
        return await service.handle(data, Address("192.168.1.10", 1), None)

    reply = asyncio.run(one())
    assert reply is None or (len(reply) >= 12 and reply[:2] == data[:2])


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(min_value=12, max_value=40))
def test_mutated_real_queries_never_raise_out_of_the_service(noise, cut):
    service, _, _ = make()
    wire = bytearray(query("fuzz.example", edns=True))
    for i, b in enumerate(noise):
        wire[(i * 7) % len(wire)] ^= b
    data = bytes(wire[:cut]) + bytes(noise)

    async def one() -> bytes | None:
        return await service.handle(data, None, None)

    reply = asyncio.run(one())
    assert reply is None or reply[:2] == data[:2]


@pytest.mark.parametrize("qtype", ["A", "AAAA", "MX", "TXT", "HTTPS"])
async def test_every_qtype_gets_an_answer_with_the_right_question(qtype):
    service, _, _ = make()
    reply = await ask(service, "q.test", qtype)
    assert reply.question[0].rdtype == dns.rdatatype.from_text(qtype) and reply.rcode() == dns.rcode.NOERROR
