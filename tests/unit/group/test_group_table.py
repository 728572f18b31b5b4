"""GroupManager without health: resolution through nested groups, Selector order, finals, reload carry-over."""

from __future__ import annotations

import logging

import pytest

from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.core.clock import FakeClock
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.manager import MAX_NESTING_DEPTH, GroupManager
from honk.group.policy import UnknownGroup, UnknownMember
from honk.outbound.registry import build_outbounds


def node(name: str) -> NodeSpec:
    return with_node_id(NodeSpec(name, "socks5", "127.0.0.1", 1000 + sum(map(ord, name))))  # distinct NodeIds


def names(*exact: str) -> NodeFilter:
    return NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in exact)),))


def group(name: str, *members: str, subgroups: tuple[str, ...] = (), **kw) -> GroupSpec:
    filters = (names(*members),) if members else ()
    return GroupSpec(
        name, filters=filters, subgroups=subgroups, has_filter_lines=bool(members or subgroups), **kw
    )


def table(*groups: GroupSpec, nodes=("a", "b", "c"), previous=None) -> GroupManager:
    spec = Spec(nodes=tuple(node(n) for n in nodes), groups=groups)
    return GroupManager.build(spec, build_outbounds(spec, FakeClock())[0], previous=previous)


def chain(t: GroupManager, name: str, network: Network = Network.TCP) -> tuple[str, ...]:
    return t.resolve(name, network).chain


# --- leaves ---------------------------------------------------------------------


def test_leaf_asked_directly_resolves_to_itself() -> None:
    t = table()
    selection = t.resolve("a", Network.TCP)
    assert selection.chain == ("a",)
    assert selection.leaf.name == "a"


def test_builtins_resolve_without_any_group() -> None:
    t = table()
    assert t.resolve("direct", Network.UDP).leaf.protocol == "direct"
    assert t.resolve("block", Network.TCP).chain == ("block",)


def test_unknown_name_is_no_route() -> None:
    with pytest.raises(NoRoute):
        table().resolve("nowhere", Network.TCP)


# --- Selector order ----------------------------------------------------------------


def test_selector_picks_the_first_member_without_default_or_choice() -> None:
    assert chain(table(group("proxy", "b", "c")), "proxy") == ("proxy", "b")


def test_selector_default_beats_the_first_member() -> None:
    assert chain(table(group("proxy", "b", "c", default="c")), "proxy") == ("proxy", "c")


def test_runtime_choice_beats_the_default() -> None:
    t = table(group("proxy", "a", "b", "c", default="c"))
    t.select("proxy", "b")
    assert chain(t, "proxy", Network.TCP) == ("proxy", "b")
    assert chain(t, "proxy", Network.UDP) == ("proxy", "b")


def test_choice_for_one_network_leaves_the_other_alone() -> None:
    t = table(group("proxy", "a", "b", "c", default="c"))
    t.select("proxy", "a", Network.UDP)
    assert chain(t, "proxy", Network.UDP) == ("proxy", "a")
    assert chain(t, "proxy", Network.TCP) == ("proxy", "c")


def test_default_that_is_not_a_member_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        t = table(group("proxy", "b", "c", default="a"))
    assert chain(t, "proxy") == ("proxy", "b")
    assert "default" in caplog.text


def test_selecting_a_non_member_is_a_typed_key_error() -> None:
    t = table(group("proxy", "a", "b"))
    with pytest.raises(UnknownMember) as info:
        t.select("proxy", "c")
    assert isinstance(info.value, KeyError)
    assert chain(t, "proxy") == ("proxy", "a")


def test_selecting_in_an_unknown_group_is_a_typed_key_error() -> None:
    with pytest.raises(UnknownGroup):
        table().select("nope", "a")


def test_an_unmeasured_urltest_picks_its_first_member_and_takes_no_selector_write() -> None:
    t = table(group("auto", "a", "b", policy=Policy.URLTEST, default="b"))
    assert chain(t, "auto") == ("auto", "a")
    with pytest.raises(UnknownGroup):
        t.select("auto", "b")


# --- nesting -----------------------------------------------------------------------


def test_chain_runs_through_nested_groups_to_the_leaf() -> None:
    t = table(group("proxy", subgroups=("hk",)), group("hk", "a", "b"))
    selection = t.resolve("proxy", Network.TCP)
    assert selection.chain == ("proxy", "hk", "a")
    assert selection.leaf.name == "a"


def test_choice_can_name_a_nested_group() -> None:
    t = table(group("proxy", "a", subgroups=("hk",)), group("hk", "b", "c", default="c"))
    assert chain(t, "proxy") == ("proxy", "a")
    t.select("proxy", "hk")
    assert chain(t, "proxy") == ("proxy", "hk", "c")


def test_nesting_up_to_the_depth_cap_resolves() -> None:
    """g0 is depth 0; g8, at depth 8, still contributes its pick."""
    levels = [group(f"g{i}", subgroups=(f"g{i + 1}",)) for i in range(MAX_NESTING_DEPTH)]
    levels.append(group(f"g{MAX_NESTING_DEPTH}", "a"))
    assert chain(table(*levels), "g0")[-1] == "a"


def test_nesting_beyond_the_depth_cap_is_no_route() -> None:
    """The root is depth 0: g0 ... g8 fit, g9 (depth 9) contributes no candidate."""
    levels = [group(f"g{i}", subgroups=(f"g{i + 1}",)) for i in range(MAX_NESTING_DEPTH + 1)]
    levels.append(group(f"g{MAX_NESTING_DEPTH + 1}", "a"))
    t = table(*levels)
    with pytest.raises(NoRoute):
        t.resolve("g0", Network.TCP)
    assert chain(t, "g1")[-1] == "a"  # one level less fits


def test_cycle_closing_edge_is_cut_at_construction(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        t = table(group("x", subgroups=("y",)), group("y", "a", subgroups=("x",)))
    assert "cycle" in caplog.text
    assert t.members("x") == ("y",)
    assert t.members("y") == ("a",)  # y -> x closed the cycle and was removed
    assert chain(t, "x") == ("x", "y", "a")
    assert chain(t, "y") == ("y", "a")


def test_three_group_cycle_is_cut_and_the_emptied_group_uses_its_final() -> None:
    t = table(
        group("x", subgroups=("y",)), group("y", subgroups=("z",)), group("z", subgroups=("x",), final="c")
    )
    assert t.members("z") == ()
    assert chain(t, "x") == ("x", "y", "z", "c")


# --- empty groups and finals -----------------------------------------------------------


def test_empty_group_follows_its_final() -> None:
    t = table(group("hk", "nothing-matches", final="direct"))
    assert chain(t, "hk") == ("hk", "direct")


def test_empty_group_without_final_is_no_route_never_direct() -> None:
    t = table(group("hk", "nothing-matches"))
    with pytest.raises(NoRoute):
        t.resolve("hk", Network.TCP)


def test_final_may_name_another_group() -> None:
    t = table(group("hk", "zzz", final="backup"), group("backup", "c"))
    assert chain(t, "hk") == ("hk", "backup", "c")


def test_chosen_empty_subgroup_uses_its_own_final_first() -> None:
    t = table(group("proxy", subgroups=("hk",), final="block"), group("hk", "zzz", final="c"))
    assert chain(t, "proxy") == ("proxy", "hk", "c")


def test_chosen_empty_subgroup_without_final_falls_to_the_parents_final_not_a_sibling() -> None:
    t = table(group("proxy", "a", subgroups=("hk",), final="block"), group("hk", "zzz"))
    t.select("proxy", "hk")
    assert chain(t, "proxy") == ("proxy", "block")


def test_missing_final_is_no_route() -> None:
    t = table(group("hk", "zzz", final="gone"))
    with pytest.raises(NoRoute):
        t.resolve("hk", Network.TCP)


def test_cyclic_finals_fail_closed() -> None:
    t = table(group("x", "zzz", final="y"), group("y", "zzz", final="x"))
    with pytest.raises(NoRoute):
        t.resolve("x", Network.TCP)


# --- reload carry-over ------------------------------------------------------------------


def test_choices_report_runtime_choices_only() -> None:
    t = table(group("proxy", "a", "b", default="b"), group("other", "a", "c"))
    assert t.choices() == {}
    t.select("proxy", "a", Network.UDP)
    assert t.choices() == {"proxy": {Network.UDP: "a"}}


def test_choices_carry_into_a_rebuilt_table_for_surviving_members() -> None:
    old = table(group("proxy", "a", "b", "c"), group("other", "a", "b"))
    old.select("proxy", "c")
    old.select("other", "b", Network.TCP)
    new = table(group("proxy", "a", "b", "c"), group("other", "a"), previous=old)
    assert chain(new, "proxy", Network.TCP) == ("proxy", "c")
    assert chain(new, "proxy", Network.UDP) == ("proxy", "c")
    assert chain(new, "other", Network.TCP) == ("other", "a")  # b left the group
    assert new.choices() == {"proxy": {Network.TCP: "c", Network.UDP: "c"}}


def test_choices_of_removed_groups_are_dropped() -> None:
    old = table(group("gone", "a", "b"))
    old.select("gone", "b")
    new = table(group("proxy", "a", "b"), previous=old)
    assert new.choices() == {}


def test_rebuilt_table_does_not_share_choice_state_with_the_old_one() -> None:
    old = table(group("proxy", "a", "b"))
    new = table(group("proxy", "a", "b"), previous=old)
    new.select("proxy", "b")
    assert chain(old, "proxy") == ("proxy", "a")


# --- identity across reloads (A suggested test 1) --------------------------------------------


def test_group_identity_survives_reorder_and_delete_and_a_rename_is_a_new_group() -> None:
    import dataclasses

    old = table(group("a", "a"), group("b", "b"), group("c", "c"))
    ids = {n: old.identity_of(n) for n in ("a", "b", "c")}
    new = table(group("c", "c"), group("a", "a"), group("d", "b"), previous=old)
    assert new.identity_of("a") == ids["a"] and new.identity_of("c") == ids["c"]
    assert new.identity_of("d").uid not in {i.uid for i in ids.values()}
    assert "b" not in new
    renamed = table(group("a2", "a"), previous=new)
    assert renamed.identity_of("a2").uid != ids["a"].uid
    carried = dataclasses.replace(
        group("a3", "a"), id=ids["a"].uid
    )  # a programmatic rename carrying a's UUID
    again = table(carried, group("a", "a"), previous=new)
    assert again.identity_of("a3").uid != ids["a"].uid and again.identity_of("a") == ids["a"]
