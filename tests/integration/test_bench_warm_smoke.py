"""Smoke test of ``benchmarks/warm.py``: a few samples of each kind through a real v2ray server over TCP and TLS,
to pin the benchmark's wiring (warm-up holding the carrier, the cold sample opening one, the
load tool's first-byte mode, the rows), not any figure."""

from __future__ import annotations

from helpers.peers import require_binary

from benchmarks import warm


def test_the_warm_up_benchmark_measures_every_kind_over_both_transports_and_prints_a_ratio(
    monkeypatch,
) -> None:
    require_binary("v2ray")  # fails in CI when missing, skips elsewhere
    monkeypatch.setattr(warm, "QUICK_SAMPLES", 3)
    rows = warm.run(quick=True)
    assert len(rows) == 2 * len(warm.KINDS)
    for transport, chunk in zip(warm.TRANSPORTS.values(), (rows[:5], rows[5:]), strict=True):
        loopback, direct, reference, cold, warm_row = chunk
        assert all(row[0].startswith(transport) for row in chunk)
        assert "no honk" in loopback[0] and "direct" in direct[0] and "v2ray client" in reference[0]
        assert loopback[5] == direct[5] == reference[5] == "-"
        assert "cold" in cold[0] and cold[3] == "3" and cold[4] == "1.00"
        assert "warm" in warm_row[0] and warm_row[3] == "3"
        assert float(warm_row[1]) > 0 and float(warm_row[4]) > 0 and warm_row[5] in ("met", "NOT met")
