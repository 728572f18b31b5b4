"""Selects the half-life decay implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import NO_EXTENSIONS
from honk._fast.decay_py import DEMAND_HALF_LIFE, EVIDENCE_HALF_LIFE, TRIAL_OUTCOME_HALF_LIFE

if TYPE_CHECKING or NO_EXTENSIONS:
    from honk._fast.decay_py import DecayedCounter, DecayedMean

    IMPLEMENTATION = "python"
else:
    try:
        from honk._fast.decay_c import DecayedCounter, DecayedMean

        IMPLEMENTATION = "compiled"
    except ImportError:  # a source checkout without a build
        from honk._fast.decay_py import DecayedCounter, DecayedMean

        IMPLEMENTATION = "python"

__all__ = [
    "DecayedCounter",
    "DecayedMean",
    "EVIDENCE_HALF_LIFE",
    "DEMAND_HALF_LIFE",
    "TRIAL_OUTCOME_HALF_LIFE",
    "IMPLEMENTATION",
]
