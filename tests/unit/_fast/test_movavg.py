import pytest
from helpers.peers import COMPILED_REQUIRED

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


def test_design_constants():
    assert movavg.EMA_ALPHA == 1 / 8
    assert movavg.EMA_WARMUP == 3
    assert movavg.WEIGHTED_MEAN_SIZE == 4


def test_ema_is_not_warm_before_three_samples(movavg_mod):
    ema = movavg_mod.Ema()
    assert ema.value is None and not ema.warm and ema.count == 0
    ema.update(0.060)
    ema.update(0.060)
    assert not ema.warm
    ema.update(0.060)
    assert ema.warm and ema.value == pytest.approx(0.060)


def test_ema_plain_averages_the_warm_up_samples(movavg_mod):
    ema = movavg_mod.Ema()
    assert ema.update(0.100) == 0.100
    assert ema.update(0.200) == pytest.approx(0.150)
    assert ema.update(0.300) == pytest.approx(0.200)


def test_ema_moves_one_eighth_of_the_gap_after_warm_up(movavg_mod):
    ema = movavg_mod.Ema()
    for _ in range(3):
        ema.update(0.060)
    assert ema.update(0.260) == pytest.approx(0.060 + (0.260 - 0.060) / 8)
    assert ema.alpha == 0.125 and ema.warmup == 3


def test_ema_with_one_sample_warm_up_starts_from_the_first_sample(movavg_mod):
    ema = movavg_mod.Ema(alpha=0.5, warmup=1)
    assert ema.update(4.0) == 4.0 and ema.warm
    assert ema.update(2.0) == 3.0


def test_ema_reset_makes_it_cold_again(movavg_mod):
    ema = movavg_mod.Ema()
    for _ in range(4):
        ema.update(1.0)
    ema.reset()
    assert not ema.warm and ema.value is None and ema.count == 0


def test_ema_rejects_bad_parameters_and_samples(movavg_mod):
    for alpha in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            movavg_mod.Ema(alpha=alpha)
    with pytest.raises(ValueError):
        movavg_mod.Ema(warmup=-1)
    with pytest.raises(ValueError):
        movavg_mod.Ema().update(float("nan"))


def test_weighted_mean_covers_only_the_last_four_observations(movavg_mod):
    wm = movavg_mod.WeightedMean()
    assert wm.mean() is None and len(wm) == 0 and wm.size == 4
    for v in (1.0, 2.0, 3.0, 4.0):
        wm.add(v)
    assert wm.mean() == pytest.approx(2.5)
    assert wm.add(9.0) == pytest.approx((2.0 + 3.0 + 4.0 + 9.0) / 4)
    assert len(wm) == 4


def test_weighted_mean_uses_per_observation_weights(movavg_mod):
    wm = movavg_mod.WeightedMean(size=2)
    wm.add(1.0, 3.0)
    assert wm.add(5.0, 1.0) == pytest.approx(2.0)
    assert wm.add(7.0, 0.0) == pytest.approx(5.0)  # evicts the weight-3 observation
    assert wm.add(0.0, 0.0) is None  # every retained weight is zero


def test_weighted_mean_rejects_bad_input_and_clears(movavg_mod):
    with pytest.raises(ValueError):
        movavg_mod.WeightedMean(size=0)
    wm = movavg_mod.WeightedMean()
    with pytest.raises(ValueError):
        wm.add(1.0, -1.0)
    with pytest.raises(ValueError):
        wm.add(float("inf"))
    wm.add(3.0)
    wm.clear()
    assert wm.mean() is None and len(wm) == 0


def test_selector_reports_the_loaded_implementation():
    expected = "python" if NO_EXTENSIONS else movavg.IMPLEMENTATION
    assert implementations()["movavg"] == expected
    if NO_EXTENSIONS:
        assert movavg.HalvingAverage.__module__ == "honk._fast.movavg_py"


@pytest.mark.skipif(not COMPILED_REQUIRED, reason="extensions are optional in a dev install outside CI")
def test_compiled_kernel_is_in_use_when_required():
    from honk._fast import movavg_c

    assert movavg.IMPLEMENTATION == "compiled"
    assert movavg.HalvingAverage is movavg_c.HalvingAverage
    # A cdef attribute is invisible from Python only if movavg_c.pxd typed the build.
    assert not hasattr(movavg_c.HalvingAverage(), "_value")
    assert movavg.Ema is movavg_c.Ema and movavg.WeightedMean is movavg_c.WeightedMean
    assert not hasattr(movavg_c.Ema(), "_alpha")
    assert not hasattr(movavg_c.WeightedMean(), "_values")
