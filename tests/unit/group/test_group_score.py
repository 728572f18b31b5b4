"""``policy: score`` in the group manager (GH-K-01, 05, 06, 07, 08, 77, 132), on a fake clock."""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

import pytest

from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.api.clash_views import PINNABLE, group_now
from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.connection.dispatch import Dispatcher, Routed
from honk.core.clock import FakeClock
from honk.core.errors import DialError
from honk.core.net import Address, FlowMeta, Network
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.group.policy import Score, UnknownGroup
from honk.group.score.attempt import Result
from honk.group.score.cells import Outcome
from honk.group.score.constants import RECOVERY_REPORTERS
from honk.group.score.keys import AggregateKey, ScoreTarget
from honk.group.score.ranker import Member
from honk.outbound.registry import build_outbounds

TCP = Network.TCP
V4 = Family.V4
KILL_FAILURES = 3  # consecutive check failures that make a node TCP-dead
SELECTIONS = 20  # flows resolved where a test asserts "never"
GOOD, BAD = 8, 6  # completions that make a node clearly better or worse for one target
TARGET_X = ScoreTarget.of("x.example", 443)
TARGET_Y = ScoreTarget.of("y.example", 443)
DEST_X = ipaddress.ip_address("192.0.2.1")
DEST_Y = ipaddress.ip_address("192.0.2.2")


def node(name: str) -> NodeSpec:
    return with_node_id(NodeSpec(name, "socks5", "127.0.0.1", 1000 + sum(map(ord, name))))


def group(name: str, *members: str, subgroups: tuple[str, ...] = (), **kw) -> GroupSpec:
    filters = (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in members)),)),) if members else ()
    return GroupSpec(
        name, filters=filters, subgroups=subgroups, has_filter_lines=bool(members or subgroups), **kw
    )


def score(name: str, *members: str, **kw) -> GroupSpec:
    return group(name, *members, policy=Policy.SCORE, **kw)


class World:
    """Nodes with real health state and a manager over them; ``rebuild`` is a reload."""

    def __init__(self, *groups: GroupSpec, nodes=("a", "b", "c")) -> None:
        self.clock = FakeClock()
        self.alive = AliveDialerSet(self.clock)
        self.health = HealthFilter(self.alive, GroupChecks(self.clock))
        self.nodes = {n: node(n) for n in nodes}
        self.ids = {n: spec.id for n, spec in self.nodes.items()}
        for spec in self.nodes.values():
            self.alive.register_node(spec.id, spec.name)
        self.clock.advance(REGISTRATION_GRACE + 1)
        self.manager = self.build(groups, previous=None)

    def build(self, groups, previous: GroupManager | None, nodes=None) -> GroupManager:
        self.spec = Spec(nodes=tuple(self.nodes[n] for n in (nodes or self.nodes)), groups=tuple(groups))
        self.outbounds = build_outbounds(self.spec, self.clock)[0]
        return GroupManager.build(
            self.spec,
            self.outbounds,
            health=self.health,
            clock=self.clock,
            previous=previous,
            score_ranking=True,
        )

    def leaf(self, name: str, target: ScoreTarget | None = None, destination=None) -> str:
        return self.manager.resolve(name, TCP, target=target, destination=destination).leaf.name

    def kill(self, n: str) -> None:
        for _ in range(KILL_FAILURES):
            self.alive.notify_check_failure(self.ids[n], Domain.TCP, V4)

    def record(
        self, grp: str, n: str, target: ScoreTarget | None, destination, outcome: Outcome, count: int
    ) -> None:
        for _ in range(count):
            self.manager.score.evidence.record(
                grp, TCP, target, self.ids[n], outcome, self.clock.now(), destination
            )


def test_score_group_is_a_score_policy_sharing_the_manager_state():
    w = World(score("auto", "a", "b"))
    policy = w.manager.policy("auto")
    assert isinstance(policy, Score)
    assert policy.state is w.manager.score


def test_without_score_ranking_a_score_group_serves_as_urltest_from_probes():
    from honk.group.policy import URLTest

    w = World(score("auto", "a", "b"))
    plain = GroupManager.build(w.spec, w.outbounds, health=w.health, clock=w.clock, score_ranking=False)
    assert isinstance(plain.policy("auto"), URLTest)


def test_the_default_build_ranks_score_groups_with_the_score_state():
    w = World(score("auto", "a", "b"))
    built = GroupManager.build(w.spec, w.outbounds, health=w.health, clock=w.clock)  # what the daemon builds
    assert isinstance(built.policy("auto"), Score)


def test_score_group_returns_one_authoritative_leaf_and_never_a_dead_member():
    w = World(score("auto", "a", "b", "c"))
    w.kill("a")
    w.kill("c")
    for _ in range(SELECTIONS):
        selection = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
        assert selection.leaf.name == "b"
        assert selection.chain == ("auto", "b")


def test_a_score_group_with_every_member_dead_serves_nothing_but_its_final():
    w = World(score("auto", "a", "b", final="c"))
    w.kill("a")
    w.kill("b")
    assert w.leaf("auto", TARGET_X) == "c"


def test_target_context_reaches_the_ranker_and_different_targets_pick_different_nodes():
    w = World(score("auto", "a", "b"), nodes=("a", "b"))
    w.record("auto", "a", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.record("auto", "b", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.record("auto", "b", TARGET_X, DEST_X, Outcome.FAILURE, BAD)
    w.record("auto", "b", TARGET_Y, DEST_Y, Outcome.USEFUL, GOOD)
    w.record("auto", "a", TARGET_Y, DEST_Y, Outcome.USEFUL, GOOD)
    w.record("auto", "a", TARGET_Y, DEST_Y, Outcome.FAILURE, BAD)
    assert w.leaf("auto", TARGET_X, DEST_X) == "a"
    assert w.leaf("auto", TARGET_Y, DEST_Y) == "b"
    assert w.leaf("auto", TARGET_X, DEST_X) == "a"  # nothing cached across targets


def test_a_nested_score_group_resolves_through_its_own_pick():
    w = World(score("auto", "a", "b"), group("outer", subgroups=("auto",), policy=Policy.SELECTOR))
    w.kill("a")
    assert w.manager.resolve("outer", TCP, target=TARGET_X).chain == ("outer", "auto", "b")


def test_a_score_group_over_a_sub_group_keeps_its_members_list_while_every_member_reads_the_same():
    w = World(
        score("inner", "a", "b"), score("top", "c", "d", subgroups=("inner",)), nodes=("a", "b", "c", "d")
    )
    lists: list[list[Member]] = []
    rank = w.manager.score.rank

    def spy(group, network, target, family, members, now, **kw):
        if group == "top":
            lists.append(members)
        return rank(group, network, target, family, members, now, **kw)

    w.manager.score.rank = spy
    w.leaf("top", TARGET_X, DEST_X)
    w.leaf("top", TARGET_Y, DEST_Y)
    assert lists[0] is lists[1]  # leaves and the sub-group's pick read the same: the very same list
    inner = lists[0][2]
    w.kill(w.manager.resolve("inner", TCP, peek=True, target=TARGET_X, destination=DEST_X).leaf.name)
    w.leaf("top", TARGET_X, DEST_X)
    assert lists[-1] is not lists[0]
    assert lists[-1][2].name == "inner" and lists[-1][2].node_id != inner.node_id  # the inner's new pick
    assert lists[0][2] == inner  # a list once ranked is never changed
    before = lists[-1]
    w.kill("c")
    w.leaf("top", TARGET_X, DEST_X)
    assert lists[-1] is not before and lists[-1][0] == Member("c", w.ids["c"], False)


def test_reload_shares_the_score_state_and_prunes_removed_members():
    w = World(score("auto", "a", "b", "c"))
    w.record("auto", "c", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.record("auto", "a", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    state = w.manager.score
    reloaded = w.build([score("auto", "a", "b")], previous=w.manager, nodes=("a", "b"))
    assert reloaded.score is state
    reloaded.commit_score(w.clock.now())
    assert state.evidence.layers("auto", TCP, TARGET_X, w.ids["c"], DEST_X) == [None, None, None]
    assert all(cell is not None for cell in state.evidence.layers("auto", TCP, TARGET_X, w.ids["a"], DEST_X))
    assert isinstance(reloaded.policy("auto"), Score) and reloaded.policy("auto").state is state


def test_a_prepared_reload_that_is_never_committed_prunes_nothing():
    w = World(score("auto", "a", "b", "c"))
    w.record("auto", "c", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.build([score("auto", "a", "b")], previous=w.manager, nodes=("a", "b"))  # prepared, then abandoned
    assert all(
        cell is not None
        for cell in w.manager.score.evidence.layers("auto", TCP, TARGET_X, w.ids["c"], DEST_X)
    )
    assert w.manager.score.evidence.is_member("auto", w.ids["c"])


def test_a_committed_reload_revokes_leases_and_clears_probe_baselines():
    w = World(score("auto", "a", "b"))
    feedback = w.manager.score_feedback(("auto", "a"), w.outbounds["a"], TCP, TARGET_X, DEST_X)
    cell = feedback.traversed[0].cohort_cell()
    failed = feedback.start().begin(w.clock.now()).into_reporter(w.clock.now())
    failed.setup(w.clock.now())
    failed.settle(w.clock.now(), Result.failure())
    for _ in range(RECOVERY_REPORTERS):  # four flows with RX after TX: the episode clears, a lease starts
        w.clock.advance(0.1)
        feedback = w.manager.score_feedback(("auto", "a"), w.outbounds["a"], TCP, TARGET_X, DEST_X)
        reporter = feedback.start().begin(w.clock.now()).into_reporter(w.clock.now())
        reporter.setup(w.clock.now())
        reporter.tx(w.clock.now(), 100)
        reporter.rx(w.clock.now(), 100)
        reporter.settle(w.clock.now(), Result.success())
    cohorts = w.manager.score.cohorts
    assert cohorts.lease_valid(cell, w.clock.now())
    heuristic = w.manager.score.performance
    generation = heuristic.probe_generation

    reloaded = w.build([score("auto", "a", "b")], previous=w.manager)
    assert cohorts.lease_valid(cell, w.clock.now())  # prepared only: nothing changed yet
    reloaded.commit_score(w.clock.now())
    assert not cohorts.lease_valid(cell, w.clock.now())
    assert heuristic.probe_generation == generation + 1


def test_a_deleted_score_group_loses_its_state_on_reload():
    w = World(score("auto", "a", "b"), score("other", "a", "b"))
    w.record("auto", "a", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.leaf("auto", TARGET_X, DEST_X)
    w.build([score("other", "a", "b")], previous=w.manager).commit_score(w.clock.now())
    assert [g["group"] for g in w.manager.score.stats()["groups"]] == []
    assert w.manager.score.evidence.layers("auto", TCP, TARGET_X, w.ids["a"], DEST_X) == [None, None, None]


def test_a_restart_starts_with_an_empty_score_state():
    w = World(score("auto", "a", "b"))
    w.record("auto", "a", TARGET_X, DEST_X, Outcome.USEFUL, GOOD)
    w.leaf("auto", TARGET_X, DEST_X)
    fresh = w.build([score("auto", "a", "b")], previous=None)
    assert fresh.score is not w.manager.score
    assert fresh.score.stats()["groups"] == []
    assert fresh.score.evidence.stats().aggregate_entries == 0


def test_peek_changes_no_score_state():
    w = World(score("auto", "a", "b", "c"))
    w.record("auto", "b", None, None, Outcome.USEFUL, GOOD)
    before = w.manager.score.stats()
    chain = w.manager.selection_chain("auto")
    w.manager.resolve("auto", TCP, peek=True, target=TARGET_X, destination=DEST_X)
    w.manager.delay_test_members("auto")
    now = group_now(w.manager, "auto")
    assert w.manager.score.stats() == before
    assert w.manager.score.scopes == {}
    assert chain[0] == "auto" and now == chain[1]


def test_clash_now_is_the_aggregate_tcp_winner():
    w = World(score("auto", "a", "b"), nodes=("a", "b"))
    w.record("auto", "a", None, None, Outcome.USEFUL, GOOD)
    w.record("auto", "b", None, None, Outcome.USEFUL, GOOD)
    w.record("auto", "a", None, None, Outcome.FAILURE, BAD)
    # the aggregate rank with no target, as a peek
    ranked = w.manager.score.rank("auto", TCP, None, None, _members(w, "a", "b"), w.clock.now(), peek=True)
    assert group_now(w.manager, "auto") == ranked.winner.name == "b"


def _fail_after_setup(w: World, selection, target: ScoreTarget, destination) -> None:
    """One flow of ``selection`` set up, then failed on its target's path (a business failure)."""
    feedback = w.manager.score_feedback(selection.chain, selection.leaf, TCP, target, destination)
    reporter = feedback.start().begin(w.clock.now()).into_reporter(w.clock.now())
    reporter.setup(w.clock.now())
    reporter.settle(w.clock.now(), Result.failure(node_scoped=False))


def test_clash_now_follows_new_flows_at_once_when_the_incumbent_fails_and_a_peek_changes_nothing():
    w = World(score("auto", "a", "b", "c"))
    for n in "abc":  # qualified everywhere: every pick below is an ordinary one, no trial
        w.record("auto", n, None, None, Outcome.USEFUL, GOOD)
    assert w.leaf("auto") == "a"  # a targetless flow makes a the aggregate's own incumbent
    served = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
    assert served.leaf.name == "a" and group_now(w.manager, "auto") == "a"
    w.clock.advance(1)
    _fail_after_setup(w, served, TARGET_X, DEST_X)
    escaped = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
    assert escaped.leaf.name == "b"  # Score's escape: the next flow leaves the failed incumbent
    before = w.manager.score.stats()
    scopes = {key: (s.spent, s.earned, set(s.tried)) for key, s in w.manager.score.scopes.items()}
    # at once, although the aggregate ranking alone still holds a (it never saw the target fail)
    assert group_now(w.manager, "auto") == "b"
    assert w.manager.selection_chain("auto") == ("auto", "b")
    assert w.manager.resolve("auto", TCP, peek=True).leaf.name == "b"
    assert (
        w.manager.score.rank(
            "auto", TCP, None, None, _members(w, "a", "b", "c"), w.clock.now(), peek=True
        ).winner.name
        == "b"
    )
    assert w.manager.score.stats() == before  # peeks change no Score state
    assert {key: (s.spent, s.earned, set(s.tried)) for key, s in w.manager.score.scopes.items()} == scopes
    assert w.manager.score.served("auto", TCP) == w.ids["b"]
    for _ in range(3):  # and new flows keep going where `now` says
        assert w.leaf("auto", TARGET_X, DEST_X) == "b" == group_now(w.manager, "auto")
    w.kill("b")  # the member it serves dies: `now` moves to the ordinary alternative before any flow
    assert group_now(w.manager, "auto") == "c"
    assert w.leaf("auto", TARGET_X, DEST_X) == "c" == group_now(w.manager, "auto")


def test_a_setup_retry_is_what_the_group_serves_now():
    w = World(score("auto", "a", "b", "c"))
    for n in "abc":
        w.record("auto", n, None, None, Outcome.USEFUL, GOOD)
    served = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
    (retry,) = w.manager.retry_candidates("auto", TCP, served.leaf, target=TARGET_X, destination=DEST_X)
    assert retry.leaf is not served.leaf
    assert group_now(w.manager, "auto") == retry.leaf.name


def test_a_warm_up_setup_sample_reaches_every_score_group_of_the_node_as_targetless_setup_quality_only():
    w = World(
        score("auto", "a", "b"),
        score("other", "b", "c", final="a"),
        group("plain", "a", "b", policy=Policy.URLTEST),
    )
    now = w.clock.now()
    assert (
        w.manager.observe_warm_setup(w.outbounds["a"], TCP, 0.020, now) == 2
    )  # auto, and other by its final
    assert w.manager.observe_warm_setup(w.outbounds["b"], TCP, 0.200, now) == 2
    assert w.manager.observe_warm_setup(w.outbounds["direct"], TCP, 0.001, now) == 0  # no node, no sample
    heuristic = w.manager.score.performance
    ids = [w.ids["a"], w.ids["b"]]
    fast, slow = heuristic.score("auto", TCP, None, None, ids, now)
    assert fast > slow  # the aggregate (targetless) setup scope ranks the quicker opening first
    assert heuristic.score("auto", TCP, TARGET_X, V4, ids, now) == [None, None]  # no target reads it
    # setup quality only (GH-F-26): no outcome, cell, episode, cohort credit or counter anywhere
    evidence = w.manager.score.evidence.stats()
    assert evidence.aggregate_entries == 0 and evidence.exact_entries == 0
    assert w.manager.score.stats()["groups"] == []
    cell = AggregateKey("auto", TCP, None, w.ids["a"])
    assert (
        w.manager.score.cohorts.reporters(cell, now) == 0
        and w.manager.score.cohorts.open_episode(cell) is None
    )


def _members(w: World, *names: str) -> list[Member]:
    return [Member(n, w.ids[n], True) for n in names]


def test_a_score_group_cannot_be_pinned_or_selected_through_the_api():
    w = World(score("auto", "a", "b"))
    assert Policy.SCORE not in PINNABLE
    with pytest.raises(UnknownGroup):
        w.manager.pin("auto", "a")
    with pytest.raises(UnknownGroup):
        w.manager.select("auto", "a")


def test_score_setup_retry_offers_one_different_node():
    w = World(score("auto", "a", "b", "c"))
    served = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
    retry = w.manager.retry_candidates("auto", TCP, served.leaf, target=TARGET_X, destination=DEST_X)
    assert len(retry) == 1
    assert retry[0].leaf is not served.leaf and retry[0].chain[0] == "auto"


def test_score_setup_retry_has_nothing_when_the_failed_node_was_the_only_live_one():
    w = World(score("auto", "a", "b"), nodes=("a", "b"))
    w.kill("b")
    served = w.manager.resolve("auto", TCP, target=TARGET_X)
    assert served.leaf.name == "a"
    assert w.manager.retry_candidates("auto", TCP, served.leaf, target=TARGET_X) == []


def test_dispatcher_retry_round_for_a_score_group_is_one_different_leaf():
    w = World(group("outer", subgroups=("auto",), policy=Policy.SELECTOR), score("auto", "a", "b", "c"))
    meta = FlowMeta(TCP, Address("127.0.0.1", 50000), Address("x.example", 443), "socks")
    served = w.manager.resolve("outer", TCP, target=TARGET_X)
    routed = Routed(meta, "outer", "match", served.chain, served.leaf, 1)
    dispatcher = Dispatcher.__new__(Dispatcher)
    dispatcher._plane = SimpleNamespace(groups=w.manager)
    retry, fresh = dispatcher._retry_round(routed, DialError(served.leaf.name, "connect", "refused"))
    assert not fresh  # GH-K-77: both attempts share one establishment deadline
    assert len(retry) == 1
    assert retry[0].leaf is not served.leaf
    assert retry[0].chain[:2] == ("outer", "auto")


def test_each_served_flow_applies_exactly_one_rank():
    w = World(score("auto", "a", "b", "c"), group("outer", subgroups=("auto",), policy=Policy.URLTEST))
    for _ in range(SELECTIONS):
        w.leaf("auto", TARGET_X, DEST_X)
        w.leaf("outer", TARGET_X, DEST_X)
    (entry,) = w.manager.score.stats()["groups"]
    assert sum(entry["reasons"].values()) == 2 * SELECTIONS


def test_clash_now_keeps_the_served_member_while_targetless_evidence_prefers_one_no_flow_goes_to():
    # issue 32: every flow of the group goes to one target; its incumbent failed there and flows
    # escaped to b. Targetless evidence never saw that failure and rates a far better, so a
    # targetless rank would name a while every new flow goes to b.
    w = World(score("auto", "a", "b", "c"))
    for n in "abc":
        w.record("auto", n, None, None, Outcome.USEFUL, GOOD)
    served = w.manager.resolve("auto", TCP, target=TARGET_X, destination=DEST_X)
    assert served.leaf.name == "a"
    w.clock.advance(1)
    _fail_after_setup(w, served, TARGET_X, DEST_X)
    assert w.leaf("auto", TARGET_X, DEST_X) == "b"
    w.record("auto", "a", None, None, Outcome.USEFUL, 50 * GOOD)  # a shines on targetless evidence
    ranked = w.manager.score.rank(
        "auto", TCP, None, None, _members(w, "a", "b", "c"), w.clock.now(), peek=True
    )
    assert w.leaf("auto", TARGET_X, DEST_X) == "b" == group_now(w.manager, "auto") == ranked.winner.name
