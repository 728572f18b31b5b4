"""Selects the moving-average implementations; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.movavg_py import EMA_ALPHA, EMA_WARMUP, WEIGHTED_MEAN_SIZE

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.movavg_py import Ema, HalvingAverage, WeightedMean, halving_average
else:
    _impl, IMPLEMENTATION = load("movavg")
    Ema = _impl.Ema
    HalvingAverage = _impl.HalvingAverage
    WeightedMean = _impl.WeightedMean
    halving_average = _impl.halving_average

__all__ = [
    "Ema",
    "HalvingAverage",
    "WeightedMean",
    "halving_average",
    "EMA_ALPHA",
    "EMA_WARMUP",
    "WEIGHTED_MEAN_SIZE",
    "IMPLEMENTATION",
]
