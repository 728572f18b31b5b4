"""Score's evidence cell: decayed outcome counts of one key, and what a rank reads of it.

A cell holds its node's outcomes under one key with the 30-minute evidence half-life. A rank
reads every member's cells on every flow, so the read is a kernel:

* :meth:`EvidenceCell.standing` is the cell's Beta reliability lower bound (setup failures
  weigh SETUP_FAILURE_WEIGHT, GH-K-26), its layer weight in the blend (GH-K-04) and its useful
  completions (GH-K-27). They are reused for BOUND_REUSE seconds while the counts they read are
  unchanged; a settled outcome drops them at once (a setup alone changes none of them).
* :func:`read_cells` blends a member's (global, family, exact) cells: each layer takes over
  from its parents by its weight, and qualification is earned completions in any layer or the
  global cell's running lease (GH-K-27/28).

Time is always an argument. This file is plain Python and also the Cython source of ``cell_c``
(types in ``cell_c.pxd``); keep the two in step.
"""

try:
    import cython
except ModuleNotFoundError:  # an install without Cython: the twin's stand-in
    from honk._fast import _cython as cython

from honk._fast.beta_py import DEFAULT_PRIOR
from honk._fast.decay_py import EVIDENCE_HALF_LIFE
from honk._fast.outcome import Outcome, Standing

if not cython.compiled:  # the compiled build cimports the compiled kernels (cell_c.pxd)
    from honk._fast.beta import beta_lower_bound
    from honk._fast.decay import DecayedCounter


# Score's numbers for reading a cell (re-exported by honk.group.score.constants)
QUALIFYING_COMPLETIONS = 4.0  # "Initial qualification requires four effective (decayed) useful completions"
# A "useful" completion (GH-K-27) is a settled success that saw a response (Outcome.USEFUL):
# a setup alone or a silent success proves the path opens, not that it serves.
BLEND_FULL_EVIDENCE = 8.0  # a layer's weight is min(1, its decayed outcomes / 8): twice the
# qualification count, so a just-qualified target still leans half on its family before overriding it
SETUP_FAILURE_WEIGHT = 2.0  # a setup failure delivers nothing and costs the user a retry, so it
# counts as two post-setup failures in the Beta bound
RELIABILITY_CONFIDENCE = 0.9  # one-sided 90 % lower bound: four clean completions already rate
# above 0.6, while one failure in five still shows clearly
RELIABILITY_PRIOR = DEFAULT_PRIOR  # Beta(1, 1): the uniform prior of the Beta kernel
BOUND_REUSE = 1.0  # seconds a cell's Beta bound, layer weight and useful count are reused while its
# counts are unchanged: at the 30-minute half-life its counts decay 0.04 % a second, which moves
# them far less than any margin they are compared with (a record recomputes them at once), and
# every rank of a busy group no longer recomputes every cell

# module constants the compiled build keeps as C values (cell_c.pxd)
_SUCCESS = Outcome.SUCCESS
_USEFUL = Outcome.USEFUL
_FAILURE = Outcome.FAILURE
_SETUP_FAILURE = Outcome.SETUP_FAILURE
# the bound of a cell with no evidence: what a missing global layer contributes
PRIOR_BOUND = beta_lower_bound(0.0, 0.0, RELIABILITY_CONFIDENCE, RELIABILITY_PRIOR, RELIABILITY_PRIOR)


class EvidenceCell:
    """Decayed outcome counts of one key. Time is always an argument."""

    def __init__(self, incarnation: int, key: object = None) -> None:
        self.incarnation = incarnation
        self.key = key  # the key object the store holds it under: reusing it makes lookups identity hits
        self.attempts = DecayedCounter(EVIDENCE_HALF_LIFE)  # every recorded sample, warm-up included
        self.successes = DecayedCounter(EVIDENCE_HALF_LIFE)  # settled successes (useful or not)
        self.failures = DecayedCounter(EVIDENCE_HALF_LIFE)  # failures after setup
        self.setup_failures = DecayedCounter(EVIDENCE_HALF_LIFE)
        self.useful = DecayedCounter(EVIDENCE_HALF_LIFE)  # useful completions
        self.last_failure = None  # event time of the newest failure
        self.lease_until = None  # qualification lease end (kept on the global cell)
        # the reused standing: valid when ``_read`` is set, computed at ``_read_at``
        self._read = False
        self._read_at = 0.0
        self._bound = 0.0
        self._weight = 0.0
        self._useful = 0.0

    def record(self, outcome: Outcome, now: float) -> None:
        """Add one ``outcome`` that happened at ``now``."""
        self.attempts.add(1.0, now)  # a setup alone changes nothing a rank reads: the standing stays
        if outcome is _SUCCESS or outcome is _USEFUL:
            self._read = False
            self.successes.add(1.0, now)
            if outcome is _USEFUL:
                self.useful.add(1.0, now)
        elif outcome is _FAILURE or outcome is _SETUP_FAILURE:
            self._read = False
            (self.failures if outcome is _FAILURE else self.setup_failures).add(1.0, now)
            if self.last_failure is None or now > self.last_failure:
                self.last_failure = now
            self.lease_until = None  # a failure revokes the qualification lease (GH-K-28)

    def outcomes(self, now: float) -> float:
        """Decayed settled outcomes (successes and failures of both kinds): the layer's evidence."""
        return self.successes.value(now) + self.failures.value(now) + self.setup_failures.value(now)

    def bound(self, now: float) -> float:
        """The reliability lower bound at ``now``, computed afresh (GH-K-26)."""
        failures = self.failures.value(now) + SETUP_FAILURE_WEIGHT * self.setup_failures.value(now)
        return beta_lower_bound(
            self.successes.value(now), failures, RELIABILITY_CONFIDENCE, RELIABILITY_PRIOR, RELIABILITY_PRIOR
        )

    def weight(self, now: float) -> float:
        """How much of the estimate this layer takes over from its parents (GH-K-04), afresh."""
        return min(1.0, self.outcomes(now) / BLEND_FULL_EVIDENCE)

    def _refresh(self, now: float) -> None:
        """Make the reused standing current: kept for BOUND_REUSE seconds unless a record came."""
        if self._read and 0.0 <= now - self._read_at < BOUND_REUSE:
            return
        self._bound = self.bound(now)
        self._weight = self.weight(now)
        self._useful = self.useful.value(now)
        self._read_at = now
        self._read = True

    def standing(self, now: float) -> Standing:
        """What a rank reads of the cell at ``now``, reused briefly (see the module docstring)."""
        self._refresh(now)
        return Standing(self._bound, self._weight, self._useful)

    def __repr__(self) -> str:
        return f"EvidenceCell(incarnation={self.incarnation})"


def reliability_bound(cell: EvidenceCell | None, now: float) -> float:
    """A cell's reliability lower bound, afresh; the prior's for no cell."""
    if cell is None:
        return PRIOR_BOUND
    return cell.bound(now)


def layer_weight(cell: EvidenceCell | None, now: float) -> float:
    """How much of the estimate a layer takes over from its parents, afresh; none for no cell."""
    if cell is None:
        return 0.0
    return cell.weight(now)


def standing(cell: EvidenceCell, now: float) -> Standing:
    """What a rank reads of ``cell`` at ``now``, computed afresh (no reuse)."""
    return Standing(cell.bound(now), cell.weight(now), cell.useful.value(now))


def blend(
    glob: EvidenceCell | None, family: EvidenceCell | None, exact: EvidenceCell | None, now: float
) -> float:
    """The hierarchical blend's reliability of a member's (global, family, exact) cells at ``now``
    (None: no cell, GH-K-04): each present layer takes over from its parents by its weight, from
    the prior's bound when there is no global cell. Each cell's standing is reused."""
    if glob is None:
        estimate = PRIOR_BOUND
    else:
        glob._refresh(now)
        estimate = glob._bound
    if family is not None:
        family._refresh(now)
        if family._weight > 0.0:
            estimate = family._weight * family._bound + (1.0 - family._weight) * estimate
    if exact is not None:
        exact._refresh(now)
        if exact._weight > 0.0:
            estimate = exact._weight * exact._bound + (1.0 - exact._weight) * estimate
    return estimate


def qualified(
    glob: EvidenceCell | None, family: EvidenceCell | None, exact: EvidenceCell | None, now: float
) -> bool:
    """Whether a member with these cells is qualified at ``now``: earned completions in a layer,
    or the global cell's running lease (GH-K-27/28)."""
    if glob is not None:
        glob._refresh(now)
        if glob._useful >= QUALIFYING_COMPLETIONS or (
            glob.lease_until is not None and now < glob.lease_until
        ):
            return True
    if family is not None:
        family._refresh(now)
        if family._useful >= QUALIFYING_COMPLETIONS:
            return True
    if exact is not None:
        exact._refresh(now)
        if exact._useful >= QUALIFYING_COMPLETIONS:
            return True
    return False


def read_cells(cells: tuple, now: float) -> tuple:
    """(reliability, qualified) of the (global, family, exact) cells at ``now`` (None: no cell):
    :func:`blend` and :func:`qualified` of them."""
    return blend(cells[0], cells[1], cells[2], now), qualified(cells[0], cells[1], cells[2], now)
