import itertools
import math

import pytest
from helpers.peers import COMPILED_REQUIRED, require_module

from honk._fast import NO_EXTENSIONS, beta, implementations

CONFIDENCES = (0.8, 0.9, 0.95, 0.99)


def test_uniform_posterior_bounds_are_the_confidence_itself(beta_mod):
    assert beta_mod.beta_lower_bound(0, 0, 0.9) == pytest.approx(0.1, abs=1e-14)
    assert beta_mod.beta_upper_bound(0, 0, 0.9) == pytest.approx(0.9, abs=1e-14)


def test_closed_form_posteriors(beta_mod):
    # Beta(n + 1, 1) has CDF x**(n + 1); Beta(1, n + 1) has CDF 1 - (1 - x)**(n + 1).
    n = 9.0
    assert beta_mod.beta_lower_bound(n, 0, 0.95) == pytest.approx(0.05 ** (1 / (n + 1)), abs=1e-14)
    assert beta_mod.beta_upper_bound(0, n, 0.95) == pytest.approx(1 - 0.05 ** (1 / (n + 1)), abs=1e-14)


def test_failure_weight_multiplies_failures(beta_mod):
    weighted = beta_mod.beta_lower_bound(20, 3, 0.9, failure_weight=2.0)
    assert weighted == pytest.approx(beta_mod.beta_lower_bound(20, 6, 0.9), abs=1e-15)
    assert weighted < beta_mod.beta_lower_bound(20, 3, 0.9)


def test_priors_shift_the_posterior(beta_mod):
    assert beta_mod.beta_lower_bound(3, 1, 0.9, prior_a=2.0, prior_b=0.5) == pytest.approx(
        beta_mod.beta_quantile(0.1, 5.0, 1.5), abs=1e-15
    )


def test_lower_bound_is_below_upper_bound_and_tightens_with_evidence(beta_mod):
    widths = []
    for n in (1, 10, 100, 1000):
        lo = beta_mod.beta_lower_bound(0.8 * n, 0.2 * n, 0.95)
        hi = beta_mod.beta_upper_bound(0.8 * n, 0.2 * n, 0.95)
        assert lo < 0.8 < hi or n == 1
        widths.append(hi - lo)
    assert widths == sorted(widths, reverse=True)


def test_quantile_inverts_the_incomplete_beta(beta_mod):
    for a, b in ((0.5, 0.5), (2.0, 3.0), (30.5, 1.0), (1.0, 400.0), (250.0, 2001.0)):
        for p in (1e-6, 0.01, 0.3, 0.5, 0.9, 0.999):
            x = beta_mod.beta_quantile(p, a, b)
            assert beta_mod.regularized_incomplete_beta(x, a, b) == pytest.approx(p, rel=1e-9, abs=1e-14)


def test_quantile_edges(beta_mod):
    assert beta_mod.beta_quantile(0.0, 2.0, 3.0) == 0.0
    assert beta_mod.beta_quantile(1.0, 2.0, 3.0) == 1.0
    assert beta_mod.regularized_incomplete_beta(-1.0, 2.0, 3.0) == 0.0
    assert beta_mod.regularized_incomplete_beta(2.0, 2.0, 3.0) == 1.0


@pytest.mark.parametrize(
    "p,a,b",
    [
        (0.3, 1e9, 1e9),
        (0.01, 1e9, 1.0),
        (0.99, 1.0, 1e9),
        (0.5, 1e-6, 1.0),
        (0.2, 1e-3, 1e-3),
        (1e-10, 0.01, 500.0),
        (1e-300, 0.5, 0.5),
        (1 - 1e-16, 2.0, 3.0),
        (0.5, 300.0, 1e-5),
        (0.5, 1e12, 1e12),
    ],
)
def test_extreme_shapes_and_tails_give_a_number_in_range(beta_mod, p, a, b):
    x = beta_mod.beta_quantile(p, a, b)
    assert 0.0 <= x <= 1.0 and not math.isnan(x)


def test_bad_arguments_raise_value_error(beta_mod):
    nan = float("nan")
    bad_calls = [
        lambda: beta_mod.beta_lower_bound(-1, 0, 0.9),
        lambda: beta_mod.beta_lower_bound(0, -1, 0.9),
        lambda: beta_mod.beta_lower_bound(nan, 0, 0.9),
        lambda: beta_mod.beta_lower_bound(0, 0, 1.0),
        lambda: beta_mod.beta_upper_bound(0, 0, 0.0),
        lambda: beta_mod.beta_upper_bound(0, 0, nan),
        lambda: beta_mod.beta_lower_bound(0, 0, 0.9, prior_a=0.0),
        lambda: beta_mod.beta_lower_bound(0, 0, 0.9, prior_b=float("inf")),
        lambda: beta_mod.beta_lower_bound(0, 0, 0.9, failure_weight=-1.0),
        lambda: beta_mod.beta_quantile(1.5, 1.0, 1.0),
        lambda: beta_mod.regularized_incomplete_beta(nan, 1.0, 1.0),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


def test_beta_matches_scipy(beta_mod):
    """Both bounds within 1e-9 (absolute) of scipy over a grid of evidence, confidences and weights."""
    np = require_module("numpy")
    stats = require_module("scipy.stats")
    counts = (0.0, 0.25, 1.0, 2.0, 3.7, 7.0, 15.5, 40.0, 99.9, 180.0, 333.3, 500.0)
    weights = (1.0, 1.5, 2.0, 3.0, 4.0)
    grid = list(itertools.product(counts, counts, CONFIDENCES, weights))
    s, f, c, w = (np.array(col) for col in zip(*grid, strict=True))
    want_lo = stats.beta.ppf(1 - c, s + 1.0, f * w + 1.0)
    want_hi = stats.beta.ppf(c, s + 1.0, f * w + 1.0)
    got_lo = np.array([beta_mod.beta_lower_bound(*row[:3], failure_weight=row[3]) for row in grid])
    got_hi = np.array([beta_mod.beta_upper_bound(*row[:3], failure_weight=row[3]) for row in grid])
    assert np.abs(got_lo - want_lo).max() <= 1e-9
    assert np.abs(got_hi - want_hi).max() <= 1e-9


def test_beta_matches_scipy_with_priors(beta_mod):
    np = require_module("numpy")
    stats = require_module("scipy.stats")
    grid = list(
        itertools.product((0.0, 1.0, 12.5, 500.0), (0.0, 2.0, 60.0), (0.5, 1.0, 4.0), (0.5, 2.0), (0.9, 0.99))
    )
    for s, f, pa, pb, c in grid:
        want = stats.beta.ppf([1 - c, c], s + pa, f + pb)
        got = [beta_mod.beta_lower_bound(s, f, c, pa, pb), beta_mod.beta_upper_bound(s, f, c, pa, pb)]
        assert np.abs(np.array(got) - want).max() <= 1e-9, (s, f, pa, pb, c)


def test_selector_reports_the_loaded_implementation():
    expected = "python" if NO_EXTENSIONS else beta.IMPLEMENTATION
    assert implementations()["beta"] == expected
    if NO_EXTENSIONS:
        assert beta.beta_lower_bound.__module__ == "honk._fast.beta_py"


@pytest.mark.skipif(not COMPILED_REQUIRED, reason="extensions are optional in a dev install outside CI")
def test_compiled_kernel_is_in_use_when_required():
    from honk._fast import beta_c

    assert beta.IMPLEMENTATION == "compiled"
    assert beta.beta_lower_bound is beta_c.beta_lower_bound
    assert beta.beta_upper_bound is beta_c.beta_upper_bound
    # cdef helpers and constants exist only at C level when beta_c.pxd typed the build.
    assert not hasattr(beta_c, "_continued_fraction")
    assert not hasattr(beta_c, "CF_EPSILON")
