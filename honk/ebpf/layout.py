"""The slot layout of a group manager: which groups have slots, in what order, over which leaves.

Groups take ordinals in the configuration's order (the manager keeps it), so a reload that
keeps the group list keeps every ordinal. Each group lists the distinct leaves it can reach
through members, nested groups and finals (transitively, cycle edges already cut, the
nesting depth bounded as in resolution). A leaf is its NodeId (None for ``direct`` and
``block``, which have no health), whether it can carry UDP and its health family (the family
its server is reached on, the only one its state is read in).
"""

from __future__ import annotations

import uuid
from typing import Any

from honk.ebpf.slots import GroupLayout, Leaf
from honk.group.filter import health_family_of, node_id_of
from honk.group.manager import GroupManager

UNSET_NODE_ID = uuid.UUID(int=0)  # NodeSpec's default before an id is derived


def layout_of(groups: GroupManager) -> GroupLayout:
    names = groups.names
    leaves = {
        name: tuple(_leaf(groups, leaf) for leaf in groups.leaf_node_names_in_group(name)) for name in names
    }
    return GroupLayout(names, leaves, {name: _final_of(groups, name) is not None for name in names})


def _leaf(groups: GroupManager, name: str) -> Leaf:
    outbound = _outbounds(groups)[name]
    capabilities = getattr(outbound, "capabilities", None)
    return Leaf(
        name,
        _node_id(outbound),
        bool(capabilities is not None and capabilities.udp),
        health_family_of(outbound),
    )


def _node_id(outbound: Any) -> uuid.UUID | None:
    """The runtime's NodeId, else the spec's (a proxy leaf not yet given a runtime)."""
    node_id = node_id_of(outbound)
    if node_id is None and getattr(outbound, "runtime", None) is None and hasattr(outbound, "node"):
        node_id = getattr(outbound.node, "id", None)
    return node_id if node_id != UNSET_NODE_ID else None


# GroupManager exposes neither its leaves by name nor a group's final; both are fixed at build.
def _outbounds(groups: GroupManager) -> Any:
    return groups._outbounds


def _final_of(groups: GroupManager, name: str) -> str | None:
    return groups._groups[name].spec.final
