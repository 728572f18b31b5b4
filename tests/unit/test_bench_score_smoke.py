"""Smoke test of ``benchmarks/score.py``: its worlds build and its flows time every event kind.

A few flows only: this pins the benchmark's wiring (the daemon's reporter sequence, the Score
depth each world promises, the rows it prints), not any figure.
"""

from __future__ import annotations

from benchmarks import score

FLOWS = 40  # timed flows: enough for every script of the mix to run at least once
WARMUP = 10


def test_a_single_score_world_times_every_reporter_event_and_reports_to_one_group():
    world = score.build("score")
    samples = score.drive(world, FLOWS, WARMUP)
    assert samples.via_score == {1: FLOWS}
    assert len(samples.calls["plan"]) == FLOWS
    for row in (
        "feedback + start",
        "begin",
        "into_reporter",
        "setup",
        "tx first (announces)",
        "rx first response (published)",
        "rx throttled",
        "settle success (flushes held RX)",
    ):
        assert samples.calls[row], row
    lifecycles = sum(len(v) for k, v in samples.calls.items() if k.startswith("lifecycle"))
    assert lifecycles == FLOWS  # every timed flow ran to its settlement


def test_the_deep_nested_world_reports_every_flow_to_both_score_groups():
    world = score.build("score>score-deep")
    samples = score.drive(world, 5, 0)
    assert samples.via_score == {2: 5}


def test_rows_carry_median_p99_target_and_ratio_for_each_world():
    figures = {}
    for name in score.WORLDS:
        samples = score.drive(score.build(name), 3, 0)
        rows = {"plan": {**score._summary(samples.calls["plan"]), "target_us": score.PLAN_TARGET_US}}
        figures[name] = {"rows": rows, "via_score": {str(k): v for k, v in samples.via_score.items()}}
    rows = score._rows(figures, "", built=True)
    assert len(rows) == len(score.WORLDS)
    for row, name in zip(rows, score.WORLDS, strict=True):
        plan = figures[name]["rows"]["plan"]
        assert len(row) == len(score.HEADER)
        assert row[3] == f"{score.PLAN_TARGET_US:.0f}"
        assert row[4] == f"{plan['median_us'] / score.PLAN_TARGET_US:.2f}"
        assert row[5] == ("met" if plan["median_us"] <= score.PLAN_TARGET_US else "NOT met")


def test_a_lifecycle_target_is_the_event_target_times_its_events():
    assert score._event_target("lifecycle: long flow (11 events)") == score.EVENT_TARGET_US * len(score.LONG)
    assert score._event_target("begin") == score.EVENT_TARGET_US


def test_each_score_group_of_a_nested_world_gets_its_own_plan_row():
    timed = score.time_ranks(score.build("score>score-deep"), 5, 0)
    assert sorted(timed) == ["score", "top"]  # the outer and the inner Score group, each on every flow
    assert all(len(v) >= 5 for v in timed.values())
    figures = {name: {"rows": {}, "via_score": {}} for name in score.WORLDS}
    figures["score>score-deep"]["rows"] = {
        f"{score.RANK_ROW}{g}": {**score._summary(v), "target_us": 50.0} for g, v in sorted(timed.items())
    }
    labels = [row[0] for row in score._rows(figures, "", built=True)]
    assert labels == [
        "  score>score-deep: plan() of Score group score (50 nodes, every rank)",
        "  score>score-deep: plan() of Score group top (49 dead nodes + the inner group, every rank)",
    ]
