"""Probe scheduling (requirements areas E and F): periodic, recovery, emergency, network
change, idle sleep, admission bound, stale generations; a fake clock and a scripted prober."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from honk.alive.group_checks import GroupCheck, GroupChecks
from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family, ProbeError, ProbeSample
from honk.alive.runner import HealthRunner, UdpOutcome
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.spec import Policy
from honk.core.clock import FakeClock

V4, V6 = Family.V4, Family.V6
TCP, DNS, DATA = Domain.TCP, Domain.DNS_UDP, Domain.DATA_UDP
FAIL = ProbeError("dial", "refused")


class ScriptedProber:
    """Answers from ``results`` (default: success in 10 ms); records every call; ``gate`` holds probes."""

    def __init__(self, udp: bool = False, families: tuple[Family, ...] = (V4,)) -> None:
        self.udp = udp
        self.fams = families
        self.tcp: dict[uuid.UUID, ProbeSample | ProbeError] = {}
        self.udp_results: dict[uuid.UUID, UdpOutcome] = {}
        self.url_results: dict[uuid.UUID, ProbeSample | ProbeError] = {}
        self.calls: list[tuple[str, uuid.UUID, object]] = []
        self.gate: asyncio.Event | None = None
        self.instant = False  # answer without yielding to the loop at all
        self.in_flight = 0
        self.peak = 0

    def families(self, node_id):
        return self.fams

    def udp_capable(self, node_id):
        return self.udp

    async def _hold(self):
        if self.instant:
            return
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
        finally:
            self.in_flight -= 1

    async def probe_tcp(self, node_id, family):
        self.calls.append(("tcp", node_id, family))
        await self._hold()
        result = self.tcp.get(node_id, ProbeSample(0.010))
        if isinstance(result, ProbeError):
            raise result
        return result

    async def probe_udp(self, node_id, family):
        self.calls.append(("udp", node_id, family))
        await self._hold()
        return self.udp_results.get(node_id, UdpOutcome(ProbeSample(0.020)))

    async def probe_url(self, node_id, url, method=None):
        self.calls.append(("url", node_id, url))
        await self._hold()
        result = self.url_results.get(node_id, ProbeSample(0.030))
        if isinstance(result, ProbeError):
            raise result
        return result

    def count(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.calls if k == kind)


@pytest.fixture
def clock():
    return FakeClock()


def make(clock, prober, n=1, interval=30.0, **kw):
    alive = AliveDialerSet(clock)
    ids = [uuid.uuid4() for _ in range(n)]
    for i, node in enumerate(ids):
        alive.register_node(node, f"n{i}")
    clock.advance(REGISTRATION_GRACE + 1)
    return alive, HealthRunner(alive, prober, clock, check_interval=interval, **kw), ids


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


async def test_periodic_cycles_run_every_check_interval(clock):
    prober = ScriptedProber()
    _, runner, ids = make(clock, prober, n=3)
    runner.start()
    await settle()
    assert prober.count("tcp") == 3
    clock.advance(29.9)
    await settle()
    assert prober.count("tcp") == 3
    clock.advance(0.1)
    await settle()
    assert prober.count("tcp") == 6
    await runner.stop()


async def test_recovery_tick_is_five_seconds_for_a_thirty_second_interval(clock):
    prober = ScriptedProber()
    _, runner, _ = make(clock, prober)
    assert runner.recovery_tick == 5.0
    _, fast, _ = make(clock, prober, interval=2.0)
    assert fast.recovery_tick == 2.0


async def test_dead_state_is_probed_on_its_growing_cooldown_forever(clock):
    """GH-E-06 with suggested test 3: recovery probes at 5, 10, 20 ... 300, 300 s."""
    prober = ScriptedProber()
    alive, runner, (node,) = make(clock, prober, interval=30.0)
    for _ in range(3):
        alive.notify_check_failure(node, TCP, V4)
    prober.tcp[node] = FAIL
    runner.start()
    await settle()  # the first periodic cycle skips the dead state
    assert prober.count("tcp") == 0
    probe_times = []
    start = clock.now()
    for _ in range(int(2000 / 5)):  # 2,000 s of recovery ticks
        clock.advance(5.0)
        await settle()
        while prober.count("tcp") > len(probe_times):
            probe_times.append(clock.now() - start)
    gaps = [b - a for a, b in zip([0.0, *probe_times], probe_times, strict=False)]
    assert gaps[:7] == [5, 10, 20, 40, 80, 160, 300]
    assert gaps[7:] == [300] * len(gaps[7:]) and len(gaps) >= 9
    assert alive.status(node, TCP, V4) is Status.DEAD
    prober.tcp[node] = ProbeSample(0.01)
    clock.advance(300)
    await settle()
    assert alive.status(node, TCP, V4) is Status.DEAD  # one success is not enough
    clock.advance(300)
    await settle()
    assert alive.status(node, TCP, V4) is Status.ALIVE
    await runner.stop()


async def test_network_change_probes_dead_states_at_once_and_one_success_revives(clock):
    prober = ScriptedProber()
    alive, runner, (node,) = make(clock, prober)
    for _ in range(3):
        alive.notify_check_failure(node, TCP, V4)
    runner.network_changed("link")
    await settle()
    assert prober.calls == [("tcp", node, V4)]
    assert alive.status(node, TCP, V4) is Status.ALIVE


async def test_emergency_probe_runs_tcp_now(clock):
    prober = ScriptedProber(families=(V4, V6))
    _, runner, (node,) = make(clock, prober)
    runner.emergency([node, uuid.uuid4()])  # an unknown node is ignored
    await settle()
    assert sorted(prober.calls, key=str) == sorted([("tcp", node, V4), ("tcp", node, V6)], key=str)


async def test_admission_bound_holds_and_duplicate_jobs_are_not_queued(clock):
    prober = ScriptedProber()
    prober.gate = asyncio.Event()
    _, runner, ids = make(clock, prober, n=40, concurrency=4)
    done = runner.run_cycle()
    runner.run_cycle()  # the same jobs again: all already queued or running
    runner.emergency(ids)
    await settle()
    assert prober.in_flight == 4 and runner.queued == 36
    prober.gate.set()
    await asyncio.wait_for(done, 5)
    assert prober.count("tcp") == 40 and prober.peak == 4 and runner.peak_in_flight == 4


async def test_stop_cancels_running_probes_and_publishes_nothing(clock):
    prober = ScriptedProber()
    prober.gate = asyncio.Event()
    prober.tcp = {}
    alive, runner, ids = make(clock, prober, n=10, concurrency=3)
    runner.start()
    await settle()
    assert prober.in_flight == 3
    await runner.stop()
    assert prober.in_flight == 0 and runner.in_flight == 0 and runner.queued == 0
    assert alive.open_tickets == 0
    assert all(alive.history(n, TCP, V4) == [] for n in ids)
    runner.run_cycle()  # a stopped runner takes no work
    await settle()
    assert prober.count("tcp") == 3


async def test_a_probe_that_outlives_a_reload_publishes_nothing(clock):
    """GH-E-22, suggested test 8: generation 1's result after generation 2 is published."""
    prober = ScriptedProber()
    prober.gate = asyncio.Event()
    alive, runner, (node,) = make(clock, prober)
    runner.run_cycle()
    await settle()
    ticket = next(iter(runner._running.values()))
    alive.next_generation()
    prober.gate.set()
    await settle()
    assert alive.history(node, TCP, V4) == []
    assert not alive.is_current(ticket)


async def test_reload_cancels_queued_and_running_probes(clock):
    prober = ScriptedProber()
    prober.gate = asyncio.Event()
    alive, runner, ids = make(clock, prober, n=6, concurrency=2)
    runner.run_cycle()
    await settle()
    generation = alive.generation
    await runner.reload(ScriptedProber())
    assert alive.generation == generation + 1 and runner.queued == 0 and runner.in_flight == 0


# --- UDP: DNS plus QUIC (GH-F-20, GH-F-21; F suggested test 5) ---------------------------------------


async def udp_round(clock, outcome: UdpOutcome, rounds: int = 1):
    prober = ScriptedProber(udp=True)
    alive, runner, (node,) = make(clock, prober)
    prober.udp_results[node] = outcome
    for _ in range(rounds):
        await asyncio.wait_for(runner.run_cycle(), 5)
    return alive, node


async def test_dns_failure_with_quic_success_fails_only_dns_udp(clock):
    alive, node = await udp_round(clock, UdpOutcome(FAIL, ProbeSample(0.05)), rounds=3)
    assert alive.status(node, DNS, V4) is Status.DEAD
    assert alive.status(node, DATA, V4) is Status.ALIVE
    assert alive.status(node, TCP, V4) is Status.ALIVE  # the TCP job of the same cycles
    assert alive.udp_selectable(node, V4)


async def test_dns_and_quic_failing_fail_both_udp_domains(clock):
    alive, node = await udp_round(clock, UdpOutcome(FAIL, FAIL))
    state = alive.node(node)
    assert state.state(DNS, V4).probe_failures == 1 and state.state(DATA, V4).probe_failures == 1


async def test_dns_success_marks_both_udp_domains_alive(clock):
    alive, node = await udp_round(clock, UdpOutcome(ProbeSample(0.02)))
    assert alive.status(node, DNS, V4) is Status.ALIVE and alive.status(node, DATA, V4) is Status.ALIVE


async def test_dns_probe_never_touches_tcp(clock):
    prober = ScriptedProber(udp=True)
    alive, runner, (node,) = make(clock, prober)
    prober.udp_results[node] = UdpOutcome(FAIL)
    prober.tcp[node] = ProbeSample(0.01)
    for _ in range(3):
        await asyncio.wait_for(runner.run_cycle(), 5)
    assert alive.status(node, TCP, V4) is Status.ALIVE
    assert alive.status(node, DNS, V4) is Status.DEAD and alive.status(node, DATA, V4) is Status.DEAD


async def test_a_quic_success_revives_dead_data_udp(clock):
    prober = ScriptedProber(udp=True)
    alive, runner, (node,) = make(clock, prober)
    prober.udp_results[node] = UdpOutcome(FAIL, FAIL)
    for _ in range(3):
        await asyncio.wait_for(runner.run_cycle(), 5)
    assert alive.status(node, DATA, V4) is Status.DEAD
    prober.udp_results[node] = UdpOutcome(FAIL, ProbeSample(0.04))
    for _ in range(2):
        clock.advance(alive.node(node).state(DATA, V4).due_at - clock.now())
        await asyncio.wait_for(runner.run_recovery(), 5)
    assert alive.status(node, DATA, V4) is Status.ALIVE
    assert alive.status(node, DNS, V4) is Status.DEAD


# --- URLTest idle sleep (GH-F-24; F suggested test 7) ----------------------------------------------------


async def test_idle_urltest_group_stops_probing_until_selected_again(clock):
    prober = ScriptedProber()
    alive, runner, (a, b) = make(clock, prober, n=2)
    runner.set_demand(always=[b], urltest={"auto": (None, [a])})
    runner.start()
    await settle()
    assert Counter(n for _, n, _ in prober.calls) == {a: 1, b: 1}
    for _ in range(60):  # 30 minutes of cycles without a selection
        clock.advance(30)
        await settle()
    before = Counter(n for _, n, _ in prober.calls)
    clock.advance(30 * 10)
    for _ in range(10):
        clock.advance(30)
        await settle()
    after = Counter(n for _, n, _ in prober.calls)
    assert after[a] == before[a]  # asleep
    assert after[b] > before[b]  # a non-URLTest demand never sleeps
    runner.note_selection("auto")
    await settle()
    assert Counter(n for _, n, _ in prober.calls)[a] == before[a] + 1  # woken at once
    await runner.stop()


async def test_a_configured_idle_timeout_is_honoured(clock):
    prober = ScriptedProber()
    _, runner, (a,) = make(clock, prober)
    runner.set_demand(always=[], urltest={"auto": (120.0, [a])})
    assert runner.wanted_nodes() == [a]
    clock.advance(119)
    assert runner.wanted_nodes() == [a]
    clock.advance(1)
    assert runner.wanted_nodes() == []
    runner.note_selection("auto")
    assert runner.wanted_nodes() == [a]


# --- per-group check_url (GH-F-22, GH-F-23; F suggested tests 6 and C suggested test 7) ---------------------


def check(group, url, members, policy=Policy.URLTEST):
    return GroupCheck(group, policy, url, lambda: list(members()))


async def test_group_check_url_failures_remove_the_member_only_from_that_group(clock):
    prober = ScriptedProber()
    alive, runner, (m,) = make(clock, prober)
    checks = runner.group_checks
    checks.sync_group_check_urls([check("g1", "http://u/", lambda: [("m", m)])])
    prober.url_results[m] = FAIL
    for _ in range(3):
        await asyncio.wait_for(runner.run_cycle(), 5)
    assert not checks.member_alive("g1", "m")
    assert checks.member_alive("g2", "m")
    assert alive.status(m, TCP, V4) is Status.ALIVE  # node health is the global probe's business
    prober.url_results[m] = ProbeSample(0.01)
    for _ in range(2):
        clock.advance(300)
        await asyncio.wait_for(runner.run_recovery(), 5)
    assert checks.member_alive("g1", "m")


async def test_selector_check_url_is_ignored_with_a_warning(clock, caplog):
    checks = GroupChecks(clock)
    checks.sync_group_check_urls([check("sel", "http://u/", lambda: [("m", uuid.uuid4())], Policy.SELECTOR)])
    assert checks.groups == () and checks.members_to_probe(due_only=False) == []
    assert "check_url is ignored" in caplog.text


async def test_a_subgroup_member_is_probed_through_its_current_pick_and_recorded_under_its_tag(clock):
    prober = ScriptedProber()
    _, runner, (n1, n2) = make(clock, prober, n=2)
    pick = {"s": n2}
    runner.group_checks.sync_group_check_urls([check("p", "http://u/", lambda: [("s", pick["s"])])])
    await asyncio.wait_for(runner.run_cycle(), 5)
    pick["s"] = n1
    await asyncio.wait_for(runner.run_cycle(), 5)
    assert [(n, u) for k, n, u in prober.calls if k == "url"] == [(n2, "http://u/"), (n1, "http://u/")]
    assert len(runner.group_checks.history("s", "http://u/")) == 2


async def test_reload_replaces_the_group_url_registry(clock):
    checks = GroupChecks(clock)
    m = uuid.uuid4()
    checks.sync_group_check_urls([check("g", "http://old/", lambda: [("m", m)])])
    for _ in range(3):
        checks.notify("m", "http://old/", None)
    assert not checks.member_alive("g", "m")
    checks.sync_group_check_urls([check("g", "http://new/", lambda: [("m", m)])])
    assert checks.member_alive("g", "m")
    assert checks.history("m", "http://old/") == []


async def test_a_cycle_queued_right_after_another_finished_still_runs(clock):
    """Workers that just saw the queue empty must not count as staff for the next cycle."""
    prober = ScriptedProber()
    prober.instant = True
    _, runner, _ = make(clock, prober, n=20)
    async with asyncio.timeout(5):  # awaited directly: no extra loop turn between cycles
        for _ in range(3):
            await runner.run_cycle()
    assert prober.count("tcp") == 60
