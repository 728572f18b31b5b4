import os

import pytest

from honk._fast import NO_EXTENSIONS, implementations, movavg


def test_first_sample_initialises_the_average(movavg_mod):
    avg = movavg_mod.HalvingAverage()
    assert avg.value is None and avg.count == 0
    assert avg.update(0.120) == 0.120
    assert avg.value == 0.120


def test_each_sample_carries_half_the_weight(movavg_mod):
    avg = movavg_mod.HalvingAverage()
    avg.update(0.100)
    assert avg.update(0.300) == pytest.approx(0.200)
    assert avg.update(0.000) == pytest.approx(0.100)
    assert avg.count == 3


def test_reset_forgets_every_sample(movavg_mod):
    avg = movavg_mod.HalvingAverage()
    avg.update(5.0)
    avg.reset()
    assert avg.value is None and avg.count == 0
    assert avg.update(1.0) == 1.0


def test_sequence_helper_matches_incremental_updates(movavg_mod):
    assert movavg_mod.halving_average([4.0, 2.0, 1.0]) == pytest.approx(((4.0 + 2.0) / 2 + 1.0) / 2)
    with pytest.raises(ValueError):
        movavg_mod.halving_average([])


def test_selector_reports_the_loaded_implementation():
    expected = "python" if NO_EXTENSIONS else movavg.IMPLEMENTATION
    assert implementations()["movavg"] == expected
    if NO_EXTENSIONS:
        assert movavg.HalvingAverage.__module__ == "honk._fast.movavg_py"


@pytest.mark.skipif(
    not os.environ.get("HONK_REQUIRE_EXTENSIONS"), reason="extensions are optional in a dev install"
)
def test_compiled_kernel_is_in_use_when_required():
    from honk._fast import movavg_c

    assert movavg.IMPLEMENTATION == "compiled"
    assert movavg.HalvingAverage is movavg_c.HalvingAverage
    # A cdef attribute is invisible from Python only if movavg_c.pxd typed the build.
    assert not hasattr(movavg_c.HalvingAverage(), "_value")
