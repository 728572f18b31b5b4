"""The simulation harness driving the real URLTest: its invariants, and URLTest's figures.

Run with ``pytest -s`` to see the figures (best-node fraction, escape, switches and flaps per hour).
"""

from __future__ import annotations

import pytest

from .engine import RunResult, Script, run
from .metrics import Figures, best_nodes, figures
from .scripts import (
    OUTAGE_END,
    OUTAGE_START,
    STEADY_BEST_FRACTION,
    TARGETS,
    WARMUP,
    failing_incumbent_script,
    jittery_script,
    steady_script,
)
from .urltest import URLTestAdapter


def simulate(script: Script) -> tuple[RunResult, Figures]:
    result = run(script, URLTestAdapter.factory())
    fig = figures(result, warmup=WARMUP)
    print("\n" + fig.summary())
    assert_harness_invariants(result, fig)
    return result, fig


def assert_harness_invariants(result: RunResult, fig: Figures) -> None:
    assert fig.generated == len(result.flows) == result.generated
    assert fig.routed + fig.unrouted == fig.generated
    assert [f.flow_id for f in result.flows] == list(range(result.generated))
    assert all(f.settled is not None and f.settled > f.arrived for f in result.flows if f.node is not None)
    assert all(0.0 <= f.arrived <= result.script.duration for f in result.flows)
    assert 0.0 <= fig.best_fraction <= 1.0
    assert fig.flaps <= fig.switches
    rounds = int(result.script.duration // result.script.check_interval) + 1
    assert result.probes == rounds * len(result.script.nodes)


def test_steady_state_puts_most_flows_on_the_clearly_better_node():
    result, fig = simulate(steady_script())
    # about one flow a second for an hour: thousands of flows
    assert fig.generated > 3000
    assert fig.unrouted == 0
    assert fig.best_fraction >= STEADY_BEST_FRACTION


def test_same_script_and_seed_replays_identically():
    first = run(steady_script(), URLTestAdapter.factory())
    second = run(steady_script(), URLTestAdapter.factory())
    assert [(f.arrived, f.target, f.node, f.ok) for f in first.flows] == [
        (f.arrived, f.target, f.node, f.ok) for f in second.flows
    ]


def test_arrivals_do_not_depend_on_the_policy():
    script = steady_script()
    by_urltest = run(script, URLTestAdapter.factory())
    pinned = run(script, lambda nodes, clock: _Pinned(nodes[0]))
    assert [(f.arrived, f.target) for f in by_urltest.flows] == [(f.arrived, f.target) for f in pinned.flows]


def test_best_node_follows_an_outage():
    script = failing_incumbent_script(probes_fail=True)
    assert best_nodes(script, TARGETS[0], OUTAGE_START - 1) == {"fast"}
    assert best_nodes(script, TARGETS[0], OUTAGE_START) == {"backup"}
    assert best_nodes(script, TARGETS[0], OUTAGE_END) == {"fast"}


@pytest.mark.parametrize("probes_fail", [True, False], ids=["probes-fail-too", "probes-still-pass"])
def test_urltest_escapes_an_incumbent_that_starts_failing(probes_fail):
    _, fig = simulate(failing_incumbent_script(probes_fail))
    (escape,) = fig.escapes
    assert escape.node == "fast"
    assert escape.flows > 0  # it was the incumbent when the outage began
    assert escape.seconds is not None  # dial-failure strikes demote it, probes or not


def test_jittery_equal_nodes_make_urltest_switch_and_flap():
    _, fig = simulate(jittery_script())
    assert fig.switches > 0
    assert fig.flaps > 0


class _Pinned:
    """Always the same node: a policy-free baseline for harness checks."""

    name = "pinned"

    def __init__(self, node: str) -> None:
        self.node = node

    def choose(self, target, now):  # noqa: ANN001, ANN201
        return self.node

    def settle(self, outcome):  # noqa: ANN001, ANN201
        pass

    def probe(self, node, rtt, now):  # noqa: ANN001, ANN201
        pass
