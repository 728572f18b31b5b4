"""Group connectivity slots: what the datapath is told about each group's reachability.

Sans-I/O. A slot belongs to a group (its ordinal in the layout), a network and an address
family, and says whether anything the group can reach is alive there:

* the value is the OR of the group's reachable leaves (members and finals, transitively);
  UDP counts only leaves that can carry UDP;
* a slot's family is the packet's (the flow's target family: the datapath picks the slot
  from the IP header), and a leaf's state is read in the leaf's own health family only, the
  family its server is reached on (GH-D-07, GH-K-01): a node reached over IPv4 serves IPv6
  targets too, so its IPv4 verdict counts toward both families' slots, and a state of a
  family it is not reached on (never recorded: unknown, read as alive) never keeps a slot
  alive. Slots stay per family (GH-H-02); today nothing makes their values differ;
* a group with exactly one leaf and no final keeps its TCP slot alive whatever that leaf's
  state: userspace serves such a leaf as a last resort, so the kernel must not refuse first;
* a node's transition recomputes every group that reaches it (all ancestors), and only
  slots whose value changed are written; a node's own state is never a slot;
* a reload is fail-open: every slot of the old or the new layout is set alive, the new
  routing generation is published, then the exact snapshot is written. A write that fails
  part-way leaves the rest alive: a group is never falsely dead.

Admission never overrides selection: an alive slot only lets packets reach userspace,
which still refuses a flow its groups cannot serve.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from honk.alive.outcome import Family
from honk.core.net import Network

log = logging.getLogger("honk.ebpf")

SLOT_NETWORKS = (Network.TCP, Network.UDP)
SLOT_FAMILIES = (Family.V4, Family.V6)


@dataclass(frozen=True, slots=True)
class SlotKey:
    ordinal: int  # the group's position in the layout
    network: Network
    family: Family


class SlotBackend(Protocol):
    """Where slots are written: the pinned BPF map, or memory."""

    def write(self, key: SlotKey, alive: bool) -> None: ...


class LeafStates(Protocol):
    """The health subsystem's view of one node (``honk.alive.health.AliveDialerSet``)."""

    def tcp_alive(self, node_id: uuid.UUID, family: Family) -> bool: ...

    def udp_selectable(self, node_id: uuid.UUID, family: Family) -> bool: ...


@dataclass(frozen=True, slots=True)
class Leaf:
    name: str
    node_id: uuid.UUID | None  # None: a built-in (direct, block), which has no health and counts alive
    udp: bool  # can carry UDP
    family: Family = Family.V4  # its health family: the one its server is reached on, the one read


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """The groups in slot order, each with its reachable leaves (the final closure included)
    and whether it has a final."""

    groups: tuple[str, ...]
    leaves: Mapping[str, tuple[Leaf, ...]]
    has_final: Mapping[str, bool] = field(default_factory=dict)

    def ordinal(self, group: str) -> int:
        return self.groups.index(group)


class MemorySlots:
    """The in-memory backend: the map's contents, and every write in order (for tests and
    for running without BPF privileges)."""

    def __init__(self) -> None:
        self.values: dict[SlotKey, bool] = {}
        self.writes: list[tuple[SlotKey, bool]] = []

    def write(self, key: SlotKey, alive: bool) -> None:
        self.values[key] = alive
        self.writes.append((key, alive))


class SlotPublisher:
    """Keeps the backend's slots equal to the groups' reachability."""

    def __init__(self, backend: SlotBackend, states: LeafStates) -> None:
        self.backend = backend
        self.states = states
        self.layout: GroupLayout | None = None
        self._written: dict[SlotKey, bool] = {}
        self._reaching: dict[uuid.UUID, list[str]] = {}  # node -> the groups that reach it

    # --- values ---------------------------------------------------------------------------

    def values(self, layout: GroupLayout, group: str) -> dict[tuple[Network, Family], bool]:
        leaves = layout.leaves.get(group, ())
        sole_leaf = len({leaf.name for leaf in leaves}) == 1 and not layout.has_final.get(group, False)
        out: dict[tuple[Network, Family], bool] = {}
        # each leaf in its own health family, whatever the packet's family (the target family
        # never decides eligibility, GH-D-07): every family's slot gets the same verdict
        tcp = any(self._tcp(leaf) for leaf in leaves) or sole_leaf  # the last-resort rule's mirror
        udp = any(leaf.udp and self._udp(leaf) for leaf in leaves)
        for family in SLOT_FAMILIES:
            out[(Network.TCP, family)] = tcp
            out[(Network.UDP, family)] = udp
        return out

    def _tcp(self, leaf: Leaf) -> bool:
        return leaf.node_id is None or self.states.tcp_alive(leaf.node_id, leaf.family)

    def _udp(self, leaf: Leaf) -> bool:
        return leaf.node_id is None or self.states.udp_selectable(leaf.node_id, leaf.family)

    # --- writes ---------------------------------------------------------------------------

    def _write(self, key: SlotKey, alive: bool, *, force: bool = False) -> None:
        if not force and self._written.get(key) == alive:
            return
        self.backend.write(key, alive)
        self._written[key] = alive

    def _write_group(self, layout: GroupLayout, group: str) -> None:
        ordinal = layout.ordinal(group)
        for (network, family), alive in self.values(layout, group).items():
            self._write(SlotKey(ordinal, network, family), alive)

    def on_transition(self, node_id: uuid.UUID) -> None:
        """A node's health changed: recompute every group that reaches it."""
        if self.layout is None:
            return
        for group in self._reaching.get(node_id, ()):
            try:
                self._write_group(self.layout, group)
            except OSError as exc:  # the slot keeps its last value; the next transition retries
                log.warning("slot write failed group=%s error=%s", group, exc)

    def reload(self, layout: GroupLayout, publish: Callable[[], None]) -> None:
        """Fail-open swap to ``layout``: every old-or-new slot alive, then ``publish`` (the
        new routing generation), then the exact snapshot. A failed write stops the snapshot;
        the slots it did not reach stay alive."""
        old = self.layout
        count = max(len(old.groups) if old is not None else 0, len(layout.groups))
        for ordinal in range(count):
            for network in SLOT_NETWORKS:
                for family in SLOT_FAMILIES:
                    self._write(SlotKey(ordinal, network, family), True, force=True)
        publish()
        self.layout = layout
        self._reaching = _reaching(layout.groups, layout.leaves)
        try:
            for group in layout.groups:
                self._write_group(layout, group)
        except OSError as exc:
            log.warning("slot snapshot incomplete; the rest stays open error=%s", exc)


def _reaching(groups: Iterable[str], leaves: Mapping[str, tuple[Leaf, ...]]) -> dict[uuid.UUID, list[str]]:
    out: dict[uuid.UUID, list[str]] = {}
    for group in groups:
        for leaf in leaves.get(group, ()):
            if leaf.node_id is not None and group not in out.setdefault(leaf.node_id, []):
                out[leaf.node_id].append(group)
    return out
