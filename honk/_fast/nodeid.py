"""Selects the node-identity implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.nodeid_py import NodeId, node_id
else:
    _impl, IMPLEMENTATION = load("nodeid")
    NodeId = _impl.NodeId
    node_id = _impl.node_id

__all__ = ["IMPLEMENTATION", "NodeId", "node_id"]
