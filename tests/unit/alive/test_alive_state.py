"""The health state machine (requirements area E), on a fake clock."""

from __future__ import annotations

import uuid

import pytest

from honk._fast.ring import SYNTHETIC_PLACEHOLDER
from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import (
    PROBE_COOLDOWN_MAX,
    PROBE_COOLDOWN_MIN,
    PROBE_DEATH_THRESHOLD,
    REGISTRATION_GRACE,
    TRAFFIC_DEATH_THRESHOLD,
)
from honk.core.clock import FakeClock

V4, V6 = Family.V4, Family.V6
TCP, DNS, DATA = Domain.TCP, Domain.DNS_UDP, Domain.DATA_UDP


class Deaths(list):
    def __call__(self, node_id: uuid.UUID, name: str) -> None:
        self.append((node_id, name))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def deaths() -> Deaths:
    return Deaths()


@pytest.fixture
def alive(clock: FakeClock, deaths: Deaths) -> AliveDialerSet:
    return AliveDialerSet(clock, on_dead=deaths)


def settled(alive: AliveDialerSet, clock: FakeClock, name: str = "n") -> uuid.UUID:
    """A node registered long enough ago to be out of its grace period."""
    node_id = uuid.uuid4()
    alive.register_node(node_id, name)
    clock.advance(REGISTRATION_GRACE + 1)
    return node_id


def fail_probes(
    alive: AliveDialerSet, node_id: uuid.UUID, domain: Domain, n: int, family: Family = V4
) -> None:
    for _ in range(n):
        alive.notify_check_failure(node_id, domain, family)


# --- GH-E-01, GH-E-02 -------------------------------------------------------------------------


def test_two_nodes_with_the_same_name_never_share_health(alive, clock):
    a, b = uuid.uuid4(), uuid.uuid4()
    alive.register_node(a, "same")
    alive.register_node(b, "same")
    clock.advance(REGISTRATION_GRACE + 1)
    fail_probes(alive, a, TCP, 3)
    assert alive.status(a, TCP, V4) is Status.DEAD
    assert alive.status(b, TCP, V4) is Status.UNKNOWN


def test_the_six_states_of_a_node_are_independent(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3, V6)
    assert alive.status(node, TCP, V6) is Status.DEAD
    for domain in Domain:
        for family in Family:
            if (domain, family) != (TCP, V6):
                assert alive.status(node, domain, family) is Status.UNKNOWN


# --- GH-E-03, GH-E-04: thresholds per source (suggested test 1) ----------------------------------


def test_third_tcp_probe_failure_kills_and_two_do_not(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, PROBE_DEATH_THRESHOLD[TCP] - 1)
    assert alive.tcp_alive(node, V4)
    fail_probes(alive, node, TCP, 1)
    assert not alive.tcp_alive(node, V4)


def test_tenth_tcp_traffic_failure_kills_and_nine_do_not(alive, clock):
    node = settled(alive, clock)
    for _ in range(TRAFFIC_DEATH_THRESHOLD[TCP] - 1):
        alive.report_traffic_failure(node, TCP, V4)
    assert alive.tcp_alive(node, V4)
    alive.report_traffic_failure(node, TCP, V4)
    assert not alive.tcp_alive(node, V4)
    assert TRAFFIC_DEATH_THRESHOLD[TCP] == 10


def test_data_udp_needs_fifty_traffic_failures_or_three_probe_failures(alive, clock):
    a = settled(alive, clock, "a")
    for _ in range(49):
        alive.report_traffic_failure(a, DATA, V4)
    assert alive.status(a, DATA, V4) is not Status.DEAD
    alive.report_traffic_failure(a, DATA, V4)
    assert alive.status(a, DATA, V4) is Status.DEAD
    b = settled(alive, clock, "b")
    fail_probes(alive, b, DATA, 3)
    assert alive.status(b, DATA, V4) is Status.DEAD


def test_dns_udp_dies_after_three_traffic_failures(alive, clock):
    node = settled(alive, clock)
    for _ in range(3):
        alive.report_traffic_failure(node, DNS, V4)
    assert alive.status(node, DNS, V4) is Status.DEAD


def test_probe_and_traffic_failures_never_add_up(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 2)
    for _ in range(9):
        alive.report_traffic_failure(node, TCP, V4)
    assert alive.tcp_alive(node, V4)


def test_a_success_resets_only_its_own_source(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 2)
    alive.report_traffic_success(node, TCP, V4)  # traffic success does not reset the probe count
    fail_probes(alive, node, TCP, 1)
    assert not alive.tcp_alive(node, V4)
    other = settled(alive, clock, "other")
    fail_probes(alive, other, TCP, 2)
    alive.notify_check_success(other, TCP, V4, 0.05)
    fail_probes(alive, other, TCP, 2)
    assert alive.tcp_alive(other, V4)  # the counts are consecutive


# --- GH-E-09: grace (suggested test 2) -----------------------------------------------------------


def test_failures_in_the_grace_period_are_recorded_but_do_not_kill(alive, clock):
    node = uuid.uuid4()
    alive.register_node(node, "n")
    for at in (10, 10, 10):  # t = 10, 20, 30
        clock.advance(at)
        alive.notify_check_failure(node, TCP, V4)
    assert alive.tcp_alive(node, V4)
    assert [failed for _, _, failed in alive.history(node, TCP, V4)] == [True, True, True]
    clock.advance(31)  # t = 61
    alive.notify_check_failure(node, TCP, V4)
    clock.advance(1)
    alive.notify_check_failure(node, TCP, V4)
    assert alive.tcp_alive(node, V4)
    clock.advance(1)  # t = 63
    alive.notify_check_failure(node, TCP, V4)
    assert not alive.tcp_alive(node, V4)


def test_a_forced_failure_counts_during_grace(alive, clock):
    node = uuid.uuid4()
    alive.register_node(node, "n")
    for _ in range(3):
        alive.notify_check_failure(node, TCP, V4, force=True)
    assert not alive.tcp_alive(node, V4)


def test_reregistering_keeps_state_and_grace_start(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    assert alive.register_node(node, "renamed") is False
    assert not alive.tcp_alive(node, V4)
    assert alive.node(node).name == "renamed"


# --- GH-E-05, GH-E-06, GH-E-07: cooldown and recovery ---------------------------------------------


def test_cooldown_doubles_from_five_seconds_to_the_cap_and_stays_there(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    waits = []
    for _ in range(9):
        state = alive.node(node).state(TCP, V4)
        waits.append(state.due_at - clock.now())
        assert alive.due_for_recovery() == []
        clock.advance(waits[-1])
        assert alive.due_for_recovery() == [(node, TCP, V4)]
        alive.notify_check_failure(node, TCP, V4)
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert waits[0] == PROBE_COOLDOWN_MIN and max(waits) == PROBE_COOLDOWN_MAX


def test_two_consecutive_successes_revive_and_one_does_not(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    alive.notify_check_success(node, TCP, V4, 0.03)
    assert not alive.tcp_alive(node, V4)
    alive.notify_check_failure(node, TCP, V4)  # the run of successes restarts
    alive.notify_check_success(node, TCP, V4, 0.03)
    assert not alive.tcp_alive(node, V4)
    alive.notify_check_success(node, TCP, V4, 0.03)
    assert alive.tcp_alive(node, V4)
    assert alive.node(node).state(TCP, V4).cooldown == 0


def test_a_revived_state_needs_three_new_failures_to_die_again(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    alive.notify_check_success(node, TCP, V4, 0.03)
    alive.notify_check_success(node, TCP, V4, 0.03)
    fail_probes(alive, node, TCP, 2)
    assert alive.tcp_alive(node, V4)


# --- GH-E-08: network change (suggested test 4) ---------------------------------------------------


def test_network_change_clears_cooldown_and_one_success_revives(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    for _ in range(7):  # into the 300 s cooldown
        clock.advance(alive.node(node).state(TCP, V4).due_at - clock.now())
        alive.notify_check_failure(node, TCP, V4)
    assert alive.node(node).state(TCP, V4).cooldown == PROBE_COOLDOWN_MAX
    assert alive.due_for_recovery() == []
    assert alive.notify_network_change() == [(node, TCP, V4)]
    assert alive.due_for_recovery() == [(node, TCP, V4)]
    alive.notify_check_success(node, TCP, V4, 0.02)
    assert alive.tcp_alive(node, V4)


# --- GH-E-15, GH-E-16: the death callback and the UDP sibling rule ----------------------------------


def test_alive_to_dead_calls_back_once_with_node_id_and_name(alive, clock, deaths):
    node = settled(alive, clock, "tokyo")
    fail_probes(alive, node, TCP, 5)
    assert deaths == [(node, "tokyo")]


def test_dns_udp_death_with_data_udp_alive_dies_but_purges_nothing(alive, clock, deaths):
    node = settled(alive, clock)
    alive.notify_check_success(node, DATA, V4, 0.04)
    fail_probes(alive, node, DNS, 3)
    assert alive.status(node, DNS, V4) is Status.DEAD
    assert deaths == []
    assert alive.udp_selectable(node, V4)


def test_dns_udp_death_without_a_live_sibling_purges(alive, clock, deaths):
    node = settled(alive, clock)
    fail_probes(alive, node, DNS, 3)
    assert deaths == [(node, "n")]


def test_the_sibling_rule_is_per_family(alive, clock, deaths):
    node = settled(alive, clock)
    alive.notify_check_success(node, DATA, V6, 0.04)
    fail_probes(alive, node, DNS, 3, V4)
    assert deaths == [(node, "n")]


# --- GH-D-05, GH-D-06: UDP eligibility from the states ------------------------------------------------


@pytest.mark.parametrize("data", ["alive", "dead", None])
@pytest.mark.parametrize("dns", ["alive", "dead", None])
@pytest.mark.parametrize("tcp", ["alive", "dead"])
def test_udp_liveness_matrix(alive, clock, data, dns, tcp):
    node = settled(alive, clock)
    for domain, want in ((DATA, data), (DNS, dns), (TCP, tcp)):
        if want == "alive":
            alive.notify_check_success(node, domain, V4, 0.01)
        elif want == "dead":
            fail_probes(alive, node, domain, 3)
    if "alive" in (data, dns):
        expected = True
    elif data is None and dns is None:
        expected = tcp == "alive"
    else:
        expected = False  # a UDP domain is known dead and none is known to work
    assert alive.udp_selectable(node, V4) is expected
    assert alive.has_udp_state(node, V4) is (data is not None or dns is not None)


def test_udp_state_is_per_family(alive, clock):
    node = settled(alive, clock)
    fail_probes(alive, node, DNS, 3, V4)
    fail_probes(alive, node, DATA, 3, V4)
    alive.notify_check_success(node, TCP, V6, 0.01)
    assert not alive.udp_selectable(node, V4)
    assert alive.udp_selectable(node, V6)
    assert not alive.has_udp_state(node, V6)
    assert alive.has_udp_state(node)


# --- GH-E-10, GH-E-11, GH-E-13: histories ------------------------------------------------------------


def test_probe_history_keeps_the_newest_hundred_with_wall_times(alive, clock):
    node = settled(alive, clock)
    for i in range(130):
        clock.advance(1)
        alive.notify_check_success(node, TCP, V4, i / 1000)
    history = alive.history(node, TCP, V4)
    assert len(history) == 100
    assert history[0][1] == pytest.approx(0.030) and history[-1][1] == pytest.approx(0.129)
    assert history[-1][0] == clock.wall()


def test_two_dial_failures_add_a_flagged_placeholder_never_shown_as_last_sample(alive, clock):
    node = settled(alive, clock)
    alive.notify_check_success(node, TCP, V4, 0.08)
    assert alive.record_dial_failure(node, V4) == 0  # strikes
    assert alive.record_dial_failure(node, V4) == 1
    ring = alive.node(node).latencies
    assert ring.last()[1:] == (SYNTHETIC_PLACEHOLDER, True)
    assert ring.last_real_sample()[1] == pytest.approx(0.08)
    assert alive.last_real_delays()[node][0] == pytest.approx(0.08)
    assert alive.average(node, TCP, V4) == pytest.approx(0.08)  # the placeholder never ranks
    alive.report_dial_success(node, V4)
    assert alive.record_dial_failure(node, V4) == 1  # a new streak: no strike until it reaches 2 again
    assert alive.record_dial_failure(node, V4) == 2


def test_a_delay_test_is_history_only(alive, clock):
    node = settled(alive, clock)
    for _ in range(5):
        alive.record_delay_test(node, V4, None)
    assert alive.tcp_alive(node, V4)
    assert alive.node(node).dial_failures == 0
    assert [failed for _, _, failed in alive.history(node, TCP, V4)] == [True] * 5


# --- GH-E-12: persistence inputs ------------------------------------------------------------------------


def test_restored_delays_fill_display_only(alive, clock):
    node = uuid.uuid4()
    alive.register_node(node, "n")
    assert alive.restore_delays({node: (0.08, clock.wall() - 100)}) == 1
    assert alive.node(node).latencies.last_real_sample()[1] == pytest.approx(0.08)
    assert alive.status(node, TCP, V4) is Status.UNKNOWN
    assert not alive.has_udp_state(node)


# --- GH-E-22: stale and cancelled results ------------------------------------------------------------------


def test_a_result_from_a_previous_generation_publishes_nothing(alive, clock):
    node = settled(alive, clock)
    ticket = alive.issue_ticket()
    alive.next_generation()
    assert alive.notify_check_failure(node, TCP, V4, ticket) is False
    assert alive.history(node, TCP, V4) == []


def test_a_retired_ticket_publishes_nothing(alive, clock):
    node = settled(alive, clock)
    ticket = alive.issue_ticket()
    alive.retire_ticket(ticket)
    assert alive.notify_check_success(node, TCP, V4, 0.01, ticket) is False
    assert alive.status(node, TCP, V4) is Status.UNKNOWN


def test_listeners_hear_every_liveness_change(alive, clock):
    heard = []
    alive.subscribe(lambda nid, d, f, up: heard.append((d, f, up)))
    node = settled(alive, clock)
    fail_probes(alive, node, TCP, 3)
    alive.notify_check_success(node, TCP, V4, 0.01)
    alive.notify_check_success(node, TCP, V4, 0.01)
    assert heard == [(TCP, V4, False), (TCP, V4, True)]
