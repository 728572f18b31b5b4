"""Smoke test of ``benchmarks/flowcost.py``: its flows run the fast path in full.

A few flows only: this pins the benchmark's wiring (every request answered with the engine's
own dial, tracked when it opens, released at its end), not any figure.
"""

from __future__ import annotations

from benchmarks import flowcost


def test_every_benchmark_flow_is_dialled_by_the_engine_tracked_and_ended(monkeypatch):
    monkeypatch.setattr(flowcost, "FLOWS", 40)
    monkeypatch.setattr(flowcost, "WARM_FLOWS", 3)
    monkeypatch.setattr(flowcost, "BATCHES", 2)
    got = flowcost.figures()
    assert got["live"] == 0  # every flow's END released its tracker entry
    assert got["opened"] == 3 + 2 * 40  # the warm-up and both batches: every request opened a flow
    for part in ("flow", "route", "plan"):
        assert got[part] > 0
