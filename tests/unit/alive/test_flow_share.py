"""The flow-failure share, the strike probation and the revival that ends a node's strikes
(issue 32), on a fake clock."""

from __future__ import annotations

import uuid

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import (
    FLOW_FAILURE_MIN,
    FLOW_OUTCOME_SPAN,
    FLOW_OUTCOME_WINDOW,
    PROBE_COOLDOWN_MIN,
    PROBE_DEATH_THRESHOLD,
    REGISTRATION_GRACE,
    STRIKE_PROBATION_MAX,
    STRIKE_PROBATION_MIN,
)
from honk.core.clock import FakeClock

V4 = Family.V4
FLOW_GAP = 0.1  # seconds between flows: 10 flows/s, as the load


def rig() -> tuple[FakeClock, AliveDialerSet, uuid.UUID, list[uuid.UUID]]:
    clock = FakeClock()
    emergencies: list[uuid.UUID] = []
    alive = AliveDialerSet(clock, on_emergency=emergencies.append)
    node_id = uuid.uuid4()
    alive.register_node(node_id, "n")
    clock.advance(REGISTRATION_GRACE + 1)
    return clock, alive, node_id, emergencies


def flows(clock: FakeClock, alive: AliveDialerSet, node_id: uuid.UUID, pattern: str) -> None:
    """One flow per character: ``x`` failed, ``.`` answered."""
    for mark in pattern:
        alive.report_flow(node_id, mark == "x")
        clock.advance(FLOW_GAP)


def test_a_node_failing_every_other_flow_is_struck_although_no_two_failures_are_consecutive():
    clock, alive, node_id, emergencies = rig()
    flows(clock, alive, node_id, "x." * (FLOW_FAILURE_MIN - 1) + "x")
    assert alive.node(node_id).strikes == 1 and alive.demoted(node_id)
    assert emergencies == [node_id]  # the emergency probe lets liveness catch up
    assert alive.node(node_id).dial_failures == 0  # the consecutive streak never saw two


def test_a_node_failing_one_flow_in_five_is_never_struck():
    clock, alive, node_id, _ = rig()
    flows(clock, alive, node_id, ("x" + "." * 4) * (3 * FLOW_OUTCOME_WINDOW))  # 20 %: below the share
    assert alive.node(node_id).strikes == 0 and not alive.demoted(node_id)


def test_failures_older_than_the_span_leave_the_window():
    clock, alive, node_id, _ = rig()
    flows(clock, alive, node_id, "x" * (FLOW_FAILURE_MIN - 1))
    clock.advance(FLOW_OUTCOME_SPAN + 1)
    flows(clock, alive, node_id, "x")
    assert alive.node(node_id).strikes == 0


def test_the_window_starts_over_after_a_strike():
    clock, alive, node_id, _ = rig()
    flows(clock, alive, node_id, "x" * FLOW_FAILURE_MIN)
    assert alive.node(node_id).strikes == 1
    flows(clock, alive, node_id, "x" * (FLOW_FAILURE_MIN - 1))
    assert alive.node(node_id).strikes == 1
    flows(clock, alive, node_id, "x")
    assert alive.node(node_id).strikes == 2


def test_answered_flows_alone_change_nothing_that_ranks():
    clock, alive, node_id, _ = rig()
    before = alive.node_version(node_id)
    flows(clock, alive, node_id, "." * FLOW_OUTCOME_WINDOW)
    assert alive.node_version(node_id) == before  # cached picks stay valid


def _kill_by_probes(alive: AliveDialerSet, node_id: uuid.UUID) -> None:
    for _ in range(PROBE_DEATH_THRESHOLD[Domain.TCP]):
        alive.notify_check_failure(node_id, Domain.TCP, V4)
    assert not alive.tcp_alive(node_id, V4)


def test_a_revival_by_probes_clears_the_strikes_of_the_failure_that_killed_the_node():
    clock, alive, node_id, _ = rig()
    for _ in range(4):
        alive.record_dial_failure(node_id, V4)
    flows(clock, alive, node_id, "x" * FLOW_FAILURE_MIN)
    assert alive.node(node_id).strikes == 3
    _kill_by_probes(alive, node_id)
    clock.advance(PROBE_COOLDOWN_MIN)
    alive.notify_check_success(node_id, Domain.TCP, V4, 0.02)
    assert alive.demoted(node_id)  # one success does not revive (RECOVERY_SUCCESSES)
    alive.notify_check_success(node_id, Domain.TCP, V4, 0.02)
    assert alive.tcp_alive(node_id, V4)
    node = alive.node(node_id)
    assert (node.strikes, node.dial_failures, len(node.outcomes)) == (0, 0, 0)
    assert not alive.demoted(node_id)


def test_a_first_probe_success_of_an_unknown_node_keeps_its_strikes():
    clock, alive, node_id, _ = rig()
    alive.record_dial_failure(node_id, V4)
    alive.record_dial_failure(node_id, V4)
    alive.notify_check_success(node_id, Domain.TCP, V4, 0.02)  # unknown -> alive is no revival
    assert alive.node(node_id).strikes == 1


def _strike(alive: AliveDialerSet, node_id: uuid.UUID) -> None:
    """Two real dial failures in a row: one strike."""
    alive.record_dial_failure(node_id, V4)
    alive.record_dial_failure(node_id, V4)


def test_a_strike_demotes_for_its_probation_then_the_node_competes_again_with_its_strikes_pending():
    clock, alive, node_id, _ = rig()
    _strike(alive, node_id)
    assert alive.demoted(node_id)
    clock.advance(STRIKE_PROBATION_MIN - 0.1)
    assert alive.lapse_probations() == [] and alive.demoted(node_id)
    before = alive.node_version(node_id)
    clock.advance(0.1)
    assert alive.lapse_probations() == [node_id]
    assert not alive.demoted(node_id) and alive.node(node_id).strikes == 1  # pending, not demoting
    assert alive.node_version(node_id) > before  # cached picks see it compete again


def test_a_relapse_after_the_probation_doubles_it_up_to_the_cap():
    clock, alive, node_id, _ = rig()
    lengths = []
    for _ in range(8):
        _strike(alive, node_id)
        lengths.append(alive.node(node_id).probation)
        clock.advance(alive.node(node_id).probation)
        alive.lapse_probations()
    assert lengths == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert (STRIKE_PROBATION_MIN, STRIKE_PROBATION_MAX) == (5.0, 300.0)


def test_strikes_of_one_incident_restart_the_probation_without_doubling_it():
    clock, alive, node_id, _ = rig()
    for _ in range(5):  # the same outage's later flows
        _strike(alive, node_id)
        clock.advance(1.0)
    node = alive.node(node_id)
    assert (
        node.probation == STRIKE_PROBATION_MIN
        and node.demoted_until == clock.now() - 1.0 + STRIKE_PROBATION_MIN
    )


def test_lucky_successes_that_clear_the_strikes_do_not_reset_the_probation_only_quiet_minutes_do():
    # a node failing every other flow gets two successes in a row often: its strikes clear, but
    # its next strike still doubles the probation, or it would be back every few seconds
    clock, alive, node_id, _ = rig()
    for _ in range(3):
        _strike(alive, node_id)
        clock.advance(alive.node(node_id).probation)
        alive.lapse_probations()
    assert alive.node(node_id).probation == 20.0
    for _ in range(alive.node(node_id).strikes):  # max(strikes, 2) real successes in a row
        alive.report_dial_success(node_id, V4, 0.02)
    assert alive.node(node_id).strikes == 0 and not alive.demoted(node_id)
    _strike(alive, node_id)
    assert alive.node(node_id).probation == 40.0
    clock.advance(40.0 + STRIKE_PROBATION_MAX + 1)  # then five quiet minutes
    alive.lapse_probations()
    for _ in range(alive.node(node_id).strikes):
        alive.report_dial_success(node_id, V4, 0.02)
    _strike(alive, node_id)
    assert alive.node(node_id).probation == STRIKE_PROBATION_MIN
