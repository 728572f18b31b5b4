"""Score's ordinary selection, sans-I/O (GH-K-01, 05, 06, 29, 34, 35, 44..46, 77, 82, 125..129).

:class:`ScoreState` is the one Score object of a group manager. It holds the evidence, the
failure cohorts, the switch history, the first-choice performance provider, the budget scopes
and the reason counters, and :meth:`ScoreState.rank` turns them into one authoritative leaf.

A rank runs in this order:

1. ``exclude`` removes NodeIds (the failed leaf of a Score-owned setup retry, GH-K-77), then the
   liveness filter's verdict removes dead members (``deadFiltered``). No score can bring a dead
   member back (GH-K-01); with no live member the rank returns no winner and the caller decides
   about last resort.
2. Recent-failure exclusion (GH-K-46): a member with an open failure episode whose newest failure
   is younger than RECENT_FAILURE_WINDOW is not eligible (``failStreakExcluded``), unless that
   would leave nobody: liveness, not Score, decides whether a group can serve.
3. The eligible members are ordered (GH-K-06, no randomness): the members whose blended
   reliability lower bound is within RELIABILITY_BAND of the best form the front, ordered by
   fresh utility (None last: missing performance is never a gain, GH-K-31), then reliability,
   then configuration order; the rest follow by reliability, utility, configuration order.
   Reliability comes first, so a faster node that keeps failing never outranks a reliable one
   (GH-K-29); sample volume enters only through the Beta bound, never as a bonus.
   Reading the members and ordering them is the compiled ``honk._fast.rank`` kernel.
4. Optional trials, funded by the scope's ledger (GH-K-82..86, 90): each original applied rank
   (not a peek, not a retry through ``exclude``) earns 1/EARN_DIVISOR credit E; a trial spends
   one, and ``V <= B + floor(E)`` always holds (V spent, B the frozen cold allowance; a trial is
   reserved and begun at once, because an applied rank is the dispatch, so R stays 0). Unspent
   earned credit is clamped at EARNED_CREDIT_CAP. A trial is never an incumbent nor a switch
   (GH-K-96). Dispatch order (GH-K-98): untrained members first, then recovery.

   a. Cold exploration (``coldExplore``): the first eligible unqualified member in configuration
      order not yet tried in the scope and without an open failure episode (that member's
      question is recovery, and it is backing off).
   b. Recovery (``periodicExplore``, the seed's reason for funded half-open work: recovery is the
      first open question of GH-K-97): a member with an open failure episode for this target's
      cells. After a real failure it backs off (GH-K-95) for EXPLORATION_BACKOFF_MIN, doubled on
      every further failure up to EXPLORATION_BACKOFF_MAX, with at most one unanswered trial
      (GH-K-94). Once a trial's RX is accepted behind the failure fence (GH-K-36), the next
      flows keep going to it as funded recovery continuations until four reporters clear the
      episode (GH-K-37) or it fails again; ordinary selection then promotes it on its merits.
      Retries never get a recovery trial (GH-K-91).
5. Otherwise the ordinary winner: the incumbent (the last ordinary winner of this
   ``(group, network, family, target)``) escapes at once when it is dead, excluded or no longer
   a member (``incumbentIneligible``), or when it has an unresolved failure (``freshFailureBypass``,
   GH-K-34); else it is kept unless the best challenger beats it by a margin (hysteresis).

Reason precedence (GH-K-125: exactly one final reason per applied multi-candidate rank), the
spec's own listing order, first applicable wins:
``coldExplore`` > ``periodicExplore`` > ``incumbentIneligible`` > ``freshFailureBypass`` > ``insufficientEvidenceHeld``
> ``incumbentHeld`` > ``reliabilityWinner`` > ``performanceWinner``. A trial names the work
actually applied, so it outranks escape; escape outranks any hold because the incumbent did not
compete; the held reasons apply only when an incumbent was kept; the winner reasons apply to a
first choice or a promotion.

Peek, a single remaining candidate (singleton bypass) and no live candidate (the caller's last
resort) change nothing: no counter, no allowance, no earned credit, no incumbent, no switch
(GH-K-129).

What the group serves now (the Clash ``now``, warm-up's current pick, the native selection) is
per group and network, not per target: :meth:`ScoreState.served` is the member of the last
applied rank that served flows as an ordinary pick (an ordinary winner, an escape, a retry's
pick or a singleton; never a trial, which is one flow's work, GH-K-96), kept for display only
(it is no incumbent of any target). A targetless peek, the read "what does the group serve
now", answers that member while it is eligible (a targetless rank would compare the members on
targetless evidence, where a node that failed every flow to the group's one target looks clean,
and name a node no flow goes to); once it is dead or failed, the member an ordinary rank moves
to. It shows no trial and changes nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from honk._fast.rank import (
    Candidate,
    aligned,
    find,
    first_cold,
    first_sound,
    forget_resolved,
    leaders,
    live,
    members_first,
    placed,
    positions,
    survey,
)
from honk._fast.rank import candidates as rank_candidates
from honk._fast.rank import order as rank_order
from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.cohort import Cohorts
from honk.group.score.constants import (
    EARN_DIVISOR,
    EARNED_CREDIT_CAP,
    EXPLORATION_BACKOFF_GROWTH,
    EXPLORATION_BACKOFF_MAX,
    EXPLORATION_BACKOFF_MIN,
    HOLD_RELIABILITY_MARGIN,
    HOLD_UTILITY_MARGIN,
    RECENT_FAILURE_WINDOW,
    RELIABILITY_BAND,
    SWITCH_HISTORY_MAX,
    TARGET_ESCAPE_FAILURES,
    TRIAL_ANSWER_TIMEOUT,
    cold_allowance,
)
from honk.group.score.evidence import EvidenceStats, ScoreEvidence
from honk.group.score.keys import NodeId, ScoreTarget, layer_rows
from honk.group.score.switches import SwitchHistory

# Final reasons, in precedence order (see the module docstring).
COLD_EXPLORE = "coldExplore"
PERIODIC_EXPLORE = "periodicExplore"  # recovery trials and continuations (funded half-open work)
INCUMBENT_INELIGIBLE = "incumbentIneligible"
FRESH_FAILURE_BYPASS = "freshFailureBypass"
INSUFFICIENT_EVIDENCE_HELD = "insufficientEvidenceHeld"
INCUMBENT_HELD = "incumbentHeld"
RELIABILITY_WINNER = "reliabilityWinner"
PERFORMANCE_WINNER = "performanceWinner"
FINAL_REASONS = (
    COLD_EXPLORE,
    PERIODIC_EXPLORE,
    INCUMBENT_INELIGIBLE,
    FRESH_FAILURE_BYPASS,
    INSUFFICIENT_EVIDENCE_HELD,
    INCUMBENT_HELD,
    RELIABILITY_WINNER,
    PERFORMANCE_WINNER,
)
# Candidate counters (GH-K-128): affected candidates, not flows.
DEAD_FILTERED = "deadFiltered"
FAIL_STREAK_EXCLUDED = "failStreakExcluded"
CANDIDATE_COUNTERS = (DEAD_FILTERED, FAIL_STREAK_EXCLUDED)
# Neutral outcomes: never counted (GH-K-129).
PEEK = "peek"
SINGLETON = "singleton"
NO_CANDIDATE = "noCandidate"


class Member(NamedTuple):
    """One configured member as the liveness filter left it; ``alive`` is its verdict. (A named
    tuple: one is built per member per rank, and a tuple builds several times faster.)"""

    name: str
    node_id: NodeId
    alive: bool


class Ranked:
    """``winner`` (None: no live candidate), the reason (a final reason or a neutral one) and
    ``order``, the eligible members in rank order (the trial, if any, first). A rank decides on
    its leaders alone; the whole order is sorted only when it is read."""

    __slots__ = ("winner", "reason", "_order", "_eligible", "_first")

    def __init__(
        self,
        winner: Member | None,
        reason: str,
        order: tuple[Member, ...] | None = None,
        eligible: list[Candidate] | None = None,
        first: Candidate | None = None,
    ) -> None:
        self.winner = winner
        self.reason = reason
        self._order = order  # None: sorted from ``eligible`` on the first read, ``first`` first
        self._eligible = eligible
        self._first = first

    @property
    def order(self) -> tuple[Member, ...]:
        if self._order is None:
            self._order = members_first(rank_order(self._eligible, RELIABILITY_BAND), self._first)
            self._eligible = self._first = None
        return self._order

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ranked):
            return NotImplemented
        return (self.winner, self.reason, self.order) == (other.winner, other.reason, other.order)

    def __hash__(self) -> int:
        return hash((self.winner, self.reason, self.order))

    def __repr__(self) -> str:
        return f"Ranked(winner={self.winner!r}, reason={self.reason!r}, order={self.order!r})"


_NO_UTILITIES: tuple[None] = (None,)  # without a performance provider every utility is unknown


class PerformanceProvider(Protocol):
    """The first-choice heuristic: utility in [0, 1], None for no fresh performance (GH-K-31)."""

    def score(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        candidates: Sequence[NodeId],
        now: float,
    ) -> Sequence[float | None]:
        """Each candidate's utility, in the candidates' order."""


@dataclass(slots=True)
class BudgetScope:
    """A (group, network, family) scope's trial ledger: its member count and cold allowance B,
    frozen when it is first retained (GH-K-82), the earned currency E (GH-K-83), the optional
    trials spent V (cold and recovery alike) and the members already tried cold."""

    members: int
    allowance: int
    spent: int = 0
    tried: set = field(default_factory=set)
    earned: float = 0.0

    @property
    def remaining(self) -> int:
        """Trials the ledger admits now: ``B + floor(E) - V`` (never negative, GH-K-85)."""
        return self.allowance + math.floor(self.earned) - self.spent

    def earn(self) -> None:
        """One original business start adds 1/q (GH-K-83), clamped so that the unspent earned
        credit ``floor(E) - max(0, V - B)`` stays at most EARNED_CREDIT_CAP (GH-K-85)."""
        cap = EARNED_CREDIT_CAP + max(0, self.spent - self.allowance)
        self.earned = min(self.earned + 1.0 / EARN_DIVISOR, float(cap))

    def spend(self) -> None:
        """Reserve and begin one trial at once (the applied rank is the dispatch, GH-K-90)."""
        if self.remaining < 1:
            raise ValueError("the ledger admits no trial")
        self.spent += 1


class _Backoff:
    """A member's exploration backoff for one (group, network, family, target) while its
    failure streak lasts (GH-K-95): the newest failure seen, the current delay, and the last
    recovery trial sent since that failure. Recovery ends the streak and drops it. Never
    changed once made (a change makes a new one); a plain slotted class, because a rank makes
    one for each unresolved member of a target it has not held yet."""

    __slots__ = ("failure", "delay", "trial_at")

    def __init__(self, failure: float, delay: float, trial_at: float | None = None) -> None:
        self.failure = failure
        self.delay = delay
        self.trial_at = trial_at

    def __repr__(self) -> str:
        return f"_Backoff(failure={self.failure}, delay={self.delay}, trial_at={self.trial_at})"

    def after_failure(self, failure: float) -> _Backoff:
        """The backoff after a failure newer than ``self.failure``: it grows when the failure
        came after a trial (the trial failed), and otherwise (another flow of the burst that
        opened the streak) stays as it is."""
        delay = self.delay
        if self.trial_at is not None and failure >= self.trial_at:
            delay = min(self.delay * EXPLORATION_BACKOFF_GROWTH, EXPLORATION_BACKOFF_MAX)
        return _Backoff(failure, delay)


def _winner_reason(winner: Candidate, eligible: list[Candidate]) -> str:
    """Why a first choice or promotion won: performance only when fresh utility decided it
    among members of comparable reliability; reliability (or configuration order) otherwise."""
    best = max(c.reliability for c in eligible)
    rivals = [c for c in eligible if c is not winner and c.reliability >= best - RELIABILITY_BAND]
    if winner.utility is not None and rivals:
        return PERFORMANCE_WINNER
    return RELIABILITY_WINNER


def _challenge(incumbent: Candidate, challenger: Candidate) -> str | None:
    """The reason the challenger displaces the incumbent, or None when the incumbent holds.

    Reliability first: a challenger more reliable by HOLD_RELIABILITY_MARGIN wins outright; one
    less reliable by that margin loses. In between, fresh utility must beat the incumbent's by
    HOLD_UTILITY_MARGIN. An unqualified challenger is never promoted: the heuristic proposes,
    it does not prove (GH-K-33). Nor is a challenger whose own failure is unresolved: it would
    lose to the bypass on the very next flow, so promoting it only makes the selection flap."""
    if not challenger.qualified or challenger.unresolved:
        return None
    if challenger.reliability > incumbent.reliability + HOLD_RELIABILITY_MARGIN:
        return RELIABILITY_WINNER
    if challenger.reliability < incumbent.reliability - HOLD_RELIABILITY_MARGIN:
        return None
    if challenger.utility is None or incumbent.utility is None:
        return None
    if challenger.utility > incumbent.utility + HOLD_UTILITY_MARGIN:
        return PERFORMANCE_WINNER
    return None


class ScoreState:
    """The manager's Score state: evidence, cohorts, switches, budgets, counters (GH-K-07)."""

    def __init__(
        self,
        performance: PerformanceProvider | None = None,
        *,
        evidence: ScoreEvidence | None = None,
        cohorts: Cohorts | None = None,
        switches: SwitchHistory | None = None,
        history_max: int = SWITCH_HISTORY_MAX,
    ) -> None:
        self.performance = performance
        self.evidence = evidence if evidence is not None else ScoreEvidence()
        self.cohorts = cohorts if cohorts is not None else Cohorts()
        self.switches = switches if switches is not None else SwitchHistory(history_max)
        self.scopes: dict[tuple[str, Network, Family | None], BudgetScope] = {}
        # the incumbent of a (group, network, family, target) is its switch history's last winner
        # exploration backoff per ((group, network, family, target), member); bounded the same way
        # (grouped by history key, so a rank looks up one entry and not one per member)
        self._backoffs: OrderedDict[Hashable, dict[NodeId, _Backoff]] = OrderedDict()
        self._history_max = history_max
        self._counters: dict[tuple[str, Network], dict[str, int]] = {}
        self._valid: frozenset[tuple[str, NodeId]] | None = None
        # per (group, network): the last members list ranked without exclusions, its live()
        # reading, the set of its live nodes and their positions (positions())
        self._live: dict[tuple[str, Network], tuple] = {}
        # per (group, network, family): the live nodes it was read for, the aggregate store's
        # row_changes then, and the global and family rows' cells aligned with those nodes
        self._aligned: dict[tuple, tuple] = {}
        # per (group, network): the node of the member the last applied ordinary rank served
        # (display: what the group serves now; see the module docstring)
        self._served: dict[tuple[str, Network], NodeId] = {}

    # --- ranking --------------------------------------------------------------------------------

    def rank(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        members: Sequence[Member],
        now: float,
        *,
        exclude: frozenset = frozenset(),
        peek: bool = False,
    ) -> Ranked:
        """Rank ``members`` (configuration order) for one flow; see the module docstring.

        ``members`` is only read, and its live reading is kept while the same list object comes
        back (the manager keeps a group's list until health changes): a caller never changes a
        list it has ranked, it passes a new one."""
        if exclude:
            alive, nodes, dead = live(members, exclude)
            place = positions(nodes)
        else:  # a group's members list is kept while health stands still (GroupManager): so is its reading
            known = self._live.get((group, network))
            if known is not None and known[0] is members:
                alive, nodes, dead = known[1]
                place = known[3]
            else:
                alive, nodes, dead = reading = live(members, exclude)
                place = positions(nodes)
                self._live[(group, network)] = (members, reading, frozenset(nodes), place)
        if not alive:
            return Ranked(None, NO_CANDIDATE, ())
        if len(alive) == 1:  # singleton bypass: nothing to rank, nothing to count
            if not peek:  # (only what the group serves now: no incumbent, switch or counter)
                self._served[(group, network)] = alive[0][1].node_id
            return Ranked(alive[0][1], SINGLETON, (alive[0][1],))

        candidates = self._candidates(group, network, target, family, alive, nodes, place, now)
        # a recent node-scoped failure keeps a member out; a target-path one only opens its cell
        # (and when every live member failed recently, all are ranked rather than none)
        eligible, unresolved = survey(candidates)
        excluded = len(candidates) - len(eligible)
        if peek and target is None:
            served = self._served.get((group, network))
            if served is not None:  # "what does the group serve now": what it served, while it may
                kept = find(eligible, served)
                if kept is None:  # dead, failed or gone: where an ordinary rank would go from it
                    kept, _ = self._ordinary(eligible, candidates, served)
                return Ranked(kept.member, PEEK, None, eligible, kept)

        scope_key = (group, network, family)
        scope = self.scopes.get(scope_key)
        history_key = (group, network, family, target)
        incumbent_id = self.switches.winner(history_key)
        original = not exclude  # a retry through ``exclude`` neither earns nor gets a recovery trial
        # the ledger as this rank would leave it: peek works on a copy and commits nothing
        if scope is None:
            ledger = BudgetScope(len(members), cold_allowance(len(members)))
        elif peek:
            ledger = BudgetScope(scope.members, scope.allowance, scope.spent, set(scope.tried), scope.earned)
        else:
            ledger = scope
        if original:
            ledger.earn()
        held = self._backoffs.get(history_key)
        for c in unresolved:
            current = held.get(c.member.node_id) if held else None
            failure = c.last_failure
            if current is None:  # the first failure of a streak starts it (now: the evidence forgot it)
                c.backoff = _Backoff(now if failure is None else failure, EXPLORATION_BACKOFF_MIN)
            elif failure is None or failure <= current.failure:
                c.backoff = current  # the streak goes on with no newer failure: as held
            else:
                c.backoff = current.after_failure(failure)

        # cold exploration: the first untried unqualified eligible member (untrained first, GH-K-98);
        # a member with an open episode has recovery as its question (GH-K-97) and its backoff
        cold = first_cold(eligible, ledger.tried) if ledger.remaining > 0 else None  # configuration order

        trial_reason = None
        if cold is not None:
            winner, reason, trial_reason = cold, COLD_EXPLORE, COLD_EXPLORE
        else:
            winner, reason = self._ordinary(eligible, candidates, incumbent_id)
            if original and ledger.remaining > 0:
                recovery = self._recovery(eligible, unresolved, now)
                if recovery is not None and recovery is not winner:
                    winner, reason, trial_reason = recovery, PERIODIC_EXPLORE, PERIODIC_EXPLORE
        if peek:
            return Ranked(winner.member, PEEK, None, eligible, winner)

        # applied: commit the work, then count exactly one final reason
        if scope is None:
            scope = self.scopes[scope_key] = ledger
        if unresolved or held:
            kept = held if held is not None else {}  # updated in place: a peek never gets here
            if held:  # recovered candidates end their streak; members not ranked keep theirs
                ranked = frozenset(nodes) if exclude else self._live[(group, network)][2]
                forget_resolved(kept, ranked, unresolved)
            for c in unresolved:
                backoff = c.backoff
                if trial_reason == PERIODIC_EXPLORE and c.member.node_id == winner.member.node_id:
                    backoff = _Backoff(backoff.failure, backoff.delay, now)  # type: ignore[union-attr]
                kept[c.member.node_id] = backoff
            if not kept:
                self._backoffs.pop(history_key, None)
            elif held is not None:
                self._backoffs.move_to_end(history_key)
            else:
                self._backoffs[history_key] = kept
                while len(self._backoffs) > self._history_max:
                    self._backoffs.popitem(last=False)
        if trial_reason is not None:
            scope.spend()
            if trial_reason == COLD_EXPLORE:
                scope.tried.add(winner.member.node_id)
        else:
            self.switches.record(group, network, history_key, winner.member.node_id)
            self._served[(group, network)] = winner.member.node_id
        counters = self._scope_counters(group, network)
        counters[reason] += 1
        counters[DEAD_FILTERED] += dead
        counters[FAIL_STREAK_EXCLUDED] += excluded
        return Ranked(winner.member, reason, None, eligible, winner)

    def served(self, group: str, network: Network) -> NodeId | None:
        """The node of the member ``group`` last served ``network`` flows with as an ordinary
        pick (an applied rank that was no trial), None before any; display only."""
        return self._served.get((group, network))

    def _recovery(
        self, eligible: list[Candidate], unresolved: list[Candidate], now: float
    ) -> Candidate | None:
        """The member owed a recovery trial (GH-K-36, 94, 95, 97): continuations (an RX already
        accepted behind the fence: the most progress, GH-K-98) before first trials whose backoff
        has elapsed and whose previous trial is answered or timed out; configuration order.
        Only a member with an open episode (``unresolved``, each with its backoff) is owed one."""
        if not unresolved:
            return None
        first = None
        for c in eligible:  # configuration order
            backoff = c.backoff
            if backoff is None:  # no open episode
                continue
            if c.cleared:
                return c  # a continuation comes before any first trial
            if (
                first is None
                and now >= backoff.failure + backoff.delay
                and (  # the backoff elapsed
                    backoff.trial_at is None or now - backoff.trial_at >= TRIAL_ANSWER_TIMEOUT
                )
            ):
                first = c
        return first

    def _ordinary(
        self, eligible: list[Candidate], candidates: list[Candidate], incumbent_id: NodeId | None
    ) -> tuple[Candidate, str]:
        top, second = leaders(eligible, RELIABILITY_BAND)
        if incumbent_id is None:
            return top, _winner_reason(top, eligible)
        # the ids of one manager's members are the same objects; after a reload, equal ones
        incumbent = find(candidates, incumbent_id)
        if incumbent is None:  # dead, excluded by the caller or no longer a member: escape at once
            return top, INCUMBENT_INELIGIBLE
        if incumbent.unresolved:
            # an unresolved failure loses at once to another eligible member (GH-K-34), one
            # without an unresolved failure of its own: swapping one failed node for another
            # only makes the selection flap
            sound = first_sound(eligible, RELIABILITY_BAND, incumbent)
            if sound is not None and self._escapes(incumbent, sound):
                return sound, FRESH_FAILURE_BYPASS
            return incumbent, INCUMBENT_HELD
        if second is None:  # the others were all excluded for a recent failure: nothing to compare
            return incumbent, INCUMBENT_HELD
        challenger = second if top is incumbent else top
        promoted = _challenge(incumbent, challenger)
        if promoted is not None:
            return challenger, promoted
        if top is challenger and (
            not challenger.qualified or challenger.utility is None or incumbent.utility is None
        ):
            # the challenger ranks first but has no shared comparison that could promote it
            return incumbent, INSUFFICIENT_EVIDENCE_HELD
        return incumbent, INCUMBENT_HELD

    def _escapes(self, incumbent: Candidate, sound: Candidate) -> bool:
        """Whether the incumbent's unresolved failure makes it leave now (GH-K-34 permits it; it
        does not require it). A node-scoped failure always does: every target shares the cause.
        A target-path failure does when it is not the first independent one of its episode, or
        when the blended evidence already prefers the sound member. A lone one is held: the
        incumbent's next flows are the reporters that can recover the cell, and a chance
        failure of the best node must not send its target away for a whole backoff."""
        if incumbent.node_failure:
            return True
        if any(episode.open_failures >= TARGET_ESCAPE_FAILURES for _, episode in incumbent.episodes):
            return True
        return sound.reliability > incumbent.reliability + HOLD_RELIABILITY_MARGIN

    def _candidates(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        alive: list[tuple[int, Member]],
        nodes: list[NodeId],
        place: tuple,
        now: float,
    ) -> list[Candidate]:
        target_for_read = target if family is not None else None  # no family: only the global aggregate
        utilities: Sequence[float | None] = _NO_UTILITIES * len(alive)
        if self.performance is not None:
            utilities = self.performance.score(group, network, target, family, nodes, now)
        # each layer's cells and open episodes in the members' order (the same cells
        # ScoreEvidence.layers reads). The aggregate rows hold nearly every member and change
        # only when a cell is made or dropped, so their alignment is kept; a target's row and
        # the open episodes hold a few nodes, walked each time.
        rows = layer_rows(group, network, family, target_for_read)
        aggregate = self.evidence.aggregate
        scope = (group, network, family)
        known = self._aligned.get(scope)
        if known is not None and known[0] is nodes and known[1] == aggregate.row_changes:
            globs, families = known[2], known[3]
        else:
            globs, families = aligned(nodes, aggregate.row(rows[0])), aligned(nodes, aggregate.row(rows[1]))
            self._aligned[scope] = (nodes, aggregate.row_changes, globs, families)
        position, aliases = place
        count = len(nodes)
        exacts = placed(self.evidence.exact.row(rows[2]), position, aliases, count)
        open_states = self.cohorts.open_states
        return rank_candidates(
            alive,
            utilities,
            globs,
            families,
            exacts,
            placed(open_states(rows[0]), position, aliases, count),
            placed(open_states(rows[1]), position, aliases, count),
            placed(open_states(rows[2]), position, aliases, count),
            now,
            RECENT_FAILURE_WINDOW,
        )

    def _scope_counters(self, group: str, network: Network) -> dict[str, int]:
        counters = self._counters.get((group, network))
        if counters is None:
            counters = self._counters[(group, network)] = dict.fromkeys(FINAL_REASONS + CANDIDATE_COUNTERS, 0)
        return counters

    # --- lifecycle ------------------------------------------------------------------------------

    def prune(self, valid: Iterable[tuple[str, NodeId]]) -> int:
        """Publish the (group, node) membership (GH-K-08): evidence drops removed cells; deleted
        groups lose their scopes, counters and switch counters; retained scopes keep their frozen
        n and B and what they spent (GH-K-82). Returns the evidence cells dropped."""
        self._valid = frozenset(valid)
        dropped = self.evidence.prune(self._valid)
        groups = {g for g, _ in self._valid}
        for key in [k for k in self._live if k[0] not in groups]:
            del self._live[key]
        for key in [k for k in self._aligned if k[0] not in groups]:
            del self._aligned[key]
        for key in [k for k, node in self._served.items() if (k[0], node) not in self._valid]:
            del self._served[key]
        for key in [k for k in self.scopes if k[0] not in groups]:
            del self.scopes[key]
        for (group, _network, _family), scope in self.scopes.items():
            scope.tried = {n for n in scope.tried if (group, n) in self._valid}
        self.switches.forget_winners(lambda key, node: (key[0], node) in self._valid)
        for history_key in list(self._backoffs):
            held = self._backoffs[history_key]
            for node in [n for n in held if (history_key[0], n) not in self._valid]:
                del held[node]
            if not held:
                del self._backoffs[history_key]
        for key in [k for k in self._counters if k[0] not in groups]:
            del self._counters[key]
        for group in {g for g, _ in self.switches.counters} - groups:
            self.switches.forget_group(group)
        return dropped

    def reload(self, now: float, valid: Iterable[tuple[str, NodeId]] | None = None) -> int:
        """A committed reload at ``now``: prune to ``valid`` (default: the last published
        membership), revoke leases and restart cohorts behind a reload fence. Budget scopes,
        incumbents and counters survive; the reload itself creates no failure."""
        if valid is not None:
            self.prune(valid)
        if self._valid is None:
            raise ValueError("reload needs the membership: none was published yet")
        dropped = self.evidence.reload(self._valid, now)
        self.cohorts.reload(now)
        return dropped

    # --- export ---------------------------------------------------------------------------------

    def stats(self) -> dict:
        """``/stats.score`` fields (GH-K-130): fixed counters per (group, network), budget totals per
        group and network, and evidence cache totals. No node, target or cell identity."""
        scopes: dict[tuple[str, Network], dict] = {}
        for key in set(self._counters) | set(self.switches.counters) | {(g, n) for g, n, _ in self.scopes}:
            scopes[key] = {}
        groups = []
        for group, network in sorted(scopes, key=lambda k: (k[0], str(getattr(k[1], "value", k[1])))):
            counters = self._counters.get((group, network)) or dict.fromkeys(
                FINAL_REASONS + CANDIDATE_COUNTERS, 0
            )
            switches = self.switches.counters.get((group, network))
            budgets = [s for (g, n, _), s in self.scopes.items() if g == group and n == network]
            groups.append(
                {
                    "group": group,
                    "network": getattr(network, "value", network),
                    "reasons": {r: counters[r] for r in FINAL_REASONS},
                    "candidates": {c: counters[c] for c in CANDIDATE_COUNTERS},
                    "ordinarySwitch": switches.ordinary_switch if switches else 0,
                    "switchFlap": switches.switch_flap if switches else 0,
                    "coldAllowance": sum(s.allowance for s in budgets),
                    "coldSpent": sum(s.spent for s in budgets),
                }
            )
        cache: EvidenceStats = self.evidence.stats()
        return {
            "groups": groups,
            "cache": {
                "exactEntries": cache.exact_entries,
                "exactCapacity": cache.exact_capacity,
                "exactEvictions": cache.exact_evictions,
                "aggregateEntries": cache.aggregate_entries,
                "aggregateCapacity": cache.aggregate_capacity,
                "aggregateEvictions": cache.aggregate_evictions,
            },
        }


__all__ = [
    "CANDIDATE_COUNTERS",
    "FINAL_REASONS",
    "BudgetScope",
    "Member",
    "PerformanceProvider",
    "Ranked",
    "ScoreState",
]
