"""The answer cache on a FakeClock: lifetimes, the time left, LRU eviction, scope pruning."""

from __future__ import annotations

import pytest

from honk.core.clock import FakeClock
from honk.dns.cache import DnsCache

A = 1


def key(name: str, scope: object = "default") -> tuple:
    return (name, A, 1, scope)


def test_an_entry_reports_the_whole_seconds_it_has_left_until_it_expires():
    clock = FakeClock()
    cache = DnsCache(clock, 10)
    cache.put(key("a.test"), b"wire", 600)
    assert cache.get(key("a.test")).ttl == 600
    clock.advance(100.25)
    hit = cache.get(key("a.test"))
    assert (hit.wire, hit.ttl) == (b"wire", 500)  # rounded up: an entry still alive never says 0
    clock.advance(499.75)
    assert cache.get(key("a.test")) is None
    assert len(cache) == 0  # an expired entry is dropped when met


def test_a_lifetime_of_zero_stores_nothing():
    cache = DnsCache(FakeClock(), 10)
    cache.put(key("a.test"), b"wire", 0)
    assert cache.get(key("a.test")) is None and len(cache) == 0


def test_the_least_recently_used_entry_is_evicted_first():
    cache = DnsCache(FakeClock(), 2)
    cache.put(key("a"), b"a", 60)
    cache.put(key("b"), b"b", 60)
    assert cache.get(key("a")) is not None  # a is now the most recent
    cache.put(key("c"), b"c", 60)
    assert cache.get(key("b")) is None
    assert cache.get(key("a")) is not None and cache.get(key("c")) is not None


def test_resizing_down_evicts_the_oldest_entries():
    cache = DnsCache(FakeClock(), 3)
    for name in "abc":
        cache.put(key(name), name.encode(), 60)
    cache.resize(1)
    assert len(cache) == 1 and cache.get(key("c")) is not None
    with pytest.raises(ValueError):
        cache.resize(0)


def test_keys_differ_by_scope_and_retain_drops_refused_scopes():
    cache = DnsCache(FakeClock(), 10)
    cache.put(key("a", "one"), b"1", 60)
    cache.put(key("a", "two"), b"2", 60)
    cache.put(key("a", ("asis", "10.0.0.1:53")), b"3", 60)
    assert cache.get(key("a", "one")).wire == b"1" and cache.get(key("a", "two")).wire == b"2"
    cache.retain(lambda scope: scope != "two")
    assert cache.get(key("a", "two")) is None
    assert cache.get(key("a", "one")) is not None and len(cache) == 2
