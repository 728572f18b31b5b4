import pytest
from helpers.peers import COMPILED_REQUIRED

from honk._fast import NO_EXTENSIONS, implementations, ring


def test_empty_ring_has_no_entries(ring_mod):
    r = ring_mod.LatencyRing(10)
    assert len(r) == 0 and r.capacity == 10
    assert r.last() is None and r.last_real_sample() is None
    assert r.average() is None and r.real_average() is None
    assert r.snapshot() == []


def test_capacity_must_be_positive(ring_mod):
    with pytest.raises(ValueError):
        ring_mod.LatencyRing(0)


def test_push_keeps_only_the_newest_capacity_entries(ring_mod):
    r = ring_mod.LatencyRing(3)
    for i in range(5):
        r.push(float(i), 0.1 * i)
    assert len(r) == 3
    assert r.snapshot() == [(2.0, 0.1 * 2, False), (3.0, 0.1 * 3, False), (4.0, 0.1 * 4, False)]
    assert r.last() == (4.0, 0.4, False)


def test_average_covers_retained_entries_only(ring_mod):
    r = ring_mod.LatencyRing(2)
    r.push(1.0, 1.0)
    r.push(2.0, 3.0)
    assert r.average() == pytest.approx(2.0)
    r.push(3.0, 5.0)  # evicts 1.0
    assert r.average() == pytest.approx(4.0)


def test_last_real_sample_skips_synthetic_entries(ring_mod):
    r = ring_mod.LatencyRing(10)
    r.push(100.0, 0.080)
    r.push(101.0, ring.SYNTHETIC_PLACEHOLDER, synthetic=True)
    assert r.last() == (101.0, 10.0, True)
    assert r.last_real_sample() == (100.0, 0.080)


def test_last_real_sample_is_none_once_real_entries_are_evicted(ring_mod):
    r = ring_mod.LatencyRing(2)
    r.push(1.0, 0.05)
    r.push(2.0, 10.0, synthetic=True)
    r.push(3.0, 10.0, synthetic=True)
    assert r.last_real_sample() is None
    assert r.real_count == 0 and r.real_average() is None
    assert r.average() == pytest.approx(10.0)


def test_real_average_excludes_synthetic_placeholders(ring_mod):
    r = ring_mod.LatencyRing(10)
    r.push(1.0, 0.100)
    r.push(2.0, 10.0, synthetic=True)
    r.push(3.0, 0.200)
    assert r.real_average() == pytest.approx(0.150)
    assert r.average() == pytest.approx((0.100 + 10.0 + 0.200) / 3)
    assert r.real_count == 2


def test_snapshot_round_trips_through_restore(ring_mod):
    r = ring_mod.LatencyRing(4)
    for i in range(6):
        r.push(float(i), 0.01 * i, synthetic=(i % 3 == 0))
    saved = r.snapshot()
    other = ring_mod.LatencyRing(4)
    other.restore(saved)
    assert other.snapshot() == saved
    assert other.last_real_sample() == r.last_real_sample()
    assert other.real_average() == pytest.approx(r.real_average())


def test_restore_keeps_the_newest_entries_when_given_too_many(ring_mod):
    r = ring_mod.LatencyRing(2)
    r.restore([(1, 1.0, False), (2, 2.0, True), (3, 3.0, False)])
    assert r.snapshot() == [(2.0, 2.0, True), (3.0, 3.0, False)]


def test_restore_rejects_bad_items_and_leaves_the_ring_empty(ring_mod):
    r = ring_mod.LatencyRing(3)
    r.push(1.0, 1.0)
    with pytest.raises(ValueError):
        r.restore([(1.0, float("nan"), False)])
    assert len(r) == 0
    with pytest.raises((TypeError, ValueError)):
        r.restore([(1.0, 2.0)])
    assert len(r) == 0


def test_push_rejects_non_finite_latency(ring_mod):
    r = ring_mod.LatencyRing(3)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            r.push(1.0, bad)
    assert len(r) == 0


def test_clear_forgets_every_entry(ring_mod):
    r = ring_mod.LatencyRing(3)
    r.push(1.0, 1.0)
    r.clear()
    assert len(r) == 0 and r.last() is None and r.average() is None
    r.push(2.0, 2.0)
    assert r.snapshot() == [(2.0, 2.0, False)]


def test_running_sums_do_not_drift_over_many_laps(ring_mod):
    r = ring_mod.LatencyRing(ring.URLTEST_LATENCY_CAPACITY)
    for i in range(100_000):
        r.push(float(i), 1e6 if i % 7 == 0 else 0.001 * (i % 13), synthetic=(i % 5 == 0))
    entries = r.snapshot()
    assert r.average() == pytest.approx(sum(v for _, v, _ in entries) / len(entries), rel=1e-12)
    real = [v for _, v, s in entries if not s]
    assert r.real_average() == pytest.approx(sum(real) / len(real), rel=1e-12)


def test_design_capacities():
    assert ring.URLTEST_LATENCY_CAPACITY == 10
    assert ring.PROBE_HISTORY_CAPACITY == 100
    assert ring.SYNTHETIC_PLACEHOLDER == 10.0


def test_selector_reports_the_loaded_implementation():
    expected = "python" if NO_EXTENSIONS else ring.IMPLEMENTATION
    assert implementations()["ring"] == expected
    if NO_EXTENSIONS:
        assert ring.LatencyRing.__module__ == "honk._fast.ring_py"


@pytest.mark.skipif(not COMPILED_REQUIRED, reason="extensions are optional in a dev install outside CI")
def test_compiled_kernel_is_in_use_when_required():
    from honk._fast import ring_c

    assert ring.IMPLEMENTATION == "compiled"
    assert ring.LatencyRing is ring_c.LatencyRing
    # A cdef attribute is invisible from Python only if ring_c.pxd typed the build.
    assert not hasattr(ring_c.LatencyRing(3), "_sum")
