"""Exponential decay by half-life, driven by event timestamps.

Score's evidence fades with time: business attempts and outcomes with a
30-minute half-life, original-business demand with five minutes, optional-trial
outcomes with ten. Each quantity here is stored as its value at a reference
time ``at`` (the newest event seen); reading at ``now`` multiplies by
``2 ** (-(now - at) / half_life)``.

Time is always an argument. The rules for time going backwards:

* reading at a ``now`` earlier than the reference returns the value at the
  reference (clamped): going back in time never increases anything;
* an event older than the reference is decayed by its age before it is added,
  exactly as if it had arrived in order; the reference does not move back.

Numerics: every add moves the reference time forward to the event time
(rebasing), so the stored value only ever decays and never has to be scaled up;
decay factors lie in [0, 1] and a gap of 10**9 s simply underflows to 0.0.
Nothing overflows however long the process runs.

This file is plain Python and also the Cython source of ``decay_c`` (types in
``decay_c.pxd``); keep the two in step.
"""

import math

EVIDENCE_HALF_LIFE = 1800.0  # "Business attempt and outcome evidence decays with a 30-minute half-life"
DEMAND_HALF_LIFE = 300.0  # "original starts decay with a five-minute half-life"
TRIAL_OUTCOME_HALF_LIFE = 600.0  # "recent optional-trial outcomes (ten-minute half-life; ...)"
LN2 = 0.6931471805599453  # log(2): a half-life h is a decay rate of LN2 / h per second


def _check_half_life(half_life: float) -> float:
    if not (half_life > 0.0 and math.isfinite(half_life)):
        raise ValueError(f"half_life must be positive and finite, got {half_life}")
    return LN2 / half_life


def _check_time(now: float) -> None:
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now}")


class DecayedCounter:
    """A count (or any non-negative amount) that halves every ``half_life`` seconds."""

    def __init__(self, half_life: float) -> None:
        self._rate = _check_half_life(half_life)
        self._half_life = half_life
        self._value = 0.0
        self._at = 0.0

    def add(self, amount: float, now: float) -> float:
        """Add ``amount`` (>= 0) that happened at ``now``; return the value at the reference time."""
        _check_time(now)
        if not (amount >= 0.0 and math.isfinite(amount)):
            raise ValueError(f"amount must be finite and non-negative, got {amount}")
        if self._value == 0.0:
            # Nothing retained: the event time becomes the reference, whatever it is.
            self._value = float(amount)
            self._at = now
        elif now >= self._at:
            self._value = self._value * math.exp(-(now - self._at) * self._rate) + amount
            self._at = now
        else:
            self._value += amount * math.exp(-(self._at - now) * self._rate)
        return self._value

    def value(self, now: float) -> float:
        """The amount decayed to ``now``, without changing the counter."""
        if now <= self._at:
            return self._value
        return self._value * math.exp(-(now - self._at) * self._rate)

    def clear(self) -> None:
        """Forget everything."""
        self._value = 0.0
        self._at = 0.0

    @property
    def half_life(self) -> float:
        return self._half_life

    @property
    def at(self) -> float:
        """The reference time: the newest event time added (0.0 before the first)."""
        return self._at


class DecayedMean:
    """A weighted mean whose observations' weights halve every ``half_life`` seconds.

    Stored as the running mean and the total weight at the reference time
    (West's incremental update), not as a weighted sum over a weight: the mean
    itself never decays, only the weight does, so the ratio does not lose
    precision as both parts shrink towards the underflow range.
    """

    def __init__(self, half_life: float) -> None:
        self._rate = _check_half_life(half_life)
        self._half_life = half_life
        self._mean = 0.0
        self._weight = 0.0
        self._at = 0.0

    def add(self, value: float, weight: float, now: float):
        """Record ``value`` with ``weight`` (>= 0) at ``now``; return the new mean (``None`` if no weight)."""
        _check_time(now)
        if not math.isfinite(value):
            raise ValueError(f"value must be finite, got {value}")
        if not (weight >= 0.0 and math.isfinite(weight)):
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        if self._weight == 0.0:
            self._at = now
        elif now >= self._at:
            self._weight *= math.exp(-(now - self._at) * self._rate)
            self._at = now
        else:
            weight *= math.exp(-(self._at - now) * self._rate)
        total = self._weight + weight
        if total > 0.0:
            if weight == total:  # nothing left of the older observations
                self._mean = float(value)
            else:
                self._mean += (value - self._mean) * (weight / total)
            self._weight = total
        else:
            self._mean = 0.0
            self._weight = 0.0
        if self._weight == 0.0:
            return None
        return self._mean

    def mean(self, now: float):
        """The weighted mean at ``now``; ``None`` once no weight is left (or none was added)."""
        if self.weight(now) == 0.0:
            return None
        return self._mean

    def weight(self, now: float) -> float:
        """The total weight decayed to ``now``."""
        if now <= self._at:
            return self._weight
        return self._weight * math.exp(-(now - self._at) * self._rate)

    def total(self, now: float) -> float:
        """The decayed weighted sum, ``mean * weight``, at ``now``."""
        return self._mean * self.weight(now)

    def clear(self) -> None:
        """Forget everything."""
        self._mean = 0.0
        self._weight = 0.0
        self._at = 0.0

    @property
    def half_life(self) -> float:
        return self._half_life

    @property
    def at(self) -> float:
        """The reference time: the newest event time added (0.0 before the first)."""
        return self._at
