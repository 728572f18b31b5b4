"""The group manager: resolves a route target to exactly one leaf, through nested groups.

Theory of operation
-------------------
* :meth:`GroupManager.build` computes every group's members once
  (:mod:`honk.group.membership`), cuts each cycle-closing nested edge (DFS in
  declaration order, one warning per cut) and gives each group its policy
  (:mod:`honk.group.policy`). Selector choices of the manager being replaced survive
  when the same member identity (NodeId for a node, name for a sub-group) is still a
  member: a different node that took a removed node's name does not inherit its choice.
* :meth:`GroupManager.resolve` walks from the asked name down to one leaf. A group asks
  its policy for a member; a member that is a group contributes exactly one candidate,
  its own pick for the same network; leaves are judged by :mod:`honk.group.filter`, each in
  its own health family (the family its server is reached on, GH-D-07, GH-K-01): the flow's
  target family never enters a judgement, so nothing here is keyed by a family. A Selector
  resolves only its chosen member, never a sibling.
* A group without an eligible pick continues with its own ``final``; without one, a
  group whose only leaf (through the current Selector choices) is TCP-dead still serves
  that leaf for TCP, as a last resort with a warning at most every 60 s; otherwise the
  failure propagates to the parent, which does the same. Nothing falls back to
  ``direct`` implicitly.
* The walk is bounded: the root is depth 0 and a group deeper than
  :data:`MAX_NESTING_DEPTH` contributes no candidate; a group met again in one walk (a
  cycle through finals) contributes none either.
* ``peek`` resolution (introspection, delay-test listings) changes nothing a policy
  remembers: no LoadBalance cursor, Fallback pin or URLTest winner moves, no warning.
* A Score group ranks with the flow's target (``resolve(..., target=, destination=)``) in the
  one :class:`~honk.group.score.ranker.ScoreState` of the manager lineage (:attr:`score`):
  ``build(previous=...)`` shares it, :meth:`commit_score` prunes removed membership when
  that manager starts serving, a fresh build starts empty. Its result depends on the target and on evidence, so a walk through a Score group is
  never cached and is served by deciding again with commit. A nested group member is judged
  by its own pick as for any policy. :meth:`score_feedback` attributes a served flow to every
  Score group on its path, once each, with the leaf's NodeId (GH-K-05).

Invariants: the structure never changes after ``build``; only policy state changes, on
the event loop's thread, through :meth:`resolve` and :meth:`select`.
"""

from __future__ import annotations

import copy
import logging
import random
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from honk._fast import nodeid
from honk.alive.outcome import Family
from honk.config.spec import GroupSpec, Spec
from honk.core.clock import Clock
from honk.core.errors import NoRoute
from honk.core.net import IPAddress, Network
from honk.group.filter import NO_HEALTH, HealthFilter, health_family_of, node_id_of
from honk.group.membership import Membership, resolve_membership
from honk.group.policy import (
    NETWORKS,
    Candidate,
    Epoch,
    Fallback,
    Fixable,
    GroupPolicy,
    Score,
    Selector,
    UnknownGroup,
    URLTest,
    make_policy,
)
from honk.group.score.attempt import ScoreFeedback, Traversal
from honk.group.score.heuristic import FirstChoiceHeuristic
from honk.group.score.keys import NodeId, ScoreTarget
from honk.group.score.ranker import Member, ScoreState
from honk.outbound.base import Outbound

log = logging.getLogger(__name__)

MAX_NESTING_DEPTH = 8  # "bounded by MAX_GROUP_DEPTH = 8"; the root group is depth 0
LAST_RESORT_WARNING_INTERVAL = 60.0  # seconds; "rate-limited to once per 60 s per group"
RETRY_CANDIDATES = 3  # "one retry round over the latency-ordered top three candidates"

# A member identity that survives reload: ("node", NodeId), ("group", name) or ("builtin", name)
Identity = tuple[str, object]
# (group, network, member identity) after a Selector write changed that network's choice
ChoiceListener = Callable[[str, Network, Identity], None]
# (group, network): the group's selection for the network changed and it has interrupt_connections
InterruptListener = Callable[[str, Network], None]


# Not frozen, as FlowMeta (honk.core.net): built per flow, never mutated.
@dataclass(slots=True)
class Selection:
    """The leaf a name resolved to; ``chain`` runs from the asked name to the leaf's name
    (a final edge taken is part of it)."""

    leaf: Outbound
    chain: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupIdentity:
    """A configured group's identity: kept across reloads while its name stays."""

    uid: uuid.UUID
    created_at: float  # wall-clock seconds


@dataclass(slots=True)
class _Group:
    spec: GroupSpec
    membership: Membership
    policy: GroupPolicy
    identity: GroupIdentity
    warned_at: float | None = None  # last last-resort warning (monotonic)
    positions: dict[str, int] = field(default_factory=dict)  # member -> declaration index
    # (network, chain) -> (stamp, (leaf, chain suffix) or None): the last peek's result,
    # valid while nothing that can change it (health, any policy's state) has changed
    cache: dict[tuple, tuple] = field(default_factory=dict)
    # a Score group's ranked members: network -> (stamp, [Member], indices of the
    # members judged again per flow: its sub-groups) (_View.score_members)
    score_members: dict[tuple, tuple] = field(default_factory=dict)

    # the members that are nodes (or builtins): a group sharing one's name does not shadow it here
    leaves: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        self.positions = {m: i for i, m in enumerate(self.policy.members)}
        self.leaves = frozenset(self.membership.nodes)


def cut_cycles(memberships: dict[str, Membership], *, quiet: bool = False) -> dict[str, Membership]:
    """Drop every nested edge that closes a cycle, visiting groups and edges in order
    (``quiet``: without the warning, for a caller that only compares)."""
    on_stack: set[str] = set()
    finished: set[str] = set()
    kept: dict[str, list[str]] = {name: list(m.subgroups) for name, m in memberships.items()}

    def visit(name: str) -> None:
        on_stack.add(name)
        for child in list(kept[name]):
            if child in on_stack:
                if not quiet:
                    log.warning("group %s: nested group %s closes a cycle; that edge is removed", name, child)
                kept[name].remove(child)
            elif child not in finished:
                visit(child)
        on_stack.discard(name)
        finished.add(name)

    for name in memberships:
        if name not in finished:
            visit(name)
    return {
        name: Membership(m.nodes, tuple(kept[name]), m.latency_offsets) for name, m in memberships.items()
    }


class _View:
    """The members of one group for one selection: resolves and judges them on demand."""

    __slots__ = ("manager", "group", "network", "chain", "depth", "peek", "target", "destination", "_seen")

    def __init__(
        self,
        manager: GroupManager,
        group: _Group,
        network: Network,
        chain: tuple[str, ...],
        depth: int,
        peek: bool,
    ) -> None:
        self.manager = manager
        self.group = group
        self.network = network
        self.chain = chain
        self.depth = depth
        self.peek = peek
        self.target, self.destination = manager._flow  # the flow being resolved (Score reads it)
        self._seen: dict[str, tuple[Candidate, Selection | None]] = {}

    def now(self) -> float:
        clock = self.manager.clock
        return clock.now() if clock is not None else 0.0

    def node_id(self, member: str) -> NodeId:
        """The NodeId of the leaf ``member`` resolves to; a builtin leaf or an unresolved member
        gets a name-based identity (it has no evidence of its own)."""
        m = self.manager
        if m._is_leaf(self.group, member):  # a leaf: its identity, without resolving a selection
            known = m._leaf_ids.get(member)
            if known is None and member in m._outbounds:
                known = m._leaf_ids[member] = _leaf_node_id(m._outbounds[member])
            if known is not None:
                return known
        selection = self.selection(member)
        if selection is None:
            return ("member", member)
        return _leaf_node_id(selection.leaf)

    def selection(self, member: str) -> Selection | None:
        candidate, selection = self._judge(member)
        if selection is None and self.manager._is_leaf(self.group, member):
            selection = Selection(
                self.manager._outbounds[member], (*self.chain, member)
            )  # a leaf, made on demand
        return selection

    def evaluate(self, member: str) -> Candidate:
        return self._judge(member)[0]

    def all(self) -> list[Candidate]:
        return [self.evaluate(m) for m in self.group.policy.members]

    def score_members(self) -> list[Member]:
        """Every member as the Score ranker reads it (configuration order), kept under the
        manager's stamp: a leaf member reads the same until health or policy state changes. A
        sub-group member's leaf (and so its NodeId) can depend on the flow, so each flow judges
        those members again and, when they read as before, gets the kept list object itself
        (the ranker keeps its reading of a list while the same object comes back)."""
        m = self.manager
        group = self.group
        key = self.network
        stamp = m._stamp()
        known = group.score_members.get(key)
        if known is not None and known[0] == stamp:
            members, routed = known[1], known[2]
            changed = None
            for i in routed:
                name = members[i].name
                member = Member(name, self.node_id(name), self.evaluate(name).eligible)
                if member != members[i]:
                    if changed is None:
                        changed = list(members)  # a list once ranked is never changed: a new one
                    changed[i] = member
            if changed is None:
                return members
            group.score_members[key] = (stamp, changed, routed)
            return changed
        members = [Member(c.member, self.node_id(c.member), c.eligible) for c in self.all()]
        # the members judged per flow: sub-groups, and names that are no leaf (judged as a group)
        routed = tuple(i for i, name in enumerate(group.policy.members) if not m._is_leaf(group, name))
        group.score_members[key] = (stamp, members, routed)
        return members

    def _judge(self, member: str) -> tuple[Candidate, Selection | None]:
        known = self._seen.get(member)
        if known is not None:
            return known
        m = self.manager
        group = self.group
        if m._is_leaf(group, member):
            # a leaf: judged from health alone, remembered until health changes
            judged = (m._leaf_candidate(group, member, self.network), None)
        else:
            judged = self._judge_group(member)
        self._seen[member] = judged
        return judged

    def _judge_group(self, member: str) -> tuple[Candidate, Selection | None]:
        m = self.manager
        group = self.group
        index = group.positions[member]
        # a non-Selector ranks its members by peeking; only the pick is then resolved for real
        peek = self.peek or not isinstance(group.policy, Selector)
        selection = m._walk(member, self.network, self.chain, self.depth + 1, peek)
        if selection is None:
            return Candidate(member, index, False), None
        return m._candidate(group, member, index, selection.leaf, self.network), selection


def _distinct_selections(
    view: _View, members: Iterable[str], limit: int, accept: Callable[[Outbound], bool]
) -> list[Selection]:
    """``members`` resolved through ``view`` in order, the first ``limit`` whose leaf ``accept``
    takes, each leaf once (a sub-group that picks a leaf already listed adds nothing)."""
    out: list[Selection] = []
    for member in members:
        selection = view.selection(member)
        if selection is None or not accept(selection.leaf) or any(s.leaf is selection.leaf for s in out):
            continue
        out.append(selection)
        if len(out) >= limit:
            break
    return out


def _leaf_node_id(leaf: Outbound | None, name: str | None = None) -> NodeId:
    """A leaf's NodeId; a builtin leaf (direct, block) gets a name-based identity."""
    node_id = node_id_of(leaf)
    if node_id is not None:
        return node_id
    return ("builtin", name if name is not None else leaf.name)  # type: ignore[union-attr]


class GroupManager:
    """Group structure plus policy state. Build with :meth:`build`; owned by the event loop."""

    epoch: Epoch

    def __init__(
        self,
        groups: dict[str, _Group],
        outbounds: Mapping[str, Outbound],
        health: HealthFilter,
        clock: Clock | None,
        score: ScoreState | None = None,
    ) -> None:
        self.epoch = Epoch()  # bumped by any policy state change
        self.score = score if score is not None else ScoreState()  # shared by the lineage's Score groups
        self._last_resorts = 0  # last-resort selections served (they are never cached)
        self._score_decisions = 0  # Score decisions made (target-dependent: never cached)
        self._leaf_ids: dict[str, NodeId] = {}  # leaf name -> NodeId (the outbounds never change)
        self._reaches_score: dict[str, bool] = {}  # group -> a Score group is at or below it
        self._flow: tuple[ScoreTarget | None, IPAddress | None] = (None, None)  # set only inside resolve
        self._judged: dict[tuple, tuple] = {}  # leaf members: (its node's version, Candidate)
        self._score_groups: dict[NodeId, tuple[str, ...]] | None = None  # node -> Score groups reaching it
        self._groups = groups
        self._outbounds = outbounds
        self.health = health
        self.clock = clock
        self.on_choice: ChoiceListener | None = None  # persistence of Selector writes
        self.on_interrupt: InterruptListener | None = None  # closes the flows a changed selection served
        self.on_change: InterruptListener | None = None  # any group's selection moved (metrics)
        for name, group in groups.items():
            group.policy.epoch = self.epoch
            if isinstance(group.policy, URLTest | Fallback):
                group.policy.moved = lambda network, name=name: self._moved(name, network)

    @classmethod
    def build(
        cls,
        spec: Spec,
        outbounds: Mapping[str, Outbound],
        *,
        health: HealthFilter | None = None,
        clock: Clock | None = None,
        previous: GroupManager | None = None,
        saved: Mapping[str, Mapping[Network, Identity]] | None = None,
        reuse: Collection[str] = (),
        score_ranking: bool = True,
        rng: random.Random | None = None,
    ) -> GroupManager:
        """Build from ``spec``. Groups named in ``reuse`` (unchanged, and nothing they select
        through was rebuilt) keep ``previous``'s policy object with all its state: the
        URLTest winner, the LoadBalance cursor, the Fallback pin, the Selector choices; but
        never a native pin of an automatic group (GH-A-16: it lives only in the running
        manager, so an activation drops it; see :func:`_unpinned`).
        Selector choices of the others come from ``previous`` (the manager being replaced)
        or, at startup, from ``saved`` (the state database), for identities that are
        still members.

        ``score_ranking``: Score groups rank with the lineage's ScoreState, fed by the reporters
        of every business path (:mod:`honk.connection.scoring`). Off, a Score group serves as
        URLTest from probe delays (a comparison baseline for tests and the simulation).

        ``rng``: what ``policy: random`` groups draw from (injected by tests; None: a fresh
        system-seeded generator per group)."""
        specs: dict[str, GroupSpec] = {}
        for group in spec.groups:
            if group.name in specs:
                log.warning("group %s is declared twice; the first declaration is used", group.name)
                continue
            specs[group.name] = group
        names = set(specs)
        memberships = cut_cycles(
            {name: resolve_membership(g, spec.nodes, names) for name, g in specs.items()}
        )
        groups: dict[str, _Group] = {}
        identities = _identities(specs, previous, clock)
        score = previous.score if previous is not None else ScoreState(FirstChoiceHeuristic())
        for name, group in specs.items():
            membership = memberships[name]
            if group.final is not None and group.final not in names and group.final not in outbounds:
                log.warning(
                    "group %s: final %r names nothing; an empty selection fails closed", name, group.final
                )
            kept = previous._groups.get(name) if previous is not None and name in reuse else None
            if kept is not None and kept.policy.members == membership.members:
                groups[name] = _Group(
                    group, membership, _unpinned(name, kept.policy), identities[name], kept.warned_at
                )
            else:
                policy = make_policy(
                    group, membership.members, score=score if score_ranking else None, rng=rng
                )
                groups[name] = _Group(group, membership, policy, identities[name])
        manager = cls(groups, outbounds, health or NO_HEALTH, clock, score)
        if previous is None:  # a fresh state: publish the membership it serves
            score.prune(manager.score_membership())
        carried = previous.choice_identities() if previous is not None else saved
        if carried:
            manager.restore_choices(carried)
        return manager

    # --- identity of members ---------------------------------------------------------

    def _is_leaf(self, group: _Group, member: str) -> bool:
        """Whether ``group``'s ``member`` is a leaf: a node member stays the node even when a
        group has the same name (name(...) selects nodes); any other name is a group if one
        exists."""
        return member in self._outbounds and (member in group.leaves or member not in self._groups)

    def member_is_leaf(self, group: str, member: str) -> bool:
        """Whether ``group``'s member ``member`` is a node or builtin, not a group (a node member
        stays the node when a group shares its name)."""
        return self._is_leaf(self._get(group), member)

    def identity(self, member: str, group: str | None = None) -> Identity:
        """``member``'s identity, as ``group`` (when given) sees its member of that name."""
        owner = self._groups.get(group) if group is not None else None
        if member in self._groups and (owner is None or not self._is_leaf(owner, member)):
            return ("group", member)
        node_id = node_id_of(self._outbounds.get(member))
        return ("node", node_id) if node_id is not None else ("builtin", member)

    def choice_identities(self) -> dict[str, dict[Network, Identity]]:
        """Selector choices by member identity, to carry into the next manager."""
        out: dict[str, dict[Network, Identity]] = {}
        for name, group in self._groups.items():
            if isinstance(group.policy, Selector):
                picked = group.policy.choices()
                if picked:
                    out[name] = {net: self.identity(member, name) for net, member in picked.items()}
        return out

    def restore_choices(self, carried: Mapping[str, Mapping[Network, Identity]]) -> None:
        for name, choices in carried.items():
            group = self._groups.get(name)
            if group is None or not isinstance(group.policy, Selector):
                continue
            by_identity = {self.identity(m, name): m for m in group.policy.members}
            for network, identity in choices.items():
                member = by_identity.get(_normal_identity(identity))
                if member is None:
                    log.info(
                        "group %s: the %s choice is no longer a member; it falls back", name, network.value
                    )
                else:
                    group.policy.restore({network: member})

    def score_membership(self) -> set[tuple[str, NodeId]]:
        """Every (Score group, NodeId) pair reachable below each Score group (members and
        finals): the membership whose evidence survives a reload."""
        out: set[tuple[str, NodeId]] = set()
        for name, group in self._groups.items():
            if isinstance(group.policy, Score):
                for leaf in self.leaf_node_names_in_group(name):
                    out.add((name, _leaf_node_id(self._outbounds.get(leaf), leaf)))
        return out

    def commit_score(self, now: float) -> None:
        """This manager, built with ``previous``, now serves (a committed reload): the shared
        Score state prunes removed membership and ignores its late feedback (GH-K-08), revokes
        leases and restarts cohorts behind a reload fence (GH-K-45) and clears configured-probe
        baselines (GH-K-12). A prepared manager that is never committed changes nothing."""
        self.score.reload(now, self.score_membership())
        reload_performance = getattr(self.score.performance, "reload", None)
        if reload_performance is not None:
            reload_performance(now)

    def score_feedback(
        self,
        chain: tuple[str, ...],
        leaf: Outbound,
        network: Network,
        target: ScoreTarget | None,
        destination: IPAddress | None,
    ) -> ScoreFeedback | None:
        """The attribution of a flow served through ``chain`` to ``leaf``: every Score group on the
        path, each once, with the leaf's NodeId (GH-K-05); None when no Score group was traversed
        (the flow then reports to no Score evidence)."""
        steps = [
            Traversal(name, network, target, _leaf_node_id(leaf), destination)
            for name in chain[:-1]
            if isinstance(getattr(self._groups.get(name), "policy", None), Score)
        ]
        if not steps:
            return None
        score = self.score
        return ScoreFeedback.of(steps, score.evidence, score.cohorts, performance=score.performance)

    def observe_warm_setup(self, leaf: Outbound, network: Network, latency: float, now: float) -> int:
        """Warm-up opened ``leaf``'s reusable resource (a bare server connection, a mux carrier)
        in ``latency`` seconds: one targetless setup-quality sample for every Score group that
        reaches the node (members and finals, as :meth:`score_membership`), in the aggregate
        layer with no target family (GH-K-03, GH-F-26: "Warm-up records setup quality only").
        It lands only in the first-choice heuristic's targetless setup scope: no Beta outcome
        (reliability), no failure, streak, cohort RX, lease or recovery credit (GH-K-39,
        GH-K-41), and no exact cell. ``network``: the path the resource serves (TCP for a
        preconnect or a Selector pin, UDP for the UDP warm set). How many groups took it."""
        observe = getattr(self.score.performance, "observe_setup", None)
        node_id = node_id_of(leaf)
        if observe is None or node_id is None:
            return 0
        if self._score_groups is None:
            by_node: dict[NodeId, list[str]] = {}
            for name, group in self._groups.items():  # configuration order
                if isinstance(group.policy, Score):
                    for leaf_name in self.leaf_node_names_in_group(name):
                        by_node.setdefault(
                            _leaf_node_id(self._outbounds.get(leaf_name), leaf_name), []
                        ).append(name)
            self._score_groups = {node: tuple(groups) for node, groups in by_node.items()}
        groups = self._score_groups.get(node_id, ())
        for group in groups:
            observe(group, network, None, None, node_id, latency, now)
        return len(groups)

    # --- reading ---------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._groups

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._groups)

    def policy(self, group: str) -> GroupPolicy:
        return self._get(group).policy

    def members(self, group: str) -> tuple[str, ...]:
        """Member names of ``group`` (nodes then nested groups), finals excluded."""
        return self._get(group).membership.members

    node_names_in_group = members

    def identity_of(self, group: str) -> GroupIdentity:
        """The group's UUID and creation time (kept by name across reloads)."""
        return self._get(group).identity

    def choices(self) -> dict[str, dict[Network, str]]:
        """The Selector runtime choices by member name (display)."""
        out: dict[str, dict[Network, str]] = {}
        for name, group in self._groups.items():
            if isinstance(group.policy, Selector) and (picked := group.policy.choices()):
                out[name] = picked
        return out

    def leaf_node_names_in_group(self, group: str) -> list[str]:
        """The distinct leaves reachable below ``group`` through members and finals."""
        out: dict[str, None] = {}
        self._leaves(group, out, set(), 0)
        return list(out)

    def _leaves(self, name: str, out: dict[str, None], seen: set[str], depth: int) -> None:
        group = self._groups.get(name)
        if group is None:
            if name in self._outbounds:
                out.setdefault(name)
            return
        if name in seen or depth > MAX_NESTING_DEPTH:
            return
        seen.add(name)
        for member in group.membership.members:
            if self._is_leaf(group, member):
                out.setdefault(member)
            else:
                self._leaves(member, out, seen, depth + 1)
        if group.spec.final:
            self._leaves(group.spec.final, out, seen, depth + 1)

    def delay_test_members(self, group: str, network: Network = Network.TCP) -> list[tuple[str, Outbound]]:
        """One (member tag, current leaf) pair per member that resolves, unchosen ones included."""
        out = []
        owner = self._get(group)
        for member in self.members(group):
            if self._is_leaf(owner, member):
                out.append((member, self._outbounds[member]))
                continue
            selection = self._walk(member, network, (group,), 1, True)
            if selection is not None:
                out.append((member, selection.leaf))
        return out

    def selection_chain(self, group: str, network: Network = Network.TCP) -> tuple[str, ...]:
        """The current chain from ``group`` to its leaf (a peek), or () when nothing resolves."""
        selection = self._walk(group, network, (), 0, True)
        return selection.chain if selection is not None else ()

    # --- resolving --------------------------------------------------------------------------

    def resolve(
        self,
        name: str,
        network: Network,
        *,
        peek: bool = False,
        target: ScoreTarget | None = None,
        destination: IPAddress | None = None,
    ) -> Selection:
        """Resolve a route target (group, node, ``direct`` or ``block``) to one leaf.

        ``target`` (and ``destination``, the IP actually used when known) is the flow's context
        for Score groups; None ranks on the aggregate. Raises :class:`NoRoute` when no leaf
        results (unknown name, no eligible pick and no usable final, nesting too deep, a cycle
        through finals).
        """
        if name not in self._groups and name not in self._outbounds:
            raise NoRoute(f"{name!r} is neither a group nor an outbound")
        outer, self._flow = self._flow, (target, destination)
        try:
            selection = self._walk(name, network, (), 0, peek)
        finally:
            self._flow = outer
        if selection is None:
            raise NoRoute(f"{name}: no eligible {network.value} member and no usable final")
        return selection

    def _walk(
        self, name: str, network: Network, chain: tuple[str, ...], depth: int, peek: bool
    ) -> Selection | None:
        group = self._groups.get(name)
        if group is None:
            leaf = self._outbounds.get(name)
            return None if leaf is None else Selection(leaf, (*chain, name))
        if name in chain or depth > MAX_NESTING_DEPTH:
            log.debug("group %s: skipped (%s)", name, "revisited" if name in chain else "too deep")
            return None
        last_resorts = (self._last_resorts, self._score_decisions)
        if not peek and self._score_below(name):
            # one applied rank per Score group: a path through one is never cached, so serving
            # by peeking first would only rank it again
            return self._decide(group, name, network, chain, depth, False)
        if not peek:
            # Serving = the peek's path, then each group on it commits its hop (a URLTest its
            # winner, a LoadBalance its cursor, a Fallback its pin): the same result as deciding
            # again, without ranking every level twice. A last resort is decided again, to warn,
            # and so is a path through a Score group (its rank is applied with the target).
            selection = self._walk(name, network, chain, depth, True)
            if (self._last_resorts, self._score_decisions) != last_resorts:
                return self._decide(group, name, network, chain, depth, False)
            if selection is not None:
                self._commit(selection.chain[len(chain) :], network, chain, depth)
            return selection
        key = (network, chain)
        stamp = self._stamp()
        hit = group.cache.get(key)
        if hit is not None and hit[0] == stamp:
            if hit[1] is None:
                return None
            leaf, suffix = hit[1]
            return Selection(leaf, chain + suffix)
        result = self._decide(group, name, network, chain, depth, True)
        if (self._last_resorts, self._score_decisions) == last_resorts:
            # no last resort was served (its warning is due again later) and no Score group
            # decided (its pick depends on the target and on evidence): keep the result
            group.cache[key] = (stamp, None if result is None else (result.leaf, result.chain[len(chain) :]))
        return result

    def _score_below(self, name: str) -> bool:
        """Whether ``name`` is a Score group or reaches one through its members or final."""
        known = self._reaches_score.get(name)
        if known is None:
            self._reaches_score[name] = False  # a cycle through finals reaches nothing new
            group = self._groups[name]
            known = isinstance(group.policy, Score) or any(
                self._score_below(m)
                for m in (*group.policy.members, *([group.spec.final] if group.spec.final else ()))
                if m in self._groups and not (m in group.leaves and m != group.spec.final)
            )
            self._reaches_score[name] = known
        return known

    def _commit(self, path: tuple[str, ...], network: Network, chain: tuple[str, ...], depth: int) -> None:
        """Each group on ``path`` remembers the hop it served. A final edge commits nothing; a
        final that is also a member was the policy's pick only if that member is eligible."""
        for step, (here, hop) in enumerate(zip(path, path[1:], strict=False)):
            group = self._groups.get(here)
            if group is None or hop not in group.positions:
                continue
            if hop == group.spec.final:
                prefix = (*chain, *path[: step + 1])
                view = _View(self, group, network, prefix, depth + step, True)
                if not view.evaluate(hop).eligible:
                    continue  # reached through the final edge
            group.policy.commit(network, hop)

    def _stamp(self) -> tuple[int, int, int]:
        return (self.epoch.value, *self.health.version())

    def _leaf_candidate(self, group: _Group, member: str, network: Network) -> Candidate:
        """A leaf member as ``group`` sees it, remembered until that node's health changes (policy
        state does not change it, so a LoadBalance cursor moving judges no leaf again)."""
        leaf = self._outbounds[member]
        version = self.health.leaf_version(leaf)
        key = (group.spec.name, member, network)
        known = self._judged.get(key)
        if known is None or known[0] != version:
            known = self._judged[key] = (
                version,
                self._candidate(group, member, group.positions[member], leaf, network),
            )
        return known[1]

    def _candidate(
        self, group: _Group, member: str, index: int, leaf: Outbound, network: Network
    ) -> Candidate:
        """``member`` (resolved to ``leaf``) as ``group`` sees it: judged and ranked in the leaf's
        own health family (GH-D-07, GH-K-01)."""
        health, name = self.health, group.spec.name
        eligible = health.eligible(leaf, network, name, member)
        if eligible and isinstance(group.policy, URLTest):  # only URLTest ranks
            rank_by = group.policy.rank_by
            # dae's add_latency: the member's sorting latency is its measured one plus the offset
            # of its filter line, unclamped (AliveDialerSet: rawLatency + dialerToLatencyOffset)
            offset = group.membership.latency_offset(member)
            metric = health.tcp_metric(leaf, name, member, rank_by)
            udp_metric = health.udp_metric(leaf, rank_by) if network is Network.UDP else None
            return Candidate(
                member,
                index,
                True,
                metric=metric + offset if metric is not None else None,
                udp_metric=udp_metric + offset if udp_metric is not None else None,
                demoted=health.demoted(leaf),
            )
        if eligible and isinstance(group.policy, Fallback):  # a Fallback leaves a struck pin
            return Candidate(member, index, True, demoted=health.demoted(leaf))
        return Candidate(member, index, eligible)

    def _decide(
        self, group: _Group, name: str, network: Network, chain: tuple[str, ...], depth: int, peek: bool
    ) -> Selection | None:
        chain = (*chain, name)
        if isinstance(group.policy, Score):
            self._score_decisions += 1
        view = _View(self, group, network, chain, depth, peek)
        member = group.policy.pick(view, commit=not peek)
        if member is not None:
            if isinstance(group.policy, Selector) or peek or self._is_leaf(group, member):
                selection = view.selection(member)
            else:
                selection = self._walk(member, network, chain, depth + 1, False)  # apply the pick
            if selection is not None:
                return selection
        final = group.spec.final
        if final is not None:
            return self._walk(final, network, chain, depth + 1, peek)
        if network is Network.TCP:
            return self._last_resort(group, chain, depth, peek)
        return None

    def _last_resort(self, group: _Group, chain: tuple[str, ...], depth: int, peek: bool) -> Selection | None:
        """The sole-leaf TCP last resort: a group whose only leaf, through the current Selector
        choices, is TCP-dead still serves it (health unchanged), never a sibling or ``direct``."""
        leaves: dict[str, tuple[str, ...]] = {}
        self._chosen_leaves(group.spec.name, chain[:-1], leaves, depth)
        if len(leaves) != 1:
            return None
        ((leaf_name, path),) = leaves.items()
        self._last_resorts += 1
        if not peek and self.clock is not None:
            now = self.clock.now()
            if group.warned_at is None or now - group.warned_at >= LAST_RESORT_WARNING_INTERVAL:
                group.warned_at = now
                log.warning(
                    "group %s: its only node %s is down; serving it as the last resort",
                    group.spec.name,
                    leaf_name,
                )
        return Selection(self._outbounds[leaf_name], path)

    def _chosen_leaves(
        self, name: str, chain: tuple[str, ...], out: dict[str, tuple[str, ...]], depth: int
    ) -> None:
        """Leaves below ``name`` reachable through the current Selector choices (every member
        of other policies), with the path to each."""
        group = self._groups.get(name)
        chain = (*chain, name)
        if group is None:
            if name in self._outbounds:
                out.setdefault(name, chain)
            return
        if name in chain[:-1] or depth > MAX_NESTING_DEPTH or len(out) > 1:
            return
        if isinstance(group.policy, Selector):
            chosen = group.policy.chosen(Network.TCP)
            members: tuple[str, ...] = (chosen,) if chosen is not None else ()
        else:
            members = group.membership.members
        for member in members:
            if self._is_leaf(group, member):
                out.setdefault(member, (*chain, member))
            else:
                self._chosen_leaves(member, chain, out, depth + 1)

    def retry_candidates(
        self,
        group: str,
        network: Network,
        exclude: Outbound,
        *,
        target: ScoreTarget | None = None,
        destination: IPAddress | None = None,
    ) -> list[Selection]:
        """For a URLTest setup failure: the top eligible members by rank, other than the leaf
        that failed, resolved to their leaves (at most :data:`RETRY_CANDIDATES`); for a Fallback
        one, its next eligible members in declaration order the same way. For a Score
        setup failure: one different permitted leaf, ranked (and applied) with the failed
        NodeId excluded first (GH-K-77); [] when no other live member remains."""
        g = self._groups.get(group)
        if g is not None and isinstance(g.policy, Score):
            return self._score_retry(g, network, exclude, target, destination)
        if g is None or not isinstance(g.policy, URLTest | Fallback):
            return []
        view = _View(self, g, network, (group,), 0, True)
        out = []
        for member in g.policy.ranked(view, RETRY_CANDIDATES + 1):
            selection = view.selection(member)
            if selection is not None and selection.leaf is not exclude and len(out) < RETRY_CANDIDATES:
                out.append(selection)
        return out

    def cold_udp_candidates(self, name: str) -> list[Selection]:
        """The leaves a cold UDP plan of route target ``name`` prepares in a race (GH-G-01): when
        ``name`` is a URLTest with no UDP pin and none of its eligible members has a usable UDP
        measurement, its eligible members by the policy's ranking (TCP's, which its UDP pick
        mirrors while UDP is unmeasured), resolved to distinct proxy leaves that carry UDP.
        [] for every other plan, and when fewer than two such leaves remain: it prepares the
        one leaf its selection gives. The caller passes only a route's own target (top level)."""
        g = self._groups.get(name)
        if g is None or not isinstance(g.policy, URLTest) or Network.UDP in g.policy.fixed():
            return []
        view = _View(self, g, Network.UDP, (name,), 0, True)
        if any(c.eligible and c.udp_metric is not None for c in view.all()):
            return []  # measured: the URLTest's own UDP pick, one leaf
        out = _distinct_selections(
            view,
            g.policy.ranked(view, len(g.policy.members)),
            len(g.policy.members),
            lambda leaf: leaf.protocol not in ("direct", "block") and leaf.capabilities.udp,
        )
        return out if len(out) > 1 else []

    def udp_warm_leaves(
        self, name: str, family: Family, limit: int, accept: Callable[[Outbound], bool]
    ) -> list[Outbound]:
        """Group ``name``'s top ``limit`` distinct leaves whose health family is ``family`` and
        that ``accept`` takes, in the order the group would serve UDP now (the UDP warm set per
        address family, GH-I-06; a leaf is judged and counted in its own health family only,
        GH-D-07), read with silent peeks: a Selector's UDP choice (alone: a Selector
        substitutes nothing), a URLTest's rank (its UDP pin first), a Score group's rank
        order, any other policy's eligible members in configuration order. A sub-group member
        counts as the leaf it picks."""
        g = self._groups.get(name)
        if g is None or limit <= 0:
            return []
        view = _View(self, g, Network.UDP, (name,), 0, True)
        policy = g.policy
        if isinstance(policy, Selector):
            chosen = policy.chosen(Network.UDP)
            order = [chosen] if chosen is not None else []
        elif isinstance(policy, URLTest):
            pinned = policy.fixed().get(Network.UDP)
            order = ([pinned] if pinned is not None else []) + policy.ranked(view, len(policy.members))
        elif isinstance(policy, Score):
            order = [member.name for member in policy.rank(view, False).order]
        else:
            order = [c.member for c in view.all() if c.eligible]
        in_family = lambda leaf: health_family_of(leaf) == family and accept(leaf)  # noqa: E731
        return [selection.leaf for selection in _distinct_selections(view, order, limit, in_family)]

    def _score_retry(
        self,
        group: _Group,
        network: Network,
        exclude: Outbound,
        target: ScoreTarget | None,
        destination: IPAddress | None,
    ) -> list[Selection]:
        excluded = frozenset((_leaf_node_id(exclude),))
        outer, self._flow = self._flow, (target, destination)
        try:
            self._score_decisions += 1
            view = _View(self, group, network, (group.spec.name,), 0, True)
            winner = group.policy.rank(view, True, exclude=excluded).winner  # type: ignore[attr-defined]
            selection = view.selection(winner.name) if winner is not None else None
        finally:
            self._flow = outer
        if selection is None or selection.leaf is exclude:
            return []
        return [selection]

    # --- changing (the control owner only) ---------------------------------------------------

    def select(self, group: str, member: str, network: Network | None = None) -> list[Network]:
        """Set a Selector's choice for one network, or both (validated once, all or nothing).
        The networks whose choice changed; each is reported to :attr:`on_choice`.

        Raises :class:`UnknownGroup` (also for a group that is not a Selector) or
        :class:`~honk.group.policy.UnknownMember`.
        """
        policy = self._get(group).policy
        if not isinstance(policy, Selector):
            raise UnknownGroup(group)
        before = {net: policy.chosen(net) for net in NETWORKS}
        changed = policy.choose(member, NETWORKS if network is None else (network,))
        if self.on_choice is not None:
            identity = self.identity(member, group)
            for net in changed:
                self.on_choice(group, net, identity)
        for net in changed:
            if before[net] != member:  # re-selecting the effective choice moves nothing
                self._moved(group, net)
        return changed

    def pin(self, group: str, member: str | None, network: Network | None = None) -> list[Network]:
        """Pin (``member`` None: unpin) an automatic group's member for one network or both,
        all or nothing; the networks whose pin changed. Runtime only: the next manager has none.

        Raises :class:`UnknownGroup` (also for a group that cannot be pinned: Selector,
        LoadBalance) or :class:`~honk.group.policy.UnknownMember`.
        """
        policy = self._get(group).policy
        if not isinstance(policy, Fixable):
            raise UnknownGroup(group)
        changed = policy.fix(member, NETWORKS if network is None else (network,))
        for net in changed:
            self._moved(group, net)
        return changed

    def pinned(self, group: str) -> dict[Network, str]:
        """The runtime pins of ``group`` by network ({} for groups that cannot be pinned)."""
        policy = self._get(group).policy
        return policy.fixed() if isinstance(policy, Fixable) else {}

    def _moved(self, group: str, network: Network) -> None:
        """``group``'s selection for ``network`` moved: count it, and interrupt its flows when
        the group asks for that."""
        if self.on_change is not None:
            self.on_change(group, network)
        if self._get(group).spec.interrupt_connections:
            self._interrupt(group, network)

    def _interrupt(self, group: str, network: Network) -> None:
        if self.on_interrupt is not None:
            self.on_interrupt(group, network)

    def _get(self, group: str) -> _Group:
        try:
            return self._groups[group]
        except KeyError:
            raise UnknownGroup(group) from None


def _unpinned(name: str, policy: GroupPolicy) -> GroupPolicy:
    """A kept policy as the replacement manager takes it: without the native pin of an
    automatic group (GH-A-16, "An automatic-policy pin lives only in the running GroupManager,
    so an activation drops it"). A pinned policy is copied with its automatic state (URLTest
    winner, Fallback pin) and no runtime pin; the running manager keeps its own object, pin
    included, until it is replaced (GH-A-02). An unpinned policy is kept as it is."""
    if not isinstance(policy, Fixable) or not policy.fixed():
        return policy
    carried = copy.copy(policy)
    for cls in type(policy).__mro__:  # its state maps, so the two managers stop sharing them
        for slot in getattr(cls, "__slots__", ()):
            value = getattr(carried, slot, None)
            if isinstance(value, dict):
                setattr(carried, slot, dict(value))
    carried._fixed = {}
    log.info("group %s: its runtime pin is dropped by the activation", name)
    return carried


def _identities(
    specs: Mapping[str, GroupSpec], previous: GroupManager | None, clock: Clock | None
) -> dict[str, GroupIdentity]:
    """Each group keeps its identity while its name stays; a new or renamed group gets a fresh
    one, even when its configuration carries the UUID of a group that had another name."""
    now = clock.wall() if clock is not None else 0.0
    old = {name: g.identity for name, g in previous._groups.items()} if previous is not None else {}
    taken = {identity.uid for identity in old.values()}
    out = {}
    for name, spec in specs.items():
        if name in old:
            out[name] = old[name]
        elif spec.id is not None and spec.id not in taken:
            out[name] = GroupIdentity(spec.id, now)
        else:
            out[name] = GroupIdentity(uuid.uuid4(), now)
    return out


def _normal_identity(identity: Identity) -> Identity:
    """Identities read back from storage carry text; nodes are keyed by UUID."""
    kind, value = identity
    if kind == "node" and not isinstance(value, uuid.UUID):
        return (kind, nodeid.NodeId(str(value)))
    return (kind, value)


def identity_text(identity: Identity) -> str:
    """``node:<uuid>``, ``group:<name>`` or ``builtin:<name>``: how the state database keeps it."""
    return f"{identity[0]}:{identity[1]}"


def identity_from_text(text: str) -> Identity | None:
    kind, sep, value = text.partition(":")
    if not sep or kind not in ("node", "group", "builtin"):
        return None
    try:
        return _normal_identity((kind, value))
    except ValueError:
        return None


class SharedGroupManager:
    """The stable handle on the current manager: replacing it is one reference swap, so a
    reader sees the whole old or the whole new manager."""

    __slots__ = ("current",)

    def __init__(self, manager: GroupManager) -> None:
        self.current = manager

    def publish(self, manager: GroupManager) -> GroupManager:
        """Swap in ``manager`` (built completely beforehand); the one it replaced."""
        old, self.current = self.current, manager
        return old
