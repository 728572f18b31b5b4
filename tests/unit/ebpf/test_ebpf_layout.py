"""The slot layout of a real GroupManager: configuration order, leaves reached through nested
groups and finals, NodeIds, UDP capability, and cut cycles."""

from __future__ import annotations

from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Spec
from honk.core.clock import FakeClock
from honk.ebpf.layout import layout_of
from honk.ebpf.slots import Leaf
from honk.group.manager import GroupManager
from honk.outbound.registry import build_outbounds


def node(name: str, protocol: str = "socks5") -> NodeSpec:
    return with_node_id(NodeSpec(name, protocol, "127.0.0.1", 1000 + sum(map(ord, name))))


def group(name: str, *members: str, subgroups: tuple[str, ...] = (), **kw) -> GroupSpec:
    filters = (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in members)),)),) if members else ()
    return GroupSpec(
        name, filters=filters, subgroups=subgroups, has_filter_lines=bool(members or subgroups), **kw
    )


NODES = (node("a"), node("b"), node("h", "http"))  # HTTP CONNECT carries no UDP
IDS = {n.name: n.id for n in NODES}


def manager(*groups: GroupSpec) -> GroupManager:
    spec = Spec(nodes=NODES, groups=groups)
    clock = FakeClock()
    return GroupManager.build(spec, build_outbounds(spec, clock)[0], clock=clock)


def leaf(name: str) -> Leaf:
    return Leaf(name, IDS[name], name != "h")


def test_groups_keep_the_configuration_order_and_reach_leaves_through_nesting_and_finals():
    layout = layout_of(
        manager(
            group("top", subgroups=("mid",), final="direct"),
            group("mid", "a", subgroups=("leafy",)),
            group("leafy", "b", "h"),
            group("solo", "a", final="leafy"),
        )
    )
    assert layout.groups == ("top", "mid", "leafy", "solo")
    assert layout.leaves["leafy"] == (leaf("b"), leaf("h"))
    assert layout.leaves["mid"] == (leaf("a"), leaf("b"), leaf("h"))
    assert layout.leaves["top"] == (leaf("a"), leaf("b"), leaf("h"), Leaf("direct", None, True))
    assert layout.leaves["solo"] == (leaf("a"), leaf("b"), leaf("h"))  # the final's leaves count
    assert dict(layout.has_final) == {"top": True, "mid": False, "leafy": False, "solo": True}


def test_built_in_leaves_have_no_node_id_and_udp_follows_the_outbounds_capability():
    layout = layout_of(manager(group("g", "h", final="block"), group("u", "a", "b")))
    assert layout.leaves["g"] == (Leaf("h", IDS["h"], False), Leaf("block", None, True))
    assert all(x.udp for x in layout.leaves["u"])


def test_a_cycle_edge_is_cut_and_each_leaf_is_listed_once():
    layout = layout_of(manager(group("x", "a", subgroups=("y",)), group("y", "a", "b", subgroups=("x",))))
    assert layout.leaves["x"] == (leaf("a"), leaf("b"))
    assert layout.leaves["y"] == (leaf("a"), leaf("b"))
    assert layout.ordinal("y") == 1


def test_a_group_without_members_has_no_leaves():
    layout = layout_of(manager(group("empty", subgroups=("nothing",))))
    assert layout.groups == ("empty",) and layout.leaves["empty"] == () and not layout.has_final["empty"]
