"""Selects the latency-ring implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.ring_py import PROBE_HISTORY_CAPACITY, SYNTHETIC_PLACEHOLDER, URLTEST_LATENCY_CAPACITY

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.ring_py import LatencyRing
else:
    _impl, IMPLEMENTATION = load("ring")
    LatencyRing = _impl.LatencyRing

__all__ = [
    "LatencyRing",
    "PROBE_HISTORY_CAPACITY",
    "SYNTHETIC_PLACEHOLDER",
    "URLTEST_LATENCY_CAPACITY",
    "IMPLEMENTATION",
]
