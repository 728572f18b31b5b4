"""The per-flow plan through nested groups: ``GroupManager.resolve`` over three levels.

    .venv/bin/python -m benchmarks.groups [--quick] [--no-twin] [--profile SCENARIO]

Every new flow whose route target is a group pays one ``resolve``: the walk from the
group down to one leaf, judging members against the health state on the way. This
measures that walk where it is deepest in a common setup: ``top`` holds 49 nodes and
the group ``middle``, which holds 49 nodes and ``bottom``, which holds 50 nodes; 150
distinct SOCKS5 nodes in all. Health is real (an ``AliveDialerSet`` behind a
``HealthFilter``, past the registration grace), so every eligibility check and every
moving-average read runs; nothing is dialled.

Scenarios (the three groups share one policy):

* urltest: every node has a probe sample and the fastest is in ``bottom``, so every
  plan ranks all three groups and descends to the bottom;
* selector: ``top`` chooses ``middle``, ``middle`` chooses ``bottom``;
* loadbalance: round robin with every node alive: most plans stop at a node of
  ``top``, a few descend (the mix a real flow sees);
* loadbalance-deep: only ``bottom``'s nodes alive, so every plan descends to the bottom
  past the dead nodes of ``top`` and ``middle``.

Each call is timed alone with ``perf_counter_ns``; the rows give the median and the
99th percentile. The twin figures rerun the same in a subprocess with
``HONK_NO_EXTENSIONS=1`` (the pure-Python moving averages).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import print_profile, twin_figures
from honk._fast import movavg
from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.links import with_node_id
from honk.config.spec import GroupSpec, NodeSpec, Policy, Spec, name_filter
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.outbound.registry import build_outbounds

PLAN_TARGET_US = 20.0  # "Target: <= 20 µs median per plan on this machine with extensions built"
GROUP_SIZE = 50  # "three nested groups of 50 members each"
NESTED = ("top", "middle", "bottom")  # outermost first; each but the last nests the next
FIRST_PORT = 20000  # node i listens (nominally) on FIRST_PORT + i: distinct ports, distinct NodeIds
DEAD_AFTER = 3  # "a node is TCP-dead after 3 probe failures"
FASTEST_RTT = 0.005  # seconds: the fastest node, in the bottom group
OTHER_RTT = 0.020  # seconds: the slowest other node's base; each further node is a little slower
RTT_STEP = 0.0001  # seconds between consecutive nodes' samples
CALLS = 5_000  # timed plans per scenario (the URLTest scenario alone takes ~8 s of them)
QUICK_CALLS = 1_000
WARMUP = 200  # untimed plans before the timed ones (policy state settles, caches warm)
PROFILE_CALLS = 2_000
PROFILE_LINES = 25


@dataclass
class Bench:
    """One built world: the manager, and what a plan through it must end at."""

    manager: GroupManager
    alive: AliveDialerSet
    ids: dict[str, object]
    expect_chain: tuple[str, ...] | None  # the exact chain every plan must return, if fixed
    always_deep: bool  # every plan must end in ``bottom``
    churn: bool = False  # health changes before every plan: no cached pick is valid


def _group(name: str, policy: Policy, nodes: list[str], subgroup: str | None) -> GroupSpec:
    filters = (name_filter(*nodes),)
    return GroupSpec(
        name,
        policy=policy,
        filters=filters,
        subgroups=(subgroup,) if subgroup else (),
        has_filter_lines=True,
        default=subgroup if policy is Policy.SELECTOR else None,  # a Selector goes down a level
    )


def build(policy: Policy, *, deep: bool = False) -> Bench:
    """The three nested groups over 150 nodes with real health, all groups using ``policy``.

    ``deep``: every node of ``top`` and ``middle`` is TCP-dead, so the plan must descend.
    """
    clock = FakeClock()
    members: dict[str, list[str]] = {}
    for level, name in enumerate(NESTED):
        own = GROUP_SIZE - 1 if level < len(NESTED) - 1 else GROUP_SIZE
        members[name] = [f"{name}-{i}" for i in range(own)]
    names = [n for group in NESTED for n in members[group]]
    nodes = tuple(
        with_node_id(NodeSpec(n, "socks5", "127.0.0.1", FIRST_PORT + i)) for i, n in enumerate(names)
    )
    groups = tuple(
        _group(name, policy, members[name], NESTED[level + 1] if level + 1 < len(NESTED) else None)
        for level, name in enumerate(NESTED)
    )
    spec = Spec(nodes=nodes, groups=groups)
    outbounds = build_outbounds(spec, clock)[0]
    alive = AliveDialerSet(clock)
    ids = {n.name: n.id for n in nodes}
    assert len(set(ids.values())) == len(nodes), "node ids must be distinct"
    for n in nodes:
        alive.register_node(n.id, n.name)
    clock.advance(REGISTRATION_GRACE + 1)  # failures count as deaths from now on
    for i, name in enumerate(names):
        rtt = FASTEST_RTT if name == members["bottom"][0] else OTHER_RTT + i * RTT_STEP
        alive.notify_check_success(ids[name], Domain.TCP, Family.V4, rtt)
    if deep:
        for name in members["top"] + members["middle"]:
            for _ in range(DEAD_AFTER):
                alive.notify_check_failure(ids[name], Domain.TCP, Family.V4)
            assert not alive.tcp_alive(ids[name], Family.V4)
    manager = GroupManager.build(spec, outbounds, health=HealthFilter(alive, GroupChecks(clock)), clock=clock)
    for name in NESTED:
        assert len(manager.members(name)) == GROUP_SIZE, (name, manager.members(name))
    expect = None
    if policy in (Policy.URLTEST, Policy.SELECTOR):
        expect = (*NESTED, members["bottom"][0])
    return Bench(manager, alive, ids, expect, policy is not Policy.LOADBALANCE or deep)


# (scenario, label, builder)
SCENARIOS: tuple[tuple[str, str, Callable[[], Bench]], ...] = (
    ("urltest", "URLTest x3, all nodes sampled, fastest in bottom", lambda: build(Policy.URLTEST)),
    (
        "urltest-churn",
        "URLTest x3, health changed before every plan (nothing cached)",
        lambda: dataclasses.replace(build(Policy.URLTEST), churn=True),
    ),
    ("selector", "Selector x3, top->middle->bottom", lambda: build(Policy.SELECTOR)),
    ("loadbalance", "LoadBalance x3, all alive (round-robin mix)", lambda: build(Policy.LOADBALANCE)),
    (
        "loadbalance-deep",
        "LoadBalance x3, only bottom alive (always 3 deep)",
        lambda: build(Policy.LOADBALANCE, deep=True),
    ),
)


def measure(bench: Bench, calls: int) -> dict[str, float]:
    """Median and p99 (µs) of ``calls`` timed plans, and the shares that reached ``middle``
    and ``bottom``."""
    resolve = bench.manager.resolve
    tcp = Network.TCP
    for _ in range(WARMUP):
        resolve("top", tcp)
    clock_ns = time.perf_counter_ns
    samples = [0] * calls
    via_middle = deep = 0
    alive = bench.alive
    for i in range(calls):
        if bench.churn:
            alive.version += 1  # what any probe result does: every cached pick expires
        started = clock_ns()
        selection = resolve("top", tcp)
        samples[i] = clock_ns() - started
        levels = len(selection.chain) - 1
        via_middle += levels >= 2
        deep += levels == len(NESTED)
        if (bench.expect_chain is not None and selection.chain != bench.expect_chain) or (
            bench.always_deep and levels != len(NESTED)
        ):
            raise AssertionError(f"unexpected plan {selection.chain}")
    p99 = statistics.quantiles(samples, n=100)[98]
    return {
        "median_us": statistics.median(samples) / 1000,
        "p99_us": p99 / 1000,
        "via_middle": via_middle / calls,
        "deep": deep / calls,
    }


def figures(quick: bool) -> dict[str, dict[str, float]]:
    calls = QUICK_CALLS if quick else CALLS
    return {key: measure(make(), calls) for key, _, make in SCENARIOS}


def _twin(quick: bool) -> dict[str, dict[str, float]] | None:
    """The same figures with HONK_NO_EXTENSIONS=1, from a subprocess; None if it failed."""
    return twin_figures("benchmarks.groups", quick, 600)


def run(quick: bool = False, twin: bool = True) -> list[tuple[str, str, str, str]]:
    """Rows (what, honk, target, status) for the benchmark table."""
    built = movavg.IMPLEMENTATION == "compiled"
    ours = figures(quick)
    twins = _twin(quick) if twin else None
    rows = []
    for key, label, _ in SCENARIOS:
        f = ours[key]
        status = "met" if f["median_us"] <= PLAN_TARGET_US else "NOT met"
        if not built:
            status += " (extensions not built)"
        honk = f"median {f['median_us']:.1f} µs, p99 {f['p99_us']:.1f} µs"
        if key == "loadbalance":
            honk += f"; {f['via_middle'] * 100:.1f}% via middle, {f['deep'] * 100:.2f}% 3 deep"
        rows.append((f"plan: {label}", honk, f"<= {PLAN_TARGET_US:.0f} µs median", status))
        if twins is not None:
            t = twins[key]
            rows.append(
                (
                    f"  twin (HONK_NO_EXTENSIONS=1): {key}",
                    f"median {t['median_us']:.1f} µs, p99 {t['p99_us']:.1f} µs",
                    "",
                    "reference",
                )
            )
    if twin and twins is None:
        rows.append(("twin (HONK_NO_EXTENSIONS=1)", "not measured", "", "subprocess failed"))
    return rows


def profile(scenario: str, calls: int = PROFILE_CALLS) -> None:
    """cProfile ``calls`` plans of one scenario; print the functions by own and total time."""
    make = next(m for key, _, m in SCENARIOS if key == scenario)
    bench = make()
    resolve = bench.manager.resolve
    for _ in range(WARMUP):
        resolve("top", Network.TCP)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        resolve("top", Network.TCP)
    profiler.disable()
    print_profile(profiler, f"{scenario}: {calls} plans", PROFILE_LINES)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.groups")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-twin", action="store_true", help="skip the HONK_NO_EXTENSIONS=1 rerun")
    parser.add_argument("--json", action="store_true", help="print this process's figures as JSON")
    parser.add_argument(
        "--profile",
        choices=[key for key, _, _ in SCENARIOS],
        help="cProfile one scenario instead of measuring",
    )
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
        return
    if args.json:
        print(json.dumps({"implementation": movavg.IMPLEMENTATION, "figures": figures(args.quick)}))
        return
    for row in run(args.quick, not args.no_twin):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
