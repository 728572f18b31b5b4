"""The descriptor budget: flows never take the control plane's reserve, refusals are counted and
warned about at most once per interval, and what is in use is counted, not assumed."""

from __future__ import annotations

import errno
import logging
import resource

import pytest

from honk.connection.descriptors import (
    FLOW_DESCRIPTORS,
    RECOUNT_INTERVAL,
    RECOUNT_MIN_GAP,
    REFUSAL_WARN_INTERVAL,
    UNCOUNTABLE,
    DescriptorBudget,
    DescriptorsExhausted,
    count_open_descriptors,
    raise_descriptor_limit,
)
from honk.core.clock import FakeClock
from honk.core.errors import CapacityRefused
from honk.core.stats import RuntimeStats


class OpenCount:
    """What /proc/self/fd would say: set by the test, and how often it was asked."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.asked = 0

    def __call__(self) -> int:
        self.asked += 1
        return self.value


def budget(
    in_use: int, *, limit: int = 1024, reserve: int = 256
) -> tuple[DescriptorBudget, OpenCount, FakeClock]:
    clock = FakeClock()
    count = OpenCount(in_use)
    return DescriptorBudget(clock, limit=limit, reserve=reserve, counter=count), count, clock


def test_flows_are_admitted_until_only_the_reserve_is_left() -> None:
    b, _count, _clock = budget(in_use=700)
    admitted = 0
    while b.admit():
        admitted += 1
    # 768 descriptors are the flows' share; 700 are in use, so 34 flows of two fit
    assert b.flow_share == 1024 - 256
    assert admitted == (768 - 700) // FLOW_DESCRIPTORS
    assert b.refused == 1


def test_a_refusal_recounts_first_so_flows_that_ended_free_their_share() -> None:
    b, count, clock = budget(in_use=767)
    assert not b.admit()
    count.value = 100  # the burst ended: most flows closed
    assert not b.admit()  # recounted a moment ago: the guess stands
    clock.advance(RECOUNT_MIN_GAP * 1.5)
    assert b.admit()
    assert count.asked == 2


def test_recounts_are_rate_limited_while_admitting() -> None:
    b, count, clock = budget(in_use=10)
    for _ in range(50):
        assert b.admit()
    assert count.asked == 1  # the guess grows by two per flow between counts
    clock.advance(RECOUNT_INTERVAL)
    assert b.admit()
    assert count.asked == 2
    assert b.in_use() == 10 + FLOW_DESCRIPTORS


def test_no_descriptor_to_count_with_refuses() -> None:
    def exhausted() -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    b = DescriptorBudget(FakeClock(), limit=1024, reserve=256, counter=exhausted)
    assert not b.admit()


def test_without_proc_the_budget_is_off_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="honk.connection")
    b, _count, clock = budget(in_use=UNCOUNTABLE)  # a chroot without /proc
    for _ in range(1000):
        assert b.admit()
        clock.advance(RECOUNT_INTERVAL)
    assert [r.getMessage() for r in caplog.records].count(
        "descriptor budget off: /proc/self/fd cannot be read, flows are not limited"
    ) == 1


def test_a_tiny_limit_still_leaves_flows_half_of_it() -> None:
    b, _count, _clock = budget(in_use=0, limit=64, reserve=256)
    assert b.reserve == 32
    assert b.flow_share == 32


def test_a_refusal_is_a_capacity_refusal_naming_the_flow_and_is_counted() -> None:
    clock = FakeClock()
    stats = RuntimeStats()
    b = DescriptorBudget(clock, limit=300, reserve=256, counter=lambda: 299, stats=stats)
    assert not b.admit()
    refusal = b.refusal("lan: 127.0.0.1:5000 -> 127.0.0.1:80")
    assert isinstance(refusal, DescriptorsExhausted)
    assert isinstance(refusal, CapacityRefused)  # a local refusal: no node is charged for it
    assert "lan: 127.0.0.1:5000 -> 127.0.0.1:80" in str(refusal)
    assert stats.descriptor_refusals == 1


def test_the_refusal_warning_is_rate_limited_and_says_how_many(caplog: pytest.LogCaptureFixture) -> None:
    b, _count, clock = budget(in_use=1000)
    caplog.set_level(logging.WARNING, logger="honk.connection")
    for _ in range(5):
        assert not b.admit()
    clock.advance(REFUSAL_WARN_INTERVAL)
    assert not b.admit()
    warnings = [r.getMessage() for r in caplog.records if "descriptor budget spent" in r.getMessage()]
    assert len(warnings) == 2
    assert "refused=1 " in warnings[0] and "refused=5 " in warnings[1]  # the four quiet ones are told


def test_the_open_count_is_this_process_s() -> None:
    before = count_open_descriptors()
    with open("/dev/null"), open("/dev/null"):
        assert count_open_descriptors() == before + 2


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = 256 if hard == resource.RLIM_INFINITY else min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        before, now = raise_descriptor_limit()
        assert before == lowered
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now
        assert now == hard or hard == resource.RLIM_INFINITY  # an unlimited hard limit may be refused
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_flows_that_ended_since_the_count_give_their_share_back_without_a_recount() -> None:
    clock = FakeClock()
    count = OpenCount(700)
    ended = [0]
    b = DescriptorBudget(clock, limit=1024, reserve=256, counter=count, ended=lambda: ended[0])
    admitted = 0
    while b.admit():
        admitted += 1
    assert admitted == 34
    ended[0] += 10  # ten tracked flows ended (their sockets are closed)
    for _ in range(10):
        assert b.admit()
    assert not b.admit()
    assert count.asked == 1  # no count was needed: the guess followed the flows
