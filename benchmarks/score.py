"""Score's per-flow cost (issue 11): each reporter event, and the plan through Score groups.

    .venv/bin/python -m benchmarks.score [--quick] [--no-twin] [--profile WORLD]

Targets: "<= 10 µs median per reporter event and <= 50 µs median per Score plan()".

Flows run the daemon's sequence on a :class:`FakeClock`: ``GroupManager.resolve`` with the
flow's target (commit), ``score_feedback`` + ``start``, ``begin``, ``into_reporter``,
``setup``, TX and RX, ``settle``. Flows start every FLOW_SPACING seconds and overlap (a long
flow lives 1.6 s), their events are replayed in time order, so the 1 s RX throttle publishes
and holds as it does for real traffic and the clock never goes back. Targets are drawn from
1,000 (Zipf-like, every tenth over IPv6); a few flows fail after setup (the target path's
failure) or before it (the node's). WARMUP flows fill the evidence, cohorts, incumbents and
heuristic before any call is timed.

Worlds (50-member groups unless said, real health as in ``benchmarks/groups.py``; each Score
group's nodes have one round of probe RTTs in the heuristic, as the daemon feeds them, so every
plan also reads the group's probe rows):

* score-4, score-8, score-16: one Score group of that many nodes (the plan's cost grows with
  the members ranked; a serving pool of at most eight, the next Score issue, will bound it);
* score: one Score group of 50 nodes (every flow reports to 1 Score group);
* selector>score: a Selector of 49 nodes whose choice is that Score group;
* urltest>score: a URLTest of 49 slow nodes and that Score group (its nodes are faster);
* score>score: a Score group of 49 nodes and an inner Score group of 50 (the outer ranks the
  inner by the inner's own pick; the inner is last in configuration order and, with every
  outer node sound, no flow goes down to it: the row's "via" counts say so);
* score>score-deep: the same with the outer's own nodes TCP-dead, so every flow traverses and
  reports to 2 Score groups.

In the nested worlds each Score group's own ``plan()`` (one rank: a nested path ranks the inner
group once to learn its pick and once more to apply it when the outer picks it) is also a row
of its own, timed in a second pass over a fresh world so that its timer never weighs on the
whole plan's row. Two rows read the targets over the whole flow mix: "every Score plan()"
pools each Score group's ranks of a nested world, and "every reporter event" pools every
reporter call of the event rows, as the flows made them (the per-kind rows are the stricter
reading, and are printed too).

Each world is built, then the heap settled as the daemon settles it once its configuration
runs (``settle_heap``: the configuration frozen out of the collector's passes, the young
generation collected every GC_YOUNG_THRESHOLD allocations). Each call is timed alone with
``perf_counter_ns``; rows give median and 99th percentile in µs and the ratio median / target.
A flow's lifecycle is the sum of its reporter calls (the plan excluded). The twin figures rerun
the same in a subprocess with ``HONK_NO_EXTENSIONS=1``.
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import ipaddress
import json
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks import twin_figures
from benchmarks.groups import DEAD_AFTER, FASTEST_RTT, FIRST_PORT, GROUP_SIZE, OTHER_RTT, RTT_STEP, _group
from honk._fast import beta, cell, decay, movavg, rank
from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.links import with_node_id
from honk.config.spec import NodeSpec, Policy, Spec
from honk.core.clock import FakeClock
from honk.core.net import IPAddress, Network
from honk.daemon.app import settle_heap
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.group.score.attempt import Result, ScoreReporter
from honk.group.score.heuristic import ProbeIdentity
from honk.group.score.keys import ScoreTarget
from honk.outbound.registry import build_outbounds

EVENT_TARGET_US = 10.0  # "target <= 10 us ... median" per reporter event
PLAN_TARGET_US = 50.0  # "... and <= 50 us median" per Score plan()
TARGETS = 1_000  # "~1,000 distinct targets"
ZIPF_EXPONENT = 0.8  # target popularity: weight 1 / rank**s, a few hot sites and a long tail
V6_EVERY = 10  # every tenth target resolves to an IPv6 destination
FLOW_SPACING = 0.005  # seconds between flow starts: 200 new flows/s, ~200 in flight
FLOWS = 2_000  # timed flows per world (the whole run, the twin included, takes under a minute)
QUICK_FLOWS = 300
WARMUP = 1_500  # untimed flows first, every target once: evidence, cohorts, incumbents, heuristic
QUICK_WARMUP = 1_000
SLOW_RTT = 0.080  # seconds: the URLTest's own nodes, so it always prefers the Score group
SEED = 11
PROBE_URL = "http://probe.example/generate_204"  # the configured TCP check, as ProbeIdentity scopes it
PROBE_CADENCE = 30.0  # s: its interval; one round of RTTs stays fresh for the whole run (< 60 s)
PROFILE_FLOWS = 500
PROFILE_LINES = 30
NS_PER_US = 1000

# A flow's script: (offset in seconds from its start, event, sample name). "start" is the plan,
# the feedback and begin; the RX throttle publishes the first RX and then once per second.
SHORT: tuple[tuple[float, str, str], ...] = (
    (0.0, "start", ""),
    (0.0, "into", "into_reporter"),
    (0.030, "setup", "setup"),
    (0.032, "tx", "tx first (announces)"),
    (0.080, "rx", "rx first response (published)"),
    (0.120, "rx", "rx throttled"),
    (0.150, "success", "settle success (flushes held RX)"),
)
LONG: tuple[tuple[float, str, str], ...] = (
    (0.0, "start", ""),
    (0.0, "into", "into_reporter"),
    (0.040, "setup", "setup"),
    (0.045, "tx", "tx first (announces)"),
    (0.090, "rx", "rx first response (published)"),
    (0.300, "rx", "rx throttled"),
    (0.500, "tx", "tx repeat"),
    (0.700, "rx", "rx throttled"),
    (1.200, "rx", "rx published (after 1 s)"),
    (1.500, "rx", "rx throttled"),
    (1.600, "success", "settle success (flushes held RX)"),
)
FAIL: tuple[tuple[float, str, str], ...] = (  # the target path failed: set up, sent, no answer
    (0.0, "start", ""),
    (0.0, "into", "into_reporter"),
    (0.050, "setup", "setup"),
    (0.060, "tx", "tx first (announces)"),
    (2.000, "failure", "settle failure"),
)
SETUP_FAIL: tuple[tuple[float, str, str], ...] = (  # the node failed before setup
    (0.0, "start", ""),
    (0.0, "into", "into_reporter"),
    (0.500, "failure", "settle failure"),
)
# per 100 flows
MIX = ((SHORT, 60), (LONG, 34), (FAIL, 5), (SETUP_FAIL, 1))
SCRIPT_NAMES = {SHORT: "short flow", LONG: "long flow", FAIL: "failed flow", SETUP_FAIL: "setup failure"}
# the reporter calls a flow makes, one row each (the plan and the lifecycles are not events)
EVENT_ROWS = (
    "feedback + start",
    "begin",
    "into_reporter",
    "setup",
    "tx first (announces)",
    "tx repeat",
    "rx first response (published)",
    "rx published (after 1 s)",
    "rx throttled",
    "settle success (flushes held RX)",
    "settle failure",
)
# the printed order of a world's rows (a lifecycle's name ends with its event count)
ROW_ORDER = (
    "plan",
    *EVENT_ROWS,
    *(f"lifecycle: {name} ({len(script)} events)" for script, name in SCRIPT_NAMES.items()),
)


@dataclass
class World:
    """A manager over 50-member groups and the route target every flow asks for."""

    name: str
    label: str
    manager: GroupManager
    clock: FakeClock
    root: str
    depth: int | None  # Score groups every flow must report to; None: it varies


@dataclass
class Samples:
    """Timed calls by row name (ns), and per-flow counts."""

    calls: dict[str, list[int]] = field(default_factory=dict)
    via_score: dict[int, int] = field(default_factory=dict)  # Score groups traversed -> flows

    def add(self, name: str, ns: int) -> None:
        self.calls.setdefault(name, []).append(ns)


def _nodes(prefix: str, count: int, first: int) -> list[NodeSpec]:
    return [
        with_node_id(NodeSpec(f"{prefix}-{i}", "socks5", "127.0.0.1", FIRST_PORT + first + i))
        for i in range(count)
    ]


def build(name: str) -> World:
    """One world of the module docstring."""
    clock = FakeClock()
    size = SIZED.get(name, GROUP_SIZE)
    inner = _nodes("score", size, 0)
    outer = _nodes("top", GROUP_SIZE - 1, GROUP_SIZE)
    inner_names = [n.name for n in inner]
    outer_names = [n.name for n in outer]
    if name == "score" or name in SIZED:
        nodes, groups, root, depth = inner, (_group("score", Policy.SCORE, inner_names, None),), "score", 1
    else:
        top_policy = {"selector>score": Policy.SELECTOR, "urltest>score": Policy.URLTEST}.get(
            name, Policy.SCORE
        )
        nodes = inner + outer
        groups = (
            _group("top", top_policy, outer_names, "score"),
            _group("score", Policy.SCORE, inner_names, None),
        )
        root = "top"
        depth = {"selector>score": 1, "score>score-deep": 2}.get(name)
    spec = Spec(nodes=tuple(nodes), groups=groups)
    outbounds = build_outbounds(spec, clock)[0]
    alive = AliveDialerSet(clock)
    for n in nodes:
        alive.register_node(n.id, n.name)
    clock.advance(REGISTRATION_GRACE + 1)  # failures count as deaths from now on
    for i, n in enumerate(inner):
        alive.notify_check_success(n.id, Domain.TCP, Family.V4, FASTEST_RTT + i * RTT_STEP)
        alive.notify_check_success(n.id, Domain.TCP, Family.V6, FASTEST_RTT + i * RTT_STEP)
    for i, n in enumerate(outer):
        rtt = SLOW_RTT if name == "urltest>score" else OTHER_RTT
        alive.notify_check_success(n.id, Domain.TCP, Family.V4, rtt + i * RTT_STEP)
        alive.notify_check_success(n.id, Domain.TCP, Family.V6, rtt + i * RTT_STEP)
        if name == "score>score-deep":
            for family in (Family.V4, Family.V6):
                for _ in range(DEAD_AFTER):
                    alive.notify_check_failure(n.id, Domain.TCP, family)
    manager = GroupManager.build(
        spec, outbounds, health=HealthFilter(alive, GroupChecks(clock)), clock=clock, score_ranking=True
    )
    # the daemon feeds each ranked probe RTT of a Score group's node to the heuristic, so every
    # plan also reads the group's probe rows (one per health family, holding every member)
    observe = manager.score.performance.observe_probe
    probe = ProbeIdentity(PROBE_URL, "HEAD", PROBE_CADENCE)
    now = clock.now()
    probed = [("score", inner, FASTEST_RTT)] + ([("top", outer, OTHER_RTT)] if name == "score>score" else [])
    for group, members, base in probed:  # (the deep world's outer nodes are dead: no RTT)
        for i, n in enumerate(members):
            for family in (Family.V4, Family.V6):
                observe(group, Network.TCP, family, n.id, probe, base + i * RTT_STEP, now)
    settle_heap()  # the collector as the daemon sets it once its configuration runs
    label = WORLDS[name]
    return World(name, label, manager, clock, root, depth)


# Score groups of other sizes: the plan's cost grows with the members ranked (a serving pool of
# at most eight members, the next Score issue, bounds it whatever the group's size)
SIZED = {"score-4": 4, "score-8": 8, "score-16": 16}
WORLDS = {
    "score-4": "Score, 4 nodes",
    "score-8": "Score, 8 nodes",
    "score-16": "Score, 16 nodes",
    "score": "Score, 50 nodes",
    "selector>score": "Selector(49 nodes, chosen: Score of 50)",
    "urltest>score": "URLTest(49 slow nodes, Score of 50)",
    "score>score": "Score(49 nodes, Score of 50)",
    "score>score-deep": "Score(49 dead nodes, Score of 50): always 2 deep",
}
# worlds whose plan ranks some Score group other than as a lone group: each rank is also a row
RANK_WORLDS = ("selector>score", "urltest>score", "score>score", "score>score-deep")
RANK_ROW = "plan() of Score group "
EVERY_PLAN = "every Score plan() of the flow mix"  # each Score group's ranks, pooled
EVERY_EVENT = "every reporter event of the flow mix"  # each call of the event rows, pooled
GROUP_SIZES = {name: {"score": "50 nodes", "top": "49 nodes + the inner group"} for name in RANK_WORLDS}
GROUP_SIZES["score>score-deep"]["top"] = "49 dead nodes + the inner group"
EVENT_WORLDS = {
    "score": 1,
    "score>score-deep": 2,
}  # worlds whose reporter events are rows, by groups traversed


def targets(count: int = TARGETS) -> list[tuple[ScoreTarget, IPAddress]]:
    """Distinct targets, each with the destination address actually dialled."""
    out = []
    for i in range(count):
        if i % V6_EVERY == 0:
            ip: IPAddress = ipaddress.IPv6Address(f"2001:db8::{i:x}")
        else:
            ip = ipaddress.IPv4Address(f"198.18.{i // 256}.{i % 256}")
        out.append((ScoreTarget.of(f"site{i}.example", 443), ip))
    return out


class _Flow:
    __slots__ = ("script", "target", "destination", "guard", "reporter", "timed", "total", "depth")

    def __init__(self, script: tuple, target: ScoreTarget, destination: IPAddress, timed: bool) -> None:
        self.script = script
        self.target = target
        self.destination = destination
        self.guard = None
        self.reporter: ScoreReporter | None = None
        self.timed = timed
        self.total = 0
        self.depth = 0


def drive(
    world: World,
    flows: int,
    warmup: int,
    samples: Samples | None = None,
    *,
    plans: cProfile.Profile | None = None,
    events: cProfile.Profile | None = None,
) -> Samples:
    """Run ``warmup`` + ``flows`` flows in event-time order; time the calls of the last ``flows``.

    ``plans`` / ``events``: profilers enabled around each plan / each reporter call (begin
    included, the plan not), for ``--profile``."""
    samples = samples if samples is not None else Samples()
    rng = random.Random(SEED)
    pool = targets()
    weights = [1.0 / (rank + 1) ** ZIPF_EXPONENT for rank in range(len(pool))]
    first = list(range(min(warmup, len(pool))))  # the warm-up visits every target once first
    rng.shuffle(first)
    picks = first + rng.choices(range(len(pool)), weights=weights, k=warmup + flows - len(first))
    scripts = [script for script, share in MIX for _ in range(share)]
    rng.shuffle(scripts)
    manager, clock, root = world.manager, world.clock, world.root
    resolve, feedback_of, tcp = manager.resolve, manager.score_feedback, Network.TCP
    ns = time.perf_counter_ns
    heap: list[tuple[float, int, int, _Flow]] = []  # (time, flow number, step, flow)
    started = clock.now()
    total = warmup + flows
    begun = 0
    while begun < total or heap:
        if begun < total and (not heap or started + begun * FLOW_SPACING <= heap[0][0]):
            at = started + begun * FLOW_SPACING
            target, destination = pool[picks[begun]]
            flow = _Flow(scripts[begun % len(scripts)], target, destination, begun >= warmup)
            number, step = begun, 0
            begun += 1
        else:
            at, number, step, flow = heapq.heappop(heap)
        if at > clock.now():
            clock.advance(at - clock.now())
        now = clock.now()
        _offset, event, name = flow.script[step]
        if event == "start":
            if plans is not None:
                plans.enable()
            t0 = ns()
            selection = resolve(root, tcp, target=flow.target, destination=flow.destination)
            t1 = ns()
            if plans is not None:
                plans.disable()
            if events is not None:
                events.enable()
            t1b = ns()
            feedback = feedback_of(selection.chain, selection.leaf, tcp, flow.target, flow.destination)
            attempt = feedback.start() if feedback is not None else None
            t2 = ns()
            if attempt is None:  # the plan passed no Score group: nothing reports
                if events is not None:
                    events.disable()
                samples.via_score[0] = samples.via_score.get(0, 0) + flow.timed
                continue
            flow.guard = attempt.begin(now)
            t3 = ns()
            if events is not None:
                events.disable()
            flow.depth = len(feedback.traversed)
            if world.depth is not None and flow.depth != world.depth:
                raise AssertionError(f"{world.name}: a flow reported to {flow.depth} Score groups")
            if flow.timed:
                samples.via_score[flow.depth] = samples.via_score.get(flow.depth, 0) + 1
                samples.add("plan", t1 - t0)
                samples.add("feedback + start", t2 - t1b)
                samples.add("begin", t3 - t2)
                flow.total = (t2 - t1b) + (t3 - t2)
        else:
            reporter = flow.reporter
            if events is not None:
                events.enable()
            if event == "into":
                t0 = ns()
                flow.reporter = flow.guard.into_reporter(now)
                t1 = ns()
                flow.guard = None
            elif event == "setup":
                t0 = ns()
                reporter.setup(now)
                t1 = ns()
            elif event == "tx":
                t0 = ns()
                reporter.tx(now, 1400)
                t1 = ns()
            elif event == "rx":
                t0 = ns()
                reporter.rx(now, 1400)
                t1 = ns()
            elif event == "success":
                t0 = ns()
                reporter.settle(now, Result.success())
                t1 = ns()
            else:
                result = Result.failure()  # its own episode: built outside the timed call
                t0 = ns()
                reporter.settle(now, result)
                t1 = ns()
            if events is not None:
                events.disable()
            if flow.timed:
                samples.add(name, t1 - t0)
                flow.total += t1 - t0
        if step + 1 < len(flow.script):
            heapq.heappush(
                heap, (at - flow.script[step][0] + flow.script[step + 1][0], number, step + 1, flow)
            )
        elif flow.timed:
            samples.add(f"lifecycle: {SCRIPT_NAMES[flow.script]} ({len(flow.script)} events)", flow.total)
    return samples


def time_ranks(world: World, flows: int, warmup: int) -> dict[str, list[int]]:
    """Each Score group's own ``plan()`` (one ``ScoreState.rank`` call; a nested path makes one
    per Score group it ranks) over the last ``flows`` flows, in ns by group: a second pass over
    a fresh world, so that the timer around each rank never weighs on the whole plan's rows."""
    state = world.manager.score
    rank, ns = state.rank, time.perf_counter_ns
    timed: dict[str, list[int]] = {}
    counting = [False]

    def timed_rank(group: str, *args: object, **kwargs: object) -> object:
        t0 = ns()
        ranked = rank(group, *args, **kwargs)
        t1 = ns()
        if counting[0]:
            timed.setdefault(group, []).append(t1 - t0)
        return ranked

    state.rank = timed_rank  # type: ignore[method-assign]
    drive(world, 0, warmup)
    counting[0] = True
    drive(world, flows, 0)
    return timed


def _summary(values: list[int]) -> dict[str, float]:
    p99 = statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]
    return {"median_us": statistics.median(values) / NS_PER_US, "p99_us": p99 / NS_PER_US, "n": len(values)}


def _event_target(name: str) -> float:
    """The per-event target; a lifecycle's is that of its events (the plan is not one of them)."""
    if name.startswith("lifecycle"):
        script = next(s for s, n in SCRIPT_NAMES.items() if name.startswith(f"lifecycle: {n}"))
        return EVENT_TARGET_US * len(script)
    return EVENT_TARGET_US


def figures(quick: bool) -> dict[str, dict]:
    """By world: each row's median, p99 (µs) and count, target (µs), and the flows' Score depths."""
    flows, warmup = (QUICK_FLOWS, QUICK_WARMUP) if quick else (FLOWS, WARMUP)
    out: dict[str, dict] = {}
    for name in WORLDS:
        world = build(name)
        samples = drive(world, flows, warmup)
        rows = {"plan": {**_summary(samples.calls["plan"]), "target_us": PLAN_TARGET_US}}
        if name in RANK_WORLDS:
            ranks = time_ranks(build(name), flows, warmup)
            for group, timed in sorted(ranks.items()):
                rows[f"{RANK_ROW}{group}"] = {**_summary(timed), "target_us": PLAN_TARGET_US}
            rows[EVERY_PLAN] = {
                **_summary([ns for timed in ranks.values() for ns in timed]),
                "target_us": PLAN_TARGET_US,
            }
        if name in EVENT_WORLDS:
            for row in ROW_ORDER[1:]:
                if samples.calls.get(row):
                    rows[row] = {**_summary(samples.calls[row]), "target_us": _event_target(row)}
            every = [ns for row in EVENT_ROWS for ns in samples.calls.get(row, ())]
            rows[EVERY_EVENT] = {**_summary(every), "target_us": EVENT_TARGET_US}
        out[name] = {"rows": rows, "via_score": {str(k): v for k, v in sorted(samples.via_score.items())}}
    return out


def _implementation() -> str:
    kinds = {
        beta.IMPLEMENTATION,
        cell.IMPLEMENTATION,
        decay.IMPLEMENTATION,
        movavg.IMPLEMENTATION,
        rank.IMPLEMENTATION,
    }
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _twin(quick: bool) -> dict[str, dict] | None:
    """The same figures with HONK_NO_EXTENSIONS=1, from a subprocess; None if it failed."""
    return twin_figures("benchmarks.score", quick, 900)


def _rows(figs: dict[str, dict], prefix: str, built: bool) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, label in WORLDS.items():
        world = figs[name]
        depths = ", ".join(f"{v} via {k}" for k, v in world["via_score"].items())
        for row, f in world["rows"].items():
            if row == "plan":
                what = f"plan: {label} [{depths}]"
            elif row.startswith(RANK_ROW):
                what = f"  {name}: {row} ({GROUP_SIZES[name][row.removeprefix(RANK_ROW)]}, every rank)"
            elif row == EVERY_PLAN:
                what = f"  {name}: {row}"
            else:
                what = f"  {name} ({EVENT_WORLDS[name]} grp): {row}"
            ratio = f["median_us"] / f["target_us"]
            status = ("met" if ratio <= 1.0 else "NOT met") + ("" if built else " (extensions not built)")
            rows.append(
                (
                    prefix + what,
                    f"{f['median_us']:.1f}",
                    f"{f['p99_us']:.1f}",
                    f"{f['target_us']:.0f}",
                    f"{ratio:.2f}",
                    status,
                )
            )
    return rows


def run(quick: bool = False, twin: bool = True) -> list[tuple[str, ...]]:
    """Rows (what, median µs, p99 µs, target µs, ratio, status) for the benchmark table; the
    twin's rows follow, prefixed."""
    print("score benchmarks:", file=sys.stderr, flush=True)
    ours = figures(quick)
    rows = _rows(ours, "", _implementation() == "compiled")
    if twin:
        twins = _twin(quick)
        if twins is None:
            rows.append(("twin (HONK_NO_EXTENSIONS=1)", "-", "-", "-", "-", "subprocess failed"))
        else:
            rows += _rows(twins, "twin: ", True)  # the twin is pure Python by design
    return rows


HEADER = ["score cost", "median µs", "p99 µs", "target µs", "ratio", "status"]


def profile(name: str, flows: int = PROFILE_FLOWS) -> None:
    """cProfile the plans, then the reporter calls, of ``flows`` flows of one world after the
    warm-up; print each by own and by total time."""
    world = build(name)
    drive(world, 0, WARMUP)
    plans, events = cProfile.Profile(), cProfile.Profile()
    drive(world, flows, 0, plans=plans, events=events)
    for what, profiler in (("plans", plans), ("reporter calls", events)):
        stats = pstats.Stats(profiler)
        print(f"--- {name}: {what} of {flows} flows, by own time")
        stats.sort_stats("tottime").print_stats(PROFILE_LINES)
        print(f"--- {name}: {what}, by cumulative time")
        stats.sort_stats("cumulative").print_stats(PROFILE_LINES)


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> None:
    from benchmarks.relay import format_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.score")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-twin", action="store_true", help="skip the HONK_NO_EXTENSIONS=1 rerun")
    parser.add_argument("--json", action="store_true", help="print this process's figures as JSON")
    parser.add_argument("--profile", choices=list(WORLDS), help="cProfile one world instead of measuring")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile)
        return
    if args.json:
        out(json.dumps({"implementation": _implementation(), "figures": figures(args.quick)}))
        return
    out(format_table(HEADER, [list(r) for r in run(args.quick, not args.no_twin)]))


if __name__ == "__main__":
    main()
