"""Typed group events: what writes and served selections report, when, and through which sink;
and the policy registry that builds each configured policy."""

from __future__ import annotations

import random

import pytest
from test_group_policies import TCP, UDP, World, group, routed

from honk.config.spec import PICK_RANDOM, GroupSpec, Policy
from honk.group import writes
from honk.group.events import ChoiceChanged, FlowsInterrupted, Outbox, SelectionMoved
from honk.group.policy import (
    NETWORKS,
    POLICIES,
    Epoch,
    Fallback,
    LoadBalance,
    Random,
    Score,
    Selector,
    URLTest,
    make_policy,
    register_policy,
)
from honk.group.score.ranker import ScoreState


def test_select_returns_choice_changed_event():
    w = World(group("sel", "a", "b", interrupt_connections=True))
    written = writes.select(w.manager._structure, "sel", "b", TCP)
    assert written.changed == [TCP]
    assert written.events == (
        ChoiceChanged("sel", TCP, ("node", w.ids["b"])),
        SelectionMoved("sel", TCP),
        FlowsInterrupted("sel", TCP),
    )


def test_reselecting_the_effective_choice_reports_the_choice_but_no_move():
    w = World(group("sel", "a", "b"))
    written = writes.select(w.manager._structure, "sel", "a", None)  # the first member already serves
    assert written.events == tuple(ChoiceChanged("sel", net, ("node", w.ids["a"])) for net in NETWORKS)


def test_pin_returns_a_move_per_changed_network_and_nothing_for_a_no_op():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    structure = w.manager._structure
    assert writes.pin(structure, "auto", "b", UDP).events == (SelectionMoved("auto", UDP),)
    assert writes.pin(structure, "auto", "b", UDP).events == ()


def test_a_write_is_routed_through_the_sink_before_it_returns_in_emission_order():
    w = World(group("sel", "a", "b", interrupt_connections=True))
    seen = routed(w.manager, object)
    assert w.manager.select("sel", "b") == [TCP, UDP]
    assert seen == [
        ChoiceChanged("sel", TCP, ("node", w.ids["b"])),
        ChoiceChanged("sel", UDP, ("node", w.ids["b"])),
        SelectionMoved("sel", TCP),
        FlowsInterrupted("sel", TCP),
        SelectionMoved("sel", UDP),
        FlowsInterrupted("sel", UDP),
    ]


def test_a_served_fallback_move_is_routed_before_resolve_returns():
    w = World(group("fb", "a", "b", policy=Policy.FALLBACK))
    seen = routed(w.manager, SelectionMoved)
    assert w.leaf("fb") == "a" and seen == []  # a first pin moves nothing
    w.kill("a")
    assert w.leaf("fb") == "b"
    assert seen == [SelectionMoved("fb", TCP)]
    w.manager.resolve("fb", UDP, peek=True)
    assert seen == [SelectionMoved("fb", TCP)]  # a peek moves nothing


def test_events_without_a_sink_are_dropped_not_delivered_later():
    w = World(group("sel", "a", "b"))
    w.manager.select("sel", "b")
    seen = routed(w.manager, object)
    w.manager.resolve("sel", TCP)
    assert seen == []


def test_an_outbox_drains_events_a_handler_emits_meanwhile_in_order():
    outbox = Outbox()
    outbox.moved("g", TCP, interrupt=False)
    seen = []

    def sink(event):
        seen.append(event)
        if len(seen) == 1:
            outbox.emit(FlowsInterrupted("g", TCP))

    outbox.drain(sink)
    assert seen == [SelectionMoved("g", TCP), FlowsInterrupted("g", TCP)] and len(outbox) == 0


def test_commit_reports_a_move_only_when_it_replaces_a_served_member():
    for policy in (URLTest("u", ("a", "b"), 0.0), Fallback("f", ("a", "b"))):
        assert policy.commit(TCP, "a") is False  # the first one replaces nothing
        assert policy.commit(TCP, "a") is False
        assert policy.commit(TCP, "b") is True
        policy.fix("a", (TCP,))
        assert policy.commit(TCP, "a") is False  # served for the runtime pin
    rotation = LoadBalance("lb", ("a", "b"))
    assert not rotation.commit(TCP, "a") and not rotation.commit(TCP, "b")


def test_policies_hold_no_callbacks():
    w = World(group("u", "a", policy=Policy.URLTEST), group("f", "a", policy=Policy.FALLBACK))
    for name in ("u", "f"):
        assert not hasattr(w.manager.policy(name), "moved")


def test_policy_registry_builds_every_policy():
    kinds = {
        Policy.SELECTOR: Selector,
        Policy.URLTEST: URLTest,
        Policy.LOADBALANCE: LoadBalance,
        Policy.FALLBACK: Fallback,
        Policy.SCORE: Score,
    }
    assert {policy for policy, strategy in POLICIES if strategy is None} == set(Policy)
    for policy, cls in kinds.items():
        built = make_policy(GroupSpec("g", policy=policy), ("a", "b"), score=ScoreState())
        assert type(built) is cls and built.kind is policy and built.members == ("a", "b")
    drawn = make_policy(
        GroupSpec("g", Policy.LOADBALANCE, strategy=PICK_RANDOM), ("a",), rng=random.Random(1)
    )
    assert type(drawn) is Random
    baseline = make_policy(GroupSpec("g", Policy.SCORE), ("a",))  # no ScoreState: URLTest from probes
    assert type(baseline) is URLTest and baseline.rank_by == ""


def test_registering_one_entry_adds_a_strategy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(POLICIES, (Policy.FALLBACK, "first"), lambda i: Selector(i.spec.name, i.members))
    epoch = Epoch()
    assert type(make_policy(GroupSpec("g", Policy.FALLBACK, strategy="first"), ("a",), epoch)) is Selector
    assert type(make_policy(GroupSpec("g", Policy.FALLBACK, strategy="other"), ("a",))) is Fallback
    register_policy(Policy.FALLBACK, lambda i: Fallback(i.spec.name, i.members, i.epoch), strategy="again")
    try:
        assert type(make_policy(GroupSpec("g", Policy.FALLBACK, strategy="again"), ("a",))) is Fallback
    finally:
        del POLICIES[(Policy.FALLBACK, "again")]
