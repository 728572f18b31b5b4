"""The compiled rank read and order agree with their pure-Python twin, and the order is the
documented one: reliability first, utility within the band, configuration order."""

import importlib
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS
from honk._fast.outcome import Outcome
from honk.group.score.ranker import Member

BAND = 0.05
WINDOW = 120.0

outcomes = st.lists(st.tuples(st.sampled_from([Outcome.USEFUL, Outcome.SUCCESS, Outcome.FAILURE,
                                               Outcome.SETUP_FAILURE]), st.floats(0.0, 300.0)), max_size=12)
member = st.fixed_dictionaries({
    "alive": st.booleans(),
    "utility": st.one_of(st.none(), st.floats(0.0, 1.0)),
    "layers": st.lists(outcomes, min_size=3, max_size=3),  # per layer: None cell when empty
    "opens": st.lists(st.one_of(st.none(), st.booleans()), min_size=3, max_size=3),  # episode: rx since fence
})
world = st.tuples(st.lists(member, min_size=1, max_size=12), st.floats(0.0, 400.0))


def _build(impl):
    return importlib.import_module(f"honk._fast.rank_{impl}"), importlib.import_module(f"honk._fast.cell_{impl}")


def _read(impl, members, now):
    """The kernel's candidates and order over ``members`` in one build."""
    rank, cell = _build(impl)
    rows, opens = ({}, {}, {}), ({}, {}, {})
    alive, utilities = [], []
    for i, m in enumerate(members):
        node = f"node-{i}"
        for layer in range(3):
            if m["layers"][layer]:
                c = rows[layer][node] = cell.EvidenceCell(i * 3 + layer + 1)
                for outcome, at in sorted(m["layers"][layer], key=lambda pair: pair[1]):
                    c.record(outcome, at)
            if m["opens"][layer] is not None:
                opens[layer][node] = SimpleNamespace(rx_since_fence=m["opens"][layer], open_failures=1)
        if m["alive"]:
            alive.append((i, Member(f"m{i}", node, True)))
            utilities.append(m["utility"])
    out = rank.candidates(alive, utilities, *rows, *opens, now, WINDOW)
    fields = [(c.member, c.index, c.reliability, c.utility, c.qualified, c.unresolved, c.recent_failure,
               c.node_failure, [layer for layer, _ in c.episodes], c.last_failure, c.cleared) for c in out]
    return fields, [c.index for c in rank.order(out, BAND)]


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(w=world)
def test_compiled_and_python_rank_reads_and_orders_agree(w):
    members, now = w
    assert _read("c", members, now) == _read("py", members, now)


candidate = st.builds(lambda index, reliability, utility: (index, reliability, utility),
                      st.integers(0, 10_000), st.floats(0.0, 1.0), st.one_of(st.none(), st.floats(0.0, 1.0)))


@given(st.lists(candidate, max_size=20, unique_by=lambda c: c[0]), st.floats(0.0, 0.2))
def test_precedes_is_the_order_of_the_sort_key(spec, band):
    rank, _ = _build("py")
    cands = [rank.Candidate(None, index, reliability, utility, False) for index, reliability, utility in spec]
    floor = max((c.reliability for c in cands), default=0.0) - band
    for a in cands:
        for b in cands:
            if a is not b:
                assert rank._precedes(a, b, floor) == (rank._sort_key(a, floor) < rank._sort_key(b, floor))


def test_the_band_ranks_utility_first_and_the_rest_by_reliability(rank_mod):
    c = [rank_mod.Candidate(None, 0, 0.90, None, True),  # in the band, no utility: after those with one
         rank_mod.Candidate(None, 1, 0.93, 0.4, True),
         rank_mod.Candidate(None, 2, 0.92, 0.9, True),  # in the band with the best utility: first
         rank_mod.Candidate(None, 3, 0.70, 1.0, True),  # behind the band: utility cannot lift it
         rank_mod.Candidate(None, 4, 0.80, None, True)]
    assert [x.index for x in rank_mod.order(c, BAND)] == [2, 1, 0, 4, 3]
    assert rank_mod.order([], BAND) == []


def test_an_open_episode_marks_its_member_and_a_node_scoped_one_says_so(rank_mod):
    _, cell = _build("py" if rank_mod.__name__.endswith("_py") else "c")
    failed = cell.EvidenceCell(1)
    failed.record(Outcome.FAILURE, 10.0)
    member = Member("a", "node-a", True)
    episode = SimpleNamespace(rx_since_fence=False, open_failures=1)
    [c] = rank_mod.candidates([(0, member)], [None], {"node-a": failed}, {}, {}, {"node-a": episode}, {}, {},
                              50.0, WINDOW)
    assert (c.unresolved, c.recent_failure, c.node_failure, c.cleared, c.last_failure) == (True, True, True, False, 10.0)
    [c] = rank_mod.candidates([(0, member)], [None], {}, {}, {"node-a": failed}, {}, {}, {"node-a": episode},
                              10.0 + WINDOW, WINDOW)
    assert (c.unresolved, c.recent_failure, c.node_failure) == (True, False, False)  # target-scoped, no longer recent
