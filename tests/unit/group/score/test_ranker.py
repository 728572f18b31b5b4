"""Score's ordinary selection: liveness first, reliability first, escape, hysteresis, cold
exploration funded by the frozen allowance, and exactly one reason per applied rank."""

from __future__ import annotations

import ipaddress

import pytest

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.cells import Outcome
from honk.group.score.keys import AggregateKey, ScoreTarget
from honk.group.score.ranker import FINAL_REASONS, Member, ScoreState

GROUP = "auto"
TCP = Network.TCP
V4 = Family.V4
TARGET = ScoreTarget.parse("example.com:443")
DESTINATION = ipaddress.IPv4Address("192.0.2.1")
TRAINED = 10  # useful completions: well past qualification
T0 = 1000.0


class FakeHeuristic:
    """The FirstChoiceHeuristic API with utilities set by the test."""

    def __init__(self) -> None:
        self.utility: dict = {}
        self.calls = 0

    def score(self, group, network, target, family, candidates, now):
        self.calls += 1
        return {node: self.utility.get(node) for node in candidates}


def members(*names: str, dead: tuple[str, ...] = ()) -> list[Member]:
    return [Member(name, name, name not in dead) for name in names]


def train(state: ScoreState, node: str, useful: int = TRAINED, failures: int = 0, now: float = T0) -> None:
    for _ in range(useful):
        state.evidence.record(GROUP, TCP, TARGET, node, Outcome.USEFUL, now, DESTINATION)
    for _ in range(failures):
        state.evidence.record(GROUP, TCP, TARGET, node, Outcome.FAILURE, now, DESTINATION)


def fail(state: ScoreState, node: str, now: float, episode: str = "e1") -> None:
    """A node-scoped failure: the outcome in the evidence, the open episode on the global aggregate."""
    state.evidence.record(GROUP, TCP, TARGET, node, Outcome.FAILURE, now, DESTINATION)
    state.cohorts.fail(AggregateKey(GROUP, TCP, None, node), now, episode=episode)


def rank(state: ScoreState, group_members, now: float = T0, **kw):
    return state.rank(GROUP, TCP, TARGET, V4, group_members, now, **kw)


def reasons(state: ScoreState) -> dict:
    [entry] = state.stats()["groups"]
    return entry["reasons"]


def entry(state: ScoreState) -> dict:
    [e] = state.stats()["groups"]
    return e


@pytest.fixture
def perf() -> FakeHeuristic:
    return FakeHeuristic()


@pytest.fixture
def state(perf) -> ScoreState:
    return ScoreState(perf)


def test_dead_member_is_never_returned_whatever_its_score(state, perf):
    for node in "abc":
        train(state, node)
    train(state, "a", useful=40)
    perf.utility = {"a": 1.0, "b": 0.1, "c": 0.1}
    group = members("a", "b", "c", dead=("a",))
    for i in range(5):
        ranked = rank(state, group, T0 + i)
        assert ranked.winner.name != "a"
        assert all(m.name != "a" for m in ranked.order)
        assert rank(state, group, T0 + i, peek=True).winner.name != "a"
    assert entry(state)["candidates"]["deadFiltered"] == 5


def test_no_live_member_returns_no_winner_and_counts_nothing(state):
    ranked = rank(state, members("a", "b", dead=("a", "b")))
    assert ranked.winner is None and ranked.order == ()
    assert state.stats()["groups"] == []


def test_reliability_beats_a_faster_but_failing_node(state, perf):
    train(state, "fast", failures=5)
    train(state, "steady")
    perf.utility = {"fast": 1.0, "steady": 0.2}
    ranked = rank(state, members("fast", "steady"))
    assert ranked.winner.name == "steady"
    assert ranked.reason == "reliabilityWinner"
    assert [m.name for m in ranked.order] == ["steady", "fast"]


def test_incumbent_escapes_on_its_first_failure_to_the_next_eligible_member(state):
    for node in "abc":
        train(state, node)
    group = members("a", "b", "c")
    assert rank(state, group).winner.name == "a"  # equal evidence: configuration order
    fail(state, "a", T0 + 1)
    ranked = rank(state, group, T0 + 2)
    assert ranked.winner.name == "b"
    assert ranked.reason == "freshFailureBypass"
    assert entry(state)["candidates"]["failStreakExcluded"] == 1


def test_old_unresolved_failure_still_escapes_but_is_no_longer_excluded(state):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    rank(state, group)
    fail(state, "a", T0 + 1)
    ranked = rank(state, group, T0 + 500)  # older than the exclusion window, episode still open
    assert ranked.winner.name == "b" and ranked.reason == "freshFailureBypass"
    assert "a" in [m.name for m in ranked.order]
    assert entry(state)["candidates"]["failStreakExcluded"] == 0


def test_dead_incumbent_escapes_as_ineligible(state):
    for node in "abc":
        train(state, node)
    assert rank(state, members("a", "b", "c")).winner.name == "a"
    ranked = rank(state, members("a", "b", "c", dead=("a",)), T0 + 1)
    assert ranked.winner.name == "b" and ranked.reason == "incumbentIneligible"


def test_incumbent_is_kept_within_the_margin_and_loses_beyond_it(state, perf):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    perf.utility = {"a": 0.5}
    assert rank(state, group).winner.name == "a"
    perf.utility = {"a": 0.5, "b": 0.55}
    ranked = rank(state, group, T0 + 1)
    assert ranked.winner.name == "a" and ranked.reason == "incumbentHeld"
    assert [m.name for m in ranked.order] == ["a", "b"]  # the winner leads the order
    perf.utility = {"a": 0.5, "b": 0.9}
    ranked = rank(state, group, T0 + 2)
    assert ranked.winner.name == "b" and ranked.reason == "performanceWinner"


def test_incumbent_without_fresh_performance_is_held_for_insufficient_evidence(state, perf):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    assert rank(state, group).winner.name == "a"
    perf.utility = {"b": 0.9}  # b ranks first, but there is nothing shared to compare against
    ranked = rank(state, group, T0 + 1)
    assert ranked.winner.name == "a" and ranked.reason == "insufficientEvidenceHeld"


def test_cold_members_are_tried_in_configuration_order_once_each(state):
    group = members("a", "b", "c")
    trials = [rank(state, group, T0 + i) for i in range(3)]
    assert [r.winner.name for r in trials] == ["a", "b", "c"]
    assert {r.reason for r in trials} == {"coldExplore"}
    after = rank(state, group, T0 + 3)
    assert after.reason != "coldExplore"
    assert entry(state)["coldSpent"] == entry(state)["coldAllowance"] == 3


@pytest.mark.parametrize(("n", "allowance"), [(2, 2), (3, 3), (4, 4), (5, 4), (10, 5)])
def test_cold_allowance_is_frozen_per_scope_then_no_more_cold_trials(n, allowance):
    state = ScoreState()
    names = [f"m{i}" for i in range(n)]
    group = members(*names)
    results = [rank(state, group, T0 + i) for i in range(n + 3)]
    cold = [r.winner.name for r in results if r.reason == "coldExplore"]
    assert cold == names[:allowance]
    assert all(r.reason != "coldExplore" for r in results[allowance:])
    assert entry(state)["coldAllowance"] == allowance


def test_allowance_stays_frozen_when_membership_grows(state):
    rank(state, members("a", "b"))
    rank(state, members("a", "b"), T0 + 1)
    ranked = rank(state, members("a", "b", "c", "d"), T0 + 2)
    assert ranked.reason != "coldExplore"
    assert entry(state)["coldAllowance"] == 2


def test_qualified_members_are_not_cold_explored(state):
    train(state, "a")
    ranked = rank(state, members("a", "b"))
    assert ranked.winner.name == "b" and ranked.reason == "coldExplore"
    assert rank(state, members("a", "b"), T0 + 1).winner.name == "a"


def test_exclude_removes_the_failed_node_even_when_it_is_the_ordinary_winner(state):
    for node in "abc":
        train(state, node)
    group = members("a", "b", "c")
    assert rank(state, group).winner.name == "a"
    ranked = rank(state, group, T0 + 1, exclude=frozenset({"a"}))
    assert ranked.winner.name == "b"
    assert all(m.name != "a" for m in ranked.order)


def test_exclude_down_to_one_member_is_a_neutral_singleton(state):
    for node in "ab":
        train(state, node)
    before = state.stats()
    ranked = rank(state, members("a", "b"), exclude=frozenset({"a"}))
    assert ranked.winner.name == "b" and ranked.reason == "singleton"
    assert state.stats() == before


def test_exactly_one_final_reason_per_applied_rank(state, perf):
    for node in "ab":
        train(state, node)
    group = members("a", "b", "c")
    applied = 0
    for i in range(12):
        perf.utility = {"a": 0.1 * (i % 4), "b": 0.3}
        if i == 5:
            fail(state, "a", T0 + i)
        before = sum(reasons(state).values()) if state.stats()["groups"] else 0
        rank(state, group, T0 + i)
        applied += 1
        assert sum(reasons(state).values()) == before + 1
    assert sum(reasons(state).values()) == applied
    assert set(reasons(state)) == set(FINAL_REASONS)


def test_peek_increments_nothing_and_spends_no_allowance(state, perf):
    group = members("a", "b", "c")
    for i in range(3):
        peeked = rank(state, group, T0 + i, peek=True)
        assert peeked.winner.name == "a" and peeked.reason == "peek"
    assert state.stats()["groups"] == []
    assert rank(state, group, T0 + 4).winner.name == "a"  # the trial a peek showed is still unspent
    for node in "abc":
        train(state, node)
    snapshot = state.stats()
    rank(state, group, T0 + 5, peek=True)
    assert state.stats() == snapshot


def test_ordinary_switch_and_flap_are_counted(state, perf):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    perf.utility = {"a": 0.9, "b": 0.1}
    assert rank(state, group).winner.name == "a"  # first choice: no switch
    perf.utility = {"a": 0.1, "b": 0.9}
    assert rank(state, group, T0 + 1).winner.name == "b"
    perf.utility = {"a": 0.9, "b": 0.1}
    assert rank(state, group, T0 + 2).winner.name == "a"
    e = entry(state)
    assert e["ordinarySwitch"] == 2 and e["switchFlap"] == 1


def test_cold_trials_are_not_switches_and_do_not_become_incumbent(state):
    group = members("a", "b")
    rank(state, group)
    rank(state, group, T0 + 1)
    assert entry(state)["ordinarySwitch"] == 0
    assert state._incumbents == {}


def test_rank_is_deterministic_for_the_same_state_and_input(perf):
    def run():
        s = ScoreState(perf)
        train(s, "a", failures=1)
        train(s, "b")
        perf.utility = {"a": 0.7, "b": 0.7}
        return [rank(s, members("a", "b", "c"), T0 + i) for i in range(6)]

    assert run() == run()


def test_stats_expose_no_node_or_target_identity(state):
    for node in ("secret-node-1", "secret-node-2"):
        train(state, node)
    rank(state, members("secret-node-1", "secret-node-2"))
    text = repr(state.stats())
    assert "secret-node" not in text and "example.com" not in text


def test_prune_forgets_removed_incumbents_and_deleted_groups(state):
    for node in "ab":
        train(state, node)
    rank(state, members("a", "b"))
    state.prune([(GROUP, "b")])
    assert state._incumbents == {}
    state.prune([("other", "x")])
    assert state.stats()["groups"] == []


def test_reload_keeps_scopes_and_needs_a_membership():
    state = ScoreState()
    with pytest.raises(ValueError):
        state.reload(T0)
    rank(state, members("a", "b"))
    state.reload(T0 + 1, [(GROUP, "a"), (GROUP, "b")])
    assert entry(state)["coldSpent"] == 1
