"""Switch and flap counting (GH-K-127), sans-I/O.

A history is kept per ``(group, network, family, target)`` key: the current ordinary
winner, the winner before it, and how many ordinary selections have been made since the
last switch. Recording an ordinary selection answers what it was:

* ``FIRST``: the key had no history (new, or evicted): nothing to compare with, so it
  proves no switch;
* ``KEPT``: the same identity won again;
* ``SWITCH``: a committed change A → B (counted in ``ordinarySwitch``);
* ``FLAP``: a switch that returns to the winner before the last switch within
  ``FLAP_WINDOW`` ordinary selections of leaving it (counted in ``ordinarySwitch`` and in
  ``switchFlap``, its subset).

Trials and first choices are not ordinary switches: the caller records only ordinary
selections. The history is an LRU of ``SWITCH_HISTORY_MAX`` keys; counters are kept per
``(group, network)``, the fixed fields ``/stats.score`` exports. Keys and identities never
leave this object.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from honk.group.score.constants import FLAP_WINDOW, SWITCH_HISTORY_MAX


class Selection(enum.Enum):
    FIRST = "first"
    KEPT = "kept"
    SWITCH = "switch"
    FLAP = "flap"


@dataclass(slots=True)
class _History:
    winner: Hashable
    previous: Hashable | None = None  # the winner before the last switch
    since_switch: int = 0  # ordinary selections made since the last switch (the switch itself is 1)


@dataclass(slots=True)
class SwitchCounters:
    ordinary_switch: int = 0
    switch_flap: int = 0


class SwitchHistory:
    def __init__(self, max_entries: int = SWITCH_HISTORY_MAX, flap_window: int = FLAP_WINDOW) -> None:
        if max_entries < 1:
            raise ValueError("a switch history holds at least one key")
        self.max_entries = max_entries
        self.flap_window = flap_window
        self._histories: OrderedDict[Hashable, _History] = OrderedDict()
        self.counters: dict[tuple[str, str], SwitchCounters] = {}

    def __len__(self) -> int:
        return len(self._histories)

    def record(self, group: str, network: str, key: Hashable, winner: Hashable) -> Selection:
        """One committed ordinary selection of ``winner`` (a node identity) for ``key``."""
        history = self._histories.get(key)
        if history is None:
            self._histories[key] = _History(winner)
            if len(self._histories) > self.max_entries:
                self._histories.popitem(last=False)  # the least recently selected key
            return Selection.FIRST
        self._histories.move_to_end(key)
        if winner is history.winner or winner == history.winner:  # the same id object, mostly
            history.since_switch += 1
            return Selection.KEPT
        counters = self.counters.setdefault((group, network), SwitchCounters())
        counters.ordinary_switch += 1
        flap = winner == history.previous and history.since_switch < self.flap_window
        if flap:
            counters.switch_flap += 1
        history.previous, history.winner, history.since_switch = history.winner, winner, 1
        return Selection.FLAP if flap else Selection.SWITCH

    def winner(self, key: Hashable) -> Hashable | None:
        """The last ordinary winner for ``key`` (the incumbent), or None."""
        history = self._histories.get(key)
        return None if history is None else history.winner

    def winners(self) -> dict[Hashable, Hashable]:
        """Every key's last ordinary winner (a copy, least recently selected first)."""
        return {key: history.winner for key, history in self._histories.items()}

    def forget_winners(self, keep: Callable[[Hashable, Hashable], bool]) -> None:
        """Drop the history of every key whose winner ``keep(key, winner)`` rejects: a removed
        member is nobody's incumbent (its key starts again with a first selection)."""
        for key in [k for k, h in self._histories.items() if not keep(k, h.winner)]:
            del self._histories[key]

    def forget_group(self, group: str) -> None:
        """A deleted group's counters go (its keys age out of the LRU)."""
        for scope in [s for s in self.counters if s[0] == group]:
            del self.counters[scope]
