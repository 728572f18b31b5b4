"""The compiled decay kernels and their pure-Python twins agree on random event sequences."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS

half_life = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
stamp = st.floats(min_value=-1e9, max_value=1e10, allow_nan=False)
amount = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
events = st.lists(st.tuples(st.sampled_from(["add", "read", "clear"]), amount, amount, stamp), max_size=100)


def _same(x, y):
    if x is None or y is None:
        return x is y
    return math.isclose(x, y, rel_tol=1e-12, abs_tol=0.0)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(hl=half_life, seq=events)
def test_compiled_and_python_counters_agree(hl, seq):
    from honk._fast import decay_c, decay_py

    c, p = decay_c.DecayedCounter(hl), decay_py.DecayedCounter(hl)
    for op, x, _, now in seq:
        if op == "add":
            assert _same(c.add(x, now), p.add(x, now))
        elif op == "clear":
            c.clear()
            p.clear()
        assert _same(c.value(now), p.value(now))
        assert c.at == p.at


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(hl=half_life, seq=events)
def test_compiled_and_python_means_agree(hl, seq):
    from honk._fast import decay_c, decay_py

    c, p = decay_c.DecayedMean(hl), decay_py.DecayedMean(hl)
    for op, value, weight, now in seq:
        if op == "add":
            assert _same(c.add(value, weight, now), p.add(value, weight, now))
        elif op == "clear":
            c.clear()
            p.clear()
        assert _same(c.mean(now), p.mean(now))
        assert _same(c.weight(now), p.weight(now))
        assert _same(c.total(now), p.total(now))


@given(hl=half_life, seq=st.lists(st.tuples(amount, stamp), max_size=60), later=stamp)
def test_counter_never_grows_by_reading_back_in_time(hl, seq, later):
    from honk._fast import decay_py

    c = decay_py.DecayedCounter(hl)
    for x, now in seq:
        c.add(x, now)
    assert c.value(min(later, c.at)) == c.value(c.at)
    assert c.value(max(later, c.at)) <= c.value(c.at)
