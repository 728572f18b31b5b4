"""Runtime pins ("fixed") on automatic groups, and the selection-change reports the metrics count."""

from __future__ import annotations

import pytest
from test_group_policies import UDP, World, group, routed

from honk.config.spec import Policy
from honk.core.net import Network
from honk.group.events import SelectionMoved
from honk.group.manager import GroupManager
from honk.group.policy import UnknownGroup, UnknownMember

TCP = Network.TCP


def test_a_pinned_urltest_member_serves_while_eligible_then_the_policy_decides_again():
    w = World(group("auto", "a", "b", "c", policy=Policy.URLTEST))
    w.sample("a", 10)
    w.sample("b", 200)
    w.sample("c", 300)
    assert w.leaf("auto") == "a"
    assert w.manager.pin("auto", "c") == [TCP, UDP]
    assert w.leaf("auto") == "c" and w.leaf("auto", UDP) == "c"
    assert w.manager.pinned("auto") == {TCP: "c", UDP: "c"}
    w.kill("c")
    assert w.leaf("auto") == "a"  # a dead pin does not hold the group hostage
    w.revive("c")
    assert w.leaf("auto") == "c"
    assert w.manager.pin("auto", None, TCP) == [TCP]
    assert w.leaf("auto") == "a" and w.leaf("auto", UDP) == "c"


def test_a_fallback_pin_overrides_the_first_eligible_member():
    w = World(group("fb", "a", "b", policy=Policy.FALLBACK))
    assert w.leaf("fb") == "a"
    w.manager.pin("fb", "b", TCP)
    assert w.leaf("fb") == "b" and w.leaf("fb", UDP) == "a"
    w.manager.pin("fb", None)
    assert w.leaf("fb") == "a"


def test_pins_are_refused_on_selectors_and_load_balancers_and_for_non_members():
    w = World(
        group("sel", "a", "b"),
        group("lb", "a", "b", policy=Policy.LOADBALANCE),
        group("auto", "a", "b", policy=Policy.URLTEST),
    )
    with pytest.raises(UnknownGroup):
        w.manager.pin("sel", "a")
    with pytest.raises(UnknownGroup):
        w.manager.pin("lb", "a")
    with pytest.raises(UnknownMember):
        w.manager.pin("auto", "c")
    assert w.manager.pinned("auto") == {} and w.manager.pinned("sel") == {}


def test_a_reload_drops_every_pin():
    w = World(group("auto", "a", "b", policy=Policy.URLTEST))
    w.manager.pin("auto", "b")
    rebuilt = GroupManager.build(
        w.spec, w.outbounds, health=w.manager.health, clock=w.clock, previous=w.manager
    )
    assert rebuilt.pinned("auto") == {}


def test_an_activation_drops_the_pins_of_unchanged_automatic_groups_and_keeps_selector_choices():
    """GH-A-16: a reload keeps an unchanged group's policy state (``reuse``, as the applier
    builds), but a native pin lives only in the running manager: the replacement has none,
    while a Selector's choice is carried (GH-A-03). The running manager keeps its pins until
    it is replaced (GH-A-02: the replacement is built, not the running one changed)."""
    w = World(
        group("sel", "a", "b"),
        group("auto", "a", "b", policy=Policy.URLTEST),
        group("fb", "a", "b", policy=Policy.FALLBACK),
    )
    w.sample("a", 10)
    w.sample("b", 300)
    w.manager.select("sel", "b", TCP)
    w.manager.pin("auto", "b")
    w.manager.pin("fb", "b", UDP)
    assert (w.leaf("sel"), w.leaf("auto"), w.leaf("fb", UDP)) == ("b", "b", "b")
    rebuilt = GroupManager.build(
        w.spec,
        w.outbounds,
        health=w.manager.health,
        clock=w.clock,
        previous=w.manager,
        reuse={"sel", "auto", "fb"},
    )
    assert rebuilt.pinned("auto") == {} and rebuilt.pinned("fb") == {}
    assert rebuilt.resolve("auto", TCP).leaf.name == "a" and rebuilt.resolve("auto", UDP).leaf.name == "a"
    assert rebuilt.resolve("fb", UDP).leaf.name == "a"
    assert rebuilt.choices() == {"sel": {TCP: "b"}} and rebuilt.resolve("sel", TCP).leaf.name == "b"
    assert w.manager.pinned("auto") == {TCP: "b", UDP: "b"} and w.manager.pinned("fb") == {UDP: "b"}
    assert w.leaf("auto") == "b"  # the running manager is not changed by building its replacement


def test_selection_changes_are_reported_for_writes_pins_and_automatic_moves_but_not_for_no_ops():
    w = World(
        group("sel", "a", "b"),
        group("auto", "a", "b", policy=Policy.URLTEST),
        group("fb", "a", "b", policy=Policy.FALLBACK),
    )
    seen = routed(w.manager, SelectionMoved)
    w.manager.select("sel", "a")  # the effective choice already (first member): nothing moved
    assert seen == []
    w.manager.select("sel", "b", TCP)
    assert seen == [SelectionMoved("sel", TCP)]
    seen.clear()
    w.sample("a", 10)
    w.sample("b", 300)
    assert w.leaf("auto") == "a"  # the first winner is not a change
    w.sample("b", 1)
    w.sample("b", 1)
    w.sample("a", 900)
    assert w.leaf("auto") == "b"
    assert seen == [SelectionMoved("auto", TCP)]
    seen.clear()
    w.manager.pin("auto", "a", UDP)
    assert seen == [SelectionMoved("auto", UDP)]
    seen.clear()
    assert w.leaf("fb") == "a"
    w.kill("a")
    assert w.leaf("fb") == "b"
    assert seen == [SelectionMoved("fb", TCP)]
