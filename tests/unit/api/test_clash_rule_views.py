"""``GET /rules``'s per-rule ``extra`` and ``PATCH /rules/disable``'s body, as pure views."""

from __future__ import annotations

import datetime

import pytest

from honk.api import clash_views as views
from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec, Spec
from honk.route.rulestats import NEVER, RuleRow

SPEC = Spec(
    routing=RoutingSpec(
        rules=(
            RuleSpec((Predicate("dport", (MatchArg("", "22"),)),), "direct"),
            RuleSpec((Predicate("domain", (MatchArg("suffix", "ads.example"),)),), "block"),
        ),
        fallback="proxy",
    )
)
WALL = 1_767_225_600.25  # 2026-01-01T00:00:00.25Z


def test_every_rule_and_the_final_match_carry_mihomos_extra_with_zero_times_when_never_counted() -> None:
    listed = views.rules(SPEC, [RuleRow(False, 0, NEVER, 0, NEVER)] * 3)["rules"]
    assert [r["type"] for r in listed] == ["DstPort", "DomainSuffix", "Match"]
    for rule in listed:
        assert rule["extra"] == {
            "disabled": False,
            "hitCount": 0,
            "hitAt": "0001-01-01T00:00:00Z",
            "missCount": 0,
            "missAt": "0001-01-01T00:00:00Z",
        }


def test_extra_shows_counts_the_disabled_flag_and_rfc3339_times() -> None:
    rows = [
        RuleRow(False, 0, NEVER, 4, WALL),
        RuleRow(True, 2, WALL - 60, 1, WALL),
        RuleRow(False, 3, WALL, 0, NEVER),
    ]
    listed = views.rules(SPEC, rows)["rules"]
    extras = [r["extra"] for r in listed]
    assert [(e["disabled"], e["hitCount"], e["missCount"]) for e in extras] == [
        (False, 0, 4),
        (True, 2, 1),
        (False, 3, 0),
    ]
    hit_at = datetime.datetime.fromisoformat(extras[1]["hitAt"])
    assert hit_at.tzinfo is not None and hit_at.timestamp() == pytest.approx(WALL - 60)
    assert datetime.datetime.fromisoformat(extras[0]["missAt"]).timestamp() == pytest.approx(WALL)
    assert extras[0]["hitAt"] == extras[2]["missAt"] == views.ZERO_TIME


def test_counters_that_do_not_fit_the_rules_show_as_zeros() -> None:
    listed = views.rules(SPEC, [RuleRow(True, 9, WALL, 9, WALL)])["rules"]
    assert all(r["extra"]["hitCount"] == 0 and r["extra"]["disabled"] is False for r in listed)


def test_a_disable_body_maps_decimal_indexes_to_bools() -> None:
    assert views.rule_changes({"1": True, "0": False}, 2) == {1: True, 0: False}
    assert views.rule_changes({}, 2) == {}


@pytest.mark.parametrize(
    "body",
    [
        [],
        "1",
        None,
        {"x": True},
        {"-1": True},
        {"1.0": True},
        {" 1": True},
        {"１": True},
        {"0": 1},
        {"0": "true"},
        {"0": None},
        {"2": True},  # the fallback of a two-rule list
        {"3": False},  # past the fallback
    ],
)
def test_a_bad_disable_body_is_refused_with_a_reason(body) -> None:
    with pytest.raises(ValueError) as refused:
        views.rule_changes(body, 2)
    assert str(refused.value)


def test_the_fallback_refusal_names_the_fallback() -> None:
    with pytest.raises(ValueError, match="fallback"):
        views.rule_changes({"2": True}, 2)
