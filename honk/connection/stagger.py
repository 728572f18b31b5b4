"""Cold URLTest UDP preparation: staggered, bounded, first eligible success wins (GH-G-01..10).

A top-level URLTest with no usable UDP measurement does not know which member's UDP path
works; preparing them one after another would pay a full timeout for each dead one. Instead
the candidates' preparations (resolution, admission, protocol negotiation) start at absolute
offsets from the start of preparation, at most three at once, and the first success that is
still eligible wins. Every other plan prepares exactly one leaf.

* :class:`Stagger` is the schedule, sans I/O: which candidates start when. Offsets are
  absolute (0, 30, 80 ms, then every further 80 ms), so a slow early attempt never shifts the
  later ones; a candidate whose offset comes while three are in flight waits for capacity and
  starts the moment one finishes (a later candidate keeps its own absolute offset). Nothing
  starts at or after the deadline.
* :func:`prepare_first` drives it on an injected clock: it starts the due preparations as
  tasks, takes the first eligible success, aborts and drains every other started one before it
  returns, rechecks the winner's eligibility and commits it (only then may the caller publish
  the endpoint or send the first datagram). A winner found ineligible at the recheck is
  dropped neutrally and the schedule goes on.

Health (GH-G-07): only an *observed* preparation error is reported (``observed_error``); an
error a loser had already completed with, found while draining, is observed too. Work that
never started, cancellation, a success that became ineligible and losers drained after a
success are neutral: their results are handed to ``discard`` and never published. The
deadline (GH-G-09/10) is one absolute time, ``max(10 s, 4 × connect_timeout)`` from the start
of preparation; its expiry fails the plan and is not itself a health event.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.core.stats import StaggerCounts

__all__ = [
    "COLD_FIRST_OFFSETS",
    "COLD_MAX_IN_FLIGHT",
    "COLD_OFFSET_STEP",
    "PREPARATION_DEADLINE_MIN",
    "PREPARATION_DEADLINE_TIMEOUTS",
    "ColdPreparationFailed",
    "ColdPreparationTimeout",
    "Stagger",
    "preparation_deadline",
    "prepare_first",
    "start_offset",
]

log = logging.getLogger("honk.connection.stagger")

COLD_FIRST_OFFSETS = (0.0, 0.030, 0.080)  # "absolute offsets ... 0 ms, 30 ms, 80 ms"
COLD_OFFSET_STEP = 0.080  # "and then one every further 80 ms (160 ms, 240 ms, ...)"
COLD_MAX_IN_FLIGHT = 3  # "At most three preparations may be in flight at once"
PREPARATION_DEADLINE_MIN = 10.0  # "max(10 s, 4 × connect_timeout)"
PREPARATION_DEADLINE_TIMEOUTS = 4  # ... the 4 × connect_timeout part

T = TypeVar("T")  # a candidate
R = TypeVar("R")  # what a candidate's preparation gives (an endpoint, a session)


def start_offset(index: int) -> float:
    """Seconds after the start of preparation at which candidate ``index`` (0-based) may start."""
    if index < len(COLD_FIRST_OFFSETS):
        return COLD_FIRST_OFFSETS[index]
    return COLD_FIRST_OFFSETS[-1] + COLD_OFFSET_STEP * (index - len(COLD_FIRST_OFFSETS) + 1)


def preparation_deadline(connect_timeout: float) -> float:
    """The preparation budget in seconds for a node ``connect_timeout`` (GH-G-09)."""
    return max(PREPARATION_DEADLINE_MIN, PREPARATION_DEADLINE_TIMEOUTS * connect_timeout)


class ColdPreparationFailed(HonkError):
    """Every candidate's preparation failed or was ineligible; ``errors`` are the observed ones."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        super().__init__(f"no candidate could be prepared ({len(errors)} observed errors)")
        self.errors = tuple(errors)


class ColdPreparationTimeout(ColdPreparationFailed):
    """The preparation deadline passed with no winner (not itself a health event, GH-G-10)."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        HonkError.__init__(
            self, f"preparation deadline passed with no winner ({len(errors)} observed errors)"
        )
        self.errors = tuple(errors)


class Stagger:
    """The start schedule of ``count`` candidates, in their order, from ``started_at`` until
    ``deadline`` (absolute times); sans I/O. The driver calls :meth:`due` whenever time passed
    or a preparation finished, starts what it returns, and reports each end with
    :meth:`finished`."""

    def __init__(self, count: int, started_at: float, deadline: float) -> None:
        self.count = count
        self.started_at = started_at
        self.deadline = deadline
        self._next = 0  # the first candidate not started yet
        self._in_flight: set[int] = set()

    @property
    def in_flight(self) -> frozenset[int]:
        return frozenset(self._in_flight)

    @property
    def unstarted(self) -> int:
        """Candidates that never started (yet)."""
        return self.count - self._next

    def start_at(self, index: int) -> float:
        return self.started_at + start_offset(index)

    def due(self, now: float) -> list[int]:
        """The candidates to start at ``now``, now counted in flight: each whose offset has come,
        in order, while fewer than COLD_MAX_IN_FLIGHT run and the deadline has not passed."""
        out = []
        while (
            self._next < self.count
            and len(self._in_flight) < COLD_MAX_IN_FLIGHT
            and now < self.deadline
            and now >= self.start_at(self._next)
        ):
            out.append(self._next)
            self._in_flight.add(self._next)
            self._next += 1
        return out

    def finished(self, index: int) -> None:
        """Candidate ``index`` ended (any way): its capacity is free."""
        self._in_flight.discard(index)

    def wakeup(self) -> float | None:
        """When :meth:`due` next has something without a finish first: the next candidate's
        offset, if capacity is free and it comes before the deadline; else None."""
        if self._next >= self.count or len(self._in_flight) >= COLD_MAX_IN_FLIGHT:
            return None
        at = self.start_at(self._next)
        return at if at < self.deadline else None

    def exhausted(self) -> bool:
        """Nothing in flight and nothing left that may still start."""
        return not self._in_flight and (self._next >= self.count or self.wakeup() is None)


class _Race(Generic[T, R]):
    """One run of :func:`prepare_first`: the started tasks and what each ended with."""

    def __init__(
        self,
        candidates: Sequence[T],
        prepare: Callable[[T], Awaitable[R]],
        clock: Clock,
        stagger: Stagger,
        observed_error: Callable[[T, BaseException], None],
        discard: Callable[[R], object],
        counts: StaggerCounts,
    ) -> None:
        self.counts = counts
        self.candidates = candidates
        self.prepare = prepare
        self.clock = clock
        self.stagger = stagger
        self.observed_error = observed_error
        self.discard = discard
        self.tasks: dict[asyncio.Task[R], int] = {}
        self.errors: list[BaseException] = []

    def start_due(self) -> None:
        for index in self.stagger.due(self.clock.now()):
            task = asyncio.ensure_future(self._prepare(self.candidates[index]))
            self.tasks[task] = index
            self.counts.attempts += 1

    async def _prepare(self, candidate: T) -> R:
        return await self.prepare(candidate)  # inside the task: even an error raised at once is its own

    def take(self, task: asyncio.Task[R]) -> tuple[T, R] | None:
        """A finished task's candidate and result; None when it failed (an observed error) or
        was cancelled (neutral)."""
        index = self.tasks.pop(task)
        self.stagger.finished(index)
        if task.cancelled():
            return None
        error = task.exception()
        if error is not None:
            self.errors.append(error)
            self.counts.errors += 1
            self.observed_error(self.candidates[index], error)
            return None
        return self.candidates[index], task.result()

    async def drop(self, result: R) -> None:
        """Close a result that will never be published (a loser's, an ineligible winner's)."""
        try:
            done = self.discard(result)
            if inspect.isawaitable(done):
                await done
        except Exception:  # noqa: BLE001 - closing a discarded resource must not fail the race
            log.debug("discarding a cold preparation's result failed", exc_info=True)

    async def drain(self) -> None:
        """Abort every task still running and wait for each to end: errors it had already
        completed with are observed, results it had are discarded, cancellations are neutral."""
        if not self.tasks:
            return
        for task in self.tasks:
            task.cancel()
        self.counts.drained += len(self.tasks)
        await asyncio.wait(list(self.tasks))
        for task in list(self.tasks):
            taken = self.take(task)
            if taken is not None:
                await self.drop(taken[1])


async def prepare_first(
    candidates: Sequence[T],
    prepare: Callable[[T], Awaitable[R]],
    *,
    clock: Clock,
    deadline: float,
    eligible: Callable[[T], bool],
    commit: Callable[[T, R], object],
    observed_error: Callable[[T, BaseException], None],
    discard: Callable[[R], object],
    counts: StaggerCounts | None = None,
) -> tuple[T, R]:
    """The first candidate (in ``candidates``' order of starts) whose ``prepare`` succeeds and
    that is still ``eligible``, with its result, committed; see the module docstring.

    ``deadline`` is absolute on ``clock`` and starts counting now. ``commit(candidate, result)``
    runs after every loser is drained and the winner rechecked. Raises
    :class:`ColdPreparationTimeout` at the deadline, :class:`ColdPreparationFailed` when no
    candidate is left; a cancellation drains everything and propagates. ``counts`` (the
    daemon's ``/stats`` ``udp.stagger``) tallies the run."""
    loop = asyncio.get_running_loop()
    counts = counts if counts is not None else StaggerCounts()
    counts.plans += 1
    race = _Race(
        candidates,
        prepare,
        clock,
        Stagger(len(candidates), clock.now(), deadline),
        observed_error,
        discard,
        counts,
    )
    try:
        while True:
            race.start_due()
            if clock.now() >= deadline:  # nothing new starts; the running ones are drained
                await race.drain()
                counts.timeouts += 1
                raise ColdPreparationTimeout(race.errors)
            if race.stagger.exhausted():
                counts.failures += 1
                raise ColdPreparationFailed(race.errors)
            # wake at the next offset or the deadline, whichever first, or when a task ends
            wake = loop.create_future()
            wakeup = race.stagger.wakeup()
            at = deadline if wakeup is None else min(wakeup, deadline)
            timer = clock.call_later(at - clock.now(), lambda w=wake: w.done() or w.set_result(None))
            try:
                await asyncio.wait([*race.tasks, wake], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
                wake.cancel()
            for task in [t for t in race.tasks if t.done()]:  # in start order
                taken = race.take(task)
                if taken is None:
                    continue
                candidate, result = taken
                if not eligible(candidate):
                    counts.rejected += 1
                    await race.drop(result)  # a success that became ineligible: neutral
                    continue
                await race.drain()  # every loser aborted and drained before anything is published
                if not eligible(candidate):  # the recheck: neutral, and the schedule goes on
                    counts.rejected += 1
                    await race.drop(result)
                    break
                commit(candidate, result)
                counts.wins += 1
                return candidate, result
    except BaseException:
        await asyncio.shield(race.drain())
        raise
