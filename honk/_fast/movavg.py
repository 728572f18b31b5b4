"""Selects the halving-moving-average implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import NO_EXTENSIONS

if TYPE_CHECKING or NO_EXTENSIONS:
    from honk._fast.movavg_py import HalvingAverage, halving_average

    IMPLEMENTATION = "python"
else:
    try:
        from honk._fast.movavg_c import HalvingAverage, halving_average

        IMPLEMENTATION = "compiled"
    except ImportError:  # a source checkout without a build
        from honk._fast.movavg_py import HalvingAverage, halving_average

        IMPLEMENTATION = "python"

__all__ = ["HalvingAverage", "halving_average", "IMPLEMENTATION"]
