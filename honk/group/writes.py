"""Writes to policy state (the control owner only) and what carries across managers.

A write returns its events (:mod:`honk.group.events`) for the manager to route: a Selector
write reports each changed network's choice (persisted by member identity) and a move for
each network whose effective member changed; a pin or unpin reports a move per changed
network. Selector choices carry into the next manager by member identity (NodeId for a
node, name for a sub-group); runtime pins never do (GH-A-16).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from honk.core.net import Network
from honk.group.events import ChoiceChanged, GroupEvent, Outbox
from honk.group.identity import Identity, normal_identity
from honk.group.policy import NETWORKS, Fixable, GroupPolicy, Selector, UnknownGroup
from honk.group.structure import Group, Structure

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Written:
    """The networks a write changed, and the events it reports, in order."""

    changed: list[Network]
    events: tuple[GroupEvent, ...] = ()


def _moves(group: Group, networks: list[Network]) -> list[GroupEvent]:
    outbox = Outbox()
    for net in networks:
        outbox.moved(group.spec.name, net, group.spec.interrupt_connections)
    return outbox.drained()


def select(structure: Structure, group: str, member: str, network: Network | None) -> Written:
    """Set a Selector's choice for one network, or both (validated once, all or nothing).

    Raises :class:`UnknownGroup` (also for a group that is not a Selector) or
    :class:`~honk.group.policy.UnknownMember`.
    """
    entry = structure.get(group)
    policy = entry.policy
    if not isinstance(policy, Selector):
        raise UnknownGroup(group)
    before = {net: policy.chosen(net) for net in NETWORKS}
    changed = policy.choose(member, NETWORKS if network is None else (network,))
    identity = structure.identity(member, group)
    events: list[GroupEvent] = [ChoiceChanged(group, net, identity) for net in changed]
    # re-selecting the effective choice moves nothing
    events += _moves(entry, [net for net in changed if before[net] != member])
    return Written(changed, tuple(events))


def pin(structure: Structure, group: str, member: str | None, network: Network | None) -> Written:
    """Pin (``member`` None: unpin) an automatic group's member for one network or both, all
    or nothing. Runtime only: the next manager has none.

    Raises :class:`UnknownGroup` (also for a group that cannot be pinned: Selector,
    LoadBalance) or :class:`~honk.group.policy.UnknownMember`.
    """
    entry = structure.get(group)
    policy = entry.policy
    if not isinstance(policy, Fixable):
        raise UnknownGroup(group)
    changed = policy.fix(member, NETWORKS if network is None else (network,))
    return Written(changed, tuple(_moves(entry, changed)))


def pinned(structure: Structure, group: str) -> dict[Network, str]:
    """The runtime pins of ``group`` by network ({} for groups that cannot be pinned)."""
    policy = structure.get(group).policy
    return policy.fixed() if isinstance(policy, Fixable) else {}


def choice_identities(structure: Structure) -> dict[str, dict[Network, Identity]]:
    """Selector choices by member identity, to carry into the next manager."""
    out: dict[str, dict[Network, Identity]] = {}
    for name, group in structure.groups.items():
        if isinstance(group.policy, Selector):
            picked = group.policy.choices()
            if picked:
                out[name] = {net: structure.identity(member, name) for net, member in picked.items()}
    return out


def restore_choices(structure: Structure, carried: Mapping[str, Mapping[Network, Identity]]) -> None:
    """Take carried (or saved) Selector choices whose member identity is still a member."""
    for name, choices in carried.items():
        group = structure.groups.get(name)
        if group is None or not isinstance(group.policy, Selector):
            continue
        by_identity = {structure.identity(m, name): m for m in group.policy.members}
        for network, identity in choices.items():
            member = by_identity.get(normal_identity(identity))
            if member is None:
                log.info("group %s: the %s choice is no longer a member; it falls back", name, network.value)
            else:
                group.policy.restore({network: member})


def unpinned(name: str, policy: GroupPolicy) -> GroupPolicy:
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
