"""The compiled rank read and order agree with their pure-Python twin, and the order is the
documented one: reliability bands first, utility within a band, configuration order."""

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

outcomes = st.lists(
    st.tuples(
        st.sampled_from([Outcome.USEFUL, Outcome.SUCCESS, Outcome.FAILURE, Outcome.SETUP_FAILURE]),
        st.floats(0.0, 300.0),
    ),
    max_size=12,
)
member = st.fixed_dictionaries(
    {
        "alive": st.booleans(),
        "utility": st.one_of(st.none(), st.floats(0.0, 1.0)),
        "layers": st.lists(outcomes, min_size=3, max_size=3),  # per layer: None cell when empty
        "opens": st.lists(
            st.one_of(st.none(), st.booleans()), min_size=3, max_size=3
        ),  # episode: rx since fence
        "excluded": st.booleans(),  # ranked out by the caller (a retry)
        "tried": st.booleans(),  # cold-explored already
        "held": st.booleans(),  # has an exploration backoff held
    }
)
world = st.tuples(st.lists(member, min_size=1, max_size=12), st.floats(0.0, 400.0))


def _build(impl):
    return importlib.import_module(f"honk._fast.rank_{impl}"), importlib.import_module(
        f"honk._fast.cell_{impl}"
    )


def _layers(rank, alive, rows, opens):
    """The kernel's per-layer lists for ``alive`` from rows and opens by node: the global row
    aligned, the rest placed (as the ranker passes them)."""
    nodes = [m[1] for _, m in alive]
    position, aliases = rank.positions(nodes)
    placed = [rank.placed(layer, position, aliases, len(nodes)) for layer in (*rows[1:], *opens)]
    return [rank.aligned(nodes, rows[0]), *placed]


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
    out = rank.candidates(alive, utilities, *_layers(rank, alive, rows, opens), now, WINDOW)
    fields = [
        (
            c.member,
            c.index,
            c.reliability,
            c.utility,
            c.qualified,
            c.unresolved,
            c.recent_failure,
            c.node_failure,
            [layer for layer, _ in c.episodes],
            c.last_failure,
            c.cleared,
        )
        for c in out
    ]
    return fields, [c.index for c in rank.order(out, BAND)]


def _decide(impl, members, now):
    """The kernel's per-member decision helpers over ``members`` in one build: what the ranker
    takes from them, as plain values."""
    rank, cell = _build(impl)
    nodes = [f"node-{i}" for i in range(len(members))]
    listed = [
        Member(f"m{i}", node, m["alive"]) for i, (node, m) in enumerate(zip(nodes, members, strict=True))
    ]
    exclude = frozenset(node for node, m in zip(nodes, members, strict=True) if m["excluded"])
    alive, live_nodes, dead = rank.live(listed, exclude)
    opens = ({}, {}, {})
    for i, m in enumerate(members):
        for layer in range(3):
            if m["opens"][layer] is not None:
                opens[layer][nodes[i]] = SimpleNamespace(rx_since_fence=m["opens"][layer], open_failures=1)
    failed = {}
    for i, m in enumerate(members):
        failed[nodes[i]] = c = cell.EvidenceCell(i + 1)
        for outcome, at in sorted(m["layers"][0], key=lambda pair: pair[1]):
            c.record(outcome, at)
    cands = rank.candidates(
        alive,
        [m["utility"] for _, m in ((i, members[i]) for i, _ in alive)],
        *_layers(rank, alive, (failed, {}, {}), opens),
        now,
        WINDOW,
    )
    eligible, unresolved = rank.survey(cands)
    tried = {node for node, m in zip(nodes, members, strict=True) if m["tried"]}
    cold = rank.first_cold(eligible, tried)
    held = {node: i for i, (node, m) in enumerate(zip(nodes, members, strict=True)) if m["held"]}
    rank.forget_resolved(held, frozenset(live_nodes), unresolved)
    found = [rank.find(cands, node) for node in nodes]
    ordered = rank.order(eligible, BAND)
    first = rank.members_first(ordered, ordered[-1]) if ordered else ()
    top, second = rank.leaders(eligible, BAND)
    sound = rank.first_sound(eligible, BAND, ordered[0] if ordered else None)
    return (
        [(i, m.name) for i, m in alive],
        live_nodes,
        dead,
        [c.index for c in eligible],
        [c.index for c in unresolved],
        None if cold is None else cold.index,
        held,
        [None if c is None else c.index for c in found],
        [m.name for m in first],
        [None if c is None else c.index for c in (top, second, sound)],
    )


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(w=world)
def test_compiled_and_python_rank_reads_and_orders_agree(w):
    members, now = w
    assert _read("c", members, now) == _read("py", members, now)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(w=world)
def test_compiled_and_python_decision_helpers_agree(w):
    members, now = w
    assert _decide("c", members, now) == _decide("py", members, now)


def test_live_keeps_configuration_indexes_and_counts_dead_but_not_excluded_members(rank_mod):
    listed = [
        Member("a", "na", True),
        Member("b", "nb", False),
        Member("c", "nc", True),
        Member("d", "nd", False),
    ]
    alive, nodes, dead = rank_mod.live(listed, frozenset({"nc", "nd"}))
    assert (alive, nodes, dead) == ([(0, listed[0])], ["na"], 1)  # excluded: neither alive nor dead
    alive, nodes, dead = rank_mod.live(listed, frozenset())
    assert ([i for i, _ in alive], nodes, dead) == ([0, 2], ["na", "nc"], 2)


def _candidate(rank_mod, index, *, qualified=True, unresolved=False, recent=False, node_failure=False):
    return rank_mod.Candidate(
        Member(f"m{index}", f"n{index}", True), index, 0.9, None, qualified, unresolved, recent, node_failure
    )


def test_survey_keeps_out_recent_node_scoped_failures_unless_that_leaves_nobody(rank_mod):
    sound = _candidate(rank_mod, 0)
    target_failure = _candidate(rank_mod, 1, unresolved=True, recent=True)  # target-scoped: still eligible
    node_failure = _candidate(rank_mod, 2, unresolved=True, recent=True, node_failure=True)
    old_node_failure = _candidate(rank_mod, 3, unresolved=True, node_failure=True)  # not recent: eligible
    eligible, unresolved = rank_mod.survey([sound, target_failure, node_failure, old_node_failure])
    assert [c.index for c in eligible] == [0, 1, 3]
    assert [c.index for c in unresolved] == [1, 2, 3]
    eligible, unresolved = rank_mod.survey([node_failure])
    assert eligible == [node_failure] and unresolved == [node_failure]


def test_first_cold_is_the_first_untried_unqualified_member_without_an_open_episode(rank_mod):
    cands = [
        _candidate(rank_mod, 0),
        _candidate(rank_mod, 1, qualified=False, unresolved=True),
        _candidate(rank_mod, 2, qualified=False),
        _candidate(rank_mod, 3, qualified=False),
    ]
    assert rank_mod.first_cold(cands, set()).index == 2
    assert rank_mod.first_cold(cands, {"n2"}).index == 3
    assert rank_mod.first_cold(cands, {"n2", "n3"}) is None


def test_find_prefers_the_same_node_object_and_falls_back_to_an_equal_one(rank_mod):
    a, b = _candidate(rank_mod, 0), _candidate(rank_mod, 1)
    assert rank_mod.find([a, b], b.member.node_id) is b
    assert rank_mod.find([a, b], "".join(["n", "1"])) is b  # equal, not identical
    assert rank_mod.find([a, b], "n9") is None


def test_forget_resolved_drops_held_backoffs_of_resolved_candidates_only(rank_mod):
    unresolved = [_candidate(rank_mod, 1, unresolved=True)]
    held = {"n0": "a", "n1": "b", "n7": "not ranked"}
    rank_mod.forget_resolved(held, frozenset({"n0", "n1"}), unresolved)
    assert held == {"n1": "b", "n7": "not ranked"}
    rank_mod.forget_resolved(held, frozenset({"n0", "n1", "n7"}), [])
    assert held == {}


def test_members_first_puts_the_winner_first_and_keeps_the_rest_in_order(rank_mod):
    cands = [_candidate(rank_mod, i) for i in range(4)]
    assert [m.name for m in rank_mod.members_first(cands, cands[2])] == ["m2", "m0", "m1", "m3"]


candidate = st.builds(
    lambda index, reliability, utility: (index, reliability, utility),
    st.integers(0, 10_000),
    st.floats(0.0, 1.0),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
)


@given(st.lists(candidate, max_size=20, unique_by=lambda c: c[0]), st.floats(0.0, 0.2))
def test_precedes_is_the_order_of_the_sort_key(spec, band):
    rank, _ = _build("py")
    cands = [rank.Candidate(None, index, reliability, utility, False) for index, reliability, utility in spec]
    floor = max((c.reliability for c in cands), default=0.0) - band
    for a in cands:
        for b in cands:
            if a is not b:
                assert rank._precedes(a, b, floor, band) == (
                    rank._sort_key(a, floor, band) < rank._sort_key(b, floor, band)
                )


@given(
    st.lists(candidate, max_size=20, unique_by=lambda c: c[0]),
    st.floats(0.0, 0.2),
    st.lists(st.booleans(), min_size=20, max_size=20),
    st.integers(0, 19),
)
def test_the_leaders_and_the_first_sound_are_those_of_the_whole_order(spec, band, unresolved, skip):
    rank, _ = _build("py")
    cands = [
        rank.Candidate(None, index, reliability, utility, False, unresolved[i])
        for i, (index, reliability, utility) in enumerate(spec)
    ]
    ordered = rank.order(cands, band)
    top, second = rank.leaders(cands, band)
    assert [top, second] == (ordered + [None, None])[:2]
    skipped = cands[skip] if skip < len(cands) else None
    assert rank.first_sound(cands, band, skipped) == next(
        (c for c in ordered if c is not skipped and not c.unresolved), None
    )


def test_the_band_ranks_utility_first_and_the_rest_by_reliability(rank_mod):
    c = [
        rank_mod.Candidate(None, 0, 0.90, None, True),  # in the band, no utility: after those with one
        rank_mod.Candidate(None, 1, 0.93, 0.4, True),
        rank_mod.Candidate(None, 2, 0.92, 0.9, True),  # in the band with the best utility: first
        rank_mod.Candidate(None, 3, 0.70, 1.0, True),  # behind the band: utility cannot lift it
        rank_mod.Candidate(None, 4, 0.80, None, True),
    ]
    assert [x.index for x in rank_mod.order(c, BAND)] == [2, 1, 0, 4, 3]
    assert rank_mod.order([], BAND) == []


def test_members_behind_the_front_whose_bounds_differ_by_a_rounding_error_compete_on_utility(rank_mod):
    # each behind the front with one success, decayed from a slightly different time (issue 32:
    # a Score escape went to the third-best node because its bound was 2e-8 higher)
    c = [
        rank_mod.Candidate(None, 0, 0.87, 1.0, True),
        rank_mod.Candidate(None, 1, 0.31615405, 0.58, True),
        rank_mod.Candidate(None, 2, 0.31615414, 0.43, True),
        rank_mod.Candidate(None, 3, 0.31615416, 0.36, True),
        rank_mod.Candidate(None, 4, 0.20, 0.99, True),
    ]  # a band further behind: real evidence
    assert [x.index for x in rank_mod.order(c, BAND)] == [0, 1, 2, 3, 4]
    assert rank_mod.first_sound(c, BAND, c[0]) is c[1]


def test_an_open_episode_marks_its_member_and_a_node_scoped_one_says_so(rank_mod):
    _, cell = _build("py" if rank_mod.__name__.endswith("_py") else "c")
    failed = cell.EvidenceCell(1)
    failed.record(Outcome.FAILURE, 10.0)
    member = Member("a", "node-a", True)
    episode = SimpleNamespace(rx_since_fence=False, open_failures=1)
    [c] = rank_mod.candidates(
        [(0, member)], [None], [failed], None, None, [episode], None, None, 50.0, WINDOW
    )
    assert (c.unresolved, c.recent_failure, c.node_failure, c.cleared, c.last_failure) == (
        True,
        True,
        True,
        False,
        10.0,
    )
    [c] = rank_mod.candidates(
        [(0, member)], [None], None, None, [failed], None, None, [episode], 10.0 + WINDOW, WINDOW
    )
    assert (c.unresolved, c.recent_failure, c.node_failure) == (
        True,
        False,
        False,
    )  # target-scoped, no longer recent


readings = st.lists(
    st.tuples(st.integers(0, 9), st.floats(0.0, 5.0), st.sampled_from([1.0, 0.5])),
    max_size=12,
    unique_by=lambda r: r[0],
)


def _gains(impl, candidates, row, higher):
    """positions + scope_best + scope_add + normalized of one build over one scope's readings."""
    rank, _ = _build(impl)
    nodes, values, confidences = [r[0] for r in row], [r[1] for r in row], [r[2] for r in row]
    position, aliases = rank.positions(candidates)
    count, best = rank.scope_best(nodes, values, position, higher)
    gains = [None] * len(candidates)
    if count and not (higher and best <= 0.0):
        rank.scope_add(nodes, values, confidences, position, higher, best, 0.4, 0.005, gains)
    return position, aliases, count, best, gains, rank.normalized(gains, 0.8)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(st.lists(st.integers(0, 9), max_size=10), readings, st.booleans())
def test_compiled_and_python_scope_reads_agree(candidates, row, higher):
    assert _gains("c", candidates, row, higher) == _gains("py", candidates, row, higher)


scopes = st.lists(st.tuples(readings, st.booleans(), st.sampled_from([0.1, 0.25, 0.4])), max_size=4)


def _utilities(impl, candidates, base, scope_list):
    """scope_utilities of one build, and the same composed of its parts (scope_best, scope_add,
    normalized) as the heuristic composed them before."""
    rank, _ = _build(impl)
    position, aliases = rank.positions(candidates)
    base_gains = [None if g is None else g * 0.3 for g in base[: len(candidates)]] + [None] * (
        len(candidates) - len(base)
    )
    entries = [
        ("s", higher, [r[0] for r in row], [r[1] for r in row], [r[2] for r in row], weight)
        for row, higher, weight in scope_list
    ]
    got = rank.scope_utilities(entries, position, aliases, base_gains, 0.3, 0.005, 2)
    gains, total = None, 0.3
    for _, higher, nodes, values, confidences, weight in entries:
        count, best = rank.scope_best(nodes, values, position, higher)
        if count < 2 or (higher and best <= 0.0):
            continue
        gains = list(base_gains) if gains is None else gains
        total += weight
        rank.scope_add(nodes, values, confidences, position, higher, best, weight, 0.005, gains)
    if gains is not None:
        for i, j in aliases:
            gains[i] = gains[j]
    return got, None if gains is None else rank.normalized(gains, total)


@given(
    st.lists(st.integers(0, 9), max_size=10),
    st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=10),
    scopes,
)
def test_scope_utilities_are_the_scopes_added_to_the_base_and_normalized(candidates, base, scope_list):
    got, composed = _utilities("py", candidates, base, scope_list)
    assert got == composed


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(
    st.lists(st.integers(0, 9), max_size=10),
    st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=10),
    scopes,
)
def test_compiled_and_python_scope_utilities_agree(candidates, base, scope_list):
    assert _utilities("c", candidates, base, scope_list) == _utilities("py", candidates, base, scope_list)


@given(st.lists(st.integers(0, 9), max_size=10), readings, st.booleans())
def test_a_scope_reads_only_candidates_relative_to_the_best_of_them(candidates, row, higher):
    position, aliases, count, best, gains, utilities = _gains("py", candidates, row, higher)
    assert utilities == [None if g is None else g / 0.8 for g in gains]
    assert position == {n: candidates.index(n) for n in candidates}
    assert aliases == [(i, candidates.index(n)) for i, n in enumerate(candidates) if candidates.index(n) != i]
    read = [(position[n], v, c) for n, v, c in row if n in position]
    assert count == len(read)
    if not read:
        return
    assert best == (max if higher else min)(v for _, v, _ in read)
    if higher and best <= 0.0:
        return
    for i, value, confidence in read:
        relative = value / best if higher else max(best, 0.005) / max(value, 0.005)
        assert gains[i] == pytest.approx(0.4 * confidence * relative)
    assert all(g is None for i, g in enumerate(gains) if i not in {p for p, _, _ in read})


listed = st.lists(st.integers(0, 7), max_size=12)  # node numbers, repeats allowed (two names, one node)
row_of = st.dictionaries(st.integers(0, 9), st.integers(100, 200), max_size=10)


@pytest.mark.parametrize(
    "impl",
    [
        "py",
        pytest.param(
            "c", marks=pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
        ),
    ],
)
@given(nodes=listed, row=row_of)
def test_aligned_and_placed_give_each_listed_node_its_row_entry(impl, nodes, row):
    rank, _ = _build(impl)
    expected = [row.get(n) for n in nodes] if any(n in row for n in nodes) else None
    position, aliases = rank.positions(nodes)
    assert rank.placed(row, position, aliases, len(nodes)) == expected
    assert rank.aligned(nodes, row) == (None if not row else [row.get(n) for n in nodes])


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="HONK_NO_EXTENSIONS: only the twin is built")
@given(nodes=listed, row=row_of)
def test_compiled_and_python_alignment_agree(nodes, row):
    c, _ = _build("c")
    py, _ = _build("py")
    assert c.placed(row, *c.positions(nodes), len(nodes)) == py.placed(row, *py.positions(nodes), len(nodes))
    assert c.aligned(nodes, row) == py.aligned(nodes, row)
