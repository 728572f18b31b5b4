"""The answer cache: LRU over entries that expire on the injected clock, bounded twice.

A key is (qname lower-cased, qtype, qclass, scope), the scope being the
upstream name request routing selected or ``("asis", destination)``: clients
that choose the same exchange share entries, different upstreams never do.
An entry holds the reply's wire bytes with its TTLs already set to its
lifetime; a hit reports the whole seconds left, which the service writes into
every record, so a client never keeps a record longer than honk does. When
the reply is the plain case, the entry also holds it prepared for answers
from bytes (:func:`honk.dns.fastwire.prepare`: where its TTLs are, which
addresses a hit teaches), which :meth:`DnsCache.peek` and
:meth:`DnsCache.touch` serve without counting anything until the service
knows it answers from it.

Why two bounds: ``max_cache_size`` counts entries, which is what a user
reasons about, but one entry may hold anything from a 40-byte NXDOMAIN to a
64 KiB TCP answer. The byte bound (an estimate: the wire plus what Python
spends around it) keeps a router's memory flat whatever the answers weigh;
whichever bound is reached first evicts the least recently used entries.

Negative answers (NXDOMAIN, NODATA) are cached like positive ones, for the
lifetime the service reads from their SOA (RFC 2308 §5, capped by
:data:`honk.dns.wire.NEGATIVE_MAX_TTL`); the cache only keeps time.

The service's own counters (queries by upstream and result, upstream latency)
live here too, in :class:`DnsStats`, so that a reload, which rebuilds the
service over the same cache, carries them with it and ``/metrics`` never sees
a counter go backwards.
"""

from __future__ import annotations

import bisect
import collections
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from honk.core.clock import Clock
from honk.dns.fastwire import FastReply, prepare
from honk.dns.wire import remaining_seconds

__all__ = [
    "DEFAULT_MAX_CACHE_BYTES",
    "DNS_LATENCY_BUCKETS",
    "DNS_QUERY_RESULTS",
    "ENTRY_OVERHEAD_BYTES",
    "FAST_ADDRESS_BYTES",
    "FAST_FORM_BYTES",
    "FAST_OFFSET_BYTES",
    "CacheKey",
    "CachedReply",
    "DnsCache",
    "DnsStats",
    "LatencyHistogram",
]

CacheKey = tuple[str, int, int, Hashable]

# Bytes an entry costs beyond its qname and wire bytes: the key tuple and its ints, the entry
# object, its float, the bytes object's header and the OrderedDict node. Measured with
# tracemalloc on CPython 3.11 (10,000 entries of 21-character names and 104-byte answers took
# 432 bytes each), rounded up.
ENTRY_OVERHEAD_BYTES = 320
# The byte bound a service's cache starts with: 8 MiB is about 18,000 typical answers (more than
# the default 10,000 entries), or 128 maximal 64 KiB TCP answers.
DEFAULT_MAX_CACHE_BYTES = 8 * 1024 * 1024
# What an entry's prepared form (FastReply) adds: the object and its tuples, plus each TTL or
# rdata offset (an int beyond the small-int cache and its slot) and each learned address (the
# address object, its int, the pair and the names tuple). Measured with tracemalloc on CPython
# 3.11: 10,000 forms of two-address answers took 857 bytes each (these constants say 880).
FAST_FORM_BYTES = 200
FAST_OFFSET_BYTES = 40
FAST_ADDRESS_BYTES = 260


@dataclass(frozen=True, slots=True)
class CachedReply:
    wire: bytes
    ttl: int  # whole seconds left, >= 1


@dataclass(slots=True)
class _Entry:
    wire: bytes
    expires: float  # on the clock
    size: int  # estimated bytes (see entry_size)
    fast: FastReply | None  # the reply prepared for answers from bytes; None: not the plain case


def entry_size(key: CacheKey, wire: bytes, fast: FastReply | None = None) -> int:
    """The estimated bytes one entry holds in memory."""
    size = ENTRY_OVERHEAD_BYTES + len(key[0]) + len(wire)
    if fast is not None:
        offsets = len(fast.ttls) + sum(len(rdatas) for rdatas, _size in fast.shuffled)
        size += FAST_FORM_BYTES + FAST_OFFSET_BYTES * offsets + FAST_ADDRESS_BYTES * len(fast.learned)
    return size


class DnsCache:
    def __init__(self, clock: Clock, max_entries: int, max_bytes: int = DEFAULT_MAX_CACHE_BYTES) -> None:
        if max_entries < 1:
            raise ValueError("a DNS cache holds at least one entry")
        if max_bytes < 1:
            raise ValueError("a DNS cache holds at least one byte")
        self._clock = clock
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: collections.OrderedDict[CacheKey, _Entry] = collections.OrderedDict()
        # counters since start (a flush or a reload does not reset them)
        self.hits = 0
        self.misses = 0  # lookups that found nothing live (an expired entry is a miss)
        self.evictions = 0  # live entries dropped to respect a bound
        self.expirations = 0  # entries dropped because their lifetime ended
        self.flushes = 0

    @property
    def max_entries(self) -> int:
        return self._max

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def bytes(self) -> int:
        """The estimated bytes the live entries hold."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> CachedReply | None:
        """The live entry for ``key`` (now the most recently used), or None; an expired one is dropped."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        now = self._clock.now()
        ttl = remaining_seconds(entry.expires, now)
        if entry.expires <= now or ttl < 1:
            self._drop(key)
            self.expirations += 1
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return CachedReply(entry.wire, ttl)

    def peek(self, key: CacheKey) -> tuple[FastReply, int] | None:
        """The live entry's prepared reply and whole seconds left, or None (absent, expired, or not
        prepared). Changes and counts nothing: a service that answers from it calls :meth:`touch`,
        one that does not calls :meth:`get`, which counts the lookup as before."""
        entry = self._entries.get(key)
        if entry is None or entry.fast is None:
            return None
        now = self._clock.now()
        ttl = remaining_seconds(entry.expires, now)
        if entry.expires <= now or ttl < 1:
            return None
        return entry.fast, ttl

    def touch(self, key: CacheKey) -> None:
        """A hit on the entry :meth:`peek` just returned: counted, and now the most recently used."""
        self._entries.move_to_end(key)
        self.hits += 1

    def put(self, key: CacheKey, wire: bytes, lifetime: float) -> None:
        """Keep ``wire`` for ``lifetime`` seconds (nothing for 0 or less, nor for an answer larger
        than the whole byte bound), evicting the least recently used entries to fit."""
        fast = prepare(wire, key[0]) if lifetime > 0 else None
        size = entry_size(key, wire, fast)
        if lifetime <= 0 or size > self._max_bytes:
            if key in self._entries:
                self._drop(key)
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = _Entry(wire, self._clock.now() + lifetime, size, fast)
        self._bytes += size
        self._evict()

    def resize(self, max_entries: int, max_bytes: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError("a DNS cache holds at least one entry")
        if max_bytes is not None:
            if max_bytes < 1:
                raise ValueError("a DNS cache holds at least one byte")
            self._max_bytes = max_bytes
        self._max = max_entries
        self._evict()

    def retain(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose scope ``keep`` refuses (a reload changed or removed its upstream)."""
        for key in [k for k in self._entries if not keep(k[3])]:
            self._drop(key)

    def flush(self) -> int:
        """Drop every entry (``POST /cache/dns/flush``); how many there were."""
        dropped = len(self._entries)
        self.clear()
        self.flushes += 1
        return dropped

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: CacheKey) -> None:
        self._bytes -= self._entries.pop(key).size

    def _evict(self) -> None:
        entries = self._entries
        while len(entries) > self._max or self._bytes > self._max_bytes:
            _, entry = entries.popitem(last=False)
            self._bytes -= entry.size
            self.evictions += 1


# --- what the service counts --------------------------------------------------------------------

# The "result" label of honk_dns_queries_total: every query ends in exactly one.
DNS_QUERY_RESULTS = (
    "cached",  # answered from the cache
    "answered",  # the upstream answered with records
    "negative",  # the upstream said NXDOMAIN or NODATA
    "error",  # the upstream answered with another rcode (SERVFAIL, REFUSED, ...)
    "failed",  # no answer: the exchange failed, timed out, or had nowhere to go (SERVFAIL to the client)
    "rejected",  # a reject request rule, or response_fallback reject (an empty NOERROR)
)
# Upper bounds (seconds) of the upstream latency buckets; +Inf is implied. Finer than the probe
# buckets: a LAN or ISP resolver answers in milliseconds, a tunnelled one in tens of them.
DNS_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LatencyHistogram:
    """Bucket counts, a sum and a count over :data:`DNS_LATENCY_BUCKETS` (Prometheus semantics)."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(DNS_LATENCY_BUCKETS) + 1)  # the last slot is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(DNS_LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound text, cumulative count) per bucket, +Inf last."""
        out, running = [], 0
        for bound, n in zip((*map(str, DNS_LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class DnsStats:
    """Queries by (upstream, result) and upstream round-trip times, as the service reports them.

    The upstream label is the request rule's action: an upstream's name, ``asis``, or
    ``reject``; all come from the configuration, so the label set is bounded."""

    __slots__ = ("queries", "latency")

    def __init__(self) -> None:
        self.queries: Counter[tuple[str, str]] = Counter()
        self.latency: dict[str, LatencyHistogram] = {}

    def query(self, upstream: str, result: str) -> None:
        self.queries[(upstream, result)] += 1

    def exchanged(self, upstream: str, seconds: float) -> None:
        """An upstream answered after ``seconds``."""
        histogram = self.latency.get(upstream)
        if histogram is None:
            histogram = self.latency[upstream] = LatencyHistogram()
        histogram.observe(seconds)
