"""Beta-posterior confidence bounds for Score's reliability estimate.

Score rates a node's reliability from decayed success and failure counts.
With a ``Beta(prior_a, prior_b)`` prior the posterior is
``Beta(successes + prior_a, failures * failure_weight + prior_b)``; setup
failures can be given more weight than other failures. The bounds here are
quantiles of that posterior:

* :func:`beta_lower_bound` is the ``1 - confidence`` quantile (the success rate
  is at least this with probability ``confidence``);
* :func:`beta_upper_bound` is the ``confidence`` quantile.

No scipy at run time. The regularised incomplete beta function
``I_x(a, b)`` is evaluated by its continued fraction (modified Lentz), using
the symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)`` where the fraction converges
slowly. The quantile inverts it by Halley steps on a bisection bracket, to a
relative tolerance of 1e-12.

``log B(a, b)`` comes from this module's own log-gamma (Stirling's series with
its correction terms, plus the recurrence below 10) rather than
``math.lgamma``: CPython ships its own lgamma, which differs from the C
library's in the last bits, and the compiled twin must agree with this file.
The Stirling form also computes ``log B`` for large ``a`` and ``b`` without
subtracting large, nearly equal log-gammas. Only ``log``, ``log1p``, ``exp``
and ``sqrt`` are needed; both builds take them from the same C library.

This file is plain Python and also the Cython source of ``beta_c`` (types in
``beta_c.pxd``); keep the two in step.
"""

import math

DEFAULT_PRIOR = 1.0  # the seed leaves "the prior" open (GH-K-26); Beta(1, 1) is the uniform prior
DEFAULT_FAILURE_WEIGHT = (
    1.0  # "Setup failures carry extra weight in the Beta confidence bounds"; the caller picks it
)

LOG_SQRT_2PI = 0.9189385332046728  # log(sqrt(2 * pi))
STIRLING_MIN = 10.0  # Stirling's series is used from here up; smaller arguments are shifted
CF_EPSILON = 1e-15  # the continued fraction stops once a step changes it by less than this
CF_TINY = 1e-300  # Lentz's guard against dividing by zero
CF_MAX_TERMS = 100_000  # enough for shape parameters up to ~1e9
QUANTILE_TOLERANCE = 1e-12  # relative change of x at which the inversion stops
QUANTILE_MAX_STEPS = 200
MAX_EXP = 700.0  # exp() of anything larger would overflow a double (Python raises)


def _stirling_correction(x: float) -> float:
    """``log Gamma(x) - ((x - 1/2) log x - x + log sqrt(2 pi))`` for ``x >= 10``.

    The first seven terms of the asymptotic series, with Bernoulli-number
    coefficients; the first term left out is below 3e-17 at ``x = 10``.
    """
    r = 1.0 / x
    r2 = r * r
    return r * (
        1.0 / 12.0
        + r2
        * (
            -1.0 / 360.0
            + r2
            * (
                1.0 / 1260.0
                + r2 * (-1.0 / 1680.0 + r2 * (1.0 / 1188.0 + r2 * (-691.0 / 360360.0 + r2 * (1.0 / 156.0))))
            )
        )
    )


def _log_gamma(x: float) -> float:
    """``log Gamma(x)`` for ``x > 0``."""
    shift = 1.0
    while x < STIRLING_MIN:
        shift *= x
        x += 1.0
    return (x - 0.5) * math.log(x) - x + LOG_SQRT_2PI + _stirling_correction(x) - math.log(shift)


def _log_beta(a: float, b: float) -> float:
    """``log B(a, b) = log Gamma(a) + log Gamma(b) - log Gamma(a + b)`` for ``a, b > 0``.

    When an argument is large the Stirling terms are combined by hand so that
    the big ``(x - 1/2) log x`` parts cancel exactly instead of numerically.
    """
    p = a
    q = b
    if p > q:
        p = b
        q = a
    if p >= STIRLING_MIN:
        corr = _stirling_correction(p) + _stirling_correction(q) - _stirling_correction(p + q)
        return (
            -0.5 * math.log(q)
            + LOG_SQRT_2PI
            + corr
            + (p - 0.5) * math.log(p / (p + q))
            + q * math.log1p(-p / (p + q))
        )
    if q >= STIRLING_MIN:
        corr = _stirling_correction(q) - _stirling_correction(p + q)
        return _log_gamma(p) + corr + p - p * math.log(p + q) + (q - 0.5) * math.log1p(-p / (p + q))
    return _log_gamma(p) + _log_gamma(q) - _log_gamma(p + q)


def _continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of ``I_x(a, b)``, by the modified Lentz method.

    Converges quickly for ``x < (a + 1) / (a + b + 2)``; the caller arranges that.
    """
    apb = a + b
    c = 1.0
    d = 1.0 - apb * x / (a + 1.0)
    if abs(d) < CF_TINY:
        d = CF_TINY
    d = 1.0 / d
    h = d
    for m in range(1, CF_MAX_TERMS + 1):
        m2 = 2.0 * m
        # Even term d_{2m}.
        num = m * (b - m) * x / ((a - 1.0 + m2) * (a + m2))
        d = 1.0 + num * d
        if abs(d) < CF_TINY:
            d = CF_TINY
        c = 1.0 + num / c
        if abs(c) < CF_TINY:
            c = CF_TINY
        d = 1.0 / d
        h *= d * c
        # Odd term d_{2m+1}.
        num = -(a + m) * (apb + m) * x / ((a + m2) * (a + 1.0 + m2))
        d = 1.0 + num * d
        if abs(d) < CF_TINY:
            d = CF_TINY
        c = 1.0 + num / c
        if abs(c) < CF_TINY:
            c = CF_TINY
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < CF_EPSILON:
            break
    return h


def _incomplete_beta(x: float, a: float, b: float, log_beta: float) -> float:
    """``I_x(a, b)`` given ``log_beta = log B(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    # x^a (1-x)^b / B(a, b) never overflows: it is at most about sqrt(a b / (a + b)).
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - log_beta)
    if x * (a + b + 2.0) < a + 1.0:
        return front * _continued_fraction(x, a, b) / a
    return 1.0 - front * _continued_fraction(1.0 - x, b, a) / b


def _initial_guess(p: float, a: float, b: float) -> float:
    """A rough ``x`` with ``I_x(a, b) = p``, strictly inside (0, 1)."""
    if a >= 1.0 and b >= 1.0:
        # Normal deviate y with P(Z > y) = p (Abramowitz & Stegun 26.2.22), mapped
        # to the beta scale by the approximation of A&S 26.5.22.
        tail = p
        if p >= 0.5:
            tail = 1.0 - p
        t = math.sqrt(-2.0 * math.log(tail))
        y = t - (2.30753 + 0.27061 * t) / (1.0 + t * (0.99229 + 0.04481 * t))
        if p >= 0.5:
            y = -y
        lam = (y * y - 3.0) / 6.0
        ra = 1.0 / (2.0 * a - 1.0)
        rb = 1.0 / (2.0 * b - 1.0)
        h = 2.0 / (ra + rb)
        w = y * math.sqrt(h + lam) / h - (rb - ra) * (lam + 5.0 / 6.0 - 2.0 / (3.0 * h))
        w2 = 2.0 * w
        if w2 > MAX_EXP:
            w2 = MAX_EXP
        elif w2 < -MAX_EXP:
            w2 = -MAX_EXP
        x = a / (a + b * math.exp(w2))
    else:
        # Near 0, I_x ~ x^a / (a B); near 1, 1 - I_x ~ (1-x)^b / (b B). Weigh the two
        # tails by their size at the mean a / (a + b) and invert the one p falls in.
        low = math.exp(a * math.log(a / (a + b))) / a
        high = math.exp(b * math.log(b / (a + b))) / b
        scale = low + high
        if p < low / scale:
            x = math.exp(math.log(a * scale * p) / a)
        else:
            x = 1.0 - math.exp(math.log(b * scale * (1.0 - p)) / b)
    if not 0.0 < x < 1.0:
        x = 0.5
    return x


def _check_shape(a: float, b: float) -> None:
    if not (a > 0.0 and math.isfinite(a) and b > 0.0 and math.isfinite(b)):
        raise ValueError(f"Beta shape parameters must be positive and finite, got a={a}, b={b}")


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """``I_x(a, b)``, the Beta(a, b) distribution function at ``x`` (clamped to [0, 1])."""
    _check_shape(a, b)
    if math.isnan(x):
        raise ValueError("x must not be NaN")
    return _incomplete_beta(x, a, b, _log_beta(a, b))


def beta_quantile(p: float, a: float, b: float) -> float:
    """The ``x`` with ``I_x(a, b) = p``: the Beta(a, b) quantile (percent-point) function."""
    _check_shape(a, b)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if p == 0.0:
        return 0.0
    if p == 1.0:
        return 1.0
    if p > 0.5:
        # Solve for the complement: 1 - p is exact, while I_x(a, b) near 1 only
        # resolves p to 1e-16 absolute, which is all of 1 - p far in the upper tail.
        return 1.0 - _lower_quantile(1.0 - p, b, a)
    return _lower_quantile(p, a, b)


def _lower_quantile(p: float, a: float, b: float) -> float:
    """``beta_quantile`` for ``0 < p <= 0.5``, arguments already checked."""
    log_beta = _log_beta(a, b)
    x = _initial_guess(p, a, b)
    lo = 0.0
    hi = 1.0
    for _ in range(QUANTILE_MAX_STEPS):
        err = _incomplete_beta(x, a, b, log_beta) - p
        if err == 0.0:
            return x
        if err < 0.0:
            lo = x
        else:
            hi = x
        log_pdf = (a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - log_beta
        if log_pdf < MAX_EXP:
            pdf = math.exp(log_pdf)
            if pdf > 0.0:
                step = err / pdf
                # Halley's correction uses pdf'/pdf = (a-1)/x - (b-1)/(1-x); skip it when large.
                bend = 0.5 * step * ((a - 1.0) / x - (b - 1.0) / (1.0 - x))
                if abs(bend) < 0.5:
                    step = step / (1.0 - bend)
                x_new = x - step
                if abs(step) <= QUANTILE_TOLERANCE * x:
                    return x_new
                if lo < x_new < hi:
                    x = x_new
                    continue
        # No usable Halley step: bisect the bracket instead, geometrically while
        # there is no lower bound yet, so a quantile of 1e-300 is a few steps away.
        if lo == 0.0:
            x_new = hi * hi
        else:
            x_new = 0.5 * (lo + hi)
        if not lo < x_new < hi:  # the bracket is as narrow as doubles allow
            return x_new
        x = x_new
    return x


def _check_evidence(
    successes: float,
    failures: float,
    confidence: float,
    prior_a: float,
    prior_b: float,
    failure_weight: float,
) -> None:
    if not (successes >= 0.0 and math.isfinite(successes)):
        raise ValueError(f"successes must be finite and non-negative, got {successes}")
    if not (failures >= 0.0 and math.isfinite(failures)):
        raise ValueError(f"failures must be finite and non-negative, got {failures}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not (failure_weight >= 0.0 and math.isfinite(failure_weight)):
        raise ValueError(f"failure_weight must be finite and non-negative, got {failure_weight}")
    _check_shape(prior_a, prior_b)


def beta_lower_bound(
    successes: float,
    failures: float,
    confidence: float,
    prior_a: float = DEFAULT_PRIOR,
    prior_b: float = DEFAULT_PRIOR,
    failure_weight: float = DEFAULT_FAILURE_WEIGHT,
) -> float:
    """The success rate that the posterior exceeds with probability ``confidence``.

    The ``1 - confidence`` quantile of
    ``Beta(successes + prior_a, failures * failure_weight + prior_b)``.
    Counts may be fractional (decayed evidence).
    """
    _check_evidence(successes, failures, confidence, prior_a, prior_b, failure_weight)
    return beta_quantile(1.0 - confidence, successes + prior_a, failures * failure_weight + prior_b)


def beta_upper_bound(
    successes: float,
    failures: float,
    confidence: float,
    prior_a: float = DEFAULT_PRIOR,
    prior_b: float = DEFAULT_PRIOR,
    failure_weight: float = DEFAULT_FAILURE_WEIGHT,
) -> float:
    """The success rate that the posterior stays below with probability ``confidence``.

    The ``confidence`` quantile of the same posterior as :func:`beta_lower_bound`.
    """
    _check_evidence(successes, failures, confidence, prior_a, prior_b, failure_weight)
    return beta_quantile(confidence, successes + prior_a, failures * failure_weight + prior_b)
