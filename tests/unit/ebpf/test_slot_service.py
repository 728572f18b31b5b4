"""The daemon's slot service on the in-memory backend: a reload publishes the kernel rule table
and the plane inside the fail-open window, transitions of the health service reach every group
that holds the node, and reopening the datapath carries the running layout to the new backend."""

from __future__ import annotations

import uuid

from test_ebpf_layout import IDS, group, manager

from honk.alive.outcome import Family
from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.core.net import Network
from honk.ebpf.service import NO_LAN, SlotService
from honk.ebpf.slots import SlotKey

ROUTING = RoutingSpec(
    rules=(RuleSpec((Predicate("dip", (MatchArg("", "203.0.113.0/24"),)),), "top"),), fallback="direct"
)


class States:
    """Leaf health as the health service would answer it; every node alive until told."""

    def __init__(self) -> None:
        self.dead: set[uuid.UUID] = set()

    def tcp_alive(self, node_id: uuid.UUID, family: Family) -> bool:
        return node_id not in self.dead

    def udp_selectable(self, node_id: uuid.UUID, family: Family) -> bool:
        return node_id not in self.dead


def nested():
    return manager(group("top", subgroups=("mid",)), group("mid", "a", "b"))


def test_without_a_lan_the_slots_live_in_memory():
    service = SlotService(States())
    assert service.datapath.kind == "memory" and service.datapath.reason == NO_LAN
    service.use_interfaces(())  # no change: nothing reopened
    assert service.datapath.kind == "memory"


def test_a_reload_publishes_rules_and_plane_while_every_slot_is_alive_then_writes_the_snapshot():
    states = States()
    states.dead.add(IDS["a"])
    states.dead.add(IDS["b"])
    service = SlotService(states)
    backend = service.datapath.backend
    seen: dict[str, object] = {}

    def publish() -> None:
        seen["alive during publish"] = all(backend.values.values())
        seen["rules"] = service.datapath.rules

    service.reload(nested(), ROUTING, publish)
    assert seen["alive during publish"] is True
    top = [rule for rule in seen["rules"] if rule.target == 0]  # the dip rule names group "top"
    assert top and all(rule.order == 0 for rule in top)
    # the exact snapshot: both groups reach only dead nodes (UDP) ...
    assert backend.values[SlotKey(0, Network.UDP, Family.V4)] is False
    assert backend.values[SlotKey(1, Network.UDP, Family.V6)] is False


def test_a_health_transition_rewrites_every_group_that_reaches_the_node():
    states = States()
    service = SlotService(states)
    service.reload(nested(), ROUTING, lambda: None)
    backend = service.datapath.backend
    assert backend.values[SlotKey(0, Network.UDP, Family.V4)] is True
    states.dead.update({IDS["a"], IDS["b"]})
    service.on_transition(IDS["a"], "data_udp", Family.V4, False)
    service.on_transition(IDS["b"], "data_udp", Family.V4, False)
    for ordinal in (0, 1):  # mid holds the nodes, top reaches them through mid
        assert backend.values[SlotKey(ordinal, Network.UDP, Family.V4)] is False
    states.dead.discard(IDS["b"])
    service.on_transition(IDS["b"], "data_udp", Family.V4, True)
    assert backend.values[SlotKey(0, Network.UDP, Family.V4)] is True


def test_reopening_the_datapath_writes_the_running_layout_to_the_new_backend(monkeypatch):
    from honk.ebpf import service as module
    from honk.ebpf.datapath import Datapath

    states = States()
    states.dead.update({IDS["a"], IDS["b"]})
    service = SlotService(states)
    service.reload(nested(), ROUTING, lambda: None)
    reopened = Datapath.memory("reopened for lan0")
    monkeypatch.setattr(module.Datapath, "open", classmethod(lambda cls, interfaces, **kw: reopened))
    service.use_interfaces(("lan0",))
    assert service.datapath is reopened and service.interfaces == ("lan0",)
    assert reopened.backend.values[SlotKey(1, Network.UDP, Family.V4)] is False  # the snapshot, at once
