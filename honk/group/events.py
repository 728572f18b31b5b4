"""What a group manager reports to its owner: typed events, not callbacks.

The cores (resolution, writes) append events to the manager's :class:`Outbox`; the manager
drains it through the one sink its owner installs (the daemon routes each event), at the end
of every public call that can emit (``resolve``, ``select``, ``pin``), so each effect is
visible when that call returns, as before. Events appended while no sink is installed are
dropped: nobody listens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from honk.core.net import Network
from honk.group.identity import Identity


@dataclass(frozen=True, slots=True)
class ChoiceChanged:
    """A Selector write changed ``network``'s choice to the member of ``identity`` (persisted)."""

    group: str
    network: Network
    identity: Identity


@dataclass(frozen=True, slots=True)
class SelectionMoved:
    """``group``'s selection for ``network`` moved: a write, a pin, a replaced URLTest winner or
    Fallback pin (never a LoadBalance rotation, never a first pick)."""

    group: str
    network: Network


@dataclass(frozen=True, slots=True)
class FlowsInterrupted:
    """``group`` moved and has ``interrupt_connections``: its flows on ``network`` must close."""

    group: str
    network: Network


GroupEvent = ChoiceChanged | SelectionMoved | FlowsInterrupted
EventSink = Callable[[GroupEvent], None]


class Outbox:
    """The events of one manager, in emission order, until the manager drains them."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[GroupEvent] = []

    def emit(self, event: GroupEvent) -> None:
        self._events.append(event)

    def moved(self, group: str, network: Network, interrupt: bool) -> None:
        """``group``'s selection moved: counted always, its flows interrupted when it asks."""
        self._events.append(SelectionMoved(group, network))
        if interrupt:
            self._events.append(FlowsInterrupted(group, network))

    def drained(self) -> list[GroupEvent]:
        """The pending events, in order; the outbox is then empty."""
        events, self._events = self._events, []
        return events

    def drain(self, sink: EventSink | None) -> None:
        """Hand every pending event to ``sink`` in order (an event a handler emits meanwhile too)."""
        while self._events:
            for event in self.drained():
                if sink is not None:
                    sink(event)

    def __len__(self) -> int:
        return len(self._events)
