"""The structure of one manager's groups, fixed at build: members, finals, leaves.

Nested edges that close a cycle are cut once, in declaration order (:func:`cut_cycles`);
what remains never changes. A node member stays the node even when a group shares its
name (``name(...)`` selects nodes); any other member name is a group if one exists.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from honk.config.spec import GroupSpec
from honk.core.net import Network
from honk.group.identity import GroupIdentity, Identity, member_identity
from honk.group.membership import Membership
from honk.group.policy import GroupPolicy, UnknownGroup
from honk.outbound.base import Outbound

log = logging.getLogger(__name__)

MAX_NESTING_DEPTH = 8  # "bounded by MAX_GROUP_DEPTH = 8"; the root group is depth 0


# Not frozen, as FlowMeta (honk.core.net): built per flow, never mutated.
@dataclass(slots=True)
class Selection:
    """The leaf a name resolved to; ``chain`` runs from the asked name to the leaf's name
    (a final edge taken is part of it)."""

    leaf: Outbound
    chain: tuple[str, ...]


@dataclass(slots=True)
class Group:
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
    # members judged again per flow: its sub-groups) (View.score_members)
    score_members: dict[Network, tuple] = field(default_factory=dict)

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


class Structure:
    """The groups by name (declaration order) and the outbounds their leaves name."""

    __slots__ = ("groups", "outbounds")

    def __init__(self, groups: dict[str, Group], outbounds: Mapping[str, Outbound]) -> None:
        self.groups = groups
        self.outbounds = outbounds

    def get(self, name: str) -> Group:
        try:
            return self.groups[name]
        except KeyError:
            raise UnknownGroup(name) from None

    def is_leaf(self, group: Group, member: str) -> bool:
        """Whether ``group``'s ``member`` is a leaf (a node or builtin), not a group."""
        return member in self.outbounds and (member in group.leaves or member not in self.groups)

    def identity(self, member: str, group: str | None = None) -> Identity:
        """``member``'s identity, as ``group`` (when given) sees its member of that name."""
        owner = self.groups.get(group) if group is not None else None
        is_group = member in self.groups and (owner is None or not self.is_leaf(owner, member))
        return member_identity(member, is_group, self.outbounds.get(member))

    def leaves_below(self, name: str) -> list[str]:
        """The distinct leaves reachable below ``name`` through members and finals."""
        out: dict[str, None] = {}
        self._leaves(name, out, set(), 0)
        return list(out)

    def _leaves(self, name: str, out: dict[str, None], seen: set[str], depth: int) -> None:
        group = self.groups.get(name)
        if group is None:
            if name in self.outbounds:
                out.setdefault(name)
            return
        if name in seen or depth > MAX_NESTING_DEPTH:
            return
        seen.add(name)
        for member in group.membership.members:
            if self.is_leaf(group, member):
                out.setdefault(member)
            else:
                self._leaves(member, out, seen, depth + 1)
        if group.spec.final:
            self._leaves(group.spec.final, out, seen, depth + 1)
