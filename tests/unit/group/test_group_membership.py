"""Filter resolution: which names a group's filter lines select."""

from __future__ import annotations

import logging

import pytest

from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec
from honk.group.membership import Membership, resolve_membership

NODES = tuple(
    NodeSpec(name, "socks5", "127.0.0.1", 1080 + i)
    for i, name in enumerate(["HK-1", "HK-2", "Hong Kong 3", "SG-1", "JP-hk", "backup"])
)


def term(kind: str, *args: str, negated: bool = False) -> FilterTerm:
    parsed = []
    for text in args:
        key, sep, value = text.partition(":")
        parsed.append(
            MatchArg(key, value) if sep and key in ("keyword", "regex", "full") else MatchArg("", text)
        )
    return FilterTerm(kind, tuple(parsed), negated)


def line(*terms: FilterTerm) -> NodeFilter:
    return NodeFilter(tuple(terms))


def members(
    *filters: NodeFilter, subgroups: tuple[str, ...] = (), nodes=NODES, groups=("g", "other", "third")
) -> tuple[str, ...]:
    spec = GroupSpec("g", filters=filters, subgroups=subgroups, has_filter_lines=bool(filters or subgroups))
    return resolve_membership(spec, nodes, groups).members


def test_group_without_filter_lines_gets_every_node_in_declaration_order() -> None:
    result = resolve_membership(GroupSpec("g"), NODES, {"g"})
    assert result == Membership(("HK-1", "HK-2", "Hong Kong 3", "SG-1", "JP-hk", "backup"), ())


def test_all_nodes_default_never_includes_builtins() -> None:
    nodes = (*NODES, NodeSpec("direct", "direct"))
    assert "direct" not in resolve_membership(GroupSpec("g"), nodes, {"g"}).members


def test_name_plain_argument_is_an_exact_match() -> None:
    assert members(line(term("name", "HK-1"))) == ("HK-1",)
    assert members(line(term("name", "HK"))) == ()


def test_name_arguments_are_alternatives() -> None:
    assert members(line(term("name", "SG-1", "HK-2"))) == ("HK-2", "SG-1")


def test_name_keyword_is_a_case_sensitive_substring() -> None:
    assert members(line(term("name", "keyword:HK"))) == ("HK-1", "HK-2")
    assert members(line(term("name", "keyword:hk"))) == ("JP-hk",)


def test_name_regex_uses_search() -> None:
    assert members(line(term("name", "regex:^Hong Kong "))) == ("Hong Kong 3",)
    assert members(line(term("name", "regex:-[12]$"))) == ("HK-1", "HK-2", "SG-1")


def test_terms_on_one_line_are_anded() -> None:
    assert members(line(term("name", "keyword:HK"), term("name", "regex:2$"))) == ("HK-2",)


def test_negated_term_excludes() -> None:
    assert members(line(term("name", "regex:-"), term("name", "keyword:HK", negated=True))) == (
        "SG-1",
        "JP-hk",
    )


def test_lines_are_ored_and_keep_node_declaration_order() -> None:
    result = members(line(term("name", "backup")), line(term("name", "keyword:HK")))
    assert result == ("HK-1", "HK-2", "backup")


def test_subtag_matches_nothing_without_subscriptions() -> None:
    assert members(line(term("subtag", "airport"))) == ()
    assert members(line(term("subtag", "airport"), term("name", "keyword:HK"))) == ()


def test_negated_subtag_always_holds() -> None:
    assert members(line(term("subtag", "airport", negated=True), term("name", "SG-1"))) == ("SG-1",)


def test_builtin_is_admitted_only_by_its_exact_name() -> None:
    assert members(line(term("name", "direct"))) == ("direct",)
    assert members(line(term("name", "block", "SG-1"))) == ("SG-1", "block")


@pytest.mark.parametrize(
    "filter_line",
    [
        line(term("name", "keyword:dir")),
        line(term("name", "regex:^direct$")),
        line(term("name", "regex:.")),
        line(term("name", "HK-1", negated=True)),
        line(term("subtag", "x", negated=True)),
    ],
)
def test_builtins_are_never_selected_by_keyword_regex_or_negation(filter_line: NodeFilter) -> None:
    result = members(filter_line)
    assert "direct" not in result and "block" not in result


def test_exact_builtin_still_needs_the_other_terms_to_hold() -> None:
    assert members(line(term("name", "direct"), term("name", "keyword:x"))) == ()
    assert members(line(term("name", "direct"), term("name", "SG-1", negated=True))) == ("direct",)


def test_duplicate_node_names_appear_once() -> None:
    nodes = (*NODES, NodeSpec("HK-1", "socks5", "127.0.0.2", 1))
    assert members(line(term("name", "keyword:HK")), nodes=nodes) == ("HK-1", "HK-2")


def test_subgroups_follow_the_nodes_as_members() -> None:
    result = resolve_membership(
        GroupSpec(
            "g", filters=(line(term("name", "SG-1")),), subgroups=("other", "third"), has_filter_lines=True
        ),
        NODES,
        {"g", "other", "third"},
    )
    assert result == Membership(("SG-1",), ("other", "third"))
    assert result.members == ("SG-1", "other", "third")


def test_only_subgroups_means_no_nodes() -> None:
    assert members(subgroups=("other",)) == ("other",)


def test_explicit_empty_filter_selects_nothing() -> None:
    spec = GroupSpec("g", has_filter_lines=True)
    assert resolve_membership(spec, NODES, {"g"}).members == ()


def test_unknown_subgroup_contributes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert members(subgroups=("nope", "other")) == ("other",)
    assert "nope" in caplog.text


def test_invalid_regex_matches_nothing_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert members(line(term("name", "regex:(unclosed"))) == ()
    assert "regular expression" in caplog.text
