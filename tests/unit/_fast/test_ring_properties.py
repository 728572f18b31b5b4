"""The compiled ring and its pure-Python twin agree on random operation sequences."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS

latency = st.floats(min_value=0.0, max_value=60.0, allow_nan=False)
stamp = st.floats(min_value=-1e10, max_value=1e10, allow_nan=False)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), stamp, latency, st.booleans()),
        st.tuples(st.just("clear")),
        st.tuples(st.just("restore"), st.lists(st.tuples(stamp, latency, st.booleans()), max_size=15)),
    ),
    max_size=150,
)


def _state(r):
    return (len(r), r.last(), r.last_real_sample(), r.average(), r.real_average(), r.real_count, r.snapshot())


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(capacity=st.integers(min_value=1, max_value=12), seq=ops)
def test_compiled_and_python_twins_agree(capacity, seq):
    from honk._fast import ring_c, ring_py

    c, p = ring_c.LatencyRing(capacity), ring_py.LatencyRing(capacity)
    for op in seq:
        if op[0] == "push":
            c.push(*op[1:])
            p.push(*op[1:])
        elif op[0] == "clear":
            c.clear()
            p.clear()
        else:
            c.restore(op[1])
            p.restore(op[1])
        # Same arithmetic in the same order: the running sums agree exactly.
        assert _state(c) == _state(p)
