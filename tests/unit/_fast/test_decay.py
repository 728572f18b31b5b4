import pytest
from helpers.peers import COMPILED_REQUIRED

from honk._fast import NO_EXTENSIONS, decay, implementations


def test_design_half_lives():
    assert decay.EVIDENCE_HALF_LIFE == 30 * 60
    assert decay.DEMAND_HALF_LIFE == 5 * 60
    assert decay.TRIAL_OUTCOME_HALF_LIFE == 10 * 60


def test_decay_halves_after_one_half_life(decay_mod):
    c = decay_mod.DecayedCounter(1800.0)
    assert c.add(8.0, 1000.0) == 8.0
    assert c.value(1000.0 + 1800.0) == pytest.approx(4.0, rel=1e-15)
    assert c.value(1000.0 + 3 * 1800.0) == pytest.approx(1.0, rel=1e-15)
    assert c.half_life == 1800.0


def test_value_does_not_change_the_counter(decay_mod):
    c = decay_mod.DecayedCounter(10.0)
    c.add(2.0, 0.0)
    c.value(1000.0)
    assert c.value(10.0) == pytest.approx(1.0)
    assert c.at == 0.0


def test_adds_accumulate_after_decay(decay_mod):
    c = decay_mod.DecayedCounter(10.0)
    c.add(4.0, 0.0)
    assert c.add(1.0, 10.0) == pytest.approx(3.0)
    assert c.at == 10.0


def test_reading_back_in_time_never_increases_the_value(decay_mod):
    c = decay_mod.DecayedCounter(10.0)
    c.add(4.0, 100.0)
    assert c.value(50.0) == 4.0
    assert c.value(-1e9) == 4.0


def test_late_event_is_decayed_by_its_age(decay_mod):
    c = decay_mod.DecayedCounter(10.0)
    c.add(4.0, 100.0)
    assert c.add(2.0, 90.0) == pytest.approx(5.0)  # 2 halved: it is one half-life old
    assert c.at == 100.0  # the reference never moves back


def test_first_event_may_have_any_timestamp(decay_mod):
    c = decay_mod.DecayedCounter(10.0)
    assert c.add(1.0, -50.0) == 1.0
    assert c.value(-40.0) == pytest.approx(0.5)


def test_no_overflow_after_a_billion_seconds(decay_mod):
    c = decay_mod.DecayedCounter(1800.0)
    c.add(1.0, 0.0)
    assert c.value(1e9) == 0.0
    assert c.add(3.0, 1e9) == 3.0
    assert c.value(1e9 + 1800.0) == pytest.approx(1.5)
    m = decay_mod.DecayedMean(1800.0)
    m.add(5.0, 1.0, 0.0)
    assert m.weight(1e9) == 0.0 and m.mean(1e9) is None
    assert m.add(2.0, 1.0, 1e9) == 2.0


def test_counter_stays_accurate_over_a_long_run(decay_mod):
    c = decay_mod.DecayedCounter(600.0)
    for i in range(200_000):
        c.add(1.0, 10.0 * i)
    # The steady state of one event every 10 s: 1 / (1 - 2**(-10/600)).
    assert c.value(10.0 * 199_999) == pytest.approx(1 / (1 - 2 ** (-10 / 600)), rel=1e-9)


def test_counter_rejects_bad_input(decay_mod):
    for hl in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            decay_mod.DecayedCounter(hl)
    c = decay_mod.DecayedCounter(1.0)
    with pytest.raises(ValueError):
        c.add(-1.0, 0.0)
    with pytest.raises(ValueError):
        c.add(1.0, float("nan"))
    c.add(1.0, 5.0)
    c.clear()
    assert c.value(5.0) == 0.0 and c.at == 0.0


def test_decayed_mean_weighs_recent_observations_more(decay_mod):
    m = decay_mod.DecayedMean(10.0)
    assert m.mean(0.0) is None and m.weight(0.0) == 0.0
    m.add(1.0, 1.0, 0.0)
    # After one half-life the old observation weighs 0.5 against the new one's 1.0.
    assert m.add(4.0, 1.0, 10.0) == pytest.approx((1.0 * 0.5 + 4.0 * 1.0) / 1.5)
    assert m.weight(20.0) == pytest.approx(0.75)
    assert m.total(20.0) == pytest.approx(0.75 * m.mean(20.0))


def test_decayed_mean_is_unchanged_by_reading_later(decay_mod):
    m = decay_mod.DecayedMean(10.0)
    m.add(2.0, 1.0, 0.0)
    m.add(6.0, 3.0, 0.0)
    assert m.mean(0.0) == pytest.approx(5.0)
    assert m.mean(100.0) == pytest.approx(5.0)
    assert m.weight(-5.0) == pytest.approx(4.0)  # clamped to the reference time


def test_decayed_mean_decays_late_observations_by_their_age(decay_mod):
    m = decay_mod.DecayedMean(10.0)
    m.add(0.0, 1.0, 100.0)
    assert m.add(3.0, 2.0, 90.0) == pytest.approx(1.5)  # weight 2 halved to 1
    assert m.at == 100.0


def test_decayed_mean_ignores_zero_weight_and_rejects_bad_input(decay_mod):
    m = decay_mod.DecayedMean(10.0)
    assert m.add(7.0, 0.0, 0.0) is None
    assert m.mean(0.0) is None
    with pytest.raises(ValueError):
        m.add(1.0, -1.0, 0.0)
    with pytest.raises(ValueError):
        m.add(float("nan"), 1.0, 0.0)
    m.add(1.0, 1.0, 0.0)
    m.clear()
    assert m.mean(0.0) is None and m.weight(0.0) == 0.0 and m.half_life == 10.0


def test_selector_reports_the_loaded_implementation():
    expected = "python" if NO_EXTENSIONS else decay.IMPLEMENTATION
    assert implementations()["decay"] == expected
    if NO_EXTENSIONS:
        assert decay.DecayedCounter.__module__ == "honk._fast.decay_py"


@pytest.mark.skipif(not COMPILED_REQUIRED, reason="extensions are optional in a dev install outside CI")
def test_compiled_kernel_is_in_use_when_required():
    from honk._fast import decay_c

    assert decay.IMPLEMENTATION == "compiled"
    assert decay.DecayedCounter is decay_c.DecayedCounter
    assert decay.DecayedMean is decay_c.DecayedMean
    # A cdef attribute is invisible from Python only if decay_c.pxd typed the build.
    assert not hasattr(decay_c.DecayedCounter(1.0), "_value")
    assert not hasattr(decay_c.DecayedMean(1.0), "_weight")
