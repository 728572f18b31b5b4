"""Properties of group resolution over random group graphs, with real health on a fake clock.

Hand-written cases pin single behaviours; these properties look for the combinations nobody
wrote down: nesting with cycles (cut by the manager), finals that loop or name nothing, dead
leaves per network, latency samples that move URLTest winners, and Selector choices. Every
resolution must end (a leaf or :class:`NoRoute`) along edges the configuration declares,
honour each Selector's choice, and never invent ``direct``; a peek must leave no trace.
"""

from __future__ import annotations

import contextlib
import signal
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import PROBE_DEATH_THRESHOLD, REGISTRATION_GRACE
from honk.config.links import with_node_id
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.core.clock import FakeClock
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager, Selection
from honk.group.policy import Fallback, LoadBalance, Selector, URLTest
from honk.outbound.registry import build_outbounds

TCP, UDP = Network.TCP, Network.UDP
V4 = Family.V4
POLICIES = (Policy.SELECTOR, Policy.URLTEST, Policy.LOADBALANCE, Policy.FALLBACK)
MISSING = "nowhere"  # a final or default that names neither a group nor an outbound
GHOST = "ghost"  # a nested group tag that is not declared
RESOLVE_BOUND = 2.0  # seconds; one resolution that takes longer counts as a hang
LB_ROUNDS = 3  # "3*k consecutive TCP picks visit each eligible member exactly 3 times"

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the random world ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPlan:
    name: str
    policy: Policy
    nodes: tuple[str, ...]  # node members by name ("direct" only when the scenario allows it)
    subgroups: tuple[str, ...]  # may name itself, repeat, form cycles or name GHOST
    final: str | None
    default: str | None
    tolerance: float


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[tuple[str, str], ...]  # (name, protocol); "http" carries no UDP
    groups: tuple[GroupPlan, ...]
    samples: tuple[tuple[str, Domain, int], ...]  # (node, domain, milliseconds), applied before deaths
    tcp_dead: frozenset[str]
    udp_dead: frozenset[str]
    demoted: frozenset[str]
    choices: tuple[tuple[str, Network, int], ...]  # (Selector, network, member index modulo its size)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.nodes)

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)

    def plan(self, name: str) -> GroupPlan:
        return next(g for g in self.groups if g.name == name)

    def member_edges(self, name: str) -> set[str]:
        """The member names the configuration gives a group, before any cycle is cut."""
        g = self.plan(name)
        groups = set(self.group_names)
        return set(g.nodes) | {s for s in g.subgroups if s in groups and s != name}

    def reachable(self, name: str) -> set[str]:
        """Every name reachable from ``name`` through configured member and final edges."""
        groups = set(self.group_names)
        seen, todo = {name}, [name]
        while todo:
            current = todo.pop()
            if current not in groups:
                continue
            final = self.plan(current).final
            for nxt in self.member_edges(current) | ({final} if final is not None else set()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    node_names = [f"n{i}" for i in range(draw(st.integers(1, 6)))]
    nodes = tuple((n, draw(st.sampled_from(("socks5", "socks5", "http")))) for n in node_names)
    group_names = [f"g{i}" for i in range(draw(st.integers(1, 8)))]
    with_direct = draw(st.booleans())
    leaf_members = node_names + (["direct"] if with_direct else [])
    groups = []
    for name in group_names:
        members = draw(st.lists(st.sampled_from(leaf_members), max_size=len(leaf_members), unique=True))
        subgroups = draw(st.lists(st.sampled_from(group_names + [GHOST]), max_size=4))
        final = draw(st.one_of(st.none(), st.sampled_from(group_names + leaf_members + [MISSING])))
        default = draw(st.one_of(st.none(), st.sampled_from(members + subgroups + [MISSING])))
        groups.append(
            GroupPlan(
                name,
                draw(st.sampled_from(POLICIES)),
                tuple(members),
                tuple(subgroups),
                final,
                default,
                draw(st.sampled_from((0.0, 0.010, 0.050))),
            )
        )
    some_nodes = st.frozensets(st.sampled_from(node_names))
    samples = draw(
        st.lists(
            st.tuples(
                st.sampled_from(node_names),
                st.sampled_from((Domain.TCP, Domain.DNS_UDP, Domain.DATA_UDP)),
                st.integers(1, 400),
            ),
            max_size=12,
        )
    )
    choices = draw(
        st.lists(
            st.tuples(st.sampled_from(group_names), st.sampled_from((TCP, UDP)), st.integers(0, 15)),
            max_size=6,
        )
    )
    return Scenario(
        nodes,
        tuple(groups),
        tuple(samples),
        draw(some_nodes),
        draw(some_nodes),
        draw(some_nodes),
        tuple(choices),
    )


def _name_filter(names: tuple[str, ...]) -> tuple[NodeFilter, ...]:
    return (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in names)),)),) if names else ()


class World:
    """A scenario made real: node specs, outbounds, health, and managers built over them."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.clock = FakeClock()
        self.alive = AliveDialerSet(self.clock)
        nodes = tuple(
            with_node_id(NodeSpec(name, protocol, "127.0.0.1", 21000 + i))
            for i, (name, protocol) in enumerate(scenario.nodes)
        )
        groups = tuple(
            GroupSpec(
                g.name,
                policy=g.policy,
                filters=_name_filter(g.nodes),
                subgroups=g.subgroups,
                has_filter_lines=True,
                final=g.final,
                default=g.default,
                tolerance=g.tolerance,
            )
            for g in scenario.groups
        )
        self.spec = Spec(nodes=nodes, groups=groups)
        self.outbounds = build_outbounds(self.spec, self.clock)[0]
        self.ids = {n.name: n.id for n in nodes}
        for n in nodes:
            self.alive.register_node(n.id, n.name)
        self.clock.advance(REGISTRATION_GRACE + 1)
        for name, domain, ms in scenario.samples:
            self.alive.notify_check_success(self.ids[name], domain, V4, ms / 1000)
        for name in scenario.tcp_dead:
            self._kill(name, Domain.TCP)
        for name in scenario.udp_dead:
            self._kill(name, Domain.DNS_UDP)
            self._kill(name, Domain.DATA_UDP)
        for name in scenario.demoted:
            for _ in range(2):  # two consecutive dial failures: one strike
                self.alive.record_dial_failure(self.ids[name], V4)

    def _kill(self, name: str, domain: Domain) -> None:
        for _ in range(PROBE_DEATH_THRESHOLD[domain]):
            self.alive.notify_check_failure(self.ids[name], domain, V4)

    def manager(self) -> tuple[GroupManager, dict[tuple[str, Network], str]]:
        """A fresh manager with the scenario's Selector choices applied; the choices by (group, network)."""
        manager = GroupManager.build(
            self.spec, self.outbounds, health=HealthFilter(self.alive), clock=self.clock
        )
        chosen: dict[tuple[str, Network], str] = {}
        for group, network, index in self.scenario.choices:
            members = manager.members(group)
            if isinstance(manager.policy(group), Selector) and members:
                member = members[index % len(members)]
                manager.select(group, member, network)
                chosen[(group, network)] = member
        return manager, chosen


# --- checking one resolution ----------------------------------------------------------------------


class ResolveHung(AssertionError):
    pass


@contextlib.contextmanager
def bounded(seconds: float, what: str):
    """Interrupt the body after ``seconds`` of wall time, then give pytest-timeout its timer back."""

    def expire(signum, frame):  # noqa: ANN001
        raise ResolveHung(f"{what} did not return within {seconds} s")

    previous_handler = signal.signal(signal.SIGALRM, expire)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            signal.setitimer(
                signal.ITIMER_REAL, max(previous_delay - (seconds - left), 0.001), previous_interval
            )


def outcome(manager: GroupManager, name: str, network: Network, peek: bool = False) -> Selection | None:
    """The selection, or None for a refusal; any other exception or a hang fails the test."""
    with bounded(RESOLVE_BOUND, f"resolve({name}, {network.value}, peek={peek})"):
        try:
            return manager.resolve(name, network, peek=peek)
        except NoRoute:
            return None


def summary(selection: Selection | None) -> tuple[str, tuple[str, ...]] | None:
    return None if selection is None else (selection.leaf.name, selection.chain)


def effective_choice(
    manager: GroupManager, chosen: dict[tuple[str, Network], str], plan: GroupPlan, network: Network
) -> str | None:
    """What a Selector serves before health: the runtime choice, else a default that is still a
    member, else the first member (computed from the scenario, not read from the policy)."""
    members = manager.members(plan.name)
    if (plan.name, network) in chosen:
        return chosen[(plan.name, network)]
    if plan.default is not None and plan.default in members:
        return plan.default
    return members[0] if members else None


def check_selection(
    world: World,
    manager: GroupManager,
    chosen: dict[tuple[str, Network], str],
    name: str,
    network: Network,
    selection: Selection | None,
) -> None:
    if selection is None:
        return  # a refusal is always an allowed answer
    s = world.scenario
    chain, leaf = selection.chain, selection.leaf
    assert chain[0] == name and chain[-1] == leaf.name, chain
    assert world.outbounds[chain[-1]] is leaf
    assert len(set(chain)) == len(chain), f"a name repeats in {chain}"
    for here, nxt in zip(chain, chain[1:], strict=False):
        assert here in s.group_names, f"{here} in {chain} is not a group but has a next hop"
        plan = s.plan(here)
        assert nxt in manager.members(here) or nxt == plan.final, f"{here} -> {nxt} is no edge ({chain})"
        assert nxt in s.member_edges(here) or nxt == plan.final
        if plan.policy is Policy.SELECTOR:
            expected = effective_choice(manager, chosen, plan, network)
            assert nxt in (expected, plan.final), f"Selector {here} went to {nxt}, chose {expected} ({chain})"
    assert chain[-1] not in s.group_names
    reachable = s.reachable(name)
    if leaf.name == "direct":
        assert "direct" in reachable, f"{name} resolved to direct, never configured below it ({chain})"
    assert leaf.name != "block"
    assert leaf.name in reachable


# --- properties -----------------------------------------------------------------------------------


@PROPERTY
@given(scenarios())
def test_every_resolution_ends_at_a_configured_leaf_through_selector_choices_or_refuses(scenario):
    world = World(scenario)
    manager, chosen = world.manager()
    for _ in range(2):  # the second pass runs on moved cursors, pins and winners
        for name in scenario.group_names:
            for network in (TCP, UDP):
                peeked = outcome(manager, name, network, peek=True)
                check_selection(world, manager, chosen, name, network, peeked)
                applied = outcome(manager, name, network)
                check_selection(world, manager, chosen, name, network, applied)


@PROPERTY
@given(scenarios())
def test_peeking_twice_before_each_resolution_changes_no_later_result(scenario):
    world = World(scenario)
    peeking, _ = world.manager()
    fresh, _ = world.manager()
    for _ in range(2):
        for name in scenario.group_names:
            for network in (TCP, UDP):
                first = summary(outcome(peeking, name, network, peek=True))
                second = summary(outcome(peeking, name, network, peek=True))
                assert first == second, f"a peek at {name}/{network.value} moved the next peek"
                applied = summary(outcome(peeking, name, network))
                assert applied == summary(outcome(fresh, name, network)), (
                    f"peeks changed {name}/{network.value}"
                )


def remembered(policy: object, network: Network) -> str | None:
    """The member a policy remembers serving: a LoadBalance cursor, a Fallback pin, a URLTest winner."""
    if isinstance(policy, LoadBalance):
        index = policy._last.get(network)
        return None if index is None else policy.members[index]
    if isinstance(policy, Fallback):
        return policy.pin(network)
    if isinstance(policy, URLTest):
        return policy.winner(network)
    return None  # a Selector remembers only writes


# The smallest case this property found: a URLTest whose final names its only member. UDP-dead n0
# is no eligible pick, so the final serves it; the apply committed that final edge as if the policy
# had picked n0, and the URLTest's UDP winner became an ineligible member.
FINAL_NAMES_A_MEMBER = Scenario(
    nodes=(("n0", "socks5"),),
    groups=(GroupPlan("g0", Policy.URLTEST, ("n0",), (), "n0", None, 0.0),),
    samples=(),
    tcp_dead=frozenset(),
    udp_dead=frozenset({"n0"}),
    demoted=frozenset(),
    choices=(),
)


@PROPERTY
@given(scenarios())
@example(FINAL_NAMES_A_MEMBER)
def test_a_policy_moves_its_memory_only_to_an_eligible_leaf_member_never_through_a_final(scenario):
    world = World(scenario)
    manager, _ = world.manager()
    health = manager.health
    for _ in range(2):
        for name in scenario.group_names:
            for network in (TCP, UDP):
                before = {
                    (g, net): remembered(manager.policy(g), net)
                    for g in scenario.group_names
                    for net in (TCP, UDP)
                }
                served = summary(outcome(manager, name, network))
                for (group, net), old in before.items():
                    new = remembered(manager.policy(group), net)
                    if new == old or new in scenario.group_names:
                        continue  # a sub-group member's eligibility depends on the walk's context
                    assert net is network, f"resolving {name}/{network.value} moved {group}/{net.value}"
                    assert health.eligible(world.outbounds[new], net, group, new), (
                        f"{group} now remembers {new}, not {net.value}-eligible; served {served}"
                    )


@PROPERTY
@given(scenarios())
def test_cycle_cutting_keeps_only_configured_edges_and_leaves_no_nesting_cycle(scenario):
    world = World(scenario)
    manager, _ = world.manager()
    for name in scenario.group_names:
        assert set(manager.members(name)) <= scenario.member_edges(name)
        assert {n for n in manager.members(name) if n not in scenario.group_names} == set(
            scenario.plan(name).nodes
        )  # only nested edges are ever cut
    state: dict[str, str] = {}

    def visit(name: str) -> None:
        state[name] = "open"
        for child in manager.members(name):
            if child in scenario.group_names:
                assert state.get(child) != "open", f"nesting cycle through {child} survived"
                if child not in state:
                    visit(child)
        state[name] = "done"

    for name in scenario.group_names:
        if name not in state:
            visit(name)


@st.composite
def load_balance_cases(draw: st.DrawFn) -> tuple[int, tuple[int, ...], frozenset[int], int, tuple[int, ...]]:
    count = draw(st.integers(1, 6))
    members = tuple(sorted(draw(st.sets(st.integers(0, count - 1), min_size=1))))
    dead = draw(st.frozensets(st.sampled_from(members), max_size=len(members) - 1))
    warmup = draw(st.integers(0, 5))
    # between two TCP picks: 0 nothing, 1 a TCP peek, 2 a UDP pick, 3 a UDP peek
    noise = tuple(draw(st.lists(st.integers(0, 3), min_size=LB_ROUNDS * 6, max_size=LB_ROUNDS * 6)))
    return count, members, dead, warmup, noise


@PROPERTY
@given(load_balance_cases())
def test_load_balance_serves_each_eligible_member_equally_often_in_three_k_tcp_picks(case):
    count, members, dead, warmup, noise = case
    scenario = Scenario(
        nodes=tuple((f"n{i}", "socks5") for i in range(count)),
        groups=(GroupPlan("lb", Policy.LOADBALANCE, tuple(f"n{i}" for i in members), (), None, None, 0.0),),
        samples=(),
        tcp_dead=frozenset(f"n{i}" for i in dead),
        udp_dead=frozenset(),
        demoted=frozenset(),
        choices=(),
    )
    manager, _ = World(scenario).manager()
    eligible = {f"n{i}" for i in members if i not in dead}
    for _ in range(warmup):
        manager.resolve("lb", TCP)
    picks = []
    for step in range(LB_ROUNDS * len(eligible)):
        picks.append(manager.resolve("lb", TCP).leaf.name)
        if noise[step] in (1, 3):
            manager.resolve("lb", TCP if noise[step] == 1 else UDP, peek=True)
        elif noise[step] == 2:
            manager.resolve("lb", UDP)
    assert Counter(picks) == {name: LB_ROUNDS for name in eligible}
