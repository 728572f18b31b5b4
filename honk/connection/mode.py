"""The Clash routing mode and the GLOBAL choice.

``rule`` (the default) routes by the configuration's rules; ``global`` sends
every flow to the member chosen in the synthetic ``GLOBAL`` selector (every
node and group, ``direct`` first); ``direct`` sends every flow direct. The mode
is runtime state of the control owner: dashboards change it with
``PATCH /configs``, a reload keeps it, and the config's ``default_mode`` sets it
at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from honk.connection.plane import Plane

MODES = ("rule", "global", "direct")
GLOBAL_GROUP = "GLOBAL"
GLOBAL_DEFAULT = "direct"  # what GLOBAL serves until a dashboard picks a member


class RoutingMode:
    """One owner for the mode and the GLOBAL choice; the dispatcher reads both per flow."""

    __slots__ = ("mode", "global_choice")

    def __init__(self, mode: str = "rule") -> None:
        self.mode = "rule"
        self.global_choice = GLOBAL_DEFAULT
        self.set(mode)

    def set(self, mode: str) -> None:
        """Switch mode (case-insensitive); ValueError for anything but rule, global, direct."""
        mode = mode.lower()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.mode = mode

    def override(self) -> str | None:
        """The outbound every flow goes to in this mode, or None when rules decide."""
        if self.mode == "direct":
            return "direct"
        if self.mode == "global":
            return self.global_choice
        return None


def mode_rule(mode: str) -> str:
    """The rule text of a flow a mode routed, bypassing the rules: ``mode(global)``, ``mode(direct)``."""
    return f"mode({mode})"


def global_members(plane: Plane) -> list[str]:
    """GLOBAL's members (honk names): direct, block, the nodes, then the groups, in config order;
    a name a group shares with a node once (picking it picks the group, which answers to it)."""
    nodes = [name for name in plane.outbounds if name not in ("direct", "block")]
    return list(dict.fromkeys(["direct", "block", *nodes, *plane.groups.names]))
