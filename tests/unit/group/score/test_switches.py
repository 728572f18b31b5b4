"""Switch and flap counting (GH-K-127): committed ordinary A→B changes per target history,
flaps as returns to the prior winner within eight selections, first choices and evicted
histories proving nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from honk.group.score.constants import FLAP_WINDOW
from honk.group.score.switches import Selection, SwitchHistory

KEY = ("g", "tcp", 4, "example.com:443")


def test_a_first_choice_is_no_switch_and_the_same_winner_is_kept():
    history = SwitchHistory()
    assert history.record("g", "tcp", KEY, "a") is Selection.FIRST
    assert history.record("g", "tcp", KEY, "a") is Selection.KEPT
    assert history.counters == {}


def test_a_change_is_a_switch_and_a_quick_return_is_also_a_flap():
    history = SwitchHistory()
    history.record("g", "tcp", KEY, "a")
    assert history.record("g", "tcp", KEY, "b") is Selection.SWITCH
    assert history.record("g", "tcp", KEY, "a") is Selection.FLAP
    counters = history.counters[("g", "tcp")]
    assert (counters.ordinary_switch, counters.switch_flap) == (2, 1)


def test_a_return_after_the_flap_window_is_an_ordinary_switch():
    history = SwitchHistory()
    history.record("g", "tcp", KEY, "a")
    history.record("g", "tcp", KEY, "b")  # the switch is the first of the window's selections
    for _ in range(FLAP_WINDOW - 2):
        history.record("g", "tcp", KEY, "b")
    assert history.record("g", "tcp", KEY, "a") is Selection.FLAP  # the eighth selection since leaving a
    history.record("g", "tcp", KEY, "b")
    for _ in range(FLAP_WINDOW - 1):
        history.record("g", "tcp", KEY, "b")
    assert history.record("g", "tcp", KEY, "a") is Selection.SWITCH  # the ninth: not a flap


def test_a_move_to_a_third_node_is_a_switch_not_a_flap():
    history = SwitchHistory()
    for winner in ("a", "b"):
        history.record("g", "tcp", KEY, winner)
    assert history.record("g", "tcp", KEY, "c") is Selection.SWITCH


def test_histories_are_per_target_and_counters_per_group_and_network():
    history = SwitchHistory()
    other = ("g", "tcp", 4, "other.test:443")
    history.record("g", "tcp", KEY, "a")
    assert history.record("g", "tcp", other, "b") is Selection.FIRST  # another target's history
    history.record("g", "udp", ("g", "udp", 4, "x:53"), "a")
    history.record("g", "udp", ("g", "udp", 4, "x:53"), "b")
    assert ("g", "tcp") not in history.counters
    assert history.counters[("g", "udp")].ordinary_switch == 1


def test_an_evicted_history_cannot_prove_a_switch():
    history = SwitchHistory(max_entries=2)
    history.record("g", "tcp", "k1", "a")
    history.record("g", "tcp", "k2", "a")
    history.record("g", "tcp", "k3", "a")  # evicts k1, the least recently selected
    assert history.record("g", "tcp", "k1", "b") is Selection.FIRST
    assert history.counters == {}


@given(st.lists(st.tuples(st.integers(0, 20), st.sampled_from("abc")), max_size=300))
def test_the_history_never_exceeds_its_cap_and_flaps_are_a_subset_of_switches(selections):
    history = SwitchHistory(max_entries=8)
    for key, winner in selections:
        history.record("g", "tcp", key, winner)
        assert len(history) <= 8
    for counters in history.counters.values():
        assert 0 <= counters.switch_flap <= counters.ordinary_switch
