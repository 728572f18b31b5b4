"""The compiled Beta bounds and their pure-Python twin agree on random evidence."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS

count = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
prior = st.floats(min_value=0.01, max_value=50.0, allow_nan=False)
weight = st.floats(min_value=0.0, max_value=8.0, allow_nan=False)
confidence = st.floats(min_value=0.5, max_value=0.999, allow_nan=False)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(s=count, f=count, c=confidence, a=prior, b=prior, w=weight)
def test_compiled_and_python_twins_agree(s, f, c, a, b, w):
    from honk._fast import beta_c, beta_py

    lo_c, lo_p = beta_c.beta_lower_bound(s, f, c, a, b, w), beta_py.beta_lower_bound(s, f, c, a, b, w)
    hi_c, hi_p = beta_c.beta_upper_bound(s, f, c, a, b, w), beta_py.beta_upper_bound(s, f, c, a, b, w)
    assert math.isclose(lo_c, lo_p, rel_tol=1e-12)
    assert math.isclose(hi_c, hi_p, rel_tol=1e-12)


@given(s=count, f=count, c=confidence, w=weight)
def test_lower_bound_never_exceeds_upper_bound(s, f, c, w):
    from honk._fast import beta

    lo = beta.beta_lower_bound(s, f, c, failure_weight=w)
    hi = beta.beta_upper_bound(s, f, c, failure_weight=w)
    assert 0.0 <= lo and hi <= 1.0
    # Near c = 0.5 both bounds are the median; each is exact only to the inversion's
    # relative tolerance, so they may cross by that much and no more.
    assert lo <= hi * (1.0 + 2 * beta.QUANTILE_TOLERANCE)
