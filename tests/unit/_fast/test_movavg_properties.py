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
