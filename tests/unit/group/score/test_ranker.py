"""Score's ordinary selection: liveness first, reliability first, escape, hysteresis, cold
exploration and recovery trials funded by the ledger, the exploration backoff, and exactly one
reason per applied rank."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.cells import Outcome
from honk.group.score.cohort import Kind, Reporter
from honk.group.score.constants import (
    EARN_DIVISOR,
    EARNED_CREDIT_CAP,
    EXPLORATION_BACKOFF_MAX,
    EXPLORATION_BACKOFF_MIN,
    RECOVERY_REPORTERS,
    TRIAL_ANSWER_TIMEOUT,
)
from honk.group.score.keys import AggregateKey, ExactKey, ScoreTarget
from honk.group.score.ranker import FINAL_REASONS, BudgetScope, Member, ScoreState

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
        return [self.utility.get(node) for node in candidates]


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


def trained_incumbent(state: ScoreState, names: str) -> list[Member]:
    """Members ``names``, each well trained, after a first rank that makes the first one incumbent."""
    for node in names:
        train(state, node)
    group = members(*names)
    assert rank(state, group).winner.name == names[0]
    return group


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


def test_a_new_members_list_is_read_again_and_the_same_list_reads_as_before(state):
    """The live reading is kept per (group, network) for the very list object ranked: the
    manager passes a new list when health changes, and that list's dead member is filtered."""
    trained_incumbent(state, "abc")
    assert rank(state, members("a", "b", "c"), T0 + 1).winner.name == "a"
    after_death = members("a", "b", "c", dead=("a",))
    for i in range(2, 4):  # the new list, then the same list object again
        ranked = rank(state, after_death, T0 + i)
        assert ranked.winner.name != "a"
        assert ranked.reason == "incumbentIneligible" if i == 2 else ranked.reason != "incumbentIneligible"
    assert entry(state)["candidates"]["deadFiltered"] == 2
    assert rank(state, members("a", "b", "c"), T0 + 4).winner.name in ("a", "b", "c")
    assert entry(state)["candidates"]["deadFiltered"] == 2


def test_a_member_whose_aggregate_cells_appear_later_is_read_with_them_on_the_same_list(state):
    """The aggregate rows' alignment with a members list is kept only while the store holds the
    same cells: a member's first cells (and a prune's dropped ones) are read at once."""
    state.scopes[(GROUP, TCP, V4)] = BudgetScope(3, 0)  # no cold allowance: only ordinary selection
    group = members("a", "b", "c")
    train(state, "a", failures=3)
    train(state, "b", failures=3)
    assert rank(state, group, peek=True).winner.name == "a"  # c has no evidence: the prior's bound
    for _ in range(3 * TRAINED):  # c's first cell, targetless (global aggregate only): a new row entry
        state.evidence.record(GROUP, TCP, None, "c", Outcome.USEFUL, T0)
    assert rank(state, group, T0 + 1, peek=True).winner.name == "c"
    state.prune({(GROUP, "a"), (GROUP, "b")})  # c's cells dropped while it stays listed
    assert rank(state, group, T0 + 2, peek=True).winner.name == "a"


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
    group = trained_incumbent(state, "abc")
    fail(state, "a", T0 + 1)
    ranked = rank(state, group, T0 + 2)
    assert ranked.winner.name == "b"
    assert ranked.reason == "freshFailureBypass"
    assert entry(state)["candidates"]["failStreakExcluded"] == 1


def test_old_unresolved_failure_still_escapes_but_is_no_longer_excluded(state):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    ranked = rank(state, group, T0 + 200)  # older than the exclusion window, still backing off
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
    group = trained_incumbent(state, "ab")
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
    group = trained_incumbent(state, "abc")
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
    assert state.switches.winners() == {}


def test_what_the_group_serves_is_its_last_ordinary_pick_never_a_trial_and_a_targetless_peek_reads_it(state):
    train(state, "a")
    train(state, "b")
    assert state.served(GROUP, TCP) is None
    ordinary = rank(state, members("a", "b"))
    assert ordinary.reason != "coldExplore" and state.served(GROUP, TCP) == ordinary.winner.node_id == "a"
    group = members("a", "b", "c")  # c joins untrained: the scope's allowance still funds a trial
    trial = rank(state, group, T0 + 2)
    assert trial.reason == "coldExplore" and trial.winner.name == "c"
    assert state.served(GROUP, TCP) == "a"  # one flow's trial is not what the group serves
    before = state.stats()
    now = state.rank(GROUP, TCP, None, None, group, T0 + 3, peek=True)
    assert now.winner.name == ordinary.winner.name and now.reason == "peek"
    assert state.stats() == before and state.served(GROUP, TCP) == ordinary.winner.node_id


def test_a_singleton_serves_without_counting_and_a_dead_served_member_is_left_at_once(state):
    for node in "abc":
        train(state, node)
    assert rank(state, members("a", "b", "c")).winner.name == "a"
    alone = rank(state, members("a", "b", "c", dead=("a", "b")), T0 + 1)
    assert alone.reason == "singleton" and state.served(GROUP, TCP) == "c"
    assert state.switches.winners() == {(GROUP, TCP, V4, TARGET): "a"}  # no incumbent moved
    peeked = state.rank(GROUP, TCP, None, None, members("a", "b", "c", dead=("c",)), T0 + 2, peek=True)
    assert peeked.winner.name == "a"  # c died: the ordinary alternative, before any flow
    state.prune({(GROUP, "a"), (GROUP, "b")})
    assert state.served(GROUP, TCP) is None  # a removed member is nothing the group serves


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
    assert state.switches.winners() == {}
    state.prune([("other", "x")])
    assert state.stats()["groups"] == []


def test_reload_keeps_scopes_and_needs_a_membership():
    state = ScoreState()
    with pytest.raises(ValueError):
        state.reload(T0)
    rank(state, members("a", "b"))
    state.reload(T0 + 1, [(GROUP, "a"), (GROUP, "b")])
    assert entry(state)["coldSpent"] == 1


def test_an_incumbent_whose_only_rival_failed_recently_is_held_not_a_crash(state):
    group = trained_incumbent(state, "ab")
    fail(state, "b", T0 + 1)  # the rival is excluded for its recent failure: no one to compare with
    ranked = rank(state, group, T0 + 2)
    assert ranked.winner.name == "a" and ranked.reason == "incumbentHeld"


def test_a_challenger_with_an_unresolved_failure_is_not_promoted(state, perf):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    assert rank(state, group, T0 + 2).winner.name == "b"  # the bypass
    perf.utility = {"a": 1.0, "b": 0.2}  # a would win on performance, but its failure is still open
    for t in (T0 + 200, T0 + 201, T0 + 202):  # past the exclusion window, within the backoff
        assert rank(state, group, t).winner.name == "b"


# --- recovery trials: backoff, ledger, continuations -------------------------------------------

TRIALS = ("coldExplore", "periodicExplore")


def scope(state: ScoreState):
    [s] = state.scopes.values()
    return s


def answer(state: ScoreState, node: str, reporter: str, now: float) -> None:
    """A Traffic reporter's TX and RX on the node's failed cell (the global aggregate)."""
    cell = AggregateKey(GROUP, TCP, None, node)
    state.cohorts.tx(cell, Reporter(reporter), now)
    state.cohorts.rx(cell, Reporter(reporter), now, kind=Kind.TRAFFIC)


def earn(state: ScoreState, group, count: int, now: float) -> None:
    """Original applied ranks that fund trials (the incumbent keeps winning them)."""
    for i in range(count):
        rank(state, group, now + i * 1e-3)


def test_a_failed_member_backs_off_five_minutes_then_gets_one_recovery_trial(state):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    assert rank(state, group, T0 + 2).winner.name == "b"  # the escape
    assert rank(state, group, T0 + 1 + EXPLORATION_BACKOFF_MIN - 1).winner.name == "b"  # backing off
    trial = rank(state, group, T0 + 1 + EXPLORATION_BACKOFF_MIN)
    assert trial.winner.name == "a" and trial.reason == "periodicExplore"
    # one unanswered trial at a time: the next flow goes to the ordinary winner
    assert rank(state, group, T0 + 2 + EXPLORATION_BACKOFF_MIN).winner.name == "b"


def test_a_recovery_trial_never_becomes_the_incumbent_nor_a_switch(state):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    rank(state, group, T0 + 2)
    switches = entry(state)["ordinarySwitch"]
    assert rank(state, group, T0 + 1 + EXPLORATION_BACKOFF_MIN).reason == "periodicExplore"
    assert list(state.switches.winners().values()) == ["b"]
    assert entry(state)["ordinarySwitch"] == switches
    assert reasons(state)["periodicExplore"] == 1


def test_an_unanswered_trial_may_be_sent_again_after_the_answer_timeout(state):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    start = T0 + 1 + EXPLORATION_BACKOFF_MIN
    assert rank(state, group, start).reason == "periodicExplore"
    assert rank(state, group, start + TRIAL_ANSWER_TIMEOUT - 1).winner.name == "b"
    assert rank(state, group, start + TRIAL_ANSWER_TIMEOUT).reason == "periodicExplore"


def test_backoff_doubles_on_each_failed_trial_up_to_six_hours(state):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    earn(state, group, 20 * EARN_DIVISOR, T0)  # fill the ledger: the cap still admits every trial below
    failed = T0 + 1
    fail(state, "a", failed, episode="e0")
    delays = []
    delay = EXPLORATION_BACKOFF_MIN
    for round_ in range(9):
        # backing off, even once its qualification has lapsed: no cold trial either
        assert rank(state, group, failed + delay - 1).winner.name == "b"
        trial = rank(state, group, failed + delay)
        assert trial.winner.name == "a" and trial.reason == "periodicExplore"
        delays.append(delay)
        failed = failed + delay + 1  # the trial fails: the streak goes on
        fail(state, "a", failed, episode=f"e{round_ + 1}")
        earn(state, group, EARN_DIVISOR, failed + 0.5)  # fund the next round
        delay = min(2 * delay, EXPLORATION_BACKOFF_MAX)
    assert delays[:4] == [300.0, 600.0, 1200.0, 2400.0]
    assert delays[-2:] == [EXPLORATION_BACKOFF_MAX, EXPLORATION_BACKOFF_MAX]


def test_more_flows_of_the_failure_burst_do_not_grow_the_backoff(state):
    group = trained_incumbent(state, "ab")
    fail(state, "a", T0 + 1)
    rank(state, group, T0 + 2)
    fail(state, "a", T0 + 3)  # another flow that was in flight when the first failed
    assert rank(state, group, T0 + 3 + EXPLORATION_BACKOFF_MIN).reason == "periodicExplore"


def test_an_answered_trial_continues_until_four_reporters_recover_then_ordinary_selection_decides(
    state, perf
):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    perf.utility = {"a": 0.9, "b": 0.3}
    assert rank(state, group).winner.name == "a"
    earn(state, group, 4 * EARN_DIVISOR, T0)  # four continuations need four credits
    fail(state, "a", T0 + 1)
    assert rank(state, group, T0 + 2).winner.name == "b"
    now = T0 + 1 + EXPLORATION_BACKOFF_MIN
    assert rank(state, group, now).reason == "periodicExplore"
    answer(state, "a", "r0", now + 0.5)  # the trial's RX lands behind the failure fence (GH-K-36)
    for i in range(1, RECOVERY_REPORTERS):
        now += 1
        continued = rank(state, group, now)
        assert continued.winner.name == "a" and continued.reason == "periodicExplore"
        answer(state, "a", f"r{i}", now + 0.5)
    assert list(state.switches.winners().values()) == ["b"]  # continuations never made it the incumbent
    back = rank(state, group, now + 1)  # recovered: the ordinary rules win the faster member back
    assert back.winner.name == "a" and back.reason == "performanceWinner"
    assert list(state.switches.winners().values()) == ["a"]


def test_a_retry_gets_no_recovery_trial_and_earns_nothing(state):
    for node in "abc":
        train(state, node)
    group = members("a", "b", "c")
    rank(state, group)
    fail(state, "a", T0 + 1)
    rank(state, group, T0 + 2)
    earned = scope(state).earned
    retry = rank(state, group, T0 + 1 + EXPLORATION_BACKOFF_MIN, exclude=frozenset({"c"}))
    assert retry.winner.name == "b" and retry.reason != "periodicExplore"
    assert scope(state).earned == earned


def test_each_original_applied_rank_earns_a_sixteenth_and_peeks_earn_nothing(state):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    for i in range(EARN_DIVISOR):
        rank(state, group, T0 + i)
        rank(state, group, T0 + i, peek=True)
    assert scope(state).earned == 1.0
    assert scope(state).remaining == scope(state).allowance + 1


def test_unspent_earned_credit_is_capped_at_eight(state):
    for node in "ab":
        train(state, node)
    group = members("a", "b")
    earn(state, group, 20 * EARN_DIVISOR, T0)
    s = scope(state)
    assert s.earned == EARNED_CREDIT_CAP
    assert s.remaining == s.allowance + EARNED_CREDIT_CAP


def test_a_trial_without_credit_is_refused_and_the_flow_goes_to_the_ordinary_winner(state):
    group = trained_incumbent(state, "ab")
    s = scope(state)
    s.spent = s.allowance  # the cold allowance is gone and less than one credit was earned
    fail(state, "a", T0 + 1)
    ranked = rank(state, group, T0 + 1 + EXPLORATION_BACKOFF_MIN)
    assert ranked.winner.name == "b" and ranked.reason not in TRIALS


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["rank", "peek", "retry", "fail", "answer", "wait"]),
        st.sampled_from(["a", "b", "c"]),
        st.floats(min_value=0.1, max_value=2 * EXPLORATION_BACKOFF_MIN),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_ledger_invariant_and_trial_rules_hold_after_every_operation(ops):
    state = ScoreState(FakeHeuristic())
    for node in "ab":  # c stays untrained: cold exploration shares the ledger
        train(state, node)
    group = members("a", "b", "c")
    now = T0
    for step, (op, node, dt) in enumerate(ops):
        now += dt
        before = state.switches.winners()
        if op == "rank":
            ranked = rank(state, group, now)
            if ranked.reason in TRIALS:
                assert state.switches.winners() == before  # a trial never becomes the incumbent
        elif op == "peek":
            snapshot = state.stats()
            rank(state, group, now, peek=True)
            assert state.stats() == snapshot
        elif op == "retry":
            assert rank(state, group, now, exclude=frozenset({node})).reason not in ("periodicExplore",)
        elif op == "fail":
            fail(state, node, now, episode=f"e{step}")
        elif op == "answer":
            answer(state, node, f"r{step}", now)
        for s in state.scopes.values():
            assert s.spent <= s.allowance + int(s.earned)  # V + R <= B + floor(E), R = 0
            assert int(s.earned) - max(0, s.spent - s.allowance) <= EARNED_CREDIT_CAP
            assert s.remaining >= 0


def target_fail(state: ScoreState, node: str, now: float, episode: str) -> None:
    """A target-path failure: the outcome in the evidence, the episode on the exact cell only."""
    state.evidence.record(GROUP, TCP, TARGET, node, Outcome.FAILURE, now, DESTINATION)
    state.cohorts.fail(ExactKey(GROUP, TCP, V4, TARGET, node), now, episode=episode)


def test_a_lone_target_path_failure_of_a_strong_incumbent_is_held(state):
    group = trained_incumbent(state, "ab")
    target_fail(state, "a", T0 + 1, "chance")
    ranked = rank(state, group, T0 + 2)
    assert ranked.winner.name == "a" and ranked.reason == "incumbentHeld"  # its next flows can recover it


def test_a_second_independent_target_path_failure_escapes_at_once(state):
    group = trained_incumbent(state, "ab")
    target_fail(state, "a", T0 + 1, "first")
    assert rank(state, group, T0 + 2).winner.name == "a"
    target_fail(state, "a", T0 + 3, "second")
    ranked = rank(state, group, T0 + 4)
    assert ranked.winner.name == "b" and ranked.reason == "freshFailureBypass"
