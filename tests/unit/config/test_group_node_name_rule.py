"""A group may have the name of a node, as upstream honk's own config.dae has it (node `iris`
and group `iris { filter: name('iris'); policy: fixed(0) }`, other groups `final: iris`) and as
dae users write it (a node `clash` and a group `clash`, routed to by `-> clash`).

The rule (upstream honk: config.rs validate has no group/node name check; its datapath gives a
routing target the ordinal of the group of that name, control/mod.rs compile_routing_plan; its
Clash API answers /proxies/{name} with the group first, clash_api.rs get_proxy; groups.md:
name(...) matches Node.name, group(...) names groups; dae: a routing outbound is always a group):
  * the group answers to the shared name: `-> name`, `final:`, nested group(name), the API;
  * name(...) filters select nodes, so the group's member of that name is the node;
  * only the builtin outbounds (direct, block, must_rules) stay reserved.
"""

from __future__ import annotations

from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_text
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.group.manager import GroupManager
from honk.outbound.registry import build_outbounds

TCP = Network.TCP

UPSTREAM_FORM = """node {
    iris: 'socks5://192.0.2.1:2077'
    hk1: 'socks5://192.0.2.2:1080'
}
group {
    iris {
        filter: name('iris')
        policy: fixed(0)
    }
    hk {
        filter: name(keyword: 'hk')
        policy: min_moving_avg
        final: iris
    }
    outer {
        filter: group(iris)
        policy: select
    }
}
routing {
    dport(22) -> iris
    fallback: hk
}
"""


def manager(text: str) -> tuple[GroupManager, object]:
    spec = load_text(text, "dae")
    outbounds = build_outbounds(spec, FakeClock())[0]
    return GroupManager.build(spec, outbounds, clock=FakeClock()), spec


def test_a_group_named_like_a_node_is_accepted_without_a_diagnostic():
    spec = load_text(UPSTREAM_FORM, "dae")
    assert [g.name for g in spec.groups] == ["iris", "hk", "outer"]
    assert [d.code for d in spec.diagnostics if d.severity is not Severity.INFO] == []


def test_a_group_named_like_a_node_is_accepted_and_routes_to_the_group():
    groups, _ = manager(UPSTREAM_FORM)
    selection = groups.resolve("iris", TCP)
    assert selection.chain == ("iris", "iris")  # through the group, to its node member
    assert selection.leaf.name == "iris"


def test_name_filters_select_the_node_so_the_group_of_that_name_is_not_empty():
    groups, _ = manager(UPSTREAM_FORM)
    assert groups.members("iris") == ("iris",)
    assert groups.leaf_node_names_in_group("iris") == ["iris"]
    assert [m for m, _ in groups.delay_test_members("iris")] == ["iris"]


def test_final_and_nested_group_names_reach_the_group():
    groups, _ = manager(UPSTREAM_FORM)
    assert groups.members("outer") == ("iris",)
    assert groups.resolve("outer", TCP).chain == ("outer", "iris", "iris")
    assert groups.identity("iris", "outer") == ("group", "iris")
    assert groups.identity("iris", "iris")[0] == "node"
    assert set(groups.leaf_node_names_in_group("hk")) == {"hk1", "iris"}  # the final's leaf too


def test_a_group_whose_filter_picks_other_nodes_wins_over_the_node_of_its_name():
    text = (
        "node {\n    clash: 'socks5://192.0.2.1:7890'\n    other: 'socks5://192.0.2.9:1080'\n}\n"
        "group {\n    clash {\n        filter: name(other)\n    }\n}\n"
        "routing {\n    fallback: clash\n}\n"
    )
    groups, spec = manager(text)
    assert spec.routing.fallback == "clash"
    assert groups.resolve("clash", TCP).leaf.name == "other"  # the group, not the node `clash`


def test_a_group_named_like_a_builtin_is_still_refused():
    try:
        load_text("group {\n    block {\n    }\n}\n", "dae")
    except ConfigError as exc:
        assert [d.code for d in exc.diagnostics] == ["name-collision"]
    else:
        raise AssertionError("a group named block was accepted")
