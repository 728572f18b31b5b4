"""The runtime counters behind /metrics: bounded labels, histogram semantics, and what the health
runner records per probe (a scripted prober on a fake clock)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Family, ProbeError, ProbeSample
from honk.alive.runner import HealthRunner, UdpOutcome
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.core.clock import FakeClock
from honk.core.errors import (
    Blocked,
    CapacityRefused,
    DialError,
    DialTimeout,
    NoRoute,
    NotSupported,
    ProxyAuthFailed,
    TargetRefused,
)
from honk.core.stats import DIAL_ERROR_KINDS, PROBE_BUCKETS, Histogram, RuntimeStats, error_kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (DialTimeout("n", "connect", "slow"), "timeout"),
        (TargetRefused("n", 5, "refused"), "target_refused"),
        (ProxyAuthFailed("n", "bad password"), "proxy_auth"),
        (DialError("n", "connect", "refused"), "dial"),
        (CapacityRefused("no slot"), "capacity"),
        (Blocked("blocked"), "blocked"),
        (NoRoute("none"), "no_route"),
        (NotSupported("udp"), "not_supported"),
        (OSError("something else"), "other"),
    ],
)
def test_each_dial_failure_maps_to_its_most_specific_bounded_kind(error, kind):
    assert error_kind(error) == kind
    assert kind in DIAL_ERROR_KINDS


def test_dial_counters_are_keyed_by_network_result_and_kind_never_by_the_message():
    stats = RuntimeStats()
    stats.dial("tcp", None)
    stats.dial("tcp", DialError("node-a", "connect", "10.1.2.3:443 refused, password=hunter2"))
    stats.dial("tcp", DialError("node-b", "connect", "another message"))
    stats.dial("udp", DialTimeout("node-a", "connect", "slow"))
    assert stats.dials == {("tcp", "ok", ""): 1, ("tcp", "error", "dial"): 2, ("udp", "error", "timeout"): 1}


def test_histogram_buckets_are_upper_inclusive_and_cumulative_with_inf_last():
    histogram = Histogram()
    for seconds in (0.025, 0.026, 0.3, 10.0, 11.0):
        histogram.observe(seconds)
    cumulative = dict(histogram.cumulative())
    assert list(cumulative) == [*map(str, PROBE_BUCKETS), "+Inf"]
    assert cumulative["0.025"] == 1  # le is "less than or equal"
    assert cumulative["0.05"] == 2
    assert cumulative["0.5"] == 3
    assert cumulative["10.0"] == 4
    assert cumulative["+Inf"] == 5 == histogram.count
    assert histogram.total == pytest.approx(0.025 + 0.026 + 0.3 + 10.0 + 11.0)


def test_retain_groups_forgets_only_removed_groups():
    stats = RuntimeStats()
    stats.selection_changed("proxy", "tcp")
    stats.selection_changed("proxy", "udp")
    stats.selection_changed("gone", "tcp")
    stats.retain_groups({"proxy", "new"})
    assert stats.selection_changes == {("proxy", "tcp"): 1, ("proxy", "udp"): 1}


# --- what the health runner records ------------------------------------------------------------


class TimedProber:
    """Each probe takes ``took`` seconds of the fake clock and answers as scripted."""

    def __init__(self, clock: FakeClock, took: float) -> None:
        self.clock = clock
        self.took = took
        self.tcp: ProbeSample | ProbeError = ProbeSample(0.01)
        self.udp = UdpOutcome(ProbeSample(0.01))
        self.url: ProbeSample | ProbeError = ProbeSample(0.01)
        self.hold: asyncio.Event | None = None

    def families(self, node_id):
        return (Family.V4,)

    def udp_capable(self, node_id):
        return True

    async def _take(self):
        if self.hold is not None:
            await self.hold.wait()
        self.clock.advance(self.took)

    async def probe_tcp(self, node_id, family):
        await self._take()
        if isinstance(self.tcp, ProbeError):
            raise self.tcp
        return self.tcp

    async def probe_udp(self, node_id, family):
        await self._take()
        return self.udp

    async def probe_url(self, node_id, url, method=None):
        await self._take()
        if isinstance(self.url, ProbeError):
            raise self.url
        return self.url


def runner_with(prober: TimedProber, clock: FakeClock) -> HealthRunner:
    alive = AliveDialerSet(clock)
    alive.register_node(uuid.uuid4(), "n0")
    clock.advance(REGISTRATION_GRACE + 1)
    runner = HealthRunner(alive, prober, clock, check_interval=3600.0)
    runner.stats = RuntimeStats()
    return runner


async def test_the_runner_records_each_probe_duration_by_kind_and_result_on_its_clock():
    clock = FakeClock()
    prober = TimedProber(clock, took=0.3)
    prober.tcp = ProbeError("dial", "refused")
    prober.udp = UdpOutcome(ProbeError("dns", "timeout"), ProbeSample(0.2))  # DNS failed: an error round
    runner = runner_with(prober, clock)
    await runner.run_cycle()
    probes = runner.stats.probes
    assert set(probes) == {("tcp", "error"), ("udp", "error")}
    tcp = probes[("tcp", "error")]
    assert tcp.count == 1 and tcp.total == pytest.approx(0.3)
    assert dict(tcp.cumulative())["0.25"] == 0 and dict(tcp.cumulative())["0.5"] == 1

    prober.tcp, prober.udp, prober.took = ProbeSample(0.01), UdpOutcome(ProbeSample(0.01)), 0.04
    await runner.run_cycle()
    assert probes[("tcp", "ok")].count == 1 and probes[("tcp", "ok")].total == pytest.approx(0.04)
    assert probes[("udp", "ok")].count == 1


async def test_a_cancelled_probe_records_nothing_and_a_runner_without_stats_records_nowhere():
    clock = FakeClock()
    prober = TimedProber(clock, took=0.1)
    prober.hold = asyncio.Event()
    runner = runner_with(prober, clock)
    runner.run_cycle()
    for _ in range(5):
        await asyncio.sleep(0)
    assert runner.in_flight > 0
    await runner.cancel_probes()
    assert runner.stats.probes == {}

    bare = runner_with(TimedProber(clock, took=0.1), clock)
    bare.stats = None
    await bare.run_cycle()  # nothing to record into: the probes still run and publish
    assert bare.probes_run == 2
