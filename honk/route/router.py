"""The compiled router: ordered rules to an outbound name, sans-I/O.

Theory of operation:
  * :meth:`Router.compile` turns a :class:`~honk.config.spec.RoutingSpec` into
    per-rule tuples of ``(match, negated)`` pairs once. Within a rule the
    predicates that need the destination IP (``dip``, ``ipversion``) are kept
    apart and evaluated last: a rule whose other predicates already fail never
    asks for DNS.
  * :meth:`Router.route` walks the rules from ``start``; the first rule whose
    predicates all hold wins. A ``(must)`` rule is simply a match whose
    decision carries ``must=True``. A ``must_rules`` rule (dae's "do not hijack
    this traffic's DNS and continue matching") never wins: when it holds, the
    search goes on and the decision it ends with (a rule's or the fallback's)
    carries ``must=True``, as in dae. A search resumed at ``start`` reads the
    ``must_rules`` rules before ``start`` again.
  * When a rule's other predicates hold, it has destination-IP predicates, and
    the target is a domain without a ``resolved`` IP, ``route`` returns
    :class:`NeedsResolution` naming that rule. The caller resolves and calls
    ``route(replace(meta, resolved=ip), start=rule_index)``; if resolution
    failed it calls ``route(meta, start=rule_index, resolution_failed=True)``.
  * Each router owns a :class:`~honk.route.rulestats.RuleStats`: per-rule hit and
    miss counters and the disabled flags (``PATCH /rules/disable``). A disabled
    rule is skipped, as if it were not in the list. A search is counted once,
    by the call that returns a decision, with the ``now`` it was given: a call
    that returns :class:`NeedsResolution` counts nothing, and the resumed call
    counts the rules before ``start`` too (the first call read them), so a
    caller that gives up after ``NeedsResolution`` and starts over counts no
    rule twice.

Invariants:
  * Nothing here performs I/O, reads a clock or compiles a regex per call.
  * An unknown domain (IP-literal target) counts as "not x": ``domain(x)``
    fails and ``!domain(x)`` holds.
  * After a failed resolution, a rule containing any destination-IP predicate
    does not match, whether that predicate is negated or not: routing on an
    address nobody could find would be a guess.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from honk.config.expr import MUST_RULES
from honk.config.spec import RoutingSpec, RuleSpec
from honk.core.net import FlowMeta
from honk.geo.assets import GeoAssets
from honk.route.matchers import (
    DESTINATION_IP_PREDICATES,
    PROCESS_PREDICATES,
    FlowView,
    compile_predicate,
    describe_predicate,
)
from honk.route.rulestats import NEVER, RuleStats

FALLBACK_RULE_TEXT = "fallback"
EMPTY_RULE_TEXT = "any"  # a rule without predicates matches every flow
_INDEX = attrgetter("index")  # a compiled rule's position: the key of a resumed search's bisection


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a flow goes and why.

    ``outbound`` is a group, node, ``direct`` or ``block`` name; ``rule`` is a
    short human text of the matched rule (``dport(22)&&!sip(10.0.0.0/8)``) or
    ``"fallback"``; ``rule_index`` is the rule's 0-based position, ``None`` for
    the fallback.
    """

    outbound: str
    rule: str
    must: bool
    rule_index: int | None
    mark: int | None = None  # dae's ``-> direct(mark: 0x800)``: the direct dial's socket mark


@dataclass(frozen=True, slots=True)
class NeedsResolution:
    """Rule ``rule_index`` needs the destination IP of a domain target.

    Resolve ``meta.target.host`` and call :meth:`Router.route` again with
    ``start=rule_index``.
    """

    rule_index: int


_Check = tuple[Callable[[FlowView], bool], bool]  # (positive match, negated)


@dataclass(frozen=True, slots=True)
class CompiledRule:
    index: int
    checks: tuple[_Check, ...]  # predicates answerable without the destination IP
    ip_checks: tuple[_Check, ...]  # predicates that read the destination IP
    decision: RouteDecision
    continues: bool = False  # a must_rules rule: when it holds, later decisions are must


def describe_rule(rule: RuleSpec) -> str:
    if not rule.predicates:
        return EMPTY_RULE_TEXT
    return "&&".join(describe_predicate(p) for p in rule.predicates)


class Router:
    """An immutable compiled rule list (with its mutable :attr:`stats`). Build with :meth:`compile`."""

    __slots__ = ("_rules", "_fallback", "_must_rules", "_stats", "reads_process")

    def __init__(
        self, rules: tuple[CompiledRule, ...], fallback: RouteDecision, reads_process: bool = False
    ) -> None:
        self._rules = rules
        self._fallback = fallback
        self._must_rules = tuple(r for r in rules if r.continues)
        self._stats = RuleStats(rules)  # this rule list's counters and flags: a new list starts afresh
        # a rule names a process: the host's own flows look their process up before routing
        self.reads_process = reads_process

    @classmethod
    def compile(cls, routing: RoutingSpec, geo: GeoAssets | None = None) -> Router:
        """Compile every rule once, geodata codes read from ``geo`` (None: the default asset
        directories). Raises :class:`~honk.route.matchers.RouteCompileError`."""
        compiled = []
        for index, rule in enumerate(routing.rules):
            checks: list[_Check] = []
            ip_checks: list[_Check] = []
            for predicate in rule.predicates:
                matcher = compile_predicate(predicate, geo)
                target = ip_checks if predicate.name in DESTINATION_IP_PREDICATES else checks
                target.append((matcher.match, predicate.negated))
            decision = RouteDecision(
                outbound=rule.outbound,
                rule=describe_rule(rule),
                must=rule.must,
                rule_index=index,
                mark=rule.mark,
            )
            continues = rule.outbound == MUST_RULES
            compiled.append(CompiledRule(index, tuple(checks), tuple(ip_checks), decision, continues))
        fallback = RouteDecision(
            outbound=routing.fallback,
            rule=FALLBACK_RULE_TEXT,
            must=routing.fallback_must,
            rule_index=None,
            mark=routing.fallback_mark,
        )
        reads_process = any(p.name in PROCESS_PREDICATES for rule in routing.rules for p in rule.predicates)
        return cls(tuple(compiled), fallback, reads_process)

    @property
    def rules(self) -> tuple[CompiledRule, ...]:
        return self._rules

    @property
    def fallback(self) -> RouteDecision:
        return self._fallback

    @property
    def stats(self) -> RuleStats:
        """The rules' hit and miss counters and disabled flags (position ``len(rules)``: the fallback)."""
        return self._stats

    def route(
        self, meta: FlowMeta, *, start: int = 0, resolution_failed: bool = False, now: float = NEVER
    ) -> RouteDecision | NeedsResolution:
        """Decide ``meta`` from rule ``start`` on; see the module docstring.

        ``resolution_failed`` says the caller tried to resolve the domain target
        and could not; destination-IP rules then do not match. ``now`` is the
        wall-clock time the counters record for this flow (the caller's clock).
        """
        rules = self._rules
        last = len(rules)  # the fallback's position
        if not 0 <= start <= last:
            raise ValueError(f"start {start} outside 0..{last}")
        stats = self._stats
        if start == last:  # nothing to match (a config of one fallback): no view to build
            if stats.first_disabled >= last:
                stats.plain[last] += 1
                stats.plain_at[last] = now
            else:
                stats.record_exact(last, now, None)
            return self._fallback
        view = FlowView.of(meta)
        ip_known = view.dst_ip is not None
        # the must_rules rules that held: None (the common case) until one does
        held = self._held_before(start, view, ip_known) if start and self._must_rules else None
        active: tuple[CompiledRule, ...] = stats.active
        if start:  # a resumed search: the enabled rules from ``start`` on
            active = active[bisect.bisect_left(active, start, key=_INDEX) :]
        for rule in active:
            if not _all_hold(rule.checks, view):
                continue
            if rule.ip_checks:
                if not ip_known:
                    if resolution_failed:
                        continue
                    return NeedsResolution(rule.index)
                if not _all_hold(rule.ip_checks, view):
                    continue
            index = rule.index
            if rule.continues:  # must_rules: a hit that does not end the search
                if held is None:
                    held = [index]
                else:
                    held.append(index)
                continue
            if held is None and stats.first_disabled >= index:  # every rule before it evaluated and missed
                stats.plain[index] += 1
                stats.plain_at[index] = now
                return rule.decision
            stats.record_exact(index, now, held)
            return _as_must(rule.decision) if held else rule.decision
        if held is None and stats.first_disabled >= last:
            stats.plain[last] += 1
            stats.plain_at[last] = now
            return self._fallback
        stats.record_exact(last, now, held)
        return _as_must(self._fallback) if held else self._fallback

    def _held_before(self, start: int, view: FlowView, ip_known: bool) -> list[int] | None:
        """The enabled ``must_rules`` rules before ``start`` that hold (None: none): a search
        resumed at ``start`` after :class:`NeedsResolution` carries the ``must`` the first
        call had found, and counts those rules' hits."""
        disabled = self._stats.disabled
        held: list[int] | None = None
        for rule in self._must_rules:
            if rule.index >= start:
                break
            if disabled[rule.index]:
                continue
            if _all_hold(rule.checks, view) and (
                not rule.ip_checks or (ip_known and _all_hold(rule.ip_checks, view))
            ):
                if held is None:
                    held = [rule.index]
                else:
                    held.append(rule.index)
        return held


def _as_must(decision: RouteDecision) -> RouteDecision:
    if decision.must:
        return decision
    return dataclasses.replace(decision, must=True)  # keeps the rule's own mark


def _all_hold(checks: tuple[_Check, ...], view: FlowView) -> bool:
    for match, negated in checks:
        # every matcher returns a real bool, so identity is exact here
        if match(view) is negated:
            return False
    return True
