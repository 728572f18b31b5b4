"""Group connectivity slots against a fake map: OR semantics, every ancestor recomputed,
the single-leaf TCP exception, UDP capability, and the fail-open reload."""

from __future__ import annotations

import uuid

import pytest

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.ebpf.slots import GroupLayout, Leaf, MemorySlots, SlotKey, SlotPublisher

A, B, L, U, V = (uuid.uuid4() for _ in range(5))


class States:
    def __init__(self) -> None:
        self.tcp: dict[tuple[uuid.UUID, Family], bool] = {}
        self.udp: dict[tuple[uuid.UUID, Family], bool] = {}

    def tcp_alive(self, node_id: uuid.UUID, family: Family) -> bool:
        return self.tcp.get((node_id, family), False)

    def udp_selectable(self, node_id: uuid.UUID, family: Family) -> bool:
        return self.udp.get((node_id, family), False)


def leaf(name: str, node_id: uuid.UUID, udp: bool = True) -> Leaf:
    return Leaf(name, node_id, udp)


def slot(ordinal: int, network: Network = Network.TCP, family: Family = Family.V4) -> SlotKey:
    return SlotKey(ordinal, network, family)


def published(layout: GroupLayout, states: States) -> tuple[SlotPublisher, MemorySlots]:
    backend = MemorySlots()
    publisher = SlotPublisher(backend, states)
    publisher.reload(layout, lambda: None)
    return publisher, backend


def test_a_group_slot_is_the_or_of_its_leaves_and_never_a_nodes_own_value():
    states = States()
    states.tcp[(A, Family.V4)] = True
    layout = GroupLayout(("g",), {"g": (leaf("a", A), leaf("b", B))})
    publisher, backend = published(layout, states)
    assert backend.values[slot(0)] is True  # A alive, B dead
    backend.writes.clear()
    states.tcp[(A, Family.V4)] = False
    publisher.on_transition(A)
    assert backend.values[slot(0)] is False
    # only the group's changed slots (A's verdict counts toward both target families), nothing keyed by A
    assert backend.writes == [(slot(0), False), (slot(0, Network.TCP, Family.V6), False)]


def test_a_transition_recomputes_every_group_that_reaches_the_leaf():
    states = States()
    states.tcp[(L, Family.V4)] = True
    # P has L as a member; Q reaches L only through its final
    layout = GroupLayout(
        ("p", "q"), {"p": (leaf("l", L), leaf("a", A)), "q": (leaf("b", B), leaf("l", L))}, {"q": True}
    )
    publisher, backend = published(layout, states)
    assert backend.values[slot(0)] and backend.values[slot(1)]
    states.tcp[(L, Family.V4)] = False
    publisher.on_transition(L)
    assert backend.values[slot(0)] is False and backend.values[slot(1)] is False


def test_a_sole_leaf_without_a_final_keeps_its_tcp_slot_alive_and_udp_follows_the_leaf():
    states = States()
    states.udp[(L, Family.V4)] = True
    layout = GroupLayout(("g",), {"g": (leaf("l", L),)})
    publisher, backend = published(layout, states)
    assert backend.values[slot(0, Network.TCP)] is True  # L is TCP-dead: the last resort still serves it
    assert backend.values[slot(0, Network.UDP)] is True
    states.udp[(L, Family.V4)] = False
    publisher.on_transition(L)
    assert backend.values[slot(0, Network.UDP)] is False
    with_final = GroupLayout(("g",), {"g": (leaf("l", L),)}, {"g": True})
    _, backend = published(with_final, states)
    assert backend.values[slot(0, Network.TCP)] is False  # a final takes the last resort's place


def test_only_leaves_that_carry_udp_count_for_the_udp_slots():
    states = States()
    states.tcp[(V, Family.V4)] = True
    states.udp[(V, Family.V4)] = True  # alive, but V cannot carry UDP at all
    layout = GroupLayout(("g",), {"g": (leaf("v", V, udp=False), leaf("u", U))})
    _, backend = published(layout, states)
    assert backend.values[slot(0, Network.TCP)] is True
    assert backend.values[slot(0, Network.UDP)] is False
    assert backend.values[slot(0, Network.UDP, Family.V6)] is False


class FailingAfter(MemorySlots):
    def __init__(self) -> None:
        super().__init__()
        self.fail_at: int | None = None

    def write(self, key: SlotKey, alive: bool) -> None:
        if self.fail_at is not None and len(self.writes) >= self.fail_at:
            raise OSError("map update failed")
        super().write(key, alive)


def test_a_reload_opens_every_old_and_new_slot_publishes_then_writes_the_exact_snapshot():
    states = States()
    old = GroupLayout(
        ("a", "b", "c"), {g: (leaf(g, uuid.uuid4()), leaf(g + "2", uuid.uuid4())) for g in "abc"}
    )
    backend = FailingAfter()
    publisher = SlotPublisher(backend, states)
    publisher.reload(old, lambda: None)
    assert all(alive is False for key, alive in backend.values.items() if key.network is Network.TCP)
    new = GroupLayout(
        ("c", "d", "a", "b"), {g: (leaf(g, uuid.uuid4()), leaf(g + "2", uuid.uuid4())) for g in "abcd"}
    )
    backend.writes.clear()
    events: list[str] = []
    publisher.reload(new, lambda: events.append(f"published after {len(backend.writes)} writes"))
    opened = 4 * len(Network) * len(Family)
    assert backend.writes[:opened] == [
        (SlotKey(o, n, f), True)
        for o in range(4)
        for n in (Network.TCP, Network.UDP)
        for f in (Family.V4, Family.V6)
    ]
    assert events == [f"published after {opened} writes"]
    assert all(alive is False for _, alive in backend.writes[opened:])  # reordered: no stale ordinal kept
    # a write that fails part-way leaves what it did not reach open
    backend.writes.clear()
    backend.fail_at = opened + 2 * 2  # the exact values of slot 0 and half of slot 1
    publisher.reload(old, lambda: None)
    for ordinal in (2, 3):
        for network in (Network.TCP, Network.UDP):
            assert backend.values[SlotKey(ordinal, network, Family.V4)] is True


@pytest.mark.parametrize("family", [Family.V4, Family.V6])
def test_built_in_leaves_count_alive(family):
    layout = GroupLayout(("g",), {"g": (Leaf("direct", None, True), leaf("a", A))})
    _, backend = published(layout, States())
    assert backend.values[slot(0, Network.TCP, family)] and backend.values[slot(0, Network.UDP, family)]


def test_a_leaf_counts_in_its_own_health_family_toward_both_family_slots():
    """GH-D-07, GH-K-01: a slot's family is the packet's (the target family); a leaf's verdict is
    its state in its health family, so an IPv4-reached node keeps the IPv6 slot alive and an
    IPv6-reached node's dead IPv6 state is not masked by its (unrecorded) IPv4 one."""
    states = States()
    states.tcp[(A, Family.V4)] = True  # A is reached over IPv4 and alive there
    states.tcp[(B, Family.V4)] = True  # B is reached over IPv6: an IPv4 state says nothing about it
    states.udp[(B, Family.V4)] = True
    layout = GroupLayout(
        ("four", "six"),
        {"four": (leaf("a", A),), "six": (Leaf("b", B, True, Family.V6),)},
        {"four": True, "six": True},
    )  # finals: no sole-leaf exception
    publisher, backend = published(layout, states)
    for family in (Family.V4, Family.V6):
        assert backend.values[slot(0, Network.TCP, family)] is True
        assert backend.values[slot(1, Network.TCP, family)] is False  # B's IPv6 state: dead
        assert backend.values[slot(1, Network.UDP, family)] is False
    states.tcp[(B, Family.V6)] = True
    publisher.on_transition(B)
    assert backend.values[slot(1, Network.TCP, Family.V4)] and backend.values[slot(1, Network.TCP, Family.V6)]
