"""How a policy sees one group's members for one selection: a :class:`View` resolves and
judges them on demand, each once per selection, for the :class:`Flow` being resolved.

A sub-group member contributes exactly one candidate, its own pick for the same network
(peeked unless the group is a Selector serving its choice); a leaf is judged from health
alone. The view notes whether every walk it made was cacheable (see
:mod:`honk.group.resolution`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from honk.core.net import IPAddress, Network
from honk.group.identity import leaf_node_id
from honk.group.policy import Candidate, Selector
from honk.group.score.keys import NodeId, ScoreTarget
from honk.group.score.ranker import Member
from honk.group.structure import Group, Selection
from honk.outbound.base import Outbound

if TYPE_CHECKING:
    from honk.group.resolution import Resolver


@dataclass(frozen=True, slots=True)
class Flow:
    """The flow being resolved, as a Score group ranks for it; :data:`NO_FLOW`: the aggregate."""

    target: ScoreTarget | None = None
    destination: IPAddress | None = None


NO_FLOW = Flow()


class View:
    """The members of one group for one selection: resolves and judges them on demand, and
    notes whether every walk it made was cacheable."""

    __slots__ = (
        "resolver",
        "group",
        "network",
        "chain",
        "depth",
        "peek",
        "flow",
        "target",
        "destination",
        "cacheable",
        "_seen",
    )

    def __init__(
        self,
        resolver: Resolver,
        group: Group,
        network: Network,
        chain: tuple[str, ...],
        depth: int,
        peek: bool,
        flow: Flow,
    ) -> None:
        self.resolver = resolver
        self.group = group
        self.network = network
        self.chain = chain
        self.depth = depth
        self.peek = peek
        self.flow = flow
        self.target, self.destination = flow.target, flow.destination  # what a Score rank reads
        self.cacheable = True
        self._seen: dict[str, tuple[Candidate, Selection | None]] = {}

    def now(self) -> float:
        clock = self.resolver.clock
        return clock.now() if clock is not None else 0.0

    def node_id(self, member: str) -> NodeId:
        """The NodeId of the leaf ``member`` resolves to; a builtin leaf or an unresolved member
        gets a name-based identity (it has no evidence of its own)."""
        r = self.resolver
        if r.structure.is_leaf(self.group, member):  # a leaf: its identity, without resolving
            known = r.leaf_id(member)
            if known is not None:
                return known
        selection = self.selection(member)
        if selection is None:
            return ("member", member)
        return leaf_node_id(selection.leaf)

    def selection(self, member: str) -> Selection | None:
        candidate, selection = self._judge(member)
        structure = self.resolver.structure
        if selection is None and structure.is_leaf(self.group, member):
            selection = Selection(structure.outbounds[member], (*self.chain, member))  # made on demand
        return selection

    def evaluate(self, member: str) -> Candidate:
        return self._judge(member)[0]

    def all(self) -> list[Candidate]:
        return [self.evaluate(m) for m in self.group.policy.members]

    def score_members(self) -> list[Member]:
        """Every member as the Score ranker reads it (configuration order), kept under the
        resolver's stamp: a leaf member reads the same until health or policy state changes. A
        sub-group member's leaf (and so its NodeId) can depend on the flow, so each flow judges
        those members again and, when they read as before, gets the kept list object itself
        (the ranker keeps its reading of a list while the same object comes back)."""
        group = self.group
        key = self.network
        stamp = self.resolver.stamp()
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
        is_leaf = self.resolver.structure.is_leaf
        routed = tuple(i for i, name in enumerate(group.policy.members) if not is_leaf(group, name))
        group.score_members[key] = (stamp, members, routed)
        return members

    def _judge(self, member: str) -> tuple[Candidate, Selection | None]:
        known = self._seen.get(member)
        if known is not None:
            return known
        r = self.resolver
        judged: tuple[Candidate, Selection | None]
        if r.structure.is_leaf(self.group, member):
            # a leaf: judged from health alone, remembered until health changes
            judged = (r.leaf_candidate(self.group, member, self.network), None)
        else:
            judged = self._judge_group(member)
        self._seen[member] = judged
        return judged

    def _judge_group(self, member: str) -> tuple[Candidate, Selection | None]:
        r = self.resolver
        group = self.group
        index = group.positions[member]
        # a non-Selector ranks its members by peeking; only the pick is then resolved for real
        peek = self.peek or not isinstance(group.policy, Selector)
        walked = r.walk(member, self.network, self.chain, self.depth + 1, peek, self.flow)
        self.cacheable = self.cacheable and walked.cacheable
        selection = walked.selection
        if selection is None:
            return Candidate(member, index, False), None
        return r.candidate(group, member, index, selection.leaf, self.network), selection


def distinct_selections(
    view: View, members: Iterable[str], limit: int, accept: Callable[[Outbound], bool]
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
