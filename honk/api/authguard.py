"""Failed API authentications, limited per source address (sans-I/O: time is the injected clock).

A wrong secret costs its sender: each source has a bucket of :data:`FAILURE_BURST` failures
that refills one failure every :data:`FAILURE_REFILL` seconds. While the bucket is empty the
source's requests are answered ``429`` before the secret is compared at all, so guessing runs
at ten tries a minute whatever the sender's speed, and a dashboard left open with an old
secret is slowed, not locked out. A right secret is never refused by the limit while tokens
remain, and an empty bucket refills by itself; nobody has to unblock anyone.

Memory is bounded: at most :data:`SOURCES_MAX` sources are remembered, a full bucket is
forgotten, and when the table is full the source that failed least recently goes first.
"""

from __future__ import annotations

from collections import OrderedDict

from honk.core.clock import Clock

__all__ = ["FAILURE_BURST", "FAILURE_REFILL", "SOURCES_MAX", "AuthThrottle"]

FAILURE_BURST = 10  # failed authentications a source may make back to back before it is slowed
FAILURE_REFILL = 6.0  # seconds that give a slowed source one more try: ten a minute
SOURCES_MAX = 4096  # sources remembered at once (a scan of many addresses cannot grow the table)

REJECTED = "rejected"  # a wrong or missing secret, answered 401
THROTTLED = "throttled"  # a source out of tries, answered 429 without comparing its secret
RESULTS = (REJECTED, THROTTLED)


class AuthThrottle:
    """Each source's remaining failed tries, refilled over time."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (tokens, at)
        self._swept = float("-inf")  # when the table was last cleared of refilled sources

    def _tokens(self, source: str, now: float) -> float:
        entry = self._buckets.get(source)
        if entry is None:
            return float(FAILURE_BURST)
        tokens, at = entry
        return min(float(FAILURE_BURST), tokens + (now - at) / FAILURE_REFILL)

    def throttled(self, source: str) -> bool:
        """Whether ``source`` has no try left: answer it 429 without looking at its secret."""
        return self._tokens(source, self._clock.now()) < 1.0

    def failed(self, source: str) -> None:
        """``source`` sent a wrong or missing secret: one try fewer."""
        now = self._clock.now()
        tokens = self._tokens(source, now) - 1.0
        self._buckets[source] = (tokens, now)
        self._buckets.move_to_end(source)
        # a large table is cleared of refilled sources at most once a refill time, so a scan from
        # many addresses costs one pass over the table per FAILURE_REFILL, not one per failure
        if len(self._buckets) >= SOURCES_MAX // 2 and now - self._swept >= FAILURE_REFILL:
            self._swept = now
            self.sweep()
        while len(self._buckets) > SOURCES_MAX:
            self._buckets.popitem(last=False)

    def retry_after(self, source: str) -> int:
        """Whole seconds until ``source`` has a try again (at least 1)."""
        missing = 1.0 - self._tokens(source, self._clock.now())
        return max(1, int(missing * FAILURE_REFILL + 0.999))

    def sweep(self) -> None:
        """Forget the sources whose bucket has refilled (nothing left to remember)."""
        now = self._clock.now()
        for source in [s for s in self._buckets if self._tokens(s, now) >= FAILURE_BURST]:
            del self._buckets[source]

    def __len__(self) -> int:
        return len(self._buckets)
