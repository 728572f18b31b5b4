"""What a walk says about itself: whether its result may be cached, and the flow it carries."""

from __future__ import annotations

from test_group_policies import TCP, World, group
from test_group_score import TARGET_X
from test_group_score import World as ScoreWorld

from honk.config.spec import Policy
from honk.group.view import NO_FLOW, Flow, View


def peek(manager, name: str):
    return manager._resolver.walk(name, TCP, (), 0, True, NO_FLOW)


def test_walk_through_score_group_is_not_cached():
    w = ScoreWorld(
        group("auto", "a", "b", policy=Policy.SCORE),
        group("outer", subgroups=("auto",), policy=Policy.FALLBACK),
    )
    walked = peek(w.manager, "outer")
    assert walked.selection is not None and walked.selection.chain[:2] == ("outer", "auto")
    assert not walked.cacheable
    assert w.manager._groups["outer"].cache == {} and w.manager._groups["auto"].cache == {}


def test_a_walk_of_classic_policies_is_cached_until_state_changes():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST), group("outer", subgroups=("auto",)))
    walked = peek(w.manager, "outer")
    assert walked.cacheable and walked.selection.chain == ("outer", "auto", "a")
    assert len(w.manager._groups["outer"].cache) == 1
    again = peek(w.manager, "outer")
    assert again.cacheable and again.selection.leaf is walked.selection.leaf


def test_a_last_resort_below_makes_the_walk_uncacheable():
    w = World(group("g", "a"), group("outer", subgroups=("g",)), nodes=("a",))
    w.kill("a")
    walked = peek(w.manager, "outer")
    assert walked.selection.chain == ("outer", "g", "a") and not walked.cacheable
    assert w.manager._groups["outer"].cache == {}


def test_a_view_carries_the_flow_it_was_given():
    w = World(group("g", "a", "b"))
    flow = Flow(TARGET_X, None)
    view = View(w.manager._resolver, w.manager._groups["g"], TCP, ("g",), 0, True, flow)
    assert (view.flow, view.target, view.destination) == (flow, TARGET_X, None)
