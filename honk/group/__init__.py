"""Groups: membership from filters, policies, and resolution to one leaf.

Nothing here performs I/O. ``GroupTable.build(spec, outbounds)`` per
configuration; ``table.resolve(name, network)`` per flow.
"""

from honk.group.manager import MAX_NESTING_DEPTH, GroupTable, Selection
from honk.group.membership import Membership, resolve_membership
from honk.group.selector import Selector, UnknownGroup, UnknownMember

__all__ = [
    "MAX_NESTING_DEPTH",
    "GroupTable",
    "Membership",
    "Selection",
    "Selector",
    "UnknownGroup",
    "UnknownMember",
    "resolve_membership",
]
