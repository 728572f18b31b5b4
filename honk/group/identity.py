"""Identities that outlive one manager: of groups, of members, and of leaves for Score.

* A group keeps its :class:`GroupIdentity` (UUID, creation time) while its name stays.
* A member's :data:`Identity` (``("node", NodeId)``, ``("group", name)`` or
  ``("builtin", name)``) is how Selector choices are carried to the next manager and kept
  in the state database (``identity_text`` / ``identity_from_text``): a different node that
  took a removed node's name does not inherit its choice.
* A leaf's Score :data:`~honk.group.score.keys.NodeId`: a builtin leaf gets a name-based one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from honk._fast import nodeid
from honk.config.spec import GroupSpec
from honk.core.clock import Clock
from honk.group.filter import node_id_of
from honk.group.score.keys import NodeId
from honk.outbound.base import Outbound

__all__ = [
    "GroupIdentity",
    "Identity",
    "group_identities",
    "identity_from_text",
    "identity_text",
    "leaf_node_id",
    "member_identity",
    "normal_identity",
]

# A member identity that survives reload: ("node", NodeId), ("group", name) or ("builtin", name)
Identity = tuple[str, object]


@dataclass(frozen=True, slots=True)
class GroupIdentity:
    """A configured group's identity: kept across reloads while its name stays."""

    uid: uuid.UUID
    created_at: float  # wall-clock seconds


def group_identities(
    specs: Mapping[str, GroupSpec], previous: Mapping[str, GroupIdentity], clock: Clock | None
) -> dict[str, GroupIdentity]:
    """Each group keeps its identity (``previous``: the replaced manager's) while its name stays;
    a new or renamed group gets a fresh one, even when its configuration carries the UUID of a
    group that had another name."""
    now = clock.wall() if clock is not None else 0.0
    taken = {identity.uid for identity in previous.values()}
    out = {}
    for name, spec in specs.items():
        if name in previous:
            out[name] = previous[name]
        elif spec.id is not None and spec.id not in taken:
            out[name] = GroupIdentity(spec.id, now)
        else:
            out[name] = GroupIdentity(uuid.uuid4(), now)
    return out


def member_identity(member: str, is_group: bool, leaf: Outbound | None) -> Identity:
    """``member``'s identity: a group's by name, a node's by NodeId, a builtin's by name."""
    if is_group:
        return ("group", member)
    node_id = node_id_of(leaf)
    return ("node", node_id) if node_id is not None else ("builtin", member)


def normal_identity(identity: Identity) -> Identity:
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
        return normal_identity((kind, value))
    except ValueError:
        return None


def leaf_node_id(leaf: Outbound | None, name: str | None = None) -> NodeId:
    """A leaf's NodeId; a builtin leaf (direct, block) gets a name-based identity."""
    node_id = node_id_of(leaf)
    if node_id is not None:
        return node_id
    return ("builtin", name if name is not None else leaf.name)  # type: ignore[union-attr]
