"""Per-rule hit and miss counters and disabled flags of one compiled rule list. Sans-I/O.

What the Clash API serves as each rule's ``extra`` (mihomo's ``disabled``, ``hitCount``,
``hitAt``, ``missCount``, ``missAt``) and what ``PATCH /rules/disable`` changes.

Theory of operation:
  * One :class:`RuleStats` is made with each compiled :class:`~honk.route.router.Router` and
    lives as long as it: a reload that recompiles the rules starts again from zero with every
    rule enabled; a reload that leaves routing (and its geodata) unchanged keeps the router and
    its counters, and enables every rule again (:meth:`RuleStats.enable_all`): a rule disabled
    at run time stays so until the next reload, like the API's other run-time edits.
  * Position ``i < size`` is rule ``i``; position ``size`` is the fallback (the Match rule).
  * A rule *hits* when a flow's search ends at it, and *misses* when a search evaluated it
    and went on. A ``must_rules`` rule that holds is a hit too (the search goes on past it, its
    flow then hits a second rule); one that does not hold is a miss. A disabled rule is skipped:
    neither. Times are the last hit and the last miss, wall-clock seconds from the caller's
    clock; :data:`NEVER` (0.0) until the first.
  * A flow is counted once, when its search ends with a decision at position ``w``. The search
    is a walk from rule 0 (a search resumed after ``NeedsResolution`` counts the rules the first
    call read), so such a flow evaluated every rule before ``w``. The common flow (no disabled
    rule before ``w``, no ``must_rules`` rule held) is recorded as "plainly decided at ``w``": a
    count and a time at ``w``, two stores whatever the rule count. Its misses are derived when
    the counters are read: rule ``i`` missed every plain flow decided after it (a suffix sum,
    its time a suffix maximum). Only a flow that skipped a disabled rule or held a
    ``must_rules`` rule takes the exact path, which walks the rules before ``w``.

Invariants:
  * Nothing here reads a clock or performs I/O; the router records, :meth:`RuleStats.rows`
    reads, :meth:`RuleStats.set_disabled` flips flags (validated whole before any applies).
  * ``active`` is the rule tuple without the disabled rules, in order, rebuilt on every flip:
    the router's search reads it and pays nothing per rule for the flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NEVER", "RuleRow", "RuleStats"]

NEVER = 0.0  # a time that never happened: the API shows it as the zero time


@dataclass(frozen=True, slots=True)
class RuleRow:
    """One position's counters as read: a rule's, or the fallback's (never disabled)."""

    disabled: bool
    hits: int
    hit_at: float  # wall seconds of the last hit; NEVER when none
    misses: int
    miss_at: float  # wall seconds of the last miss; NEVER when none


class RuleStats:
    """The counters and flags of ``rules`` (a compiled rule tuple) and the fallback after them."""

    __slots__ = (
        "size",
        "rules",
        "active",
        "disabled",
        "first_disabled",
        "plain",
        "plain_at",
        "exact_hits",
        "exact_hit_at",
        "exact_misses",
        "exact_miss_at",
    )

    def __init__(self, rules: Sequence[Any]) -> None:
        size = len(rules)
        positions = size + 1  # the rules, then the fallback
        self.size = size
        self.rules = tuple(rules)
        self.active = self.rules  # the rules the search reads: the enabled ones, in order
        self.disabled = bytearray(size)  # 1: rule i is skipped
        self.first_disabled = positions  # the lowest disabled index; past the fallback when none
        # flows plainly decided at each position (nothing disabled before it, no must_rules held)
        self.plain = [0] * positions
        self.plain_at = [NEVER] * positions
        # what the exact path recorded: hits (decisions and held must_rules rules) and misses
        self.exact_hits = [0] * positions
        self.exact_hit_at = [NEVER] * positions
        self.exact_misses = [0] * positions
        self.exact_miss_at = [NEVER] * positions

    # --- recording (the router's search) ------------------------------------------------------

    def record_exact(self, decided: int, now: float, held: Sequence[int] | None) -> None:
        """A flow decided at ``decided`` that skipped a disabled rule or held the ``must_rules``
        rules ``held``: every rule before ``decided`` is counted one by one."""
        disabled, hits, hit_at = self.disabled, self.exact_hits, self.exact_hit_at
        misses, miss_at = self.exact_misses, self.exact_miss_at
        held = held or ()
        for i in range(decided):
            if i in held:
                hits[i] += 1
                hit_at[i] = now
            elif not disabled[i]:
                misses[i] += 1
                miss_at[i] = now
        hits[decided] += 1
        hit_at[decided] = now

    # --- reading ------------------------------------------------------------------------------

    def rows(self) -> list[RuleRow]:
        """Every position's counters, the rules in order and then the fallback."""
        size, plain, plain_at = self.size, self.plain, self.plain_at
        out: list[RuleRow] = []
        later = 0  # plain flows decided after position i: each missed rule i
        later_at = NEVER
        for i in range(size, -1, -1):
            out.append(
                RuleRow(
                    disabled=i < size and bool(self.disabled[i]),
                    hits=plain[i] + self.exact_hits[i],
                    hit_at=max(plain_at[i], self.exact_hit_at[i]),
                    misses=later + self.exact_misses[i],
                    miss_at=max(later_at, self.exact_miss_at[i]),
                )
            )
            later += plain[i]
            later_at = max(later_at, plain_at[i])
        out.reverse()
        return out

    # --- the flags ----------------------------------------------------------------------------

    def check(self, changes: Mapping[int, bool]) -> None:
        """Raise ValueError naming the first index ``changes`` cannot set (the fallback's, one
        out of range) or a value that is not a bool; changes nothing."""
        for index, disabled in changes.items():
            if type(index) is not int:
                raise ValueError(f"rule index {index!r} is not an integer")
            if type(disabled) is not bool:
                raise ValueError(f"rule {index}: the value must be true or false")
            if index == self.size:
                raise ValueError(f"rule {index} is the fallback (Match) rule, which cannot be disabled")
            if not 0 <= index < self.size:
                raise ValueError(
                    f"no rule {index}: the rules are 0..{self.size - 1}"
                    if self.size
                    else f"no rule {index}: there are no rules"
                )

    def enable_all(self) -> None:
        """Every rule enabled again (a reload re-reads the file); counters are kept."""
        off = {index: False for index in range(self.size) if self.disabled[index]}
        if off:
            self.set_disabled(off)

    def set_disabled(self, changes: Mapping[int, bool]) -> None:
        """Disable (True) or enable (False) rules by index; all or nothing (see :meth:`check`).
        The next search reads the new flags; counters are kept."""
        self.check(changes)
        for index, disabled in changes.items():
            self.disabled[index] = disabled
        flags = self.disabled
        first = flags.find(1)
        self.first_disabled = first if first >= 0 else self.size + 1
        self.active = tuple(rule for rule, off in zip(self.rules, flags, strict=True) if not off)
