"""dae's filter annotation ``[add_latency: d]`` in the URLTest ranking, and a group's own
``check_interval`` for its check-URL probes; real health state on a fake clock."""

from __future__ import annotations

import uuid

from test_group_policies import MS, TCP, UDP, World, group

from honk.alive.group_checks import GroupCheck, GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain
from honk.alive.runner import HealthRunner, JobKind
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, Policy
from honk.core.clock import FakeClock


def annotated(name: str, *lines: tuple[str, float], **kw) -> GroupSpec:
    """A URLTest group with one ``filter: name(x) [add_latency: s]`` line per (x, seconds)."""
    filters = tuple(NodeFilter((FilterTerm("name", (MatchArg("", n),)),), offset) for n, offset in lines)
    return GroupSpec(
        name, policy=kw.pop("policy", Policy.URLTEST), filters=filters, has_filter_lines=True, **kw
    )


def test_add_latency_moves_a_member_in_the_ranking():
    plain = World(group("auto", "a", "b", policy=Policy.URLTEST))
    offset = World(annotated("auto", ("a", 0.0), ("b", -0.2)))
    for w in (plain, offset):
        w.sample("a", 100)
        w.sample("b", 250)
    assert plain.leaf("auto") == "a"
    assert offset.leaf("auto") == "b"  # 250 ms - 200 ms ranks below 100 ms


def test_a_positive_add_latency_pushes_a_member_down():
    w = World(annotated("auto", ("a", 0.5), ("b", 0.0)))
    w.sample("a", 10)
    w.sample("b", 300)
    assert w.leaf("auto") == "b"


def test_add_latency_is_not_clamped_at_zero():
    # b: 150 - 200 = -50 ms, c: 200 - 300 = -100 ms; clamped at zero they would tie and b (first) win
    w = World(annotated("auto", ("a", 0.0), ("b", -0.2), ("c", -0.3)))
    for n, ms in (("a", 100), ("b", 150), ("c", 200)):
        w.sample(n, ms)
    assert w.leaf("auto") == "c"


def test_add_latency_counts_in_the_tolerance_comparison():
    w = World(annotated("auto", ("a", 0.0), ("b", -0.1), tolerance=0.050))
    w.sample("a", 100)
    w.sample("b", 300)
    assert w.leaf("auto") == "a"  # b ranks 200 ms
    w.sample("b", 60)  # moving average (300 + 60) / 2 = 180: ranks 80, best, but 80 + 50 >= 100
    assert w.leaf("auto") == "a"
    w.sample("b", 20)  # (180 + 20) / 2 = 100: ranks 0, and 0 + 50 < 100
    assert w.leaf("auto") == "b"


def test_add_latency_applies_to_the_udp_ranking_too():
    w = World(annotated("auto", ("a", 0.0), ("b", -0.2)))
    w.sample("a", 100, Domain.DATA_UDP)
    w.sample("b", 250, Domain.DATA_UDP)
    assert w.leaf("auto", UDP) == "b"


def test_add_latency_leaves_other_policies_alone():
    w = World(annotated("fb", ("a", 0.0), ("b", -5.0), policy=Policy.FALLBACK))
    w.sample("a", 100)
    w.sample("b", 10)
    assert w.leaf("fb", TCP) == "a"


def test_add_latency_moves_a_member_ranked_by_its_groups_check_url():
    w = World(annotated("auto", ("a", 0.0), ("b", -0.2), check_url="http://u/"))
    w.checks.sync_group_check_urls(
        [GroupCheck("auto", Policy.URLTEST, "http://u/", lambda: [("a", w.ids["a"]), ("b", w.ids["b"])])]
    )
    w.checks.notify("a", "http://u/", 100 * MS)
    w.checks.notify("b", "http://u/", 250 * MS)
    assert w.leaf("auto") == "b"


# --- a group's own check_interval --------------------------------------------------------------


def _checks(clock, *groups: tuple[str, str, float | None]) -> GroupChecks:
    checks = GroupChecks(clock)
    checks.sync_group_check_urls(
        [
            GroupCheck(name, Policy.URLTEST, url, lambda: [("m", uuid.UUID(int=1))], interval)
            for name, url, interval in groups
        ]
    )
    return checks


def test_a_group_check_interval_probes_its_check_url_at_that_interval():
    clock = FakeClock()
    checks = _checks(clock, ("slow", "http://u/", 120.0))
    assert checks.members_to_probe(due_only=False) == []  # not the global periodic cycle's
    assert [m for m, _, _ in checks.own_interval_due()] == ["m"]  # never probed: due now
    checks.notify("m", "http://u/", 0.05)
    clock.advance(119)
    assert checks.own_interval_due() == []
    clock.advance(1)
    assert [(m, u) for m, u, _ in checks.own_interval_due()] == [("m", "http://u/")]


def test_a_pair_shared_with_a_group_on_the_global_interval_stays_in_the_periodic_cycle():
    clock = FakeClock()
    checks = _checks(clock, ("slow", "http://u/", 120.0), ("plain", "http://u/", None))
    assert [m for m, _, _ in checks.members_to_probe(due_only=False)] == ["m"]
    assert checks.own_interval_due() == []


def test_a_dead_pair_on_its_own_interval_is_left_to_the_recovery_schedule():
    clock = FakeClock()
    checks = _checks(clock, ("slow", "http://u/", 10.0))
    for _ in range(3):
        checks.notify("m", "http://u/", None)
    clock.advance(10)
    assert checks.own_interval_due() == []


def test_the_runners_recovery_tick_queues_a_group_check_due_on_its_own_interval():
    clock = FakeClock()
    checks = _checks(clock, ("slow", "http://u/", 60.0))
    runner = HealthRunner(
        AliveDialerSet(clock),
        prober=None,
        clock=clock,
        check_interval=30.0,  # type: ignore[arg-type]
        group_checks=checks,
    )
    assert [j.kind for j in runner.cycle_jobs()] == []
    assert [(j.kind, j.member) for j in runner.recovery_jobs()] == [(JobKind.GROUP_URL, "m")]
    checks.notify("m", "http://u/", 0.05)
    clock.advance(30)
    assert runner.recovery_jobs() == []
    clock.advance(30)
    assert [j.url for j in runner.recovery_jobs()] == ["http://u/"]
