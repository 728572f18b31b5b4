"""The compiled evidence cell and its pure-Python twin agree, record by record and read by read."""

import importlib

import pytest
from helpers.peers import COMPILED_REQUIRED
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS
from honk._fast.outcome import Outcome, Standing

stamp = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)
step = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 2), st.sampled_from(list(Outcome)), stamp),
    st.tuples(st.just("read"), st.integers(0, 2), st.none(), stamp),
    st.tuples(st.just("lease"), st.integers(0, 2), st.none(), stamp),
)


def _build(impl):
    return importlib.import_module(f"honk._fast.cell_{impl}")


def _drive(mod, steps):
    """Apply ``steps`` to three cells (global, family, exact) of one build; every read's result."""
    cells = [mod.EvidenceCell(i + 1, f"key{i}") for i in range(3)]
    reads = []
    for op, layer, outcome, now in steps:
        cell = cells[layer]
        if op == "record":
            cell.record(outcome, now)
        elif op == "lease":
            cell.lease_until = now + 60.0
        else:
            present = tuple(c if i <= layer else None for i, c in enumerate(cells))
            reads.append(
                (
                    cell.standing(now),
                    mod.standing(cell, now),
                    cell.outcomes(now),
                    mod.read_cells(present, now),
                    mod.reliability_bound(cell, now),
                    mod.layer_weight(cell, now),
                    cell.last_failure,
                    cell.lease_until,
                )
            )
    return reads


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(steps=st.lists(step, max_size=60))
def test_compiled_and_python_cells_agree(steps):
    assert _drive(_build("c"), steps) == _drive(_build("py"), steps)


def test_a_missing_layer_reads_as_the_prior_and_adds_no_weight(cell_mod):
    assert cell_mod.reliability_bound(None, 0.0) == cell_mod.PRIOR_BOUND
    assert cell_mod.layer_weight(None, 0.0) == 0.0
    assert cell_mod.read_cells((None, None, None), 0.0) == (cell_mod.PRIOR_BOUND, False)


def test_a_setup_alone_keeps_the_reused_standing_and_any_settled_outcome_drops_it(cell_mod):
    cell = cell_mod.EvidenceCell(1)
    for _ in range(5):
        cell.record(Outcome.USEFUL, 0.0)
    first = cell.standing(1.0)
    assert isinstance(first, Standing)
    cell.record(Outcome.SETUP_OK, 1.5)  # counts an attempt, changes nothing a rank reads
    assert cell.standing(1.5) == first != cell_mod.standing(cell, 1.5)  # reused, not decayed afresh
    cell.record(Outcome.SUCCESS, 1.5)
    assert cell.standing(1.5) == cell_mod.standing(cell, 1.5) and cell.standing(1.5).bound > first.bound
    cell.record(Outcome.SETUP_FAILURE, 1.6)
    assert cell.standing(1.6) == cell_mod.standing(cell, 1.6)
    assert cell.last_failure == 1.6


def test_the_blend_and_qualification_follow_the_layers(cell_mod):
    glob, family, exact = (cell_mod.EvidenceCell(i) for i in (1, 2, 3))
    for _ in range(10):
        glob.record(Outcome.SUCCESS, 0.0)
    for _ in range(8):  # a full-evidence exact layer replaces its parents' estimate
        exact.record(Outcome.USEFUL, 0.0)
    estimate, qualified = cell_mod.read_cells((glob, family, exact), 0.0)
    assert estimate == pytest.approx(exact.bound(0.0)) and qualified  # earned in the exact layer
    assert cell_mod.read_cells((glob, family, None), 0.0) == (glob.bound(0.0), False)
    glob.lease_until = 30.0  # a running lease on the global cell qualifies
    assert cell_mod.read_cells((glob, None, None), 10.0)[1]
    assert not cell_mod.read_cells((glob, None, None), 30.0)[1]


@pytest.mark.skipif(not COMPILED_REQUIRED, reason="extensions are optional in a dev install outside CI")
def test_the_compiled_cell_and_rank_kernels_are_in_use_when_required():
    from honk._fast import cell, cell_c, rank, rank_c

    assert cell.IMPLEMENTATION == rank.IMPLEMENTATION == "compiled"
    assert cell.EvidenceCell is cell_c.EvidenceCell and rank.candidates is rank_c.candidates


def test_the_selectors_report_the_loaded_implementations():
    from honk._fast import cell, implementations, rank

    assert implementations()["cell"] == ("python" if NO_EXTENSIONS else cell.IMPLEMENTATION)
    assert implementations()["rank"] == ("python" if NO_EXTENSIONS else rank.IMPLEMENTATION)
