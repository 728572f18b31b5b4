"""A flow handle for tracker tests: it records how it was asked to close."""

from __future__ import annotations

from honk.core.clock import FakeClock
from honk.core.errors import HonkError


class FakeHandle:
    def __init__(self, clock: FakeClock) -> None:
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_activity = clock.now()
        self.half_closed_at: float | None = None  # when one direction ended (the half-close timeout)
        self.closed_with: list[HonkError | None] = []

    def close(self, reason: HonkError | None = None) -> None:
        self.closed_with.append(reason)
