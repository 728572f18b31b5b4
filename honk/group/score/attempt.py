"""Score's business attempt, guard and reporter lifecycle (GH-K-69..78), sans-I/O.

The chain a selected business plan walks:

* :class:`ScoreFeedback` -- immutable attribution: every Score group the selection traversed
  (GH-K-05), each once, with the network, target and leaf NodeId. It is a factory:
  :meth:`ScoreFeedback.start` creates an independent :class:`ScoreAttempt`. Every attempt
  started from one feedback or its clones reports under the same cohort ``Reporter.origin``,
  so retries and clones of one business flow count once toward a recovery quorum (GH-K-41).
* :meth:`ScoreAttempt.begin` admits the attempt into the evidence store; it is fallible (the
  membership may be gone: :class:`ScoreAttemptRefused`) and one-shot.
* :class:`ScoreBusinessGuard` owns cancellation until :meth:`~ScoreBusinessGuard.into_reporter`
  hands it to a :class:`ScoreReporter` at the physical/logical I/O boundary (GH-K-70, GH-K-76).
  Closing or dropping a guard that was never transferred cancels neutrally.
* :class:`ScoreReporter` stamps setup and first response once each (GH-K-71), feeds TX/RX
  through one :class:`~honk.group.score.reporter.RxPublisher` per traversed group, and settles
  at most one outcome (GH-K-73). Neutral endings record nothing and keep factual RX (GH-K-74).

:func:`classify_relay_end` maps honk's relay ends onto a :class:`Result` (GH-K-20).

Decisions the requirements leave open:

* **Cohort cell.** A traversed group's availability cohort lives on its most specific evidence
  key (the exact cell when the target has a family, else the global aggregate), as
  :meth:`ScoreEvidence.keys` lists it. Failure *scoping* (target vs node, GH-K-14/15) belongs to
  the caller that knows the provenance; this module fails the reporter's own cohort cell.
* **A positive RX is a response.** The reporter is started after setup, so the first positive
  RX publishes the first response if the caller has not already done so.
* **Idle expiry** (:class:`IdleTimeout`) is not a client-side end, and not proof of upstream
  failure either: as for UDP reply-idle expiry (GH-K-22) it settles as a success when a response
  was seen and as a (timeout) failure when none was.
* **Dropping** an unsettled reporter cancels it without a clock, so a held RX is discarded rather
  than flushed at an unknown time: a drop can never credit support that may have expired.
* **Refusal at begin** is all-or-nothing: if any traversed (group, node) left the membership the
  plan is stale, and no cell is created for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from honk.alive.outcome import Family
from honk.core.errors import (
    ClientGone,
    CodecError,
    FlowClosed,
    HonkError,
    IdleTimeout,
)
from honk.core.net import IPAddress, Network
from honk.group.score.cells import Outcome
from honk.group.score.cohort import Cohorts, Kind, Reporter
from honk.group.score.evidence import Admission, ScoreEvidence
from honk.group.score.keys import NodeId, ScoreTarget, target_family
from honk.group.score.reporter import Outcome as RxOutcome
from honk.group.score.reporter import RxPublisher

_ids = itertools.count(1)  # process-local identities for origins, reporters and episodes


class ScoreAttemptRefused(HonkError):
    """``begin`` refused the attempt: a traversed (group, node) left the membership (GH-K-78).

    A typed cancellation: nothing is recorded and no node-specific I/O may start."""


class ScoreLifecycleError(RuntimeError):
    """A lifecycle step was used out of order (begin twice, transfer twice, after close)."""


# --- attribution ---------------------------------------------------------------------------------


class LatencySink(Protocol):
    """What a reporter tells the first-choice heuristic (:class:`~honk.group.score.heuristic.FirstChoiceHeuristic`)."""

    def observe_setup(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        node_id: NodeId,
        latency: float,
        now: float,
    ) -> None: ...

    def observe_response(
        self,
        group: str,
        network: Network,
        target: ScoreTarget | None,
        family: Family | None,
        node_id: NodeId,
        latency: float,
        now: float,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Traversal:
    """One traversed Score group's attribution; ``destination`` is the address actually used
    (it decides the target family when the target is a name)."""

    group: str
    network: Network
    target: ScoreTarget | None
    node_id: NodeId
    destination: IPAddress | None = None
    # the target family, decided once: every admission and latency of the flow uses it
    family: Family | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", target_family(self.target, self.destination))

    def cohort_cell(self) -> Hashable:
        """The most specific evidence key: where this group's availability cohort lives."""
        return ScoreEvidence.keys(self.group, self.network, self.target, self.node_id, self.destination)[-1][
            1
        ]

    def node_cells(self) -> tuple[Hashable, ...]:
        """The node's aggregate keys (family, then none): where a node-scoped failure opens, so
        that every target of the node sees it (GH-K-15)."""
        keys = ScoreEvidence.keys(self.group, self.network, self.target, self.node_id, self.destination)
        return tuple(key for _store, key in keys[:-1]) if len(keys) > 1 else ()


@dataclass(frozen=True, slots=True, eq=False)
class Episode:
    """A failure episode identity (GH-K-17). Build one per independently constructed failure and
    hand the same one to every flow a shared failure fans out to. Compared and hashed as the
    object it is (in C): every cohort a failure reaches looks it up."""

    id: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True, slots=True)
class ScoreFeedback:
    """Immutable attribution of one business flow to every Score group it traversed (GH-K-69)."""

    traversed: tuple[Traversal, ...]
    evidence: ScoreEvidence = field(compare=False)
    cohorts: Cohorts = field(compare=False)
    kind: Kind = Kind.TRAFFIC
    origin: Hashable = field(default_factory=lambda: ("feedback", next(_ids)))
    # the first-choice heuristic told each setup and first-response latency; None: not kept
    performance: LatencySink | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        traversed: Iterable[Traversal],
        evidence: ScoreEvidence,
        cohorts: Cohorts,
        *,
        kind: Kind = Kind.TRAFFIC,
        performance: LatencySink | None = None,
    ) -> ScoreFeedback:
        """Attribution that keeps the first traversal of each group: a group counts once (GH-K-05)."""
        seen: dict[str, Traversal] = {}
        for step in traversed:
            seen.setdefault(step.group, step)
        return cls(tuple(seen.values()), evidence, cohorts, kind, performance=performance)

    def clone(self) -> ScoreFeedback:
        """The same attribution and origin: its attempts count as the same business flow."""
        return ScoreFeedback(
            self.traversed, self.evidence, self.cohorts, self.kind, self.origin, self.performance
        )

    def start(self) -> ScoreAttempt:
        """A new, independent observation of this business flow; the feedback is unchanged."""
        return ScoreAttempt(self, Reporter(("reporter", next(_ids)), self.origin))


# --- results -------------------------------------------------------------------------------------


class Ending(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    IDLE = "idle"  # idle expiry: success after a response, else a timeout failure
    CANCELLED = "cancelled"  # neutral
    REJECTED = "rejected"  # neutral
    SHUTDOWN = "shutdown"  # neutral
    CLIENT_GONE = "client_gone"  # neutral (GH-K-20)

    __hash__ = object.__hash__  # singletons compared by identity: hashed so, in C (every settlement asks)

    @property
    def neutral(self) -> bool:
        return self in _NEUTRAL


_NEUTRAL = frozenset({Ending.CANCELLED, Ending.REJECTED, Ending.SHUTDOWN, Ending.CLIENT_GONE})


@dataclass(frozen=True, slots=True)
class Result:
    """How a business flow ended. A failure carries its episode: share one :class:`Episode`
    across every flow one failure fans out to; a failure built without one is its own episode."""

    ending: Ending
    episode: Episode | None = None
    # whose failure it is (GH-K-14/15): True the node's (proxy, auth, framing, carrier, unknown
    # pre-setup), False the target path's; None: decided by when it happened (before setup: node)
    node_scoped: bool | None = None

    @classmethod
    def success(cls) -> Result:
        return _SUCCESS  # immutable, so one serves every flow

    @classmethod
    def failure(cls, episode: Episode | None = None, *, node_scoped: bool | None = None) -> Result:
        return cls(Ending.FAILURE, episode if episode is not None else Episode(), node_scoped)

    @classmethod
    def idle(cls, episode: Episode | None = None) -> Result:
        return cls(Ending.IDLE, episode if episode is not None else Episode())

    @classmethod
    def neutral(cls, ending: Ending = Ending.CANCELLED) -> Result:
        if not ending.neutral:
            raise ValueError(f"{ending} is not a neutral ending")
        return cls(ending)

    @property
    def is_neutral(self) -> bool:
        return self.ending.neutral


_SUCCESS = Result(Ending.SUCCESS)

# Enum members read on every event, bound once: in Python 3.11 each ``Enum.MEMBER`` read goes
# through the enum metaclass's __getattr__ hook, several hundred instructions; a global is one.
_END_SUCCESS, _END_FAILURE, _END_IDLE = Ending.SUCCESS, Ending.FAILURE, Ending.IDLE
_END_REJECTED, _END_SHUTDOWN = Ending.REJECTED, Ending.SHUTDOWN
_USEFUL, _SUCCEEDED, _FAILED, _SETUP_FAILED = (
    Outcome.USEFUL,
    Outcome.SUCCESS,
    Outcome.FAILURE,
    Outcome.SETUP_FAILURE,
)
_RX_REJECTED, _RX_SHUTDOWN, _RX_CANCELLED = RxOutcome.REJECTED, RxOutcome.SHUTDOWN, RxOutcome.CANCELLED
_RX_FAILURE, _RX_SUCCESS = RxOutcome.FAILURE, RxOutcome.SUCCESS
_tuple_new = tuple.__new__  # builds a named tuple as its _make does, without a Python call

CAUSE_DEPTH = 8  # causes followed to find the error object a failure fanned out from


def shared_episode(error: BaseException) -> Episode:
    """The failure episode of ``error``: flows that ended with one error object, or with errors
    caused by one (a mux carrier's loss reaches every stream on it so), share one episode
    (GH-K-17); every other failure is its own. The episode rides on that object."""
    root = error
    for _ in range(CAUSE_DEPTH):
        if root.__cause__ is None:
            break
        root = root.__cause__
    episode = getattr(root, "score_episode", None)
    if not isinstance(episode, Episode):
        episode = Episode()
        with contextlib.suppress(AttributeError):  # an error that takes no attribute: its own episode
            root.score_episode = episode  # type: ignore[attr-defined]
    return episode


def classify_relay_end(error: BaseException | None, *, episode: Episode | None = None) -> Result:
    """The Score result of a TCP relay's end (GH-K-20), from the engines' typed ends
    (:mod:`honk.relay.ends`, the same for copy and splice engines).

    ``None`` (both directions finished) is a success. :class:`ClientGone` -- the client's
    reset, abort, broken pipe, disconnect, unexpected EOF, timeout or unreachability -- is
    neutral. A deliberate close (:class:`FlowClosed`, drains included) or task cancellation is
    neutral. :class:`IdleTimeout` is decided by whether a response was seen (see the module
    docstring). Everything else -- :class:`UpstreamFailed` (the same errnos on the upstream side),
    codec/protocol errors, an unexpected errno on the client's socket and local relay failures,
    all plain ``RelayError``s -- keeps its failure treatment. Only the type decides: a log
    severity never makes an error neutral. A carrier-wide :class:`CodecError` (the node's framing,
    AEAD authentication or a mux carrier's loss) is node-scoped; other failures after setup, a
    mux session's reset included, are the target path's (GH-K-14, 15, 19). Without ``episode``,
    flows that ended with one error object share its episode (:func:`shared_episode`)."""
    if error is None:
        return Result.success()
    if isinstance(error, ClientGone):
        return Result.neutral(Ending.CLIENT_GONE)
    if isinstance(error, FlowClosed | asyncio.CancelledError):
        return Result.neutral(Ending.CANCELLED)
    if episode is None:
        episode = shared_episode(error)
    if isinstance(error, IdleTimeout):
        return Result.idle(episode)
    if (
        isinstance(error, CodecError) and error.carrier_wide
    ):  # the node's framing, authentication or carrier broke
        return Result.failure(episode, node_scoped=True)
    return Result.failure(episode)


class Settlement(NamedTuple):  # one per settled flow: a tuple builds several times faster
    """What settlement recorded: ``outcome`` is None for a neutral ending."""

    ending: Ending
    outcome: Outcome | None


# --- lifecycle -----------------------------------------------------------------------------------


class ScoreAttempt:
    """One attempt of a selected business plan; :meth:`begin` admits it once (GH-K-70)."""

    __slots__ = ("_begun", "feedback", "reporter")

    def __init__(self, feedback: ScoreFeedback, reporter: Reporter) -> None:
        self.feedback = feedback
        self.reporter = reporter
        self._begun = False

    @property
    def begun(self) -> bool:
        return self._begun

    def begin(self, now: float) -> ScoreBusinessGuard:
        """Admit into every traversed group's cells, before node-specific I/O (GH-K-78).

        Raises :class:`ScoreAttemptRefused` when a traversed (group, node) is no longer a member
        (nothing is admitted then), :class:`ScoreLifecycleError` when already begun."""
        if self._begun:
            raise ScoreLifecycleError("a ScoreAttempt begins at most once")
        self._begun = True
        feedback = self.feedback
        evidence = feedback.evidence
        traversed = feedback.traversed
        for step in traversed:
            if not evidence.is_member(step.group, step.node_id):
                raise ScoreAttemptRefused("the selected member left its Score group")
        # every traversal is a member (checked above): admit each without asking again
        admissions = tuple(
            [
                evidence.admit_member(step.group, step.network, step.family, step.target, step.node_id)
                for step in traversed
            ]
        )
        return ScoreBusinessGuard(self, admissions, now, members_at=evidence.membership_version)


class ScoreBusinessGuard:
    """The single admitted guard of an attempt. Owns cancellation until transferred (GH-K-70)."""

    __slots__ = ("__weakref__", "_admissions", "_attempt", "_members_at", "_state", "begun_at")

    _OPEN, _TRANSFERRED, _CANCELLED = "open", "transferred", "cancelled"

    def __init__(
        self,
        attempt: ScoreAttempt,
        admissions: tuple[Admission, ...],
        now: float,
        *,
        members_at: int | None = None,
    ) -> None:
        self._attempt = attempt
        self._admissions = admissions
        self._members_at = members_at  # the membership version begin() found every traversal in
        self._state = self._OPEN
        self.begun_at = now

    @property
    def cancelled(self) -> bool:
        return self._state == self._CANCELLED

    @property
    def transferred(self) -> bool:
        return self._state == self._TRANSFERRED

    def into_reporter(self, now: float, dial_started: float | None = None) -> ScoreReporter:
        """Hand cancellation over to a reporter at the I/O boundary; one-shot (GH-K-76).
        ``dial_started``: when the physical dial began, after any admission wait; setup latency
        runs from there (a wait for a dial permit is honk's, not the node's)."""
        if self._state != self._OPEN:
            raise ScoreLifecycleError(f"the guard is already {self._state}")
        self._state = self._TRANSFERRED
        return ScoreReporter(
            self._attempt,
            self._admissions,
            now,
            begun_at=self.begun_at if dial_started is None else dial_started,
            members_at=self._members_at,
        )

    def close(self) -> None:
        """Cancel neutrally unless transferred: nothing was observed, so nothing is recorded."""
        if self._state == self._OPEN:
            self._state = self._CANCELLED

    def __enter__(self) -> ScoreBusinessGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class ScoreReporter:
    """Reports one admitted business flow to every traversed Score group (GH-K-71..74)."""

    __slots__ = (
        "__weakref__",
        "_admissions",
        "_attempt",
        "_cells",
        "_members",
        "_node_cells",
        "_publishers",
        "_settlement",
        "begun_at",
        "first_response_at",
        "rx_bytes",
        "setup_at",
        "started_at",
        "tx_bytes",
    )

    def __init__(
        self,
        attempt: ScoreAttempt,
        admissions: tuple[Admission, ...],
        now: float,
        *,
        begun_at: float | None = None,
        members_at: int | None = None,
    ) -> None:
        feedback = attempt.feedback
        self._attempt = attempt
        self._admissions = admissions
        # the admitted keys, global first and the most specific last: the cohort cell is the last
        # (Traversal.cohort_cell), the node's aggregates the others (Traversal.node_cells)
        # parallel to ``admissions`` (and so to the traversals), as are the node cells and publishers
        self._cells = tuple([admission.cells[-1][1] for admission in admissions])
        self._node_cells = tuple(
            [tuple([key for _store, key, _inc in admission.cells[:-1]]) for admission in admissions]
        )
        # (membership version, per traversal); ``members_at``: a version at which all were members
        self._members: tuple[int, tuple[bool, ...]] | None = (
            None if members_at is None else (members_at, (True,) * len(admissions))
        )
        reporter, cohorts, kind = attempt.reporter, feedback.cohorts, feedback.kind
        self._publishers = tuple([RxPublisher(cell, reporter, cohorts, kind=kind) for cell in self._cells])
        self._settlement: Settlement | None = None
        self.started_at = now
        self.begun_at = begun_at if begun_at is not None else now  # admission: setup latency runs from here
        self.setup_at: float | None = None
        self.first_response_at: float | None = None
        self.tx_bytes = 0
        self.rx_bytes = 0

    @property
    def settled(self) -> bool:
        return self._settlement is not None

    @property
    def settlement(self) -> Settlement | None:
        return self._settlement

    @property
    def response_time(self) -> float | None:
        """First response after setup, in seconds; None until both were observed."""
        if self.setup_at is None or self.first_response_at is None:
            return None
        return self.first_response_at - self.setup_at

    def setup(self, now: float) -> bool:
        """Setup finished at ``now``. Publishes once; returns whether this call published."""
        if self.setup_at is not None or self._settlement is not None:
            return False
        self.setup_at = now
        for publisher in self._publishers:
            publisher.setup(now)
        performance = self._attempt.feedback.performance
        if performance is not None:
            self._observe(performance.observe_setup, now - self.begun_at, now)
        return True

    def first_response(self, now: float) -> bool:
        """The first response byte at ``now``. Publishes once; returns whether this call did."""
        if self.first_response_at is not None or self._settlement is not None:
            return False
        self.first_response_at = now
        if self.setup_at is not None:
            performance = self._attempt.feedback.performance
            if performance is not None:
                self._observe(performance.observe_response, now - self.setup_at, now)
        return True

    def _observe(self, observe: Callable[..., None], latency: float, now: float) -> None:
        """A latency for the first-choice heuristic (``observe``, one of the sink's methods), in
        every traversed group still holding the node."""
        members = self._memberships()
        for i, step in enumerate(self._attempt.feedback.traversed):
            if members[i]:
                observe(step.group, step.network, step.target, step.family, step.node_id, latency, now)

    def tx(self, now: float, nbytes: int) -> None:
        """Accepted TX. It announces the reporter to the cohorts; it never proves availability."""
        if nbytes <= 0 or self._settlement is not None:
            return
        self.tx_bytes += nbytes
        members = self._memberships()
        for i, publisher in enumerate(self._publishers):
            if members[i]:
                publisher.tx(now)

    def rx(self, now: float, nbytes: int) -> None:
        """Delivered RX. Through each group's throttle; a published RX may renew qualification."""
        if nbytes <= 0 or self._settlement is not None:
            return
        self.rx_bytes += nbytes
        if self.setup_at is not None and self.first_response_at is None:
            self.first_response(now)
        evidence = self._attempt.feedback.evidence
        members = self._memberships()
        for i, publisher in enumerate(self._publishers):
            if members[i] and publisher.rx(now) is not None:
                evidence.rx(self._admissions[i], now)

    def settle(self, now: float, result: Result) -> Settlement | None:
        """Contribute at most one outcome (GH-K-73); None when already settled.

        Held RX is flushed at its own event time for every ending (it happened). A failure also
        opens or joins ``result.episode`` in each traversed group's cohort (GH-K-17)."""
        if self._settlement is not None:
            return None
        outcome = self._outcome(result)
        failed = outcome is not None and outcome.is_failure
        ending = result.ending
        if ending is _END_REJECTED:
            rx_outcome = _RX_REJECTED
        elif ending is _END_SHUTDOWN:
            rx_outcome = _RX_SHUTDOWN
        elif outcome is None:
            rx_outcome = _RX_CANCELLED
        else:
            rx_outcome = _RX_FAILURE if failed else _RX_SUCCESS
        feedback = self._attempt.feedback
        evidence = feedback.evidence
        node_scoped = result.node_scoped if result.node_scoped is not None else self.setup_at is None
        members = self._memberships()
        for i, publisher in enumerate(self._publishers):
            if not members[i]:  # late feedback for deleted membership is ignored (GH-K-08)
                continue
            admission = self._admissions[i]
            flushed = publisher.settle(now, rx_outcome)
            rx_at = flushed.flushed_at if flushed is not None else None
            if outcome is None:
                if rx_at is not None:
                    evidence.rx(admission, rx_at)
                continue
            evidence.settle(admission, outcome, now, rx_at=rx_at)
            if failed:
                feedback.cohorts.fail(self._cells[i], now, episode=result.episode)
                if node_scoped:  # every target of the node sees it, not only this one
                    for node_cell in self._node_cells[i]:
                        feedback.cohorts.fail(node_cell, now, episode=result.episode)
        self._settlement = _tuple_new(
            Settlement, (result.ending, outcome)
        )  # Settlement(...), no Python __new__
        return self._settlement

    def cancel(self, now: float, ending: Ending = Ending.CANCELLED) -> Settlement | None:
        """Settle neutrally: nothing recorded, factual RX kept (GH-K-74)."""
        return self.settle(now, Result.neutral(ending))

    def _memberships(self) -> tuple[bool, ...]:
        """Whether each traversal's (group, node) is still a member (cached per membership)."""
        evidence = self._attempt.feedback.evidence
        known = self._members
        if known is None or known[0] != evidence.membership_version:
            known = self._members = (
                evidence.membership_version,
                tuple(
                    [
                        evidence.is_member(step.group, step.node_id)
                        for step in self._attempt.feedback.traversed
                    ]
                ),
            )
        return known[1]

    def _outcome(self, result: Result) -> Outcome | None:
        ending = result.ending
        if ending in _NEUTRAL:
            return None
        if ending is _END_IDLE:
            ending = _END_SUCCESS if self.first_response_at is not None else _END_FAILURE
        if ending is _END_SUCCESS:
            return _USEFUL if self.first_response_at is not None else _SUCCEEDED
        return _SETUP_FAILED if self.setup_at is None else _FAILED

    def __del__(self) -> None:
        # Dropping the last unfinished handle cancels (GH-K-73). Without a clock, held RX is
        # discarded rather than flushed at an unknown time (see the module docstring).
        if self._settlement is None:
            self._settlement = Settlement(Ending.CANCELLED, None)


__all__ = [
    "Ending",
    "Episode",
    "Result",
    "ScoreAttempt",
    "ScoreAttemptRefused",
    "ScoreBusinessGuard",
    "ScoreFeedback",
    "ScoreLifecycleError",
    "ScoreReporter",
    "Settlement",
    "Traversal",
    "classify_relay_end",
    "shared_episode",
]
