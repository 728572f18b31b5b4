"""The answer cache's bounds and counters on a FakeClock, and the service's counting hooks.

The cache is bounded twice (entries, estimated bytes) and flushable; negative answers live
their SOA's RFC 2308 lifetime under a cap; hits, misses, evictions and every query's
upstream and result are counted for /metrics, across a reload.
"""

from __future__ import annotations

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.spec import DnsCondition, DnsRequestRule, DnsSpec, DnsUpstreamSpec, MatchArg
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.dns.cache import (
    DNS_LATENCY_BUCKETS,
    ENTRY_OVERHEAD_BYTES,
    DnsCache,
    DnsStats,
    entry_size,
)
from honk.dns.service import DnsService
from honk.dns.upstream import Destination, ExchangeFailed
from honk.dns.wire import NEGATIVE_MAX_TTL

A = 1
ROUND_TRIP = 0.004  # seconds the fake upstream takes, on the fake clock
CLIENT = Address("192.168.1.10", 5353)


def key(name: str, scope: object = "default") -> tuple:
    return (name, A, 1, scope)


def wire_of(n: int) -> bytes:
    return b"x" * n


# --- bounds ----------------------------------------------------------------------------------


def test_an_entry_is_estimated_at_its_wire_and_name_plus_a_fixed_overhead():
    assert entry_size(key("a.test"), wire_of(100)) == ENTRY_OVERHEAD_BYTES + len("a.test") + 100
    cache = DnsCache(FakeClock(), 10)
    cache.put(key("a.test"), wire_of(100), 60)
    cache.put(key("b.test"), wire_of(50), 60)
    assert cache.bytes == entry_size(key("a.test"), wire_of(100)) + entry_size(key("b.test"), wire_of(50))


def test_the_byte_bound_evicts_the_least_recently_used_entries_first():
    one = entry_size(key("a"), wire_of(1000))
    cache = DnsCache(FakeClock(), 100, max_bytes=3 * one)
    for name in ("a", "b", "c"):
        cache.put(key(name), wire_of(1000), 60)
    assert cache.get(key("a")) is not None  # a is now the most recently used
    cache.put(key("d"), wire_of(1000), 60)
    assert [n for n in "abcd" if cache.get(key(n)) is not None] == ["a", "c", "d"]
    assert cache.evictions == 1 and cache.bytes == 3 * one


def test_a_large_answer_evicts_as_many_small_ones_as_it_needs():
    small = entry_size(key("a"), wire_of(10))
    cache = DnsCache(FakeClock(), 100, max_bytes=10 * small)
    for i in range(10):
        cache.put(key(str(i)), wire_of(10), 60)
    big = wire_of(4 * small - ENTRY_OVERHEAD_BYTES - len("big"))  # an entry of four small ones' size
    cache.put(key("big"), big, 60)
    assert cache.get(key("big")) is not None
    assert [i for i in range(10) if cache.get(key(str(i))) is not None] == [4, 5, 6, 7, 8, 9]
    assert cache.evictions == 4 and cache.bytes == cache.max_bytes


def test_an_answer_larger_than_the_whole_byte_bound_is_not_kept_and_evicts_nothing():
    cache = DnsCache(FakeClock(), 10, max_bytes=2000)
    cache.put(key("a"), wire_of(10), 60)
    cache.put(key("huge"), wire_of(5000), 60)
    assert cache.get(key("huge")) is None
    assert cache.get(key("a")) is not None and cache.evictions == 0


def test_the_entry_bound_evicts_and_counts_each_eviction():
    cache = DnsCache(FakeClock(), 2)
    for name in ("a", "b", "c", "d"):
        cache.put(key(name), wire_of(10), 60)
    assert len(cache) == 2 and cache.evictions == 2
    assert cache.get(key("c")) is not None and cache.get(key("d")) is not None


def test_shrinking_either_bound_evicts_at_once():
    cache = DnsCache(FakeClock(), 10)
    for name in "abcdef":
        cache.put(key(name), wire_of(100), 60)
    cache.resize(4)
    assert len(cache) == 4
    cache.resize(4, max_bytes=2 * entry_size(key("a"), wire_of(100)))
    assert len(cache) == 2 and cache.evictions == 4
    assert [n for n in "abcdef" if cache.get(key(n)) is not None] == ["e", "f"]


def test_replacing_an_entry_counts_its_bytes_once():
    cache = DnsCache(FakeClock(), 10)
    cache.put(key("a"), wire_of(100), 60)
    cache.put(key("a"), wire_of(300), 60)
    assert len(cache) == 1 and cache.bytes == entry_size(key("a"), wire_of(300))
    cache.put(key("a"), wire_of(300), 0)  # a lifetime of 0 removes it
    assert len(cache) == 0 and cache.bytes == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "get", "advance", "retain"]), st.integers(0, 7), st.integers(0, 3000)
        ),
        max_size=60,
    )
)
def test_the_bounds_hold_and_the_byte_count_stays_exact_whatever_happens(ops):
    clock = FakeClock()
    cache = DnsCache(clock, 5, max_bytes=6000)
    for op, name, n in ops:
        if op == "put":
            cache.put(key(str(name), scope=name % 2), wire_of(n), n % 120)
        elif op == "get":
            cache.get(key(str(name), scope=name % 2))
        elif op == "advance":
            clock.advance(n / 50)
        else:
            cache.retain(lambda scope, kept=name % 2: scope == kept)
        assert len(cache) <= cache.max_entries and cache.bytes <= cache.max_bytes
        assert cache.bytes == sum(entry.size for entry in cache._entries.values())


# --- expiry, flush, counters -------------------------------------------------------------------


def test_hits_misses_and_expirations_are_counted_on_the_injected_clock():
    clock = FakeClock()
    cache = DnsCache(clock, 10)
    assert cache.get(key("a")) is None
    cache.put(key("a"), wire_of(10), 30)
    clock.advance(29.5)
    assert cache.get(key("a")).ttl == 1
    clock.advance(0.5)
    assert cache.get(key("a")) is None
    assert (cache.hits, cache.misses, cache.expirations, cache.evictions) == (1, 2, 1, 0)
    assert cache.bytes == 0


def test_a_flush_empties_the_cache_and_keeps_the_counters():
    cache = DnsCache(FakeClock(), 10)
    for name in "abc":
        cache.put(key(name), wire_of(10), 60)
    cache.get(key("a"))
    assert cache.flush() == 3
    assert len(cache) == 0 and cache.bytes == 0 and cache.flushes == 1
    assert cache.get(key("a")) is None
    assert (cache.hits, cache.misses) == (1, 1)  # counters run since start, a flush is no restart


def test_latency_histogram_buckets_are_cumulative_and_end_at_inf():
    stats = DnsStats()
    for seconds in (0.0005, 0.003, 0.003, 9.0):
        stats.exchanged("default", seconds)
    histogram = stats.latency["default"]
    cumulative = dict(histogram.cumulative())
    assert cumulative[str(DNS_LATENCY_BUCKETS[0])] == 1 and cumulative["0.005"] == 3
    assert cumulative["+Inf"] == histogram.count == 4
    assert abs(histogram.total - 9.0065) < 1e-9


# --- through the service -----------------------------------------------------------------------


class Upstream:
    """A fake exchanger: ``reply(query)`` answers; each exchange takes ROUND_TRIP on the clock."""

    timeout = 5.0

    def __init__(self, clock: FakeClock, reply) -> None:  # noqa: ANN001 - a message factory
        self.clock = clock
        self.reply = reply
        self.calls = 0

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        self.calls += 1
        self.clock.advance(ROUND_TRIP)
        result = self.reply(query)
        if isinstance(result, Exception):
            raise result
        answer = dns.message.from_wire(result.to_wire())
        answer.id = query.id
        return answer


def addresses(query: dns.message.Message) -> dns.message.Message:
    reply = dns.message.make_response(query)
    reply.answer.append(dns.rrset.from_text(query.question[0].name, 60, "IN", "A", "10.0.0.1"))
    return reply


def nxdomain(soa_ttl: int, minimum: int):  # noqa: ANN201 - a message factory
    def reply(query: dns.message.Message) -> dns.message.Message:
        answer = dns.message.make_response(query)
        answer.set_rcode(dns.rcode.NXDOMAIN)
        answer.authority.append(
            dns.rrset.from_text(
                "test.", soa_ttl, "IN", "SOA", f"ns.test. admin.test. 1 3600 600 86400 {minimum}"
            )
        )
        return answer

    return reply


def nodata(query: dns.message.Message) -> dns.message.Message:
    answer = dns.message.make_response(query)
    answer.authority.append(
        dns.rrset.from_text("test.", 3600, "IN", "SOA", "ns.test. admin.test. 1 3600 600 86400 45")
    )
    return answer


def servfail(query: dns.message.Message) -> dns.message.Message:
    answer = dns.message.make_response(query)
    answer.set_rcode(dns.rcode.SERVFAIL)
    return answer


def dns_spec(**overrides: object) -> DnsSpec:
    base: dict[str, object] = {"upstreams": (DnsUpstreamSpec("default", "udp", "192.0.2.53"),)}
    base.update(overrides)
    return DnsSpec(**base)  # type: ignore[arg-type]


def service_with(reply, spec: DnsSpec | None = None) -> tuple[DnsService, Upstream, FakeClock]:  # noqa: ANN001
    clock = FakeClock()
    upstream = Upstream(clock, reply)
    return DnsService(spec or dns_spec(), None, clock, exchanger=upstream), upstream, clock  # type: ignore[arg-type]


async def ask(service: DnsService, name: str, qtype: str = "A") -> dns.message.Message:
    raw = await service.handle(dns.message.make_query(name, qtype).to_wire(), CLIENT, None)
    assert raw is not None
    return dns.message.from_wire(raw)


async def test_a_nxdomain_is_cached_for_its_soa_minimum():
    service, upstream, clock = service_with(nxdomain(soa_ttl=3600, minimum=30))
    assert (await ask(service, "nx.test")).rcode() == dns.rcode.NXDOMAIN
    clock.advance(29)
    again = await ask(service, "nx.test")
    assert again.rcode() == dns.rcode.NXDOMAIN and upstream.calls == 1
    assert {rrset.ttl for rrset in again.authority} == {1}  # the second it has left
    clock.advance(1)
    await ask(service, "nx.test")
    assert upstream.calls == 2


async def test_a_negative_lifetime_is_capped_however_long_the_soa_asks():
    service, upstream, clock = service_with(nxdomain(soa_ttl=86400, minimum=86400))
    await ask(service, "nx.test")
    clock.advance(NEGATIVE_MAX_TTL - 1)
    await ask(service, "nx.test")
    assert upstream.calls == 1
    clock.advance(1)
    await ask(service, "nx.test")
    assert upstream.calls == 2


async def test_a_nodata_answer_is_cached_as_negative_for_its_soa_lifetime():
    service, upstream, clock = service_with(nodata)
    await ask(service, "www.example.test", "AAAA")
    clock.advance(44)
    await ask(service, "www.example.test", "AAAA")
    assert upstream.calls == 1
    clock.advance(1)
    await ask(service, "www.example.test", "AAAA")
    assert upstream.calls == 2


async def test_queries_are_counted_by_upstream_and_result():
    rules = (DnsRequestRule((DnsCondition("qname", names=(MatchArg("full", "ads.test"),)),), "reject"),)
    service, _, _ = service_with(addresses, dns_spec(request_rules=rules))
    await ask(service, "www.example.test")
    await ask(service, "www.example.test")
    await ask(service, "ads.test")
    assert service.stats.queries == {
        ("default", "answered"): 1,
        ("default", "cached"): 1,
        ("reject", "rejected"): 1,
    }
    assert (service.cache.hits, service.cache.misses) == (1, 1)


async def test_upstream_failures_and_errors_are_counted_apart():
    service, _, _ = service_with(servfail)
    assert (await ask(service, "a.test")).rcode() == dns.rcode.SERVFAIL
    service._exchanger.reply = lambda _query: ExchangeFailed("timeout", "no answer")  # type: ignore[attr-defined]
    assert (await ask(service, "b.test")).rcode() == dns.rcode.SERVFAIL
    service._exchanger.reply = nxdomain(60, 60)  # type: ignore[attr-defined]
    await ask(service, "c.test")
    assert service.stats.queries == {
        ("default", "error"): 1,
        ("default", "failed"): 1,
        ("default", "negative"): 1,
    }


async def test_upstream_latency_is_observed_on_the_injected_clock_for_answered_exchanges():
    service, _, _ = service_with(addresses)
    await ask(service, "a.test")
    await ask(service, "a.test")  # a hit: no exchange, nothing observed
    histogram = service.stats.latency["default"]
    assert histogram.count == 1 and abs(histogram.total - ROUND_TRIP) < 1e-9
    assert dict(histogram.cumulative())["0.005"] == 1 and dict(histogram.cumulative())["0.0025"] == 0


async def test_a_rebuilt_service_keeps_the_counters_and_the_cache():
    service, _, _ = service_with(addresses)
    await ask(service, "a.test")
    rebuilt = service.rebuilt(dns_spec(max_cache_size=50))
    assert rebuilt.stats is service.stats and rebuilt.cache is service.cache
    await ask(rebuilt, "a.test")
    assert rebuilt.stats.queries == {("default", "answered"): 1, ("default", "cached"): 1}


async def test_a_flush_makes_the_next_query_reach_the_upstream():
    service, upstream, _ = service_with(addresses)
    await ask(service, "a.test")
    await ask(service, "a.test")
    assert upstream.calls == 1
    service.cache.flush()
    await ask(service, "a.test")
    assert upstream.calls == 2
