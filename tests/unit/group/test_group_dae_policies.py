"""dae's group policies (random, fixed(N), min, min_avg10, min_moving_avg) as dae defines them,
from the configuration text to the member served, on a fake clock with an injected RNG."""

from __future__ import annotations

import random

import pytest
from test_group_policies import World as PolicyWorld
from test_group_policies import group

from honk.alive.group_checks import GroupCheck
from honk.alive.outcome import Domain, Family
from honk.api.clash_views import group_type
from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_text
from honk.config.spec import (
    PICK_RANDOM,
    RANK_AVG10,
    RANK_LAST,
    GroupSpec,
    Policy,
    Spec,
)
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.policy import Random, Selector, URLTest

TCP, UDP = Network.TCP, Network.UDP
V4 = Family.V4
MS = 0.001


class World(PolicyWorld):
    """test_group_policies' world, its groups drawing from a seeded RNG."""

    def __init__(self, *groups: GroupSpec, nodes=("a", "b", "c"), seed: int = 7) -> None:
        super().__init__(*groups, nodes=nodes, rng=random.Random(seed))

    def samples(self, n: str, *ms: float) -> None:
        for value in ms:
            self.sample(n, value)


def load(text: str) -> tuple[Spec | None, tuple]:
    try:
        spec = load_text(text, "dae")
    except ConfigError as exc:
        return None, exc.diagnostics
    return spec, spec.diagnostics


def dae_group(policy: str) -> str:
    return (
        "node {\n    n1: 'socks5://192.0.2.1:1080'\n}\n"
        f"group {{\n    g {{\n        filter: name(n1)\n        policy: {policy}\n    }}\n}}\n"
    )  # policy: line 7


# --- reading dae's spellings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy", "strategy", "index"),
    [
        ("random", Policy.LOADBALANCE, PICK_RANDOM, None),
        ("min", Policy.URLTEST, RANK_LAST, None),
        ("min_last_latency", Policy.URLTEST, RANK_LAST, None),
        ("min_avg10", Policy.URLTEST, RANK_AVG10, None),
        ("min_moving_avg", Policy.URLTEST, "", None),
        ("fixed", Policy.SELECTOR, "", None),
        ("fixed(0)", Policy.SELECTOR, "", None),  # the same as fixed: the first member
        ("fixed(2)", Policy.SELECTOR, "", 2),
        ("FIXED( 3 )", Policy.SELECTOR, "", 3),
        ("roundrobin", Policy.LOADBALANCE, "", None),
    ],
)
def test_each_dae_policy_spelling_reads_as_its_own_behaviour(text, policy, strategy, index):
    spec, diagnostics = load(dae_group(text))
    assert spec is not None, diagnostics
    g = spec.group("g")
    assert (g.policy, g.strategy, g.fixed_index) == (policy, strategy, index)
    assert not [d for d in diagnostics if d.code == "unknown-policy"]


@pytest.mark.parametrize("text", ["fixed(-1)", "fixed(x)", "fixed(1.5)"])
def test_fixed_without_a_member_index_is_a_located_config_error(text):
    spec, diagnostics = load(dae_group(text))
    assert spec is None
    (d,) = [d for d in diagnostics if d.code == "invalid-value"]
    assert d.severity is Severity.ERROR and d.loc.line == 7 and "fixed(N)" in d.message


def test_an_unknown_policy_is_still_a_located_diagnostic():
    spec, diagnostics = load(dae_group("fastest"))
    assert spec is not None and spec.group("g").policy is Policy.SELECTOR
    (d,) = [d for d in diagnostics if d.code == "unknown-policy"]
    assert d.loc.line == 7 and "'g'" in d.message


def test_dashboards_see_random_as_load_balance_fixed_n_as_selector_and_min_as_urltest():
    spec, _ = load(dae_group("random"))
    assert group_type(spec.group("g")) == "LoadBalance"
    spec, _ = load(dae_group("fixed(0)"))
    assert group_type(spec.group("g")) == "Selector"
    for text in ("min", "min_avg10", "min_moving_avg"):
        spec, _ = load(dae_group(text))
        assert group_type(spec.group("g")) == "URLTest"


# --- random --------------------------------------------------------------------------------------


def random_group(name: str = "r") -> GroupSpec:
    return group(name, "a", "b", "c", policy=Policy.LOADBALANCE, strategy=PICK_RANDOM)


def test_random_picks_every_alive_member_and_never_a_dead_one():
    w = World(random_group())
    assert isinstance(w.manager.policy("r"), Random)
    seen = [w.leaf("r") for _ in range(300)]
    assert {m: seen.count(m) for m in "abc"} == pytest.approx({"a": 100, "b": 100, "c": 100}, abs=30)
    w.kill("b")
    seen = [w.leaf("r") for _ in range(200)]
    assert set(seen) == {"a", "c"}


def test_random_draws_from_the_injected_rng_and_its_peek_is_what_serves_next():
    one, two, other = (
        World(random_group(), seed=1),
        World(random_group(), seed=1),
        World(random_group(), seed=2),
    )
    first = [one.leaf("r") for _ in range(40)]
    assert first == [two.leaf("r") for _ in range(40)]
    assert first != [other.leaf("r") for _ in range(40)]
    for _ in range(20):
        peeked = one.manager.resolve("r", TCP, peek=True).leaf.name
        assert one.manager.resolve("r", TCP, peek=True).leaf.name == peeked  # a peek draws nothing new
        assert one.leaf("r") == peeked


def test_random_with_no_alive_member_fails_closed():
    w = World(random_group())
    for n in "abc":
        w.kill(n)
    with pytest.raises(NoRoute):
        w.leaf("r")


# --- fixed(N) ------------------------------------------------------------------------------------


def test_fixed_n_takes_the_nth_member():
    w = World(
        group("f", "a", "b", "c", fixed_index=2),
        group("z", "a", "b", "c", fixed_index=0),
        group("plain", "a", "b", "c"),
    )
    assert isinstance(w.manager.policy("f"), Selector)
    assert [w.leaf(g, net) for g in ("f", "z", "plain") for net in (TCP, UDP)] == [
        "c",
        "c",
        "a",
        "a",
        "a",
        "a",
    ]


def test_fixed_n_counts_in_the_groups_member_order():
    w = World(group("f", "c", "a", "b", fixed_index=1), nodes=("c", "a", "b"))
    assert w.manager.members("f") == ("c", "a", "b")
    assert w.leaf("f") == "a"


def test_fixed_n_never_substitutes_a_sibling_for_a_dead_member():
    w = World(group("f", "a", "b", "c", fixed_index=1))
    w.kill("b")
    assert w.leaf("f") == "b"  # dae's fixed ignores health; honk serves it as the sole-leaf last resort


def test_fixed_n_past_the_last_member_serves_nothing_until_a_member_is_chosen(caplog):
    w = World(group("f", "a", "b", "c", fixed_index=3))
    assert "fixed(3) is past its 3 members" in caplog.text
    with pytest.raises(NoRoute):
        w.leaf("f")
    w.manager.select("f", "b")
    assert w.leaf("f") == "b"


def test_fixed_n_past_the_last_member_follows_the_final():
    w = World(group("f", "a", "b", fixed_index=5, final="c"))
    assert w.leaf("f") == "c"


# --- min, min_avg10, min_moving_avg ----------------------------------------------------------------


def ranked_world() -> World:
    """a: 1000, nine 100s, 150 (last 150; last ten 105; moving ~126). b: 2000, eight 50s, two
    200s (last 200; last ten 80, all eleven 254; moving ~164)."""
    w = World(
        group("mov", "a", "b", policy=Policy.URLTEST),
        group("last", "a", "b", policy=Policy.URLTEST, strategy=RANK_LAST),
        group("avg10", "a", "b", policy=Policy.URLTEST, strategy=RANK_AVG10),
    )
    w.samples("a", 1000, *[100] * 9, 150)
    w.samples("b", 2000, *[50] * 8, 200, 200)
    return w


def test_min_avg10_prefers_the_lower_average_of_the_last_ten():
    w = ranked_world()
    assert w.alive.ranking(w.ids["b"], Domain.TCP, V4, RANK_AVG10) == pytest.approx(0.080)
    assert w.alive.ranking(w.ids["a"], Domain.TCP, V4, RANK_AVG10) == pytest.approx(0.105)
    assert w.leaf("avg10") == "b"  # b's 2000 ms fell out of its last ten


def test_min_prefers_the_lowest_last_latency():
    w = ranked_world()
    assert w.leaf("last") == "a"  # 150 < 200
    w.samples("b", 20)
    assert w.leaf("last") == "b"  # 20 < 150, beyond the tolerance


def test_min_moving_avg_keeps_the_halving_moving_average():
    w = ranked_world()
    assert isinstance(w.manager.policy("mov"), URLTest) and w.manager.policy("mov").rank_by == ""
    assert w.alive.ranking(w.ids["a"], Domain.TCP, V4) == w.alive.average(w.ids["a"], Domain.TCP, V4)
    assert w.leaf("mov") == "a"


def test_min_keeps_the_switching_tolerance():
    w = World(group("last", "a", "b", policy=Policy.URLTEST, strategy=RANK_LAST, tolerance=0.050))
    w.samples("a", 100)
    w.samples("b", 120)
    assert w.leaf("last") == "a"
    w.samples("b", 60)  # 40 ms better: within the tolerance
    assert w.leaf("last") == "a"
    w.samples("b", 40)  # 60 ms better
    assert w.leaf("last") == "b"


def test_min_ranks_only_real_probe_samples_not_failures_or_placeholders():
    w = World(group("last", "a", "b", policy=Policy.URLTEST, strategy=RANK_LAST))
    w.samples("a", 100)
    w.samples("b", 150)
    w.alive.notify_check_failure(w.ids["a"], Domain.TCP, V4)  # one failure: a stays alive
    w.alive.record_dial_failure(w.ids["a"], V4)
    w.alive.record_dial_failure(w.ids["a"], V4)  # the 10 s placeholder goes to the display collection only
    assert w.alive.ranking(w.ids["a"], Domain.TCP, V4, RANK_LAST) == pytest.approx(0.100)


def test_min_avg10_of_a_group_check_url_ranks_by_that_urls_samples():
    w = World(group("g", "a", "b", policy=Policy.URLTEST, strategy=RANK_AVG10, check_url="http://u/"))
    w.checks.sync_group_check_urls(
        [GroupCheck("g", Policy.URLTEST, "http://u/", lambda: [("a", w.ids["a"]), ("b", w.ids["b"])])]
    )
    w.samples("a", 500)  # the global probe would rank b first
    w.samples("b", 10)
    for ms in (300, 10):
        w.checks.notify("a", "http://u/", ms * MS)
    for ms in (100, 100, 180):
        w.checks.notify("b", "http://u/", ms * MS)
    assert w.checks.ranking("a", "http://u/", RANK_AVG10) == pytest.approx(0.155)
    assert w.checks.ranking("b", "http://u/") == pytest.approx(0.140)  # the moving average would pick b
    assert w.leaf("g") == "b"
