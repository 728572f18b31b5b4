"""Selects the half-life decay implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.decay_py import DEMAND_HALF_LIFE, EVIDENCE_HALF_LIFE, TRIAL_OUTCOME_HALF_LIFE

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.decay_py import DecayedCounter, DecayedMean
else:
    _impl, IMPLEMENTATION = load("decay")
    DecayedCounter = _impl.DecayedCounter
    DecayedMean = _impl.DecayedMean

__all__ = [
    "DecayedCounter",
    "DecayedMean",
    "DEMAND_HALF_LIFE",
    "EVIDENCE_HALF_LIFE",
    "TRIAL_OUTCOME_HALF_LIFE",
    "IMPLEMENTATION",
]
