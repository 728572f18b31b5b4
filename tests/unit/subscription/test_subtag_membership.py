"""subtag(...) selects nodes by the subscription they came from."""

from __future__ import annotations

from honk.config.links import with_node_id
from honk.config.load import load_text
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec
from honk.group.membership import resolve_membership
from honk.subscription.manager import merge_nodes

NODES = tuple(
    with_node_id(node)
    for node in (
        NodeSpec("static", "socks5", "10.0.0.1", 1080),
        NodeSpec("HK-1", "socks5", "10.0.0.2", 1080, subscription="paid"),
        NodeSpec("SG-1", "socks5", "10.0.0.3", 1080, subscription="paid"),
        NodeSpec("HK-2", "socks5", "10.0.0.4", 1080, subscription="free"),
    )
)


def members(*lines: tuple[FilterTerm, ...], nodes=NODES) -> tuple[str, ...]:
    group = GroupSpec("g", filters=tuple(NodeFilter(t) for t in lines), has_filter_lines=True)
    return resolve_membership(group, nodes, {"g"}).members


def subtag(*args: MatchArg, negated: bool = False) -> FilterTerm:
    return FilterTerm("subtag", args, negated)


def test_subtag_selects_the_nodes_of_that_subscription_only():
    assert members((subtag(MatchArg("", "paid")),)) == ("HK-1", "SG-1")


def test_subtag_arguments_are_alternatives_and_take_keyword_and_regex():
    assert members((subtag(MatchArg("", "paid"), MatchArg("", "free")),)) == ("HK-1", "SG-1", "HK-2")
    assert members((subtag(MatchArg("keyword", "re")),)) == ("HK-2",)
    assert members((subtag(MatchArg("regex", "^p")),)) == ("HK-1", "SG-1")


def test_subtag_combines_with_name_and_negation_holds_for_configured_nodes():
    hk_paid = (subtag(MatchArg("", "paid")), FilterTerm("name", (MatchArg("keyword", "HK"),)))
    assert members(hk_paid) == ("HK-1",)
    assert members((subtag(MatchArg("", "paid"), negated=True),)) == ("static", "HK-2")


def test_builtins_never_match_subtag():
    assert "direct" not in members((subtag(MatchArg("regex", ".*")),))


def test_a_duplicate_name_takes_the_subscription_of_its_first_declaration():
    nodes = (*NODES, NodeSpec("static", "socks5", "10.0.0.9", 1, subscription="paid"))
    assert "static" not in members((subtag(MatchArg("", "paid")),), nodes=nodes)


def test_config_validation_counts_subscription_nodes_as_members_for_a_default():
    from honk.config.validate import members as config_members

    group = GroupSpec("g", filters=(NodeFilter((subtag(MatchArg("", "paid")),)),), has_filter_lines=True)
    assert config_members(group, list(NODES)) == {"HK-1", "SG-1"}


def test_configured_nodes_win_name_clashes_in_the_effective_node_list(caplog):
    spec = load_text("node {\n    HK-1: 'socks5://192.0.2.1:1080'\n}\n", "dae")
    merged = merge_nodes(spec.nodes, {"paid": NODES[1:3], "free": NODES[3:]})
    assert [(n.name, n.host, n.subscription) for n in merged] == [
        ("HK-1", "192.0.2.1", ""),
        ("SG-1", "10.0.0.3", "paid"),
        ("HK-2", "10.0.0.4", "free"),
    ]
    assert "subscription nodes left out" in caplog.text and "nodes=1" in caplog.text
