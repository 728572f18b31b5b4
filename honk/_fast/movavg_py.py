"""The halving moving average used by URLTest ranking.

``next = (prev + sample) / 2``; the first sample initialises the average.
Upstream honk calls this policy ``min_moving_avg``: every new latency sample
carries half the weight, so a node that got slow is noticed within a few
probes while one outlier is still damped.

This file is plain Python and also the Cython source of ``movavg_c`` (types in
``movavg_c.pxd``); keep the two in step.
"""


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
