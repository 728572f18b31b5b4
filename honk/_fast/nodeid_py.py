"""A node's identity: a :class:`uuid.UUID` whose hash is computed once.

Node ids key most of honk's per-node state (health, the Score cells, cohorts, backoffs and the
per-target heuristic), so every flow hashes a node id dozens of times: a Score plan over 50
members looks one up about 380 times, and every aggregate or exact Score key is a tuple that
holds one. ``uuid.UUID.__hash__`` is Python code that hashes the 128-bit integer again on each
call; a :class:`NodeId` stores that same hash when it is made. The compiled build also makes
``__hash__`` a C function, so a lookup by a node id costs what a lookup by a small int does.

A :class:`NodeId` equals, and hashes like, the plain :class:`uuid.UUID` of the same value, so
either may look up state keyed by the other; it stays immutable, and pickles and copies to a
:class:`NodeId`.

This file is plain Python and also the Cython source of ``nodeid_c``; keep the two in step.
"""

import uuid

try:
    import cython
except ModuleNotFoundError:  # an install without Cython: the twin's stand-in
    from honk._fast import _cython as cython


class NodeId(uuid.UUID):
    """A UUID whose hash is computed once (takes the arguments of :class:`uuid.UUID`)."""

    __slots__ = ("_hash",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_hash", hash(self.int))  # UUID.__hash__'s value: hash(int)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:  # UUID's own state would leave the stored hash unset
        return (self.__class__, (None, None, None, None, self.int))

    def __copy__(self) -> "NodeId":  # immutable
        return self

    def __deepcopy__(self, memo: dict) -> "NodeId":
        return self


def node_id(value: uuid.UUID) -> NodeId:
    """``value`` as a :class:`NodeId` (itself when it already is one of this build)."""
    if type(value) is NodeId:
        return value
    return NodeId(int=value.int)


if cython.compiled:  # the stored hash straight from C (nodeid_c.pxd)
    honk_install_nodeid_hash(NodeId)  # noqa: F821 - declared in nodeid_c.pxd
