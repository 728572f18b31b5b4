"""The four classic group policies: which member a group picks for a network, given health.

A policy sees its members through a :class:`Candidates` view the manager builds for one
selection: ``evaluate(member)`` resolves a member (a node, or a sub-group's own pick) and
says whether it is eligible for this network and family, with its ranking metric. A
policy returns the member's name, or ``None`` when it has no eligible pick (the manager
then follows the group's ``final``, or the sole-leaf TCP last resort).

``commit`` is False for a peek (introspection, warm-up, delay-test listings): nothing a
policy remembers changes then. Nothing here does I/O or reads a clock. ``commit(network,
member)`` says whether the served member replaced one the policy served before (the
selection moved); the manager reports that, so a policy holds no callback.

:data:`POLICIES` maps each configured policy (and strategy) to the factory that builds it;
:func:`make_policy` only looks it up.

* :class:`Selector`: the runtime choice for the network, else ``default``, else the member
  ``fixed(N)`` names (the first one without N), decided before and independently of health.
  An ineligible choice is not replaced by a sibling. ``fixed(N)`` with N past the last member
  (membership is known only at run time: filters, subscriptions) chooses nothing: the group
  serves its ``final`` or fails closed, as dae's "selected dialer index is out of range".
* :class:`URLTest`: the eligible member with the lowest ranking latency (the moving average;
  the newest sample for ``min``; the mean of the newest 10 for ``min_avg10``); strikes demote
  a member below every member without; the incumbent stays while
  ``best + tolerance >= incumbent`` (its current average, re-read each time) unless it
  carries strikes. TCP and UDP keep separate winners; UDP ranks by DataUdp, then DnsUdp,
  and mirrors the TCP winner while no eligible member has UDP evidence.
* :class:`LoadBalance`: the next eligible member after the last one served, per network.
* :class:`Random` (``policy: random``, kind LoadBalance): each served selection draws uniformly
  among the members eligible then, from the group's injectable RNG.
* :class:`Fallback`: the first eligible member, pinned per network until it stops being
  eligible or carries strikes while a member without strikes is eligible (a node that fails
  flows is left, not only a dead one); an earlier member's recovery does not take the pin back.
* :class:`Score`: the manager's shared :class:`~honk.group.score.ranker.ScoreState` ranks the
  eligible members for the flow's target; it remembers nothing itself.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from honk.config.spec import MIN_URLTEST_TOLERANCE, PICK_RANDOM, GroupSpec, Policy
from honk.core.errors import HonkError
from honk.core.net import IPAddress, Network
from honk.group.score.keys import NodeId, ScoreTarget, target_family
from honk.group.score.ranker import Member, Ranked, ScoreState

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


class Epoch:
    """Counts changes of any policy's remembered state in one manager (cached picks expire)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


@dataclass(frozen=True, slots=True)
class Candidate:
    """One member as a selection sees it."""

    member: str
    index: int  # declaration order
    eligible: bool
    metric: float | None = None  # ranking latency in seconds (URLTest), None: unmeasured
    udp_metric: float | None = None  # DataUdp, else DnsUdp average; None: no UDP evidence
    demoted: bool = False  # carries ranking strikes


class Candidates(Protocol):
    """The members of one group for one selection (network and family fixed)."""

    network: Network

    def evaluate(self, member: str) -> Candidate: ...

    def all(self) -> list[Candidate]: ...


class GroupPolicy(Protocol):
    name: str
    members: tuple[str, ...]
    kind: Policy
    epoch: Epoch

    def pick(self, candidates: Candidates, commit: bool) -> str | None: ...

    def commit(self, network: Network, member: str) -> bool:
        """Remember that ``member`` served ``network`` (what ``pick`` with commit would do);
        whether it replaced the member served before (the selection moved)."""


class Selector:
    """Runtime choice (per network) → ``default`` → the ``fixed(N)`` member (N = 0 without one);
    health never substitutes. N past the last member chooses nothing (dae: an error, not a
    sibling)."""

    kind = Policy.SELECTOR
    __slots__ = ("name", "members", "default", "fixed_index", "epoch", "_member_set", "_choice")

    def __init__(
        self,
        name: str,
        members: tuple[str, ...],
        default: str | None = None,
        epoch: Epoch | None = None,
        fixed_index: int | None = None,
    ) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self._member_set = frozenset(members)
        self.fixed_index = fixed_index
        if default is not None and default not in self._member_set:
            log.warning(
                "group %s: default %r is not a member; using the %s instead",
                name,
                default,
                "first member" if fixed_index is None else f"fixed({fixed_index}) member",
            )
            default = None
        if default is None and fixed_index is not None and fixed_index >= len(members):
            log.warning(
                "group %s: fixed(%d) is past its %d members; it serves only its final until a "
                "member is chosen",
                name,
                fixed_index,
                len(members),
            )
        self.default = default
        self._choice: dict[Network, str] = {}

    def chosen(self, network: Network) -> str | None:
        """The effective member for ``network``, before health."""
        choice = self._choice.get(network)
        if choice is not None:
            return choice
        if self.default is not None:
            return self.default
        index = self.fixed_index or 0
        return self.members[index] if index < len(self.members) else None

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        chosen = self.chosen(candidates.network)
        if chosen is None:
            return None
        return chosen if candidates.evaluate(chosen).eligible else None

    def commit(self, network: Network, member: str) -> bool:
        return False  # a Selector's choice changes only by a write

    def validate(self, member: str) -> None:
        if member not in self._member_set:
            raise UnknownMember(self.name, member)

    def choose(self, member: str, networks: tuple[Network, ...]) -> list[Network]:
        """Set the choice for ``networks`` (validated once, all or nothing); the networks that changed."""
        self.validate(member)
        changed = [net for net in networks if self._choice.get(net) != member]
        for net in networks:
            self._choice[net] = member
        if changed:
            self.epoch.bump()
        return changed

    def choices(self) -> dict[Network, str]:
        return dict(self._choice)

    def restore(self, choices: Mapping[Network, str]) -> None:
        for network, member in choices.items():
            if member in self._member_set:
                self._choice[network] = member
                self.epoch.bump()


class Fixable:
    """A runtime pin ("fixed") on an automatic policy: while the pinned member is eligible it
    serves, like a Selector choice; otherwise the policy decides as usual. Runtime only: a
    configuration activation builds policies without pins (GH-A-16)."""

    __slots__ = ()
    _fixed: dict[Network, str]
    members: tuple[str, ...]
    name: str
    epoch: Epoch

    def fixed(self) -> dict[Network, str]:
        return dict(self._fixed)

    def fix(self, member: str | None, networks: tuple[Network, ...]) -> list[Network]:
        """Pin ``member`` (None: unpin) for ``networks``; the networks whose pin changed."""
        if member is not None and member not in self.members:
            raise UnknownMember(self.name, member)
        changed = [net for net in networks if self._fixed.get(net) != member]
        for net in changed:
            if member is None:
                self._fixed.pop(net, None)
            else:
                self._fixed[net] = member
        if changed:
            self.epoch.bump()
        return changed


def _fixed_pick(fixed: dict[Network, str], candidates: Candidates) -> str | None:
    member = fixed.get(candidates.network)
    if member is not None and candidates.evaluate(member).eligible:
        return member
    return None


def _remember(served: dict[Network, str], network: Network, member: str, epoch: Epoch) -> bool:
    """Keep ``member`` as ``network``'s served one; whether it replaced an earlier one."""
    previous = served.get(network)
    if previous == member:
        return False
    served[network] = member
    epoch.bump()
    return previous is not None


class URLTest(Fixable):
    """Lowest moving average, with hysteresis and strikes; separate TCP and UDP winners."""

    kind = Policy.URLTEST
    __slots__ = ("name", "members", "tolerance", "rank_by", "epoch", "_winner", "_fixed")

    def __init__(
        self,
        name: str,
        members: tuple[str, ...],
        tolerance: float,
        epoch: Epoch | None = None,
        rank_by: str = "",
    ) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self.tolerance = max(tolerance, MIN_URLTEST_TOLERANCE)  # "max(configured, 1 ms)"
        self.rank_by = rank_by  # the metric's statistic: "" moving average, "last", "avg10" (HealthFilter)
        self._winner: dict[Network, str] = {}
        self._fixed: dict[Network, str] = {}

    def winner(self, network: Network) -> str | None:
        return self._winner.get(network)

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        fixed = _fixed_pick(self._fixed, candidates)
        if fixed is not None:
            return fixed
        eligible = [c for c in candidates.all() if c.eligible]
        if not eligible:
            return None
        network = candidates.network
        ranked = self._decide(eligible, *_ranking(network, eligible))
        if commit:
            self.commit(network, ranked)
        return ranked

    def commit(self, network: Network, member: str) -> bool:
        """True when an earlier winner was replaced (a first winner moves nothing)."""
        if self._fixed.get(network) == member:
            return False  # served for the pin: the automatic winner stays what it was
        return _remember(self._winner, network, member, self.epoch)

    def _decide(self, eligible: list[Candidate], incumbent_network: Network, metric) -> str:  # noqa: ANN001
        best = min(eligible, key=lambda c: _rank_key(c, metric))
        incumbent = next((c for c in eligible if c.member == self._winner.get(incumbent_network)), None)
        if incumbent is None or incumbent.demoted or incumbent is best:
            return best.member  # a failed or ineligible incumbent gets no hysteresis
        current, best_value = metric(incumbent), metric(best)
        if best_value is None:
            return incumbent.member  # nobody is measured: no reason to move
        if current is None:
            return best.member
        # the incumbent's current average, re-read now: a degraded incumbent can be replaced
        return incumbent.member if best_value + self.tolerance >= current else best.member

    def ranked(self, candidates: Candidates, limit: int) -> list[str]:
        """The eligible members by rank (strikes last), by the metric :meth:`pick` ranks with: for
        a setup-failure retry round, and a cold UDP plan's candidates."""
        eligible = [c for c in candidates.all() if c.eligible]
        _, metric = _ranking(candidates.network, eligible)
        eligible.sort(key=lambda c: _rank_key(c, metric))
        return [c.member for c in eligible[:limit]]


def _ranking(
    network: Network, eligible: list[Candidate]
) -> tuple[Network, Callable[[Candidate], float | None]]:
    """The network whose winner is the incumbent and the metric a URLTest ranks ``network``
    with: UDP's own average once an eligible member has one; otherwise (TCP, or UDP mirroring
    TCP while no eligible member has UDP evidence) the TCP average."""
    if network is Network.UDP and any(c.udp_metric is not None for c in eligible):
        return network, lambda c: c.udp_metric
    return Network.TCP, lambda c: c.metric


def _rank_key(c: Candidate, metric: Callable[[Candidate], float | None]) -> tuple[bool, bool, float, int]:
    """Strikes last, then measured before unmeasured, the lower average first, then declaration order."""
    value = metric(c)
    return (c.demoted, value is None, value if value is not None else 0.0, c.index)


class LoadBalance:
    """Round robin over eligible members in declaration order; TCP and UDP cursors apart."""

    kind = Policy.LOADBALANCE
    __slots__ = ("name", "members", "epoch", "_last")

    def __init__(self, name: str, members: tuple[str, ...], epoch: Epoch | None = None) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self._last: dict[Network, int] = {}  # index of the member served last, per network

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        n = len(self.members)
        start = self._last.get(candidates.network, -1) + 1
        for step in range(n):
            index = (start + step) % n
            if candidates.evaluate(self.members[index]).eligible:
                if commit:
                    self.commit(candidates.network, self.members[index])
                return self.members[index]
        return None

    def commit(self, network: Network, member: str) -> bool:
        self._last[network] = self.members.index(member)
        self.epoch.bump()  # every served pick moves the cursor
        return False  # a rotation is no selection change


class Random:
    """``policy: random``: each served selection draws uniformly among the members eligible then
    (dae ``GetRand`` over the alive set); TCP and UDP draw apart. The draw a peek shows is kept
    until a selection serves it (commit), so a peek and the selection after it agree; a drawn
    member that is no longer eligible is drawn again. ``rng``: injectable for tests."""

    kind = Policy.LOADBALANCE
    __slots__ = ("name", "members", "epoch", "rng", "_drawn")

    def __init__(
        self,
        name: str,
        members: tuple[str, ...],
        epoch: Epoch | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self.rng = rng if rng is not None else random.Random()
        self._drawn: dict[Network, str] = {}  # the next selection's member, per network

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        network = candidates.network
        drawn = self._drawn.get(network)
        if drawn is None or not candidates.evaluate(drawn).eligible:
            eligible = [c.member for c in candidates.all() if c.eligible]
            if not eligible:
                return None
            drawn = self._drawn[network] = eligible[self.rng.randrange(len(eligible))]
        if commit:
            self.commit(network, drawn)
        return drawn

    def commit(self, network: Network, member: str) -> bool:
        self._drawn.pop(network, None)  # served: the next selection draws again
        self.epoch.bump()
        return False  # a draw is no selection change, as a rotation


class Fallback(Fixable):
    """The first eligible member, pinned per network until it is no longer eligible, or carries
    strikes while a member without strikes is eligible.

    The design's pin "stays until that member dies" (GH-B-23); honk also moves it off a member
    that real flows demoted (dial-failure strikes, the flow-failure share, the EMA detector): a
    node that refuses every other flow, or answers none, never dies by consecutive counts, and a
    Fallback would keep serving it. Among demoted members only, the first eligible keeps serving.
    """

    kind = Policy.FALLBACK
    __slots__ = ("name", "members", "epoch", "_pin", "_fixed")

    def __init__(self, name: str, members: tuple[str, ...], epoch: Epoch | None = None) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self._pin: dict[Network, str] = {}
        self._fixed: dict[Network, str] = {}

    def pin(self, network: Network) -> str | None:
        return self._pin.get(network)

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        fixed = _fixed_pick(self._fixed, candidates)
        if fixed is not None:
            return fixed
        pinned = self._pin.get(candidates.network)
        if pinned is not None:
            current = candidates.evaluate(pinned)
            if current.eligible and not current.demoted:
                return pinned
        order = self.ranked(candidates, 1)
        if not order:
            return None
        if (
            pinned is not None
            and order[0] != pinned
            and candidates.evaluate(pinned).eligible
            and candidates.evaluate(order[0]).demoted
        ):
            return pinned  # every eligible member carries strikes: the pin stays where it is
        if commit:
            self.commit(candidates.network, order[0])
        return order[0]

    def ranked(self, candidates: Candidates, limit: int) -> list[str]:
        """The eligible members in declaration order, those without strikes first: what the pin
        moves to, and a setup-failure retry round's candidates."""
        eligible = [c for c in (candidates.evaluate(m) for m in self.members) if c.eligible]
        eligible.sort(key=lambda c: (c.demoted, c.index))
        return [c.member for c in eligible[:limit]]

    def commit(self, network: Network, member: str) -> bool:
        """True when the pin moved off an earlier member (a first pin moves nothing)."""
        if self._fixed.get(network) == member:
            return False  # served for the runtime pin: the sticky pin stays what it was
        return _remember(self._pin, network, member, self.epoch)


class ScoreCandidates(Candidates, Protocol):
    """What a Score pick reads beyond :class:`Candidates`: the flow's target context, the
    time, and the NodeId each member resolves to."""

    target: ScoreTarget | None
    destination: IPAddress | None

    def now(self) -> float: ...

    def node_id(self, member: str) -> NodeId: ...

    def score_members(self) -> Sequence[Member]:
        """Every member in configuration order: its name, its leaf's NodeId, its eligibility."""


class Score:
    """``policy: score``: one authoritative leaf from the shared ScoreState's rank. Liveness is
    the view's eligibility (a dead member never wins, GH-K-01); a peek ranks with ``peek=True``
    and changes nothing (GH-K-129). All state lives in the ScoreState, so a reload that shares
    it keeps what this group learned (GH-K-07, 08)."""

    kind = Policy.SCORE
    __slots__ = ("name", "members", "epoch", "state")

    def __init__(
        self, name: str, members: tuple[str, ...], state: ScoreState, epoch: Epoch | None = None
    ) -> None:
        self.name = name
        self.epoch = epoch or Epoch()
        self.members = members
        self.state = state

    def pick(self, candidates: Candidates, commit: bool) -> str | None:
        winner = self.rank(candidates, commit).winner  # type: ignore[arg-type]
        return winner.name if winner is not None else None

    def rank(self, candidates: ScoreCandidates, commit: bool, exclude: frozenset = frozenset()) -> Ranked:
        """The ranker's verdict for this flow; ``exclude`` holds NodeIds ranked out first."""
        target = getattr(candidates, "target", None)
        destination = getattr(candidates, "destination", None)
        members = candidates.score_members()
        return self.state.rank(
            self.name,
            candidates.network,
            target,
            target_family(target, destination),
            members,
            candidates.now(),
            exclude=exclude,
            peek=not commit,
        )

    def commit(self, network: Network, member: str) -> bool:
        return False  # a Score pick is applied by its pick with commit (it needs the target)


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """What a policy factory builds from: the group's spec and members, and what the manager shares."""

    spec: GroupSpec
    members: tuple[str, ...]
    epoch: Epoch | None = None
    score: ScoreState | None = None  # the lineage's ScoreState; None: Score serves as URLTest
    rng: random.Random | None = None  # what ``policy: random`` draws from


PolicyFactory = Callable[[PolicyInputs], GroupPolicy]

# (policy, strategy) -> factory; a strategy of None is the policy's default entry
POLICIES: dict[tuple[Policy, str | None], PolicyFactory] = {}


def register_policy(policy: Policy, factory: PolicyFactory, strategy: str | None = None) -> None:
    """Make ``factory`` build the groups of ``policy`` (only with ``strategy``, when given)."""
    POLICIES[(policy, strategy)] = factory


def _score(inputs: PolicyInputs) -> GroupPolicy:
    spec, members = inputs.spec, inputs.members
    if inputs.score is None:  # score_ranking off: URLTest from probe delays, default statistic
        return URLTest(spec.name, members, spec.tolerance, inputs.epoch)
    return Score(spec.name, members, inputs.score, inputs.epoch)


register_policy(
    Policy.SELECTOR,
    lambda i: Selector(i.spec.name, i.members, i.spec.default, i.epoch, i.spec.fixed_index),
)
register_policy(
    Policy.URLTEST,
    lambda i: URLTest(i.spec.name, i.members, i.spec.tolerance, i.epoch, i.spec.strategy),
)
register_policy(Policy.LOADBALANCE, lambda i: LoadBalance(i.spec.name, i.members, i.epoch))
register_policy(
    Policy.LOADBALANCE, lambda i: Random(i.spec.name, i.members, i.epoch, i.rng), strategy=PICK_RANDOM
)
register_policy(Policy.FALLBACK, lambda i: Fallback(i.spec.name, i.members, i.epoch))
register_policy(Policy.SCORE, _score)


def make_policy(
    spec: GroupSpec,
    members: tuple[str, ...],
    epoch: Epoch | None = None,
    score: ScoreState | None = None,
    rng: random.Random | None = None,
) -> GroupPolicy:
    """The policy object of a group, from its :data:`POLICIES` entry: the one registered for its
    strategy, else its policy's default entry. A Score group ranks with ``score``; without one
    it serves as URLTest (see ``GroupManager.build``'s ``score_ranking``). A random group draws
    from ``rng``."""
    factory = POLICIES.get((spec.policy, spec.strategy)) or POLICIES[(spec.policy, None)]
    return factory(PolicyInputs(spec, members, epoch, score, rng))
