"""Group policies: the seam, and the plain Selector.

A policy answers one question: which member name does this group pick for a
network right now? :class:`GroupPolicy` is that seam; the full policy engine
(URLTest, Fallback, LoadBalance, Score) will implement it later. Until then
every policy runs as a :class:`Selector` (see :func:`make_policy`).

Selector order: the runtime choice for the network, then ``default``, then the
first member. Health never replaces a valid choice (there is no health yet).
Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from honk.config.spec import GroupSpec, Policy
from honk.core.errors import HonkError
from honk.core.net import Network

log = logging.getLogger(__name__)

NETWORKS = (Network.TCP, Network.UDP)


class UnknownGroup(HonkError, KeyError):
    """No group has this name."""

    def __init__(self, group: str) -> None:
        super().__init__(group)
        self.group = group

    def __str__(self) -> str:
        return f"no group named {self.group!r}"


class UnknownMember(HonkError, KeyError):
    """The name is not a member of the group."""

    def __init__(self, group: str, member: str) -> None:
        super().__init__(group, member)
        self.group = group
        self.member = member

    def __str__(self) -> str:
        return f"{self.member!r} is not a member of group {self.group!r}"


class GroupPolicy(Protocol):
    """Picks one member of a group per network. Owned by one task; not thread-safe."""

    members: tuple[str, ...]

    def pick(self, network: Network) -> str | None:
        """The chosen member name, or ``None`` when the group has no member."""

    def choose(self, member: str, network: Network | None = None) -> None:
        """Record an operator's choice (both networks when ``network`` is None)."""

    def choices(self) -> dict[Network, str]:
        """The runtime choices currently recorded, per network."""

    def restore(self, choices: Mapping[Network, str]) -> None:
        """Take over choices from the table being replaced, for members that still exist."""


class Selector:
    """Runtime choice (per network) → ``default`` → first member."""

    __slots__ = ("name", "members", "default", "_member_set", "_choice")

    def __init__(self, name: str, members: tuple[str, ...], default: str | None = None) -> None:
        self.name = name
        self.members = members
        self._member_set = frozenset(members)
        if default is not None and default not in self._member_set:
            log.warning("group %s: default %r is not a member; using the first member instead", name, default)
            default = None
        self.default = default
        self._choice: dict[Network, str] = {}

    def pick(self, network: Network) -> str | None:
        choice = self._choice.get(network)
        if choice is not None:
            return choice
        if self.default is not None:
            return self.default
        return self.members[0] if self.members else None

    def choose(self, member: str, network: Network | None = None) -> None:
        if member not in self._member_set:
            raise UnknownMember(self.name, member)
        for net in NETWORKS if network is None else (network,):
            self._choice[net] = member

    def choices(self) -> dict[Network, str]:
        return dict(self._choice)

    def restore(self, choices: Mapping[Network, str]) -> None:
        """Carry choices over from an earlier table, keeping only current members."""
        for network, member in choices.items():
            if member in self._member_set:
                self._choice[network] = member
            else:
                log.info(
                    "group %s: dropping %s choice %r, no longer a member", self.name, network.value, member
                )


def make_policy(spec: GroupSpec, members: tuple[str, ...]) -> Selector:
    """The policy object for a group. Every policy is a Selector until the policy engine lands."""
    if spec.policy is not Policy.SELECTOR:
        log.debug("group %s: policy %s runs as a selector in this version", spec.name, spec.policy.value)
    return Selector(spec.name, members, spec.default)
