"""Groups: membership from filters, the classic policies, and resolution to one leaf.

Nothing here performs I/O. ``GroupManager.build(spec, outbounds, health=...)`` per
configuration; ``manager.resolve(name, network)`` per flow.
"""

from honk.group.manager import MAX_NESTING_DEPTH, GroupManager, Selection, SharedGroupManager
from honk.group.membership import Membership, resolve_membership
from honk.group.policy import Fallback, LoadBalance, Random, Selector, UnknownGroup, UnknownMember, URLTest

__all__ = [
    "MAX_NESTING_DEPTH",
    "Fallback",
    "GroupManager",
    "LoadBalance",
    "Membership",
    "Random",
    "Selection",
    "Selector",
    "SharedGroupManager",
    "URLTest",
    "UnknownGroup",
    "UnknownMember",
    "resolve_membership",
]
