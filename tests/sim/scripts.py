"""The scripted scenarios the simulation tests share, so every policy is judged on the same flows."""

from __future__ import annotations

from .engine import NodeScript, Outage, Script

HOUR = 3600.0
TARGETS = tuple(f"site{i}.example" for i in range(20))
WARMUP = 120.0  # seconds before the steady-state fraction is judged: the first probe rounds settle
STEADY_BEST_FRACTION = 0.90  # issue 11's steady-state target
OUTAGE_START, OUTAGE_END = 1200.0, 2400.0
JITTER = 0.080  # seconds; twice the default 50 ms tolerance, around equal means


def steady_script() -> Script:
    return Script(
        nodes=(
            NodeScript("slow", success=0.99, setup=0.150, response=0.300),
            NodeScript("fast", success=0.99, setup=0.050, response=0.100),
            NodeScript("flaky", success=0.80, setup=0.060, response=0.100),
        ),
        targets=TARGETS,
        duration=HOUR,
        seed=11,
    )


def failing_incumbent_script(probes_fail: bool) -> Script:
    """``fast`` wins until it stops serving real targets; with ``probes_fail`` False its probes still pass.
    No background failures: a URLTest node with dial-failure strikes gets no real traffic to clear them,
    so a chance pair of failures before the outage would already have moved the winner for good."""
    outage = Outage(OUTAGE_START, OUTAGE_END, targets=None if probes_fail else frozenset(TARGETS))
    return Script(
        nodes=(
            NodeScript("backup", success=1.0, setup=0.100, response=0.200),
            NodeScript("fast", success=1.0, setup=0.050, response=0.100, outages=(outage,)),
        ),
        targets=TARGETS,
        duration=HOUR,
        seed=12,
    )


def jittery_script() -> Script:
    return Script(
        nodes=(
            NodeScript("left", success=0.99, setup=0.100, response=0.200, jitter=JITTER),
            NodeScript("right", success=0.99, setup=0.100, response=0.205, jitter=JITTER),
        ),
        targets=TARGETS,
        duration=HOUR,
        seed=13,
    )


def per_target_script() -> Script:
    """``east`` fails the first half of the targets and serves the rest; ``west`` the reverse.
    Both pass every probe at the same latency: only per-target learning finds the best node."""
    half = len(TARGETS) // 2
    return Script(
        nodes=(
            NodeScript("east", target_success=dict.fromkeys(TARGETS[:half], 0.0)),
            NodeScript("west", target_success=dict.fromkeys(TARGETS[half:], 0.0)),
        ),
        targets=TARGETS,
        duration=HOUR,
        seed=14,
    )
