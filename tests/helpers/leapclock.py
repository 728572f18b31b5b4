"""A real clock a test can move forward in one leap.

Registration grace (60 s) and recovery cooldowns are read as differences of clock readings, so
a daemon started on a :class:`LeapClock` can be taken past them at once: ``leap(61)`` makes a
node registered now out of its grace for every later reading. Sleeps and timers still run in
real time (a leap never fires them early), so what the daemon does between readings -- dials,
probes, relays -- is the real thing.
"""

from __future__ import annotations

from honk.core.clock import MonotonicClock


class LeapClock(MonotonicClock):
    """``MonotonicClock`` plus an offset that only grows."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset

    def wall(self) -> float:
        return super().wall() + self.offset

    def leap(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self.offset += seconds
