"""Recovery quorum, per-cell credit and availability cohorts (GH-K-17, GH-K-36..45)."""

from __future__ import annotations

from honk.group.score.cohort import Cohorts, Credit, FailResult, Kind, Reporter
from honk.group.score.constants import COHORT_GAP, RECOVERY_LEASE

T1 = ("node-a", "t1.example:443")
T2 = ("node-a", "t2.example:443")
NODE_FAILURE = "episode-1"


def _traffic(cohorts: Cohorts, cell, reporter: Reporter, now: float) -> Credit:
    cohorts.tx(cell, reporter, now)
    return cohorts.rx(cell, reporter, now, kind=Kind.TRAFFIC)


def _failed_at_zero() -> Cohorts:
    cohorts = Cohorts()
    for cell in (T1, T2):
        assert cohorts.fail(cell, 0.0, episode=NODE_FAILURE) is FailResult.OPENED
    return cohorts


def test_recovery_quorum_and_per_cell_credit() -> None:
    """Suggested test 2, verbatim."""
    cohorts = _failed_at_zero()
    r1, r2, r3, r4 = (Reporter(f"r{i}") for i in range(1, 5))
    failures_before = (cohorts.failures(T1), cohorts.failures(T2))

    for reporter, t in ((r1, 5.0), (r2, 10.0), (r3, 15.0)):
        assert _traffic(cohorts, T1, reporter, t) is Credit.COUNTED
    assert cohorts.open_episode(T1) == NODE_FAILURE

    clone = r1.clone("r1-clone")
    assert _traffic(cohorts, T1, clone, 16.0) is Credit.REFRESHED
    assert cohorts.open_episode(T1) == NODE_FAILURE
    assert cohorts.reporters(T1, 16.0) == 3

    # Probes and warm-up in between never clear anything, on either cell.
    prober = Reporter("probe")
    for cell in (T1, T2):
        cohorts.tx(cell, prober, 17.0)
        assert cohorts.rx(cell, prober, 17.0, kind=Kind.PROBE) is Credit.IGNORED
        assert cohorts.rx(cell, prober, 18.0, kind=Kind.WARMUP) is Credit.IGNORED
    assert cohorts.open_episode(T1) == NODE_FAILURE

    # RX reported before any TX does not count.
    eager = Reporter("rx-before-tx")
    assert cohorts.rx(T1, eager, 19.0, kind=Kind.TRAFFIC) is Credit.IGNORED
    assert cohorts.reporters(T1, 19.0) == 3

    assert _traffic(cohorts, T1, r4, 20.0) is Credit.RECOVERED
    assert cohorts.open_episode(T1) is None
    assert cohorts.lease_valid(T1, 79.9)
    assert not cohorts.lease_valid(T1, 20.0 + RECOVERY_LEASE)
    assert (cohorts.failures(T1), cohorts.failures(T2)) == failures_before

    # T2 is still open until its own four reporters arrive.
    assert cohorts.open_episode(T2) == NODE_FAILURE
    assert not cohorts.lease_valid(T2, 21.0)
    for i, t in enumerate((21.0, 22.0, 23.0), start=1):
        assert _traffic(cohorts, T2, Reporter(f"s{i}"), t) is Credit.COUNTED
    assert cohorts.open_episode(T2) == NODE_FAILURE
    assert _traffic(cohorts, T2, Reporter("s4"), 24.0) is Credit.RECOVERED
    assert cohorts.open_episode(T2) is None


def _cohort_with_fourth_at(fourth: float) -> tuple[Cohorts, float]:
    cohorts = Cohorts()
    for i, t in enumerate((0.0, 5.0, 10.0, fourth), start=1):
        _traffic(cohorts, T1, Reporter(f"r{i}"), t)
    return cohorts, fourth


def test_availability_cohort_gap() -> None:
    """Suggested test 3, verbatim: a 61 s silence resets the cohort, a 40 s one does not."""
    cohorts, now = _cohort_with_fourth_at(71.0)
    assert not cohorts.observed_usable(T1, now)
    assert cohorts.reporters(T1, now) == 1

    cohorts, now = _cohort_with_fourth_at(50.0)
    assert cohorts.observed_usable(T1, now)


def test_gap_of_exactly_cohort_gap_resets() -> None:
    cohorts, now = _cohort_with_fourth_at(10.0 + COHORT_GAP)
    assert not cohorts.observed_usable(T1, now)


def test_usable_cohort_expires_without_new_rx() -> None:
    cohorts, _ = _cohort_with_fourth_at(15.0)
    assert cohorts.observed_usable(T1, 15.0 + COHORT_GAP - 0.1)
    assert not cohorts.observed_usable(T1, 15.0 + COHORT_GAP)


def test_later_rx_refreshes_cohort_event_time() -> None:
    cohorts, _ = _cohort_with_fourth_at(15.0)
    r1 = Reporter("r1")
    assert cohorts.rx(T1, r1, 70.0, kind=Kind.TRAFFIC) is Credit.REFRESHED
    assert cohorts.observed_usable(T1, 129.0)


def test_one_returning_reporter_cannot_revive_old_credits() -> None:
    cohorts, _ = _cohort_with_fourth_at(15.0)
    # r1..r4 all TX'd already; only r1 comes back after the gap.
    assert cohorts.rx(T1, Reporter("r1"), 15.0 + COHORT_GAP + 1, kind=Kind.TRAFFIC) is Credit.COUNTED
    assert cohorts.reporters(T1, 15.0 + COHORT_GAP + 1) == 1
    assert not cohorts.observed_usable(T1, 15.0 + COHORT_GAP + 1)


def test_delayed_fanout_counts_every_failed_flow_without_restarting_recovered_episode() -> None:
    cohorts = _failed_at_zero()
    # A second flow of the same fan-out, still open: counted, cohort kept.
    _traffic(cohorts, T1, Reporter("r1"), 5.0)
    assert cohorts.fail(T1, 0.0, episode=NODE_FAILURE) is FailResult.KEPT
    assert cohorts.reporters(T1, 6.0) == 1
    for i, t in enumerate((10.0, 15.0, 20.0), start=2):
        _traffic(cohorts, T1, Reporter(f"r{i}"), t)
    assert cohorts.open_episode(T1) is None
    failures = cohorts.failures(T1)

    # Two more flows of the recovered episode report late: counted, never reopened.
    assert cohorts.fail(T1, 0.0, episode=NODE_FAILURE) is FailResult.COUNTED
    assert cohorts.fail(T1, 0.0, episode=NODE_FAILURE) is FailResult.COUNTED
    assert cohorts.failures(T1) == failures + 2
    assert cohorts.open_episode(T1) is None
    assert cohorts.lease_valid(T1, 25.0)
    assert cohorts.observed_usable(T1, 25.0)


def test_independent_failure_is_a_new_episode() -> None:
    cohorts = _failed_at_zero()
    for i, t in enumerate((5.0, 10.0, 15.0, 20.0), start=1):
        _traffic(cohorts, T1, Reporter(f"r{i}"), t)
    assert cohorts.lease_valid(T1, 30.0)

    assert cohorts.fail(T1, 30.0, episode="episode-2") is FailResult.OPENED
    assert cohorts.open_episode(T1) == "episode-2"
    assert not cohorts.lease_valid(T1, 30.0)
    assert not cohorts.observed_usable(T1, 30.0)
    assert cohorts.reporters(T1, 30.0) == 0


def test_rx_at_or_before_failure_fence_does_not_count() -> None:
    cohorts = Cohorts()
    r1 = Reporter("r1")
    cohorts.tx(T1, r1, 0.0)
    cohorts.fail(T1, 10.0, episode="e")
    assert cohorts.rx(T1, r1, 10.0, kind=Kind.TRAFFIC) is Credit.IGNORED
    assert not cohorts.exploration_cleared(T1)
    # A surviving reporter may contribute new RX after the fence.
    assert cohorts.rx(T1, r1, 10.5, kind=Kind.TRAFFIC) is Credit.COUNTED


def test_first_accepted_rx_after_failure_clears_exploration_delay() -> None:
    cohorts = _failed_at_zero()
    assert not cohorts.exploration_cleared(T1)
    cohorts.tx(T1, Reporter("r1"), 1.0)
    assert not cohorts.exploration_cleared(T1)  # TX alone proves nothing
    cohorts.rx(T1, Reporter("r1"), 2.0, kind=Kind.TRAFFIC)
    assert cohorts.exploration_cleared(T1)
    assert not cohorts.exploration_cleared(T2)


def test_tx_only_and_probe_activity_never_recover() -> None:
    cohorts = _failed_at_zero()
    for i in range(8):
        reporter = Reporter(f"r{i}")
        cohorts.tx(T1, reporter, 1.0 + i)
        for kind in (Kind.PROBE, Kind.WARMUP, Kind.TX_ONLY, Kind.SETUP_ONLY):
            assert cohorts.rx(T1, reporter, 1.5 + i, kind=kind) is Credit.IGNORED
    assert cohorts.open_episode(T1) == NODE_FAILURE
    assert not cohorts.lease_valid(T1, 10.0)
    assert not cohorts.observed_usable(T1, 10.0)
    assert not cohorts.exploration_cleared(T1)


def test_clones_count_once_per_cohort() -> None:
    cohorts = Cohorts()
    r1 = Reporter("r1")
    clones = [r1.clone(f"r1-{i}") for i in range(4)]
    for i, reporter in enumerate([r1, *clones]):
        _traffic(cohorts, T1, reporter, float(i))
    assert cohorts.reporters(T1, 5.0) == 1
    assert not cohorts.observed_usable(T1, 5.0)


def test_committed_reload_at_30_resets_cohorts_and_revokes_usability_and_lease() -> None:
    cohorts = _failed_at_zero()
    reporters = [Reporter(f"r{i}") for i in range(1, 5)]
    for reporter, t in zip(reporters, (5.0, 10.0, 15.0, 20.0), strict=True):
        _traffic(cohorts, T1, reporter, t)
    for reporter, t in zip(reporters[:3], (21.0, 22.0, 23.0), strict=True):
        _traffic(cohorts, T2, reporter, t)
    assert cohorts.observed_usable(T1, 29.0) and cohorts.lease_valid(T1, 29.0)
    failures = (cohorts.failures(T1), cohorts.failures(T2))

    cohorts.reload(30.0)
    assert not cohorts.observed_usable(T1, 30.0)
    assert not cohorts.lease_valid(T1, 30.0)
    # Reload creates no failure provenance and does not close T2's real episode.
    assert cohorts.open_episode(T1) is None
    assert cohorts.open_episode(T2) == NODE_FAILURE
    assert (cohorts.failures(T1), cohorts.failures(T2)) == failures
    # RX at the reload instant is behind the fence; T2 needs four fresh credits.
    assert cohorts.rx(T2, reporters[3], 30.0, kind=Kind.TRAFFIC) is Credit.IGNORED
    for reporter, t in zip(reporters[:3], (31.0, 32.0, 33.0), strict=True):
        assert cohorts.rx(T2, reporter, t, kind=Kind.TRAFFIC) is Credit.COUNTED
    assert cohorts.open_episode(T2) == NODE_FAILURE
    assert _traffic(cohorts, T2, reporters[3], 34.0) is Credit.RECOVERED


def test_reload_alone_grants_no_recovery_lease() -> None:
    cohorts = Cohorts()
    cohorts.reload(0.0)
    for i, t in enumerate((1.0, 2.0, 3.0, 4.0), start=1):
        assert _traffic(cohorts, T1, Reporter(f"r{i}"), t) is Credit.COUNTED
    assert cohorts.observed_usable(T1, 5.0)
    assert not cohorts.lease_valid(T1, 5.0)  # availability is not qualification (GH-K-44)


def test_flushed_rx_counts_at_its_event_time_but_not_across_expired_support() -> None:
    cohorts = Cohorts()
    r1, r2 = Reporter("r1"), Reporter("r2")
    cohorts.tx(T1, r1, 0.0)
    cohorts.tx(T1, r2, 0.0)
    assert cohorts.rx(T1, r1, 30.0, kind=Kind.TRAFFIC, at=1.0) is Credit.COUNTED
    assert cohorts.reporters(T1, 30.0) == 1
    assert cohorts.reporters(T1, 1.0 + COHORT_GAP) == 0  # expires from the event time
    assert cohorts.rx(T1, r2, 1.0 + COHORT_GAP, kind=Kind.TRAFFIC, at=1.0) is Credit.IGNORED


def test_rx_from_a_cohort_ended_by_a_gap_cannot_join_the_next() -> None:
    cohorts, _ = _cohort_with_fourth_at(10.0)
    late = Reporter("late")
    cohorts.tx(T1, late, 0.0)
    _traffic(cohorts, T1, Reporter("new"), 80.0)  # gap: new cohort
    assert cohorts.rx(T1, late, 81.0, kind=Kind.TRAFFIC, at=40.0) is Credit.IGNORED
    assert cohorts.reporters(T1, 81.0) == 1


def test_forget_drops_the_cell() -> None:
    cohorts = _failed_at_zero()
    cohorts.forget(T1)
    assert cohorts.open_episode(T1) is None
    assert cohorts.failures(T1) == 0
    assert cohorts.open_episode(T2) == NODE_FAILURE


def test_episode_failures_count_independent_failures_not_fan_out_and_restart_after_recovery() -> None:
    cohorts = Cohorts()
    assert cohorts.episode_failures("T1") == 0
    cohorts.fail("T1", 0.0, episode="e1")
    cohorts.fail("T1", 0.5, episode="e1")  # another flow of the same fanned-out failure
    assert cohorts.episode_failures("T1") == 1
    cohorts.fail("T1", 1.0, episode="e2")  # an independent failure before recovery
    assert cohorts.episode_failures("T1") == 2
    for i, t in enumerate((5.0, 10.0, 15.0, 20.0)):
        reporter = Reporter(f"r{i}")
        cohorts.tx("T1", reporter, t)
        cohorts.rx("T1", reporter, t + 0.1, kind=Kind.TRAFFIC)
    assert cohorts.open_episode("T1") is None and cohorts.episode_failures("T1") == 0
    cohorts.fail("T1", 30.0, episode="e3")
    assert cohorts.episode_failures("T1") == 1  # a new episode starts counting afresh
