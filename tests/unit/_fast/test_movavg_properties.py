"""The compiled kernel and its pure-Python twin agree on random sequences."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS

samples = st.lists(st.floats(min_value=0.0, max_value=60.0, allow_nan=False), max_size=200)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(seq=samples, reset_at=st.integers(min_value=-1, max_value=200))
def test_compiled_and_python_twins_agree(seq, reset_at):
    from honk._fast import movavg_c, movavg_py

    c, p = movavg_c.HalvingAverage(), movavg_py.HalvingAverage()
    for i, s in enumerate(seq):
        if i == reset_at:
            c.reset()
            p.reset()
        assert math.isclose(c.update(s), p.update(s), rel_tol=0.0, abs_tol=0.0)
        assert c.count == p.count
    assert c.value == p.value
    if seq:
        assert movavg_c.halving_average(seq) == movavg_py.halving_average(seq)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(
    seq=samples,
    alpha=st.floats(min_value=1e-3, max_value=1.0, allow_nan=False),
    warmup=st.integers(min_value=0, max_value=10),
    reset_at=st.integers(min_value=-1, max_value=200),
)
def test_compiled_and_python_emas_agree(seq, alpha, warmup, reset_at):
    from honk._fast import movavg_c, movavg_py

    c, p = movavg_c.Ema(alpha, warmup), movavg_py.Ema(alpha, warmup)
    for i, s in enumerate(seq):
        if i == reset_at:
            c.reset()
            p.reset()
        assert math.isclose(c.update(s), p.update(s), rel_tol=1e-12)
        assert (c.count, c.warm) == (p.count, p.warm)
    assert c.value == p.value


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(
    size=st.integers(min_value=1, max_value=8),
    seq=st.lists(
        st.tuples(
            st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
            st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
        ),
        max_size=100,
    ),
)
def test_compiled_and_python_weighted_means_agree(size, seq):
    from honk._fast import movavg_c, movavg_py

    c, p = movavg_c.WeightedMean(size), movavg_py.WeightedMean(size)
    for value, weight in seq:
        mc, mp = c.add(value, weight), p.add(value, weight)
        assert (mc is None) == (mp is None)
        if mc is not None:
            assert math.isclose(mc, mp, rel_tol=1e-12, abs_tol=0.0)
        assert len(c) == len(p)
