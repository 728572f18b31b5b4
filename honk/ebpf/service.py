"""The daemon's one owner of the datapath: which backend, its slots, its kernel rules.

* :meth:`SlotService.use_interfaces` opens the datapath for the transparent listener's LAN
  interfaces (the BPF classifier when the kernel allows, else memory; ``Datapath.open`` says
  which at startup). No LAN: memory, no classifier. A different set reopens it; the
  applier calls this when it installs the interception, so both follow one desired state.
* :meth:`SlotService.reload` is the fail-open swap of area H: every old-or-new slot alive,
  then, inside ``publish``, the new kernel rule table and the new plane, then the exact
  snapshot of the new layout.
* :meth:`SlotService.on_transition` is the health service's transition listener: a node's
  change recomputes every group that reaches it.
* :meth:`SlotService.close` takes the classifier off the interfaces (stopping honk leaves no
  filter behind); the pinned maps stay, so a restart finds its slots.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from honk.config.spec import RoutingSpec
from honk.ebpf import loader
from honk.ebpf.datapath import Datapath
from honk.ebpf.kernel_rules import compile_kernel_rules
from honk.ebpf.layout import layout_of
from honk.ebpf.slots import LeafStates, SlotPublisher

log = logging.getLogger("honk.ebpf")

NO_LAN = "no LAN interface (global.lan_interface)"


class SlotService:
    def __init__(self, states: LeafStates, *, pin_dir: str = loader.DEFAULT_PIN_DIR) -> None:
        self.states = states
        self.pin_dir = pin_dir
        self.interfaces: tuple[str, ...] = ()
        self.datapath = Datapath.memory(NO_LAN)
        self.publisher = SlotPublisher(self.datapath.backend, states)

    def use_interfaces(self, interfaces: tuple[str, ...]) -> None:
        """Serve ``interfaces`` (blocking: loading and attaching take a few milliseconds)."""
        if interfaces == self.interfaces:
            return
        layout = self.publisher.layout
        self.datapath.close(detach=True)
        self.datapath = (
            Datapath.open(interfaces, pin_dir=self.pin_dir) if interfaces else Datapath.memory(NO_LAN)
        )
        self.interfaces = interfaces
        self.publisher = SlotPublisher(self.datapath.backend, self.states)
        if layout is not None:  # the new backend learns the running layout at once
            self.publisher.reload(layout, lambda: None)

    def reload(self, groups: Any, routing: RoutingSpec, publish: Callable[[], None]) -> None:
        """Fail-open swap to ``groups`` (a GroupManager) and ``routing``; ``publish`` makes the
        new plane current."""
        layout = layout_of(groups)

        def publish_with_rules() -> None:
            try:
                self.datapath.set_rules(compile_kernel_rules(routing, layout).entries)
            except (OSError, ValueError) as exc:  # the classifier keeps a consistent table
                log.warning("ebpf: the kernel rule table was not replaced error=%s", exc)
            publish()

        self.publisher.reload(layout, publish_with_rules)

    def on_transition(self, node_id: uuid.UUID, *_state: object) -> None:
        self.publisher.on_transition(node_id)

    def close(self) -> None:
        self.datapath.close(detach=True)
