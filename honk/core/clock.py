"""Injected time.

Every timer, deadline and idle check in honk reads a :class:`Clock`. The daemon
uses :class:`MonotonicClock`; tests use :class:`FakeClock` and move time by hand
with :meth:`FakeClock.advance`, so no test sleeps to synchronise.

Deadlines on a hot path use :meth:`Clock.call_later` (a plain loop timer) or
:class:`timeout_at` (a deadline scope built on it), not a sleeping task: a
per-flow task plus ``asyncio.wait`` costs several times more than a timer.
Thousands of them a second (the SOCKS fast path's connect deadlines) share one
timer through :class:`Deadlines`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None:
        """Stop the timer; cancelling a fired or cancelled timer does nothing."""


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""

    def wall(self) -> float:
        """Wall-clock seconds since the Unix epoch, for display and persistence."""

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` of this clock's time."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle:
        """Run ``callback`` on the running loop after ``delay`` seconds of this clock's time."""


class MonotonicClock:
    """The real clock: ``time.monotonic`` for deadlines, ``time.time`` for display."""

    # the C functions themselves, not methods wrapping them: a flow reads the clock a few
    # times on the loop's thread, and each Python frame around a reading costs more than it
    now = staticmethod(time.monotonic)
    wall = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)


class _FakeTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance`.

    Timers (sleeps and ``call_later`` callbacks) fire in deadline order inside
    ``advance``; a sleep of zero or less returns after one loop iteration, like
    ``asyncio.sleep(0)``, and a ``call_later`` with a non-positive delay runs on
    the next loop iteration.
    """

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_offset + self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await fut
        finally:
            timer.cancel()

    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle:
        timer = _FakeTimer(callback)
        if delay <= 0:
            asyncio.get_running_loop().call_soon(lambda: timer.cancelled or callback())
            return timer
        heapq.heappush(self._timers, (self._now + delay, next(self._seq), timer))
        return timer

    @property
    def sleepers(self) -> int:
        """How many timers (sleeps and callbacks) are armed and not cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward and fire every timer whose deadline has come, in order."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.cancelled = True  # fired: no longer armed
                timer.callback()


class _Deadline:
    """One deadline of a :class:`Deadlines`; ``cancel()`` as a timer's."""

    __slots__ = ("callback", "cancelled", "_owner")

    def __init__(self, callback: Callable[[], object], owner: Deadlines) -> None:
        self.callback = callback
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.callback = _nothing  # what it would have called (a flow) is not kept by the heap
            self._owner._dropped()


def _nothing() -> None:
    pass


DEADLINES_COMPACT = 1024  # cancelled deadlines kept in the heap at most (beyond half of it)


class Deadlines:
    """Many one-shot deadlines on one timer of a :class:`Clock`.

    :meth:`at` pushes onto a heap; the clock's ``call_later`` is armed for the
    earliest deadline only, and no timer is armed while none is pending. Meant for
    per-flow deadlines that nearly always end cancelled (a connect that
    succeeded): a loop timer per flow costs more than its heap entry, and a
    cancelled entry just waits to be skipped (or swept once they outnumber the
    live ones). The timer stays armed when the last pending deadline is cancelled:
    the next one (a later connect's) needs no new timer, and the old one, when it
    fires, only re-arms for what is pending then. So a stream of flows arms the
    clock about once per deadline's length, not once per flow. A callback's
    exception goes to the loop's exception handler; the others still run.
    """

    __slots__ = ("_clock", "_heap", "_seq", "_timer", "_armed", "_live")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._timer: TimerHandle | None = None
        self._armed = math.inf  # the deadline the timer is armed for
        self._live = 0  # deadlines neither fired nor cancelled

    def at(self, when: float, callback: Callable[[], object]) -> TimerHandle:
        """Call ``callback`` once the clock reaches ``when`` (absolute, on the clock)."""
        deadline = _Deadline(callback, self)
        heapq.heappush(self._heap, (when, next(self._seq), deadline))
        self._live += 1
        if when < self._armed:
            self._arm(when)
        return deadline

    def __len__(self) -> int:
        return self._live

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = self._clock.call_later(when - self._clock.now(), self._fire)

    def _dropped(self) -> None:
        self._live -= 1
        if self._live == 0:
            self._heap.clear()  # the timer stays armed (see the class docstring)
        elif len(self._heap) > DEADLINES_COMPACT and len(self._heap) > 2 * self._live:
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)

    def _fire(self) -> None:
        self._timer, self._armed = None, math.inf
        now, heap, due = self._clock.now(), self._heap, []
        while heap and (heap[0][2].cancelled or heap[0][0] <= now):
            deadline = heapq.heappop(heap)[2]
            if not deadline.cancelled:
                deadline.cancelled = True  # fired: a later cancel() does nothing
                self._live -= 1
                due.append(deadline)
        if heap:
            self._arm(heap[0][0])
        for deadline in due:
            try:
                deadline.callback()
            except Exception as exc:  # noqa: BLE001 - reported as the loop reports a callback's
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "a deadline's callback failed", "exception": exc}
                )


class timeout_at:  # noqa: N801 - used like asyncio.timeout_at
    """``async with timeout_at(clock, deadline):`` cancels the block at ``deadline``
    (absolute, on ``clock``) and raises :class:`TimeoutError` in its place.

    The same contract as ``asyncio.timeout_at``, but on an injected clock: one
    loop timer, no extra task. A cancellation from outside is not turned into a
    timeout.
    """

    __slots__ = ("_clock", "_deadline", "_task", "_handle", "_expired")

    def __init__(self, clock: Clock, deadline: float) -> None:
        self._clock = clock
        self._deadline = deadline
        self._task: asyncio.Task[Any] | None = None
        self._handle: TimerHandle | None = None
        self._expired = False

    @property
    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> timeout_at:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout_at must be used inside a task")
        self._task = task
        self._handle = self._clock.call_later(self._deadline - self._clock.now(), self._expire)
        return self

    def _expire(self) -> None:
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._handle is not None:
            self._handle.cancel()
        if self._expired and self._task is not None:
            # Our cancel was delivered; a cancel from outside as well keeps the count above zero.
            if self._task.uncancel() == 0 and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
        return False
