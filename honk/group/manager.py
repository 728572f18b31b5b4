"""The group manager: resolves a route target to exactly one leaf, through nested groups.

Theory of operation
-------------------
* :meth:`GroupManager.build` computes every group's members once
  (:mod:`honk.group.membership`), cuts each cycle-closing nested edge (DFS in
  declaration order, one warning per cut; :mod:`honk.group.structure`) and gives each group
  its policy (:mod:`honk.group.policy`, from its registry). Selector choices of the manager
  being replaced survive when the same member identity (NodeId for a node, name for a
  sub-group; :mod:`honk.group.identity`) is still a member: a different node that took a
  removed node's name does not inherit its choice.
* :meth:`GroupManager.resolve` walks from the asked name down to one leaf
  (:mod:`honk.group.resolution`): a group asks its policy for a member, a member that is a
  group contributes its own pick, leaves are judged in their own health family; no pick
  continues with the group's ``final``, then the sole-leaf TCP last resort, then the parent.
  The walk is bounded in depth and by cycles; peeks are cached until health or policy state
  changes and change nothing a policy remembers.
* A Score group ranks with the flow's target (``resolve(..., target=, destination=)``) in the
  one :class:`~honk.group.score.ranker.ScoreState` of the manager lineage (:attr:`score`):
  ``build(previous=...)`` shares it, :meth:`commit_score` prunes removed membership when
  that manager starts serving, a fresh build starts empty. A walk through a Score group is
  never cached. :meth:`score_feedback` attributes a served flow to every Score group on its
  path, once each (GH-K-05; :mod:`honk.group.attribution`).
* Retry rounds, the cold UDP race, the UDP warm set and delay-test listings are silent
  peeks (:mod:`honk.group.queries`). Writes (:meth:`select`, :meth:`pin`) change policy
  state (:mod:`honk.group.writes`).
* What changes is reported as typed events (:mod:`honk.group.events`): the cores append
  them to the manager's outbox, and each public call that can emit (``resolve``,
  ``select``, ``pin``) hands them, before it returns, to the one :attr:`GroupManager.sink`
  its owner installs.

Invariants: the structure never changes after ``build``; only policy state changes, on
the event loop's thread, through :meth:`resolve`, :meth:`select` and :meth:`pin`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping

from honk.alive.outcome import Family
from honk.config.spec import GroupSpec, Spec
from honk.core.clock import Clock
from honk.core.net import IPAddress, Network
from honk.group import queries, writes
from honk.group.attribution import ScoreAttribution
from honk.group.events import EventSink, GroupEvent, Outbox
from honk.group.filter import NO_HEALTH, HealthFilter
from honk.group.identity import GroupIdentity, Identity, group_identities, identity_from_text, identity_text
from honk.group.membership import resolve_membership
from honk.group.policy import Epoch, GroupPolicy, Selector, make_policy
from honk.group.queries import RETRY_CANDIDATES
from honk.group.resolution import LAST_RESORT_WARNING_INTERVAL, Resolver
from honk.group.score.attempt import ScoreFeedback
from honk.group.score.heuristic import FirstChoiceHeuristic
from honk.group.score.keys import NodeId, ScoreTarget
from honk.group.score.ranker import ScoreState
from honk.group.structure import MAX_NESTING_DEPTH, Group, Selection, Structure, cut_cycles
from honk.group.view import NO_FLOW, Flow
from honk.outbound.base import Outbound

__all__ = [
    "LAST_RESORT_WARNING_INTERVAL",
    "MAX_NESTING_DEPTH",
    "RETRY_CANDIDATES",
    "GroupIdentity",
    "GroupManager",
    "Identity",
    "Selection",
    "SharedGroupManager",
    "cut_cycles",
    "identity_from_text",
    "identity_text",
]

log = logging.getLogger(__name__)


class GroupManager:
    """Group structure plus policy state. Build with :meth:`build`; owned by the event loop."""

    epoch: Epoch

    def __init__(
        self,
        groups: dict[str, Group],
        outbounds: Mapping[str, Outbound],
        health: HealthFilter,
        clock: Clock | None,
        score: ScoreState | None = None,
    ) -> None:
        self.epoch = Epoch()  # bumped by any policy state change
        self.score = score if score is not None else ScoreState()  # shared by the lineage's Score groups
        self.health = health
        self.clock = clock
        self.sink: EventSink | None = None  # where every event goes (the daemon's router)
        self._groups = groups
        self._outbounds = outbounds
        self._structure = Structure(groups, outbounds)
        self._outbox = Outbox()
        self._resolver = Resolver(self._structure, health, clock, self.epoch, self._outbox)
        self._attribution = ScoreAttribution(self._structure, self.score)
        for group in groups.values():
            group.policy.epoch = self.epoch

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
        manager, so an activation drops it; see :func:`honk.group.writes.unpinned`).
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
        groups: dict[str, Group] = {}
        old = {name: g.identity for name, g in previous._groups.items()} if previous is not None else {}
        identities = group_identities(specs, old, clock)
        score = previous.score if previous is not None else ScoreState(FirstChoiceHeuristic())
        for name, group in specs.items():
            membership = memberships[name]
            if group.final is not None and group.final not in names and group.final not in outbounds:
                log.warning(
                    "group %s: final %r names nothing; an empty selection fails closed", name, group.final
                )
            kept = previous._groups.get(name) if previous is not None and name in reuse else None
            if kept is not None and kept.policy.members == membership.members:
                groups[name] = Group(
                    group, membership, writes.unpinned(name, kept.policy), identities[name], kept.warned_at
                )
            else:
                policy = make_policy(
                    group, membership.members, score=score if score_ranking else None, rng=rng
                )
                groups[name] = Group(group, membership, policy, identities[name])
        manager = cls(groups, outbounds, health or NO_HEALTH, clock, score)
        if previous is None:  # a fresh state: publish the membership it serves
            score.prune(manager.score_membership())
        carried = previous.choice_identities() if previous is not None else saved
        if carried:
            manager.restore_choices(carried)
        return manager

    def _route(self, events: tuple[GroupEvent, ...] = ()) -> None:
        """Hand ``events`` and everything the cores emitted to :attr:`sink`, in order."""
        for event in events:
            self._outbox.emit(event)
        self._outbox.drain(self.sink)

    # --- identity of members ---------------------------------------------------------

    def member_is_leaf(self, group: str, member: str) -> bool:
        """Whether ``group``'s member ``member`` is a node or builtin, not a group (a node member
        stays the node when a group shares its name)."""
        return self._structure.is_leaf(self._structure.get(group), member)

    def identity(self, member: str, group: str | None = None) -> Identity:
        """``member``'s identity, as ``group`` (when given) sees its member of that name."""
        return self._structure.identity(member, group)

    def choice_identities(self) -> dict[str, dict[Network, Identity]]:
        """Selector choices by member identity, to carry into the next manager."""
        return writes.choice_identities(self._structure)

    def restore_choices(self, carried: Mapping[str, Mapping[Network, Identity]]) -> None:
        writes.restore_choices(self._structure, carried)

    # --- Score attribution -------------------------------------------------------------------

    def score_membership(self) -> set[tuple[str, NodeId]]:
        """Every (Score group, NodeId) pair reachable below each Score group (members, finals)."""
        return self._attribution.membership()

    def commit_score(self, now: float) -> None:
        """This manager now serves: the shared Score state follows its membership (GH-K-08)."""
        self._attribution.commit(now)

    def score_feedback(
        self,
        chain: tuple[str, ...],
        leaf: Outbound,
        network: Network,
        target: ScoreTarget | None,
        destination: IPAddress | None,
    ) -> ScoreFeedback | None:
        """Every Score group on ``chain``, once each, with ``leaf``'s NodeId (GH-K-05); or None."""
        return self._attribution.feedback(chain, leaf, network, Flow(target, destination))

    def observe_warm_setup(self, leaf: Outbound, network: Network, latency: float, now: float) -> int:
        """A warm-up setup sample for every Score group reaching ``leaf`` (GH-K-03); how many."""
        return self._attribution.observe_warm_setup(leaf, network, latency, now)

    # --- reading ---------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._groups

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._groups)

    def policy(self, group: str) -> GroupPolicy:
        return self._structure.get(group).policy

    def members(self, group: str) -> tuple[str, ...]:
        """Member names of ``group`` (nodes then nested groups), finals excluded."""
        return self._structure.get(group).membership.members

    node_names_in_group = members

    def identity_of(self, group: str) -> GroupIdentity:
        """The group's UUID and creation time (kept by name across reloads)."""
        return self._structure.get(group).identity

    def choices(self) -> dict[str, dict[Network, str]]:
        """The Selector runtime choices by member name (display)."""
        out: dict[str, dict[Network, str]] = {}
        for name, group in self._groups.items():
            if isinstance(group.policy, Selector) and (picked := group.policy.choices()):
                out[name] = picked
        return out

    def leaf_node_names_in_group(self, group: str) -> list[str]:
        """The distinct leaves reachable below ``group`` through members and finals."""
        return self._structure.leaves_below(group)

    def delay_test_members(self, group: str, network: Network = Network.TCP) -> list[tuple[str, Outbound]]:
        """One (member tag, current leaf) pair per member that resolves, unchosen ones included."""
        return queries.delay_test_members(self._resolver, group, network)

    def selection_chain(self, group: str, network: Network = Network.TCP) -> tuple[str, ...]:
        """The current chain from ``group`` to its leaf (a peek), or () when nothing resolves."""
        return queries.selection_chain(self._resolver, group, network)

    def retry_candidates(
        self,
        group: str,
        network: Network,
        exclude: Outbound,
        *,
        target: ScoreTarget | None = None,
        destination: IPAddress | None = None,
    ) -> list[Selection]:
        """A setup failure's retry round (see :func:`honk.group.queries.retry_candidates`)."""
        return queries.retry_candidates(self._resolver, group, network, exclude, Flow(target, destination))

    def cold_udp_candidates(self, name: str) -> list[Selection]:
        """The leaves a cold UDP plan of ``name`` races (GH-G-01; [] for every other plan)."""
        return queries.cold_udp_candidates(self._resolver, name)

    def udp_warm_leaves(
        self, name: str, family: Family, limit: int, accept: Callable[[Outbound], bool]
    ) -> list[Outbound]:
        """Group ``name``'s top UDP leaves of health family ``family`` (GH-I-06, GH-D-07)."""
        return queries.udp_warm_leaves(self._resolver, name, family, limit, accept)

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
        flow = NO_FLOW if target is None and destination is None else Flow(target, destination)
        try:
            return self._resolver.resolve(name, network, peek, flow)
        finally:
            self._route()  # a served hop may have moved a URLTest winner or Fallback pin

    # --- changing (the control owner only) ---------------------------------------------------

    def select(self, group: str, member: str, network: Network | None = None) -> list[Network]:
        """Set a Selector's choice for one network, or both (validated once, all or nothing).
        The networks whose choice changed; each is reported as a ``ChoiceChanged``.

        Raises :class:`UnknownGroup` (also for a group that is not a Selector) or
        :class:`~honk.group.policy.UnknownMember`.
        """
        written = writes.select(self._structure, group, member, network)
        self._route(written.events)
        return written.changed

    def pin(self, group: str, member: str | None, network: Network | None = None) -> list[Network]:
        """Pin (``member`` None: unpin) an automatic group's member for one network or both,
        all or nothing; the networks whose pin changed. Runtime only: the next manager has none.

        Raises :class:`UnknownGroup` (also for a group that cannot be pinned: Selector,
        LoadBalance) or :class:`~honk.group.policy.UnknownMember`.
        """
        written = writes.pin(self._structure, group, member, network)
        self._route(written.events)
        return written.changed

    def pinned(self, group: str) -> dict[Network, str]:
        """The runtime pins of ``group`` by network ({} for groups that cannot be pinned)."""
        return writes.pinned(self._structure, group)


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
