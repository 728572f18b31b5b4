"""Learned names: address -> names for the lifetime the client was given, bounded, LRU."""

from __future__ import annotations

import ipaddress

from honk.core.clock import FakeClock
from honk.dns.learning import MAX_NAMES_PER_ADDRESS, MIN_LEARNED_LIFETIME, DomainLearning


def test_a_name_is_learned_for_its_lifetime_then_forgotten():
    clock = FakeClock()
    learning = DomainLearning(clock)
    learning.record("10.0.0.1", ["Example.COM."], 60)
    assert learning.learned_names("10.0.0.1") == ("example.com",)
    assert learning.learned_names(ipaddress.ip_address("10.0.0.1")) == ("example.com",)
    clock.advance(59)
    assert learning.learned_names("10.0.0.1") == ("example.com",)
    clock.advance(1)
    assert learning.learned_names("10.0.0.1") == ()
    assert len(learning) == 0


def test_names_expire_one_by_one_and_the_newest_comes_first():
    clock = FakeClock()
    learning = DomainLearning(clock)
    learning.record("10.0.0.1", ["short.test"], 30)
    learning.record("10.0.0.1", ["long.test", "cdn.test"], 300)
    assert learning.learned_names("10.0.0.1") == ("cdn.test", "long.test", "short.test")
    clock.advance(30)
    assert learning.learned_names("10.0.0.1") == ("cdn.test", "long.test")


def test_a_zero_ttl_answer_still_covers_the_first_connection():
    clock = FakeClock()
    learning = DomainLearning(clock)
    learning.record("2001:db8::1", ["v6.test"], 0)
    clock.advance(MIN_LEARNED_LIFETIME - 1)
    assert learning.learned_names("2001:db8::1") == ("v6.test",)


def test_an_ipv4_mapped_address_is_the_ipv4_address():
    learning = DomainLearning(FakeClock())
    learning.record("::ffff:10.0.0.7", ["mapped.test"], 60)
    assert learning.learned_names("10.0.0.7") == ("mapped.test",)


def test_the_table_is_bounded_by_addresses_least_recently_recorded_first():
    learning = DomainLearning(FakeClock(), max_addresses=2)
    learning.record("10.0.0.1", ["a.test"], 60)
    learning.record("10.0.0.2", ["b.test"], 60)
    learning.record("10.0.0.1", ["a2.test"], 60)  # 10.0.0.1 is recorded again: now the newest
    learning.record("10.0.0.3", ["c.test"], 60)
    assert learning.learned_names("10.0.0.2") == ()
    assert learning.learned_names("10.0.0.1") == ("a2.test", "a.test")
    assert learning.learned_names("10.0.0.3") == ("c.test",)


def test_one_address_keeps_a_bounded_number_of_names():
    learning = DomainLearning(FakeClock())
    learning.record("10.0.0.1", [f"n{i}.test" for i in range(MAX_NAMES_PER_ADDRESS + 3)], 60)
    names = learning.learned_names("10.0.0.1")
    assert len(names) == MAX_NAMES_PER_ADDRESS and "n0.test" not in names


def test_asking_about_something_that_is_not_an_address_learns_nothing():
    assert DomainLearning(FakeClock()).learned_names("not-an-ip") == ()
