"""Score's first-choice performance heuristic: freshness, inertia, per-scope normalization,
probe baselines and reload, exact-target degradation (GH-K-12, GH-K-29..33, GH-K-47)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.constants import (
    PERFORMANCE_CONFIDENCE_LOSS,
    PERFORMANCE_EXPIRY,
    PERFORMANCE_INERTIA,
    PERFORMANCE_STALE_CONFIDENCE,
)
from honk.group.score.heuristic import Direction, FirstChoiceHeuristic, Metric, ProbeIdentity
from honk.group.score.keys import ScoreTarget

TCP = Network.TCP
V4 = Family.V4
A = uuid.UUID(int=1)
B = uuid.UUID(int=2)
C = uuid.UUID(int=3)
T1 = ScoreTarget.parse("192.0.2.10:443")
T2 = ScoreTarget.parse("192.0.2.20:443")
PROBE = ProbeIdentity("https://www.gstatic.com/generate_204", "HEAD", 30.0)
PROBE_GET = ProbeIdentity("https://www.gstatic.com/generate_204", "GET", 30.0)


def utilities(h: FirstChoiceHeuristic, group, network, target, family, candidates, now) -> dict:
    """``h.score`` by candidate (it answers in the candidates' order)."""
    return dict(zip(candidates, h.score(group, network, target, family, candidates, now), strict=True))


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _response(h, node, latency, now, target=T1):
    h.observe_response("g", TCP, target, V4, node, latency, now)


def _probe(h, node, rtt, now, probe=PROBE):
    return h.observe_probe("g", TCP, V4, node, probe, rtt, now)


def test_equal_fresh_responses_score_fully(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.1, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: 1.0, B: 1.0}


def test_faster_response_ranks_relative_to_best(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.2, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[A] == 1.0
    assert scores[B] == pytest.approx(0.5)


def test_scores_answer_in_candidate_order_and_a_node_listed_twice_is_one_comparison(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.2, clock.now)
    assert h.score("g", TCP, T1, V4, [B, A, B], clock.now) == [pytest.approx(0.5), 1.0, pytest.approx(0.5)]
    # one measured node under two names is not two comparable nodes
    assert h.score("g", TCP, T1, V4, [A, C, A], clock.now) == [None, None, None]


def test_metric_loses_confidence_after_60s_and_expires_at_120s(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    t0 = clock.now
    clock.advance(PERFORMANCE_CONFIDENCE_LOSS - 1)
    _response(h, B, 0.1, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now)[A] == 1.0
    clock.now = t0 + PERFORMANCE_CONFIDENCE_LOSS
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[A] == pytest.approx(PERFORMANCE_STALE_CONFIDENCE)
    assert scores[B] == 1.0
    clock.now = t0 + PERFORMANCE_EXPIRY
    # A expired; B is alone, so its scope is no longer comparable
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: None, B: None}


def test_expiry_ignores_historical_count(clock):
    h = FirstChoiceHeuristic()
    for _ in range(100):
        _response(h, A, 0.05, clock.now)
    clock.advance(PERFORMANCE_EXPIRY)
    _response(h, B, 0.3, clock.now)
    _response(h, C, 0.3, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now)
    assert scores[A] is None
    assert scores[B] == scores[C] == 1.0


def test_expired_performance_is_never_a_gain(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.01, clock.now)  # once the fastest
    clock.advance(PERFORMANCE_EXPIRY + 1)
    _response(h, B, 0.5, clock.now)
    _response(h, C, 0.9, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now)
    assert scores[A] is None
    assert scores[B] > scores[C]


def test_missing_comparable_metric_is_never_a_gain(clock):
    h = FirstChoiceHeuristic()
    for node in (A, B, C):
        _probe(h, node, 0.05, clock.now)
    _response(h, B, 0.2, clock.now)
    _response(h, C, 0.2, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now)
    assert scores[A] < scores[B] == scores[C]


def test_inertia_keeps_only_four_observations(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 10.0, clock.now)  # an old outlier
    for _ in range(PERFORMANCE_INERTIA):
        _response(h, A, 0.1, clock.now)
    _response(h, B, 0.1, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now)[A] == pytest.approx(1.0)


def test_inertia_damps_a_single_new_sample(clock):
    h = FirstChoiceHeuristic()
    for _ in range(PERFORMANCE_INERTIA):
        _response(h, A, 0.1, clock.now)
    _response(h, A, 0.5, clock.now)
    _response(h, B, 0.2, clock.now)
    # A's mean is (3 * 0.1 + 0.5) / 4 = 0.2, not 0.5
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[A] == pytest.approx(1.0) and scores[B] == pytest.approx(1.0)


def test_fresh_comparable_target_response_overrides_probe_baseline(clock):
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.010, clock.now)
    _probe(h, B, 0.100, clock.now)
    assert (
        utilities(h, "g", TCP, T1, V4, [A, B], clock.now)[A]
        > utilities(h, "g", TCP, T1, V4, [A, B], clock.now)[B]
    )
    _response(h, A, 0.300, clock.now)
    _response(h, B, 0.100, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[B] > scores[A]


def test_lone_target_response_does_not_override_probe_baseline(clock):
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.010, clock.now)
    _probe(h, B, 0.100, clock.now)
    _response(h, B, 0.050, clock.now)
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[A] > scores[B]


def test_setup_and_response_are_normalized_in_their_own_scopes(clock):
    h = FirstChoiceHeuristic()
    # A has only a 10 ms setup, B only a 300 ms response: different scopes, nothing comparable
    h.observe_setup("g", TCP, T1, V4, A, 0.010, clock.now)
    _response(h, B, 0.300, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: None, B: None}
    # within each scope both candidates are equal, so neither the 10 ms nor the 300 ms wins
    h.observe_setup("g", TCP, T1, V4, B, 0.010, clock.now)
    _response(h, A, 0.300, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: 1.0, B: 1.0}


def test_other_targets_metrics_are_not_compared(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.010, clock.now, target=T1)
    _response(h, B, 0.300, clock.now, target=T2)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: None, B: None}


def test_probe_identities_are_distinct_scopes(clock):
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.010, clock.now, probe=PROBE)
    _probe(h, B, 0.300, clock.now, probe=PROBE_GET)
    assert utilities(h, "g", TCP, None, None, [A, B], clock.now) == {A: None, B: None}


def test_goodput_higher_is_better_and_unknown_direction_is_no_scope(clock):
    h = FirstChoiceHeuristic()
    h.observe_goodput("g", TCP, T1, V4, A, Direction.DOWN, 1_000_000, 1.0, clock.now)
    h.observe_goodput("g", TCP, T1, V4, B, Direction.DOWN, 500_000, 1.0, clock.now)
    h.observe_goodput("g", TCP, T1, V4, A, Direction.UP, 0, 1.0, clock.now)  # no load: unknown
    scores = utilities(h, "g", TCP, T1, V4, [A, B], clock.now)
    assert scores[A] == 1.0
    assert scores[B] == pytest.approx(0.5)


def test_reload_clears_probe_baselines_and_rejects_old_generation(clock):
    h = FirstChoiceHeuristic()
    generation = h.probe_generation
    _probe(h, A, 0.01, clock.now)
    _probe(h, B, 0.02, clock.now)
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.1, clock.now)
    h.reload(clock.now)
    assert utilities(h, "g", TCP, None, None, [A, B], clock.now) == {A: None, B: None}
    assert not h.observe_probe("g", TCP, V4, A, PROBE, 0.01, clock.now, generation=generation)
    assert h.observe_probe("g", TCP, V4, A, PROBE, 0.01, clock.now, generation=h.probe_generation)
    # business metrics survive the reload
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: 1.0, B: 1.0}


def test_prune_forgets_invalid_pairs(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.1, clock.now)
    _response(h, C, 0.1, clock.now)
    h.prune([("g", A), ("g", B)])
    scores = utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now)
    assert scores[C] is None and scores[A] == 1.0


def test_degradation_compares_only_the_same_exact_targets_history(clock):
    h = FirstChoiceHeuristic()
    for _ in range(2):
        _response(h, A, 0.020, clock.now, target=T1)
        _response(h, A, 0.400, clock.now, target=T2)
    # 0.3 s is degraded for T1 (mean 20 ms) even though T2's history is slower
    assert h.degraded("g", TCP, T1, A, 0.300, clock.now)
    assert not h.degraded("g", TCP, T2, A, 0.300, clock.now)
    # no exact history of its own: never degraded, whatever the aggregate holds
    assert not h.degraded("g", TCP, ScoreTarget.parse("192.0.2.30:443"), A, 5.0, clock.now)
    assert not h.degraded("g", TCP, None, A, 5.0, clock.now)


def test_degradation_needs_ratio_and_absolute_excess(clock):
    h = FirstChoiceHeuristic()
    for _ in range(2):
        h.observe_setup("g", TCP, T1, V4, A, 0.002, clock.now)
    assert not h.degraded("g", TCP, T1, A, 0.010, clock.now, metric=Metric.SETUP)  # 5x but +8 ms
    assert h.degraded("g", TCP, T1, A, 0.030, clock.now, metric=Metric.SETUP)


def test_degradation_needs_fresh_history(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.020, clock.now)
    assert not h.degraded("g", TCP, T1, A, 1.0, clock.now)  # one observation only
    _response(h, A, 0.020, clock.now)
    assert h.degraded("g", TCP, T1, A, 1.0, clock.now)
    clock.advance(PERFORMANCE_EXPIRY)
    assert not h.degraded("g", TCP, T1, A, 1.0, clock.now)


def test_reprs_hide_targets_and_keys(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    assert "192.0.2" not in repr(h) and str(A) not in repr(h)
    assert "gstatic" not in repr(PROBE)


def test_late_report_older_than_expiry_is_ignored(clock):
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, A, 5.0, clock.now - PERFORMANCE_EXPIRY)  # stale report arriving late
    _response(h, B, 0.1, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: 1.0, B: 1.0}


def test_the_heuristic_keeps_at_most_as_many_keys_as_the_exact_evidence_store():
    from honk.group.score.constants import EXACT_CELLS_MAX

    heuristic = FirstChoiceHeuristic()
    for i in range(EXACT_CELLS_MAX + 10):
        heuristic.observe_setup("g", Network.TCP, None, None, f"node{i}", 0.05, 1.0)
    assert len(heuristic) == EXACT_CELLS_MAX


_op = st.one_of(
    st.tuples(
        st.just("probe"), st.sampled_from([A, B, C]), st.sampled_from([V4, Family.V6]), st.floats(0.001, 0.5)
    ),
    st.tuples(
        st.just("response"), st.sampled_from([A, B, C]), st.sampled_from([T1, T2]), st.floats(0.001, 0.5)
    ),
    st.tuples(st.just("setup"), st.sampled_from([A, B, C]), st.sampled_from([T1, T2]), st.floats(0.001, 0.5)),
    st.tuples(st.just("advance"), st.floats(0.0, 70.0)),
    st.tuples(
        st.just("read"),
        st.sampled_from([T1, T2, None]),
        st.sampled_from([V4, Family.V6, None]),
        st.sampled_from([[A, B, C], [B, A], [A, C, A]]),
    ),
    st.tuples(
        st.just("reload"),
    ),
    st.tuples(st.just("prune"), st.sampled_from([A, B, C])),
    st.tuples(
        st.just("expire"),
    ),
)


def _apply(h, op, now):
    kind = op[0]
    if kind == "probe":
        h.observe_probe("g", TCP, op[2], op[1], PROBE, op[3], now)
    elif kind == "response":
        h.observe_response("g", TCP, op[2], V4, op[1], op[3], now)
    elif kind == "setup":
        h.observe_setup("g", TCP, op[2], V4, op[1], op[3], now)
    elif kind == "reload":
        h.reload(now)
    elif kind == "prune":
        h.prune([("g", n) for n in (A, B, C) if n != op[1]])
    elif kind == "expire":
        h.expire(now)


@settings(max_examples=500, deadline=None)
@given(st.lists(_op, max_size=40))
def test_a_read_returns_what_a_heuristic_that_never_read_before_returns(ops):
    """Reads keep each row's readings (and a group's probe baseline) until the row changes or a
    reading's confidence or freshness runs out, and a target row's view takes the readings an
    observation changed again; none of that may ever change an answer."""
    h = FirstChoiceHeuristic()
    now = 1000.0
    applied = []
    for op in ops:
        if op[0] == "advance":
            now += op[1]
            continue
        if op[0] != "read":
            _apply(h, op, now)
            applied.append((op, now))
            continue
        target, family, candidates = op[1], op[2], op[3]
        fresh = FirstChoiceHeuristic()
        for earlier, at in applied:
            _apply(fresh, earlier, at)
        assert h.score("g", TCP, target, family, candidates, now) == fresh.score(
            "g", TCP, target, family, candidates, now
        )


def test_a_new_probe_rtt_changes_the_very_next_read(clock):
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.01, clock.now)
    _probe(h, B, 0.02, clock.now)
    assert utilities(h, "g", TCP, None, None, [A, B], clock.now) == {A: 1.0, B: 0.5}
    for _ in range(PERFORMANCE_INERTIA):  # B's mean becomes 1 ms: now A is the slower one
        _probe(h, B, 0.001, clock.now)
    scores = utilities(h, "g", TCP, None, None, [A, B], clock.now)
    assert scores[B] == 1.0 and scores[A] < 1.0


def test_a_reload_or_prune_after_a_read_takes_effect_on_the_next_read(clock):
    h = FirstChoiceHeuristic()
    for node, rtt in ((A, 0.01), (B, 0.02), (C, 0.04)):
        _probe(h, node, rtt, clock.now)
    assert utilities(h, "g", TCP, None, None, [A, B, C], clock.now)[C] == 0.25
    h.prune([("g", B), ("g", C)])
    assert utilities(h, "g", TCP, None, None, [A, B, C], clock.now) == {A: None, B: 1.0, C: 0.5}
    h.reload(clock.now)
    assert utilities(h, "g", TCP, None, None, [A, B, C], clock.now) == {A: None, B: None, C: None}


def test_a_targetless_read_of_a_family_reads_its_probe_row_as_probes(clock):
    """Without a target, a family's business row and its probe row are the same row."""
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.01, clock.now)
    _probe(h, B, 0.02, clock.now)
    assert utilities(h, "g", TCP, None, V4, [A, B], clock.now) == {A: 1.0, B: 0.5}
    assert utilities(h, "g", TCP, None, V4, [A, B], clock.now) == {A: 1.0, B: 0.5}  # and again, from the view


def test_a_probe_baseline_loses_confidence_and_expires_with_its_readings(clock):
    """The group's probe baseline is kept between reads, never past its readings' freshness."""
    h = FirstChoiceHeuristic()
    _probe(h, A, 0.01, clock.now)
    _probe(h, B, 0.02, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: 1.0, B: 0.5}
    clock.advance(PERFORMANCE_CONFIDENCE_LOSS)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {
        A: PERFORMANCE_STALE_CONFIDENCE,
        B: 0.5 * PERFORMANCE_STALE_CONFIDENCE,
    }
    clock.advance(PERFORMANCE_EXPIRY - PERFORMANCE_CONFIDENCE_LOSS)
    assert utilities(h, "g", TCP, T1, V4, [A, B], clock.now) == {A: None, B: None}


def test_a_target_rows_view_takes_each_new_observation_on_the_next_read(clock):
    """Observations into a target's row after a read change the very next read, as they would
    for a heuristic that never read the row."""
    h = FirstChoiceHeuristic()
    _response(h, A, 0.1, clock.now)
    _response(h, B, 0.2, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now) == {A: 1.0, B: 0.5, C: None}
    clock.advance(1.0)
    for _ in range(PERFORMANCE_INERTIA):  # B becomes the faster; C joins the row
        _response(h, B, 0.05, clock.now)
    _response(h, C, 0.1, clock.now)
    assert utilities(h, "g", TCP, T1, V4, [A, B, C], clock.now) == {A: 0.5, B: 1.0, C: 0.5}
