"""Every number of Score in one place: the seed's numbers with its wording, and each
constant the seed leaves open decided once, with the reason.

Decay half-lives live with the decay kernel (``honk._fast.decay_py``: EVIDENCE_HALF_LIFE,
DEMAND_HALF_LIFE, TRIAL_OUTCOME_HALF_LIFE) and the Beta prior and failure weight with the
Beta kernel (``honk._fast.beta_py``); they are re-exported here so a reviewer finds them all.
"""

from __future__ import annotations

import math

from honk._fast.cell_py import (
    BLEND_FULL_EVIDENCE,
    BOUND_REUSE,
    QUALIFYING_COMPLETIONS,
    RELIABILITY_CONFIDENCE,
    RELIABILITY_PRIOR,
    SETUP_FAILURE_WEIGHT,
)
from honk._fast.decay_py import DEMAND_HALF_LIFE, EVIDENCE_HALF_LIFE, TRIAL_OUTCOME_HALF_LIFE

# --- K.1 keys, layers and storage -------------------------------------------------------------
EXACT_CELLS_MAX = 4096  # "Exact cells live in a 4,096-entry LRU"
AGGREGATE_CELLS_MAX = 4096  # "and aggregate cells in a separate 4,096-entry LRU"

# --- K.3 decay, Beta bounds, qualification and leases -----------------------------------------
# The cell kernel (``honk._fast.cell_py``) holds the numbers a rank's read of a cell uses:
# QUALIFYING_COMPLETIONS ("Initial qualification requires four effective (decayed) useful
# completions"), BLEND_FULL_EVIDENCE, SETUP_FAILURE_WEIGHT, RELIABILITY_CONFIDENCE,
# RELIABILITY_PRIOR and BOUND_REUSE, each with its reason; they are re-exported here.
QUALIFICATION_LEASE = 60.0  # seconds; "retains earned qualification for 60 s from the RX event time"
# A "useful" completion (GH-K-27) is a settled success that saw a response (Outcome.USEFUL):
# a setup alone or a silent success proves the path opens, not that it serves.

# --- K.4 first-choice performance heuristic ---------------------------------------------------
PERFORMANCE_CONFIDENCE_LOSS = 60.0  # seconds; "Each metric loses confidence 60 s after its event time"
PERFORMANCE_EXPIRY = 120.0  # seconds; "and expires at 120 s"
PERFORMANCE_INERTIA = 4  # "a bounded WeightedMean inertia of at most four observations"

# --- K.5 recovery and availability ------------------------------------------------------------
RECOVERY_REPORTERS = 4  # "Four distinct reporters in a cell's uninterrupted post-failure availability cohort"
USABLE_REPORTERS = 4  # "Recent usability requires four distinct Traffic reporters"
COHORT_GAP = 60.0  # seconds; "a gap of at least 60 s resets the cohort"
RECOVERY_LEASE = 60.0  # seconds; "grant a current 60-second qualification lease"
EPISODE_MEMORY = 16  # failure episode ids a cell remembers for late fan-out; forgetting one errs
# towards one more failure (a very late report reopens), never towards a false recovery
TX_MEMORY = 256  # reporters per cell whose positive send is remembered; eviction can only lose a credit

# --- K.9 RX publication -----------------------------------------------------------------------
RX_PUBLISH_INTERVAL = 1.0  # seconds; "after that, at most once per second per reporter"

# --- K.10 budgets (only the cold allowance in this issue) -------------------------------------
COLD_ALLOWANCE_ALL_UP_TO = 4  # "B = n if n <= 4"


def cold_allowance(members: int) -> int:
    """B: every member up to four, otherwise ceil(sqrt(n)) + 1 (GH-K-82)."""
    if members <= COLD_ALLOWANCE_ALL_UP_TO:
        return members
    return math.isqrt(members - 1) + 2  # ceil(sqrt(n)) + 1 without floating point


# --- K.13 reason counters ---------------------------------------------------------------------
SWITCH_HISTORY_MAX = 4096  # "The history is a 4,096-entry LRU"
FLAP_WINDOW = 8  # "return to the prior winner within eight ordinary selections"

# --- K.5 decisions ----------------------------------------------------------------------------
# Ordinary selection (ranker.py). Reliability is a 90 % Beta lower bound; one outcome moves a
# lightly trained node's bound by a few hundredths, a mature node's by less than one.
RELIABILITY_BAND = 0.05  # members this close to the best bound are "as reliable" and compete on
# utility; a wider gap is real evidence, so a faster but failing node stays behind (GH-K-29)
HOLD_RELIABILITY_MARGIN = 0.1  # a qualified challenger displaces the incumbent on reliability only
# when ahead by twice the band, so one outcome on either side cannot flip the selection back and forth
HOLD_UTILITY_MARGIN = 0.1  # within the margin above, fresh utility (in [0, 1]) must lead by a tenth of
# its range: normalised measurements jitter by less, so a hold is not undone by noise
RECENT_FAILURE_WINDOW = PERFORMANCE_EXPIRY  # GH-K-46: a failure excludes its member until it is older
# than the performance evidence age, the 120 s metric expiry of GH-K-31

__all__ = [
    "HOLD_RELIABILITY_MARGIN",
    "HOLD_UTILITY_MARGIN",
    "RECENT_FAILURE_WINDOW",
    "RELIABILITY_BAND",
    "AGGREGATE_CELLS_MAX",
    "COHORT_GAP",
    "COLD_ALLOWANCE_ALL_UP_TO",
    "DEMAND_HALF_LIFE",
    "EVIDENCE_HALF_LIFE",
    "EXACT_CELLS_MAX",
    "FLAP_WINDOW",
    "PERFORMANCE_CONFIDENCE_LOSS",
    "PERFORMANCE_EXPIRY",
    "PERFORMANCE_INERTIA",
    "QUALIFICATION_LEASE",
    "QUALIFYING_COMPLETIONS",
    "RECOVERY_LEASE",
    "RECOVERY_REPORTERS",
    "RX_PUBLISH_INTERVAL",
    "SWITCH_HISTORY_MAX",
    "TRIAL_OUTCOME_HALF_LIFE",
    "USABLE_REPORTERS",
    "cold_allowance",
    "BLEND_FULL_EVIDENCE",
    "RELIABILITY_CONFIDENCE",
    "RELIABILITY_PRIOR",
    "SETUP_FAILURE_WEIGHT",
    "BOUND_REUSE",
    "EPISODE_MEMORY",
    "TX_MEMORY",
    "EARN_DIVISOR",
    "EARNED_CREDIT_CAP",
    "EXPLORATION_BACKOFF_GROWTH",
    "EXPLORATION_BACKOFF_MAX",
    "EXPLORATION_BACKOFF_MIN",
    "TRIAL_ANSWER_TIMEOUT",
    "PERFORMANCE_STALE_CONFIDENCE",
    "PERFORMANCE_LATENCY_FLOOR",
    "PERFORMANCE_COMPARABLE_MIN",
    "PERFORMANCE_WEIGHT_RESPONSE",
    "PERFORMANCE_WEIGHT_SETUP",
    "PERFORMANCE_WEIGHT_GOODPUT",
    "PERFORMANCE_WEIGHT_PROBE",
    "DEGRADATION_RATIO",
    "DEGRADATION_MIN_EXCESS",
    "DEGRADATION_MIN_HISTORY",
]


# --- K.4 decisions ----------------------------------------------------------------------------
# Normalization (GH-K-32): within one scope (group, network, metric, and target or probe identity) a
# candidate's relative score is best/value for latencies and value/best for goodput, in [0, 1]; scopes
# never share units. Utility = sum(w * confidence * relative) / sum(w) over the comparable scopes.
PERFORMANCE_STALE_CONFIDENCE = (
    0.5  # a metric 60-120 s old counts half: it still ranks, but an equal fresh one beats it
)
PERFORMANCE_LATENCY_FLOOR = (
    0.001  # seconds; sub-millisecond latencies compare as 1 ms (loopback noise, no 0-division)
)
PERFORMANCE_COMPARABLE_MIN = (
    2  # a scope ranks only when two candidates have it: a lone value compares with nothing
)
PERFORMANCE_WEIGHT_RESPONSE = (
    4.0  # response is the default objective, so a comparable one outweighs the probe baseline
)
PERFORMANCE_WEIGHT_SETUP = 1.0  # setup costs once per flow; response dominates it
PERFORMANCE_WEIGHT_GOODPUT = (
    1.0  # per known direction; unknown directions add no scope, so never a win or a zero
)
PERFORMANCE_WEIGHT_PROBE = (
    1.0  # the baseline, split evenly across comparable probe identities so several don't outvote
)
DEGRADATION_RATIO = (
    1.5  # GH-K-47: a sample >= 1.5x the exact target's mean, like K-120's carrier RTT pressure rule
)
DEGRADATION_MIN_EXCESS = (
    0.020  # seconds; and >= mean + 20 ms, so fast targets' jitter (2 ms -> 4 ms) is not degradation
)
DEGRADATION_MIN_HISTORY = (
    2  # the target's fresh history needs two observations; one may itself be the outlier
)


# --- recovery trials (K.10 minimal: backoff, earned-currency ledger, recovery continuations) ---
EXPLORATION_BACKOFF_MIN = 300.0  # seconds; GH-K-95 "a 5-minute ... exploration backoff" after a real failure
EXPLORATION_BACKOFF_MAX = 6 * 3600.0  # seconds; "... to 6-hour": the growth never exceeds it
EXPLORATION_BACKOFF_GROWTH = 2.0  # each failed recovery trial doubles the delay: 5 min reaches the 6 h cap in
# seven failed rounds (~12 trials in the first day, then four a day), so a dead path costs little, while one
# chance failure costs one 5-minute wait. Recovery (the four-reporter quorum) ends the streak: the next failure
# starts again at 5 min; a member that keeps recovering and failing is bounded by the ledger, not the backoff
EARN_DIVISOR = 16  # GH-K-83 q = 16: each original applied rank earns 1/16 trial (the q = 8 acceleration is
# not implemented: it needs decayed trial-outcome and demand tracking this issue does not have)
EARNED_CREDIT_CAP = 8  # GH-K-85 "unspent earned credit is capped at eight", in the form
# floor(E) - max(0, V - B) <= 8: E is clamped there, so an idle-but-busy scope cannot bank a burst of trials
TRIAL_ANSWER_TIMEOUT = COHORT_GAP  # seconds; GH-K-94 one unanswered trial per member and target: a trial
# neither answered (no RX after the fence) nor failed within a cohort gap is inconclusive and may be re-sent

# --- escape on a target-path failure -----------------------------------------------------------
TARGET_ESCAPE_FAILURES = 2  # independent target-path failures in one open episode that make the
# incumbent leave at once: a lone one among many successes may be chance (the incumbent's own next
# flows then recover the cell), a second before recovery is not; node-scoped failures leave at once
__all__ += ["TARGET_ESCAPE_FAILURES"]
