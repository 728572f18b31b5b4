"""Failed API authentications per source: the bucket, its refill, its bounded memory."""

from __future__ import annotations

from honk.api.authguard import FAILURE_BURST, FAILURE_REFILL, SOURCES_MAX, AuthThrottle
from honk.core.clock import FakeClock


def test_a_source_is_throttled_after_its_burst_of_failures_and_others_are_not():
    clock = FakeClock()
    throttle = AuthThrottle(clock)
    for _ in range(FAILURE_BURST - 1):
        throttle.failed("192.0.2.7")
        assert not throttle.throttled("192.0.2.7")
    throttle.failed("192.0.2.7")
    assert throttle.throttled("192.0.2.7")
    assert not throttle.throttled("192.0.2.8")  # its neighbour has all its tries
    assert throttle.retry_after("192.0.2.7") == int(FAILURE_REFILL)


def test_a_throttled_source_gets_one_try_back_per_refill_and_a_full_bucket_after_a_quiet_spell():
    clock = FakeClock()
    throttle = AuthThrottle(clock)
    for _ in range(FAILURE_BURST):
        throttle.failed("198.51.100.1")
    clock.advance(FAILURE_REFILL - 0.1)
    assert throttle.throttled("198.51.100.1")
    assert throttle.retry_after("198.51.100.1") == 1
    clock.advance(0.1)
    assert not throttle.throttled("198.51.100.1")
    throttle.failed("198.51.100.1")
    assert throttle.throttled("198.51.100.1")  # that one try, spent
    clock.advance(FAILURE_REFILL * FAILURE_BURST)
    for _ in range(FAILURE_BURST - 1):
        throttle.failed("198.51.100.1")
    assert not throttle.throttled("198.51.100.1")  # refilled to the whole burst, never beyond it


def test_the_table_is_bounded_and_forgets_refilled_sources():
    clock = FakeClock()
    throttle = AuthThrottle(clock)
    for n in range(SOURCES_MAX + 10):
        throttle.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(throttle) == SOURCES_MAX  # the least recent failures went first
    clock.advance(FAILURE_REFILL * FAILURE_BURST)
    throttle.sweep()
    assert len(throttle) == 0
