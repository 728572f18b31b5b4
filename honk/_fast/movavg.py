"""Selects the moving-average implementations; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import NO_EXTENSIONS
from honk._fast.movavg_py import EMA_ALPHA, EMA_WARMUP, WEIGHTED_MEAN_SIZE

if TYPE_CHECKING or NO_EXTENSIONS:
    from honk._fast.movavg_py import Ema, HalvingAverage, WeightedMean, halving_average

    IMPLEMENTATION = "python"
else:
    try:
        from honk._fast.movavg_c import Ema, HalvingAverage, WeightedMean, halving_average

        IMPLEMENTATION = "compiled"
    except ImportError:  # a source checkout without a build
        from honk._fast.movavg_py import Ema, HalvingAverage, WeightedMean, halving_average

        IMPLEMENTATION = "python"

__all__ = [
    "HalvingAverage",
    "halving_average",
    "Ema",
    "WeightedMean",
    "EMA_ALPHA",
    "EMA_WARMUP",
    "WEIGHTED_MEAN_SIZE",
    "IMPLEMENTATION",
]
