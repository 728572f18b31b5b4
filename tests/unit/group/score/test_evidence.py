"""Score's evidence core: layers, LRU cells and incarnations, decay, blending, Beta bounds,
qualification and its lease, prune and reload (GH-K-02..12, GH-K-25..29)."""

from __future__ import annotations

import ipaddress
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast.decay import EVIDENCE_HALF_LIFE
from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.cells import CellStore, Outcome, current_cells
from honk.group.score.constants import (
    BLEND_FULL_EVIDENCE,
    QUALIFICATION_LEASE,
    QUALIFYING_COMPLETIONS,
    SETUP_FAILURE_WEIGHT,
)
from honk.group.score.evidence import ScoreEvidence, reliability_bound, standing
from honk.group.score.keys import AggregateKey, ExactKey, ScoreTarget

TCP = Network.TCP
NODE = uuid.UUID(int=1)
OTHER = uuid.UUID(int=2)
T1 = ScoreTarget.parse("example.com:443")
T2 = ScoreTarget.parse("example.org:443")
V4 = ipaddress.ip_address("192.0.2.1")
V4B = ipaddress.ip_address("192.0.2.2")


def _record(ev, target, outcome, now, times=1, node=NODE, destination=V4, group="g"):
    for _ in range(times):
        ev.record(group, TCP, target, node, outcome, now, destination)


def _useful(ev, now, times=4, target=T1):
    _record(ev, target, Outcome.USEFUL, now, times)


# --- keys and layers ------------------------------------------------------------------------------


def test_equivalent_targets_land_in_the_same_exact_cell_and_other_ports_in_another():
    ev = ScoreEvidence()
    ev.record("g", TCP, ScoreTarget.parse("Example.COM.:443"), NODE, Outcome.SUCCESS, 0.0, V4)
    ev.record("g", TCP, ScoreTarget.parse("example.com:443"), NODE, Outcome.SUCCESS, 0.0, V4)
    ev.record("g", TCP, ScoreTarget.parse("example.com:80"), NODE, Outcome.SUCCESS, 0.0, V4)
    ev.record("g", TCP, ScoreTarget.parse("[2001:db8::1]:443"), NODE, Outcome.SUCCESS, 0.0)
    assert len(ev.exact) == 3
    assert ev.exact.peek(ExactKey("g", TCP, Family.V4, T1, NODE)).successes.value(0.0) == 2.0
    v6 = ExactKey("g", TCP, Family.V6, ScoreTarget.of("2001:db8::1", 443), NODE)
    assert ev.exact.peek(v6) is not None
    assert ev.aggregate.peek(AggregateKey("g", TCP, None, NODE)).successes.value(0.0) == 4.0
    assert ev.aggregate.peek(AggregateKey("g", TCP, Family.V4, NODE)).successes.value(0.0) == 3.0


def test_targetless_warmup_updates_only_the_no_family_aggregate():
    ev = ScoreEvidence()
    ev.record("g", TCP, None, NODE, Outcome.SETUP_OK, 0.0)
    ev.record("g", TCP, None, NODE, Outcome.SETUP_FAILURE, 1.0)
    assert len(ev.exact) == 0
    assert len(ev.aggregate) == 1
    cell = ev.aggregate.peek(AggregateKey("g", TCP, None, NODE))
    assert cell.attempts.value(1.0) > 1.9
    assert cell.setup_failures.value(1.0) == 1.0
    assert cell.successes.value(1.0) == 0.0  # warm-up is setup quality, never a business success


def test_a_domain_with_no_known_address_feeds_only_the_global_aggregate():
    ev = ScoreEvidence()
    ev.record("g", TCP, T1, NODE, Outcome.USEFUL, 0.0)  # no destination: family unknown
    assert len(ev.exact) == 0
    assert list(ev.aggregate._cells) == [AggregateKey("g", TCP, None, NODE)]


def test_reads_never_create_cells():
    ev = ScoreEvidence()
    blend = ev.blend("g", TCP, T1, NODE, 0.0, V4)
    assert blend.weights == (1.0, 0.0, 0.0) and blend.support == 0.0
    assert not ev.qualified("g", TCP, NODE, 0.0, T1, V4)
    assert len(ev.exact) == len(ev.aggregate) == 0


# --- cells, LRU and incarnations ------------------------------------------------------------------


def test_the_least_recently_used_cell_is_evicted_first():
    store = CellStore(2)
    store.get_or_create("a")
    store.get_or_create("b")
    store.get_or_create("a")  # use refreshes a
    store.get_or_create("c")
    assert store.peek("b") is None and store.peek("a") is not None
    assert store.evictions == 1


def test_an_evicted_cell_is_not_recreated_by_its_old_reporter():
    ev = ScoreEvidence(exact_max=1)
    old = ev.admit("g", TCP, T1, NODE, V4)
    ev.admit("g", TCP, T2, NODE, V4)  # evicts T1's exact cell
    assert ev.stats().exact_evictions == 1
    ev.settle(old, Outcome.USEFUL, 1.0)
    assert ev.exact.peek(ExactKey("g", TCP, Family.V4, T1, NODE)) is None
    # the aggregates it was admitted to are still current and do take the outcome
    assert ev.aggregate.peek(AggregateKey("g", TCP, None, NODE)).useful.value(1.0) == 1.0
    # a new admission gets a new incarnation, which the old reporter does not match either
    fresh = ev.admit("g", TCP, T1, NODE, V4)
    ev.settle(old, Outcome.FAILURE, 2.0)
    cell = ev.exact.peek(ExactKey("g", TCP, Family.V4, T1, NODE))
    assert cell.failures.value(2.0) == 0.0
    ev.settle(fresh, Outcome.FAILURE, 2.0)
    assert cell.failures.value(2.0) == 1.0


def test_incarnations_keep_counting_across_clear():
    store = CellStore(4)
    first = store.get_or_create("a").incarnation
    store.clear()
    assert store.get_or_create("a").incarnation > first
    assert current_cells([(store, "a", first)]) == []


@given(st.integers(1, 8), st.lists(st.integers(0, 20), max_size=60))
def test_the_lru_never_exceeds_its_cap(cap, keys):
    store = CellStore(cap)
    seen = set()
    for key in keys:
        incarnation = store.get_or_create(key).incarnation
        assert incarnation not in seen or store.peek(key).incarnation == incarnation
        seen.add(incarnation)
        assert len(store) <= cap
    assert store.evictions == max(0, len(seen) - cap)


# --- decay, blending and Beta bounds --------------------------------------------------------------


def test_exact_evidence_overrides_the_aggregate_as_it_grows_and_yields_as_it_ages():
    ev = ScoreEvidence()
    _record(ev, T2, Outcome.USEFUL, 0.0, times=20, destination=V4B)  # the family is healthy
    weights = []
    for _ in range(int(BLEND_FULL_EVIDENCE)):
        _record(ev, T1, Outcome.FAILURE, 0.0)  # ...but T1 fails through this node
        weights.append(ev.blend("g", TCP, T1, NODE, 0.0, V4).weights[2])
    assert weights == sorted(weights) and weights[0] < 0.5 and weights[-1] == 1.0
    exact = ev.exact.peek(ExactKey("g", TCP, Family.V4, T1, NODE))
    assert ev.blend("g", TCP, T1, NODE, 0.0, V4).reliability == reliability_bound(exact, 0.0)
    # Three hours later the family keeps getting fresh successes while T1's failures aged.
    later = 6 * EVIDENCE_HALF_LIFE
    _record(ev, T2, Outcome.USEFUL, later, times=20, destination=V4B)
    aged = ev.blend("g", TCP, T1, NODE, later, V4)
    assert aged.weights[2] < 0.05
    assert aged.reliability > 0.5 > reliability_bound(exact, later)
    assert abs(sum(aged.weights) - 1.0) < 1e-12


def test_layer_counts_are_never_added():
    ev = ScoreEvidence()
    _record(ev, T1, Outcome.USEFUL, 0.0, times=5)
    blend = ev.blend("g", TCP, T1, NODE, 0.0, V4)
    assert blend.support == 5.0 and blend.useful == 5.0  # not 15: each layer holds the same five
    glob, family, exact = ev.layers("g", TCP, T1, NODE, V4)
    assert glob.successes.value(0.0) == family.successes.value(0.0) == exact.successes.value(0.0) == 5.0
    # the blend mixes each layer's own bound; with equal counts it is that bound, not a pooled one
    assert abs(blend.reliability - reliability_bound(exact, 0.0)) < 1e-12


def test_evidence_decays_with_the_thirty_minute_half_life():
    ev = ScoreEvidence()
    _record(ev, T1, Outcome.SUCCESS, 0.0, times=4)
    assert abs(ev.blend("g", TCP, T1, NODE, EVIDENCE_HALF_LIFE, V4).support - 2.0) < 1e-12
    assert EVIDENCE_HALF_LIFE == 1800.0


def test_setup_failures_weigh_more_than_failures_in_the_bound():
    setup, plain, double = ScoreEvidence(), ScoreEvidence(), ScoreEvidence()
    for ev in (setup, plain, double):
        _record(ev, T1, Outcome.USEFUL, 0.0, times=10)
    _record(setup, T1, Outcome.SETUP_FAILURE, 0.0)
    _record(plain, T1, Outcome.FAILURE, 0.0)
    _record(double, T1, Outcome.FAILURE, 0.0, times=int(SETUP_FAILURE_WEIGHT))
    r = [ev.layers("g", TCP, T1, NODE, V4)[2] for ev in (setup, plain, double)]
    assert reliability_bound(r[0], 0.0) < reliability_bound(r[1], 0.0)
    assert abs(reliability_bound(r[0], 0.0) - reliability_bound(r[2], 0.0)) < 1e-12


# --- qualification and its lease ------------------------------------------------------------------


def test_four_useful_completions_qualify_and_decay_unqualifies():
    ev = ScoreEvidence()
    _useful(ev, 0.0, times=3)
    assert not ev.qualified("g", TCP, NODE, 0.0)
    _useful(ev, 0.0, times=1)
    assert QUALIFYING_COMPLETIONS == 4.0
    assert ev.qualified("g", TCP, NODE, 0.0)
    assert not ev.qualified("g", TCP, NODE, 1.0)  # 4 decayed by one second is under four


def test_qualification_counts_across_targets():
    ev = ScoreEvidence()
    _useful(ev, 0.0, times=2, target=T1)
    _useful(ev, 0.0, times=2, target=T2)
    assert ev.qualified("g", TCP, NODE, 0.0, T2, V4)


def test_silent_successes_and_setups_are_not_useful():
    ev = ScoreEvidence()
    _record(ev, T1, Outcome.SUCCESS, 0.0, times=10)
    _record(ev, None, Outcome.SETUP_OK, 0.0, times=10)
    assert not ev.qualified("g", TCP, NODE, 0.0)


def test_rx_keeps_earned_qualification_for_sixty_seconds():
    ev = ScoreEvidence()
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0)
    assert ev.rx(reporter, 0.0)
    assert ev.qualified("g", TCP, NODE, QUALIFICATION_LEASE - 0.001)
    assert not ev.qualified("g", TCP, NODE, QUALIFICATION_LEASE)
    # RX under the running lease renews it from its own event time, without adding completions
    assert ev.rx(reporter, 50.0)
    assert ev.qualified("g", TCP, NODE, 50.0 + QUALIFICATION_LEASE - 0.001)
    assert ev.blend("g", TCP, T1, NODE, 50.0, V4).useful < QUALIFYING_COMPLETIONS


def test_rx_below_the_threshold_cannot_create_a_lease():
    ev = ScoreEvidence()
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0, times=3)
    assert not ev.rx(reporter, 1.0)
    assert not ev.qualified("g", TCP, NODE, 1.0)
    _useful(ev, 2.0, times=1)  # 3 decayed + 1 < 4: still not earned
    assert not ev.rx(reporter, 2.0)
    # an expired lease is not renewed by RX once completions have decayed below the threshold
    ev = ScoreEvidence()
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0)
    assert ev.rx(reporter, 0.0)
    assert not ev.rx(reporter, QUALIFICATION_LEASE + 1.0)
    assert not ev.qualified("g", TCP, NODE, QUALIFICATION_LEASE + 1.0)


def test_targetless_rx_renews_nothing():
    ev = ScoreEvidence()
    _useful(ev, 0.0)
    assert not ev.rx(ev.admit("g", TCP, None, NODE), 0.0)


def test_failure_and_reload_revoke_the_lease():
    ev = ScoreEvidence()
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0)
    assert ev.rx(reporter, 0.0)
    _record(ev, T2, Outcome.FAILURE, 10.0, destination=V4B)  # any failure of the node
    assert not ev.qualified("g", TCP, NODE, 10.0)
    assert not ev.rx(reporter, 10.0)  # not strictly after the failure
    # reload: a lease that was running is gone, and RX up to the reload time renews nothing
    ev = ScoreEvidence([("g", NODE)])
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0)
    assert ev.rx(reporter, 0.0)
    assert ev.qualified("g", TCP, NODE, 30.0)
    ev.reload([("g", NODE)], 30.0)
    assert not ev.qualified("g", TCP, NODE, 30.0)
    assert not ev.rx(reporter, 30.0)
    assert not ev.rx(reporter, 31.0)  # below the threshold: a reload-only lease cannot be recreated


def test_pruned_membership_ignores_late_feedback():
    ev = ScoreEvidence([("g", NODE), ("g", OTHER)])
    gone = ev.admit("g", TCP, T1, OTHER, V4)
    kept = ev.admit("g", TCP, T1, NODE, V4)
    dropped = ev.prune([("g", NODE)])
    assert dropped == 3
    ev.settle(gone, Outcome.USEFUL, 1.0)
    assert ev.admit("g", TCP, T1, OTHER, V4) is None
    ev.record("g", TCP, T1, OTHER, Outcome.USEFUL, 1.0, V4)
    assert all(key.node_id == NODE for key in list(ev.exact._cells) + list(ev.aggregate._cells))
    ev.settle(kept, Outcome.USEFUL, 1.0)  # surviving membership keeps reporting
    assert ev.blend("g", TCP, T1, NODE, 1.0, V4).useful == 1.0


def test_a_readded_member_does_not_take_its_old_reporters_feedback():
    ev = ScoreEvidence([("g", NODE)])
    old = ev.admit("g", TCP, T1, NODE, V4)
    ev.reload([], 1.0)
    ev.reload([("g", NODE)], 2.0)
    ev.admit("g", TCP, T1, NODE, V4)
    ev.settle(old, Outcome.USEFUL, 3.0)
    assert ev.blend("g", TCP, T1, NODE, 3.0, V4).useful == 0.0


def test_reload_keeps_surviving_cells_and_their_reporters():
    ev = ScoreEvidence([("g", NODE)])
    reporter = ev.admit("g", TCP, T1, NODE, V4)
    _useful(ev, 0.0, times=2)
    ev.reload([("g", NODE)], 5.0)
    ev.settle(reporter, Outcome.USEFUL, 6.0)
    assert ev.blend("g", TCP, T1, NODE, 6.0, V4).useful > 2.9


def test_stats_count_entries_and_evictions_without_keys():
    ev = ScoreEvidence(exact_max=2, aggregate_max=8)
    for port in range(1, 5):
        ev.record("g", TCP, ScoreTarget.of("example.com", port), NODE, Outcome.SUCCESS, 0.0, V4)
    stats = ev.stats()
    assert (stats.exact_entries, stats.exact_evictions, stats.aggregate_entries) == (2, 2, 2)
    assert "example" not in repr(stats)


def test_a_cells_standing_is_reused_briefly_and_recomputed_after_a_record_or_the_reuse_window():
    from honk.group.score.constants import BOUND_REUSE

    store = CellStore(4)
    cell = store.get_or_create(AggregateKey("g", TCP, None, NODE))
    for _ in range(6):
        cell.record(Outcome.USEFUL, 0.0)
    cell.record(Outcome.FAILURE, 0.0)
    first = cell.standing(10.0)
    assert first == standing(cell, 10.0)
    assert first.bound == reliability_bound(cell, 10.0) and first.useful == cell.useful.value(10.0)
    later = 10.0 + BOUND_REUSE / 2
    assert cell.standing(later) == first  # reused within the window ...
    fresh = standing(cell, later)
    assert first == pytest.approx(
        fresh, rel=5e-4
    )  # ... where decay barely moves it (0.02 % in half a second)
    cell.record(Outcome.FAILURE, later)  # new evidence: recomputed at once
    assert cell.standing(later) == standing(cell, later)
    assert cell.standing(later).bound < first.bound
    after = later + BOUND_REUSE
    assert cell.standing(after) == standing(cell, after)
