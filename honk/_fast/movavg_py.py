"""Moving averages of latency samples.

* :class:`HalvingAverage`, used by URLTest ranking: ``next = (prev + sample) / 2``;
  the first sample initialises the average. Upstream honk calls this policy
  ``min_moving_avg``: every new latency sample carries half the weight, so a
  node that got slow is noticed within a few probes while one outlier is still
  damped.
* :class:`Ema`, the real-traffic dial-latency EMA behind the URLTest
  degradation detector (alpha = 1/8, active after 3 warm-up dials).
* :class:`WeightedMean`, the bounded four-observation inertia of Score's
  first-choice performance heuristic.

This file is plain Python and also the Cython source of ``movavg_c`` (types in
``movavg_c.pxd``); keep the two in step.
"""

import math
from array import array

EMA_ALPHA = 0.125  # "a self-referential EMA (α=1/8, after 3 warmup dials) of fresh dial latencies"
EMA_WARMUP = 3  # same sentence: the EMA is active "after 3 warmup dials"
WEIGHTED_MEAN_SIZE = 4  # "bounded four-observation WeightedMean inertia"


class HalvingAverage:
    """Halving moving average of latency samples, in seconds."""

    def __init__(self) -> None:
        self._value = 0.0
        self._count = 0

    def update(self, sample: float) -> float:
        """Fold ``sample`` in and return the new average."""
        if self._count == 0:
            self._value = sample
        else:
            self._value = (self._value + sample) / 2.0
        self._count += 1
        return self._value

    def reset(self) -> None:
        """Forget every sample."""
        self._value = 0.0
        self._count = 0

    @property
    def value(self):
        """The current average, or ``None`` before the first sample."""
        if self._count == 0:
            return None
        return self._value

    @property
    def count(self) -> int:
        """How many samples were folded in since construction or the last reset."""
        return self._count


def halving_average(samples) -> float:
    """The halving average of a sequence, oldest first; ``ValueError`` if empty."""
    avg = HalvingAverage()
    for s in samples:
        avg.update(s)
    if avg.count == 0:
        raise ValueError("no samples")
    return avg._value


class Ema:
    """Exponential moving average of real-traffic dial latencies, in seconds.

    After warm-up each sample moves the average by ``alpha`` of the gap:
    ``next = prev + alpha * (sample - prev)``.

    Warm-up: the first ``warmup`` samples are plain-averaged, so the EMA starts
    from the mean of the warm-up dials rather than from the first dial alone;
    with alpha = 1/8 a single unlucky first dial would otherwise weigh on the
    average for a dozen or more dials ((7/8)**17 is still 10%). The seed leaves
    this choice open (GH-B-18 marks EMA initialisation underspecified). Until
    ``warmup`` samples have arrived
    :attr:`warm` is ``False`` and callers must not act on :attr:`value`.
    """

    def __init__(self, alpha: float = EMA_ALPHA, warmup: int = EMA_WARMUP) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if warmup < 0:
            raise ValueError(f"warmup must not be negative, got {warmup}")
        self._alpha = alpha
        self._warmup = warmup
        self._value = 0.0
        self._count = 0

    def update(self, sample: float) -> float:
        """Fold ``sample`` in and return the new average."""
        if not math.isfinite(sample):
            raise ValueError(f"latency must be finite, got {sample}")
        self._count += 1
        if self._count == 1:
            self._value = float(sample)
        elif self._count <= self._warmup:
            self._value += (sample - self._value) / self._count
        else:
            self._value += self._alpha * (sample - self._value)
        return self._value

    def reset(self) -> None:
        """Forget every sample; the EMA is cold again."""
        self._value = 0.0
        self._count = 0

    @property
    def value(self):
        """The current average, or ``None`` before the first sample."""
        if self._count == 0:
            return None
        return self._value

    @property
    def warm(self) -> bool:
        """``True`` once ``warmup`` samples (and at least one) have been folded in."""
        return self._count > 0 and self._count >= self._warmup

    @property
    def count(self) -> int:
        """How many samples were folded in since construction or the last reset."""
        return self._count

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def warmup(self) -> int:
        return self._warmup


_ZERO = array("d", [0.0])  # repeated into a mean's zeroed buffer


class WeightedMean:
    """Weighted mean of the newest ``size`` observations; older ones drop out.

    The seed gives no per-position weights, so every retained position counts
    the same. An observation may carry its own non-negative ``weight`` (default
    1.0, giving the plain mean), for example the bytes a goodput window moved.
    """

    def __init__(self, size: int = WEIGHTED_MEAN_SIZE) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._size = size
        # observation k's value at k and its weight at size + k: one buffer, made once per mean
        self._slots = _ZERO * (2 * size)
        self._head = 0
        self._len = 0

    def add(self, value: float, weight: float = 1.0):
        """Record one observation and return the new mean (``None`` if all weights are zero)."""
        if not math.isfinite(value):
            raise ValueError(f"value must be finite, got {value}")
        if not (weight >= 0.0 and math.isfinite(weight)):
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        self._slots[self._head] = value
        self._slots[self._size + self._head] = weight
        self._head += 1
        if self._head == self._size:
            self._head = 0
        if self._len < self._size:
            self._len += 1
        return self.mean()

    def mean(self):
        """The weighted mean of the retained observations; ``None`` if empty or all weights are zero.

        Recomputed from at most ``size`` entries on each call, so no rounding drift builds up.
        """
        total = 0.0
        weight = 0.0
        size = self._size
        for i in range(self._len):
            total += self._slots[i] * self._slots[size + i]
            weight += self._slots[size + i]
        if weight == 0.0:
            return None
        return total / weight

    def clear(self) -> None:
        """Forget every observation."""
        self._head = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def size(self) -> int:
        """How many observations are retained at most."""
        return self._size
