"""The group table: resolves an outbound name to one leaf through nested groups.

Theory of operation:
  * :meth:`GroupTable.build` computes every group's members once
    (:mod:`honk.group.membership`), removes each cycle-closing nested edge
    (with a warning), and gives each group its policy object.
  * :meth:`GroupTable.resolve` walks from the asked name down to a leaf:
    a group asks its policy for a member and recurses; a leaf name is looked up
    among the outbounds. The walk is recorded as ``Selection.chain``.
  * When a group cannot produce a leaf (no members, or its chosen member
    produced none) it continues with its own ``final``; without one the failure
    propagates to the parent, which does the same. A sibling is never tried
    and nothing falls back to ``direct`` implicitly.

Invariants:
  * The structure (members, finals, nesting) never changes after ``build``.
    Only Selector runtime choices change, through :meth:`GroupTable.select`,
    which the control task owns; readers are synchronous so they always see a
    whole choice.
  * A chain passes through at most :data:`MAX_NESTING_DEPTH` groups; deeper
    or cyclic (through ``final``) walks raise :class:`NoRoute`.
  * A name that is both a group and a node resolves as the group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from honk.config.spec import GroupSpec, Spec
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.membership import Membership, resolve_membership
from honk.group.selector import GroupPolicy, UnknownGroup, make_policy
from honk.outbound.base import Outbound

log = logging.getLogger(__name__)

MAX_NESTING_DEPTH = 8  # groups one chain may pass through, the asked group included

Choices = Mapping[str, Mapping[Network, str]]  # group -> network -> chosen member


@dataclass(frozen=True, slots=True)
class Selection:
    """The leaf a name resolved to; ``chain`` runs from the asked name to the leaf's name."""

    leaf: Outbound
    chain: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Group:
    spec: GroupSpec
    membership: Membership
    policy: GroupPolicy


def _cut_cycles(memberships: dict[str, Membership]) -> dict[str, Membership]:
    """Drop every nested edge that closes a cycle, visiting groups and edges in order."""
    on_stack: set[str] = set()
    finished: set[str] = set()
    kept: dict[str, list[str]] = {name: list(m.subgroups) for name, m in memberships.items()}

    def visit(name: str) -> None:
        on_stack.add(name)
        for child in list(kept[name]):
            if child in on_stack:
                log.warning("group %s: nested group %s closes a cycle; that edge is removed", name, child)
                kept[name].remove(child)
            elif child not in finished:
                visit(child)
        on_stack.discard(name)
        finished.add(name)

    for name in memberships:
        if name not in finished:
            visit(name)
    return {name: Membership(m.nodes, tuple(kept[name])) for name, m in memberships.items()}


class GroupTable:
    """Immutable group structure plus the Selector choices. Build with :meth:`build`."""

    __slots__ = ("_groups", "_outbounds")

    def __init__(self, groups: dict[str, _Group], outbounds: Mapping[str, Outbound]) -> None:
        self._groups = groups
        self._outbounds = outbounds

    @classmethod
    def build(
        cls,
        spec: Spec,
        outbounds: Mapping[str, Outbound],
        previous_choices: Choices | None = None,
    ) -> GroupTable:
        """Build from ``spec``; ``previous_choices`` (from :meth:`choices` of the
        table being replaced) survive for groups and members that still exist."""
        specs: dict[str, GroupSpec] = {}
        for group in spec.groups:
            if group.name in specs:
                log.warning("group %s is declared twice; the first declaration is used", group.name)
                continue
            specs[group.name] = group
        names = set(specs)
        memberships = _cut_cycles(
            {name: resolve_membership(g, spec.nodes, names) for name, g in specs.items()}
        )
        groups: dict[str, _Group] = {}
        for name, group in specs.items():
            membership = memberships[name]
            policy = make_policy(group, membership.members)
            if previous_choices and name in previous_choices:
                policy.restore(previous_choices[name])
            if group.final is not None and group.final not in names and group.final not in outbounds:
                log.warning(
                    "group %s: final %r names nothing; an empty selection fails closed", name, group.final
                )
            groups[name] = _Group(group, membership, policy)
        return cls(groups, outbounds)

    # --- reading -------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._groups

    @property
    def names(self) -> tuple[str, ...]:
        """Group names in declaration order."""
        return tuple(self._groups)

    def members(self, group: str) -> tuple[str, ...]:
        """Member names of ``group`` (nodes then nested groups). Raises :class:`UnknownGroup`."""
        return self._get(group).membership.members

    def choices(self) -> dict[str, dict[Network, str]]:
        """The Selector runtime choices, to carry into the next table on reload."""
        out: dict[str, dict[Network, str]] = {}
        for name, group in self._groups.items():
            picked = group.policy.choices()
            if picked:
                out[name] = picked
        return out

    def resolve(self, name: str, network: Network) -> Selection:
        """Resolve a route target (group, node, ``direct`` or ``block``) to one leaf.

        Raises :class:`NoRoute` when no leaf results (unknown name, empty group
        without a usable ``final``, nesting too deep, a cycle through finals).
        """
        return self._resolve(name, network, ())

    def _resolve(self, name: str, network: Network, chain: tuple[str, ...]) -> Selection:
        group = self._groups.get(name)
        if group is None:
            leaf = self._outbounds.get(name)
            if leaf is None:
                raise NoRoute(f"{name!r} is neither a group nor an outbound")
            return Selection(leaf, (*chain, name))
        if name in chain:
            raise NoRoute(f"group {name} is reached again through a final: {' > '.join(chain)}")
        chain = (*chain, name)
        if len(chain) > MAX_NESTING_DEPTH:
            raise NoRoute(f"groups nest deeper than {MAX_NESTING_DEPTH}: {' > '.join(chain)}")
        final = group.spec.final
        member = group.policy.pick(network)
        if member is not None:
            try:
                return self._resolve(member, network, chain)
            except NoRoute:
                if final is None:
                    raise
        elif final is None:
            raise NoRoute(f"group {name} has no members and no final")
        return self._resolve(final, network, chain)

    # --- changing (control task only) -------------------------------------------

    def select(self, group: str, member: str, network: Network | None = None) -> None:
        """Set the Selector choice of ``group`` for one network, or both when ``network`` is None.

        Raises :class:`UnknownGroup` or :class:`~honk.group.selector.UnknownMember`
        (both ``KeyError`` subclasses).
        """
        self._get(group).policy.choose(member, network)

    def _get(self, group: str) -> _Group:
        try:
            return self._groups[group]
        except KeyError:
            raise UnknownGroup(group) from None
