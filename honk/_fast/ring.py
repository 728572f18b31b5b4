"""Selects the latency-ring implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import NO_EXTENSIONS
from honk._fast.ring_py import PROBE_HISTORY_CAPACITY, SYNTHETIC_PLACEHOLDER, URLTEST_LATENCY_CAPACITY

if TYPE_CHECKING or NO_EXTENSIONS:
    from honk._fast.ring_py import LatencyRing

    IMPLEMENTATION = "python"
else:
    try:
        from honk._fast.ring_c import LatencyRing

        IMPLEMENTATION = "compiled"
    except ImportError:  # a source checkout without a build
        from honk._fast.ring_py import LatencyRing

        IMPLEMENTATION = "python"

__all__ = [
    "LatencyRing",
    "URLTEST_LATENCY_CAPACITY",
    "PROBE_HISTORY_CAPACITY",
    "SYNTHETIC_PLACEHOLDER",
    "IMPLEMENTATION",
]
