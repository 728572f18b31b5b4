"""The relay benchmark harness's parsing, statistics and verdicts (no subject is started here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import relay

ROOT = Path(__file__).resolve().parents[2]


def test_parse_kv_keeps_pairs_and_ignores_bare_words() -> None:
    line = "ready mode=idle count=1000 origin_accepted=998 =x y="
    assert relay.parse_kv(line) == {"mode": "idle", "count": "1000", "origin_accepted": "998", "y": ""}


def test_parse_kv_of_a_bulk_line() -> None:
    kv = relay.parse_kv("mode=bulk dir=up streams=8 threads=2 bytes=100 seconds=2.0000 mbps=50.0 "
                        "total_bytes=150 errors=0 loadgen_cpu=1.5\n")
    assert kv["dir"] == "up" and float(kv["mbps"]) == 50.0 and int(kv["total_bytes"]) == 150


def test_median_of_three_and_of_none() -> None:
    assert relay.median([3.0, 1.0, 2.0]) == 2.0
    assert relay.median([4.0, 1.0]) == 2.5
    assert relay.median([]) is None


def test_parse_stat_survives_spaces_and_parens_in_comm() -> None:
    fields = ["S", "10", "42", "42"] + ["0"] * 7 + ["150", "50", "7", "3"] + ["0"] * 30
    stat = relay.parse_stat("1234 (evil ) (name) " + " ".join(fields))
    assert stat == {"state": "S", "ppid": 10, "pgrp": 42, "utime": 150, "stime": 50, "cutime": 7, "cstime": 3}


def test_parse_stat_of_this_process() -> None:
    stat = relay.parse_stat(Path("/proc/self/stat").read_text())
    assert stat["pgrp"] == os.getpgrp()


def test_vmrss_from_status_and_zombie() -> None:
    assert relay.parse_vmrss_kb("Name:\tx\nVmHWM:\t 9 kB\nVmRSS:\t   2048 kB\n") == 2048
    assert relay.parse_vmrss_kb("Name:\tx\nState:\tZ (zombie)\n") == 0


def test_group_figures_of_this_process_group() -> None:
    pgid = os.getpgrp()
    assert relay.group_rss_kb(pgid) > 0
    assert relay.group_cpu_seconds(pgid) > 0


def _metrics() -> dict[str, dict[str, float]]:
    return {
        "haproxy": {"bulk_up_1": 1000.0, "cpu_up_1": 0.4, "added_p50_us": 20.0},
        "pproxy": {"bulk_up_1": 400.0, "idle_kb_per_conn": 10.0, "start_rss_mb": 32.0},
        "honk": {"bulk_up_1": 950.0, "cpu_up_1": 0.7, "added_p50_us": 30.0, "idle_kb_per_conn": 10.0,
                 "demo_rss_mb": 48.5},
    }


@pytest.mark.parametrize(("target", "status", "ratio"), [
    (relay.Target("bulk", "bulk_up_1", ">=", 0.9, "haproxy"), "met", 0.95),
    (relay.Target("bulk", "bulk_up_1", ">=", 2.0, "pproxy"), "met", 2.375),
    (relay.Target("cpu", "cpu_up_1", "<=", 1.5, "haproxy"), "NOT met", 1.75),
    (relay.Target("lat", "added_p50_us", "<=", 1.5, "haproxy"), "met", 1.5),  # the bound itself passes
    (relay.Target("idle", "idle_kb_per_conn", "<=", 1.0, "pproxy"), "met", 1.0),
    (relay.Target("demo", "demo_rss_mb", "<=", 1.5, "pproxy", "start_rss_mb"), "NOT met", 48.5 / 32),
    (relay.Target("rate", "rate_16", ">=", 1.0, "microsocks"), "n/a", None),
])
def test_evaluate(target: relay.Target, status: str, ratio: float | None) -> None:
    got = relay.evaluate(target, "honk", _metrics())
    assert got["status"] == status
    assert got["ratio"] == (pytest.approx(ratio) if ratio is not None else None)


def test_targets_cover_what_the_issue_asks() -> None:
    labels = [t.label for t in relay.targets(relay.FULL)]
    assert len(labels) == len(set(labels)) == 8 + 4 + 1 + 4 + 2
    assert {t.peer for t in relay.targets(relay.FULL)} == {"haproxy", "pproxy", "microsocks"}


def test_figures_table_aligns_and_drops_empty_rows() -> None:
    text = relay.figures_table(relay.QUICK, ["haproxy", "honk"], _metrics())
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "haproxy", "honk"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert any(line.startswith("bulk up, 1 stream (MB/s)") and line.endswith("1,000    950") for line in lines)
    assert not any("conn/s" in line for line in lines)  # nobody has a rate figure
    assert len({len(line) for line in lines[:2]}) == 1


def test_targets_table_marks_each_verdict() -> None:
    results = [relay.evaluate(t, "honk", _metrics()) for t in relay.targets(relay.FULL)]
    text = relay.targets_table(results)
    assert "NOT met" in text and " met" in text and "n/a" in text


def test_busy_warning() -> None:
    assert relay.busy_warning("0.20 0.10 0.05 1/100 42", 2) == ""
    assert "load average 3.00" in relay.busy_warning("3.00 1.0 0.5 3/100 42", 2)


def test_haproxy_config_forces_splicing_on_loopback() -> None:
    cfg = relay.haproxy_config(8000, 9000)
    for option in ("splice-request", "splice-response", "splice-auto"):
        assert f"option {option}" in cfg
    assert "bind 127.0.0.1:8000" in cfg and "server origin 127.0.0.1:9000" in cfg and "mode tcp" in cfg


def test_honk_config_routes_the_mixed_port_direct() -> None:
    cfg = relay.honk_config(8123)
    assert "mixed://127.0.0.1:8123" in cfg and "fallback: direct" in cfg and "log_level: warn" in cfg


def test_demo_config_moves_to_free_ports_and_nothing_else() -> None:
    original = (ROOT / "configs" / "demo.toml").read_text()
    cfg = relay.demo_config(original, 8123, 8124)
    assert "mixed://127.0.0.1:8123" in cfg and '"127.0.0.1:8124"' in cfg and 'data_dir = "./var"' in cfg
    live = [line.split("#", 1)[0] for line in cfg.splitlines()]
    assert not any("7890" in line or "9090" in line or "../var" in line for line in live)
    rules = [line for line in original.splitlines() if "->" in line]
    assert rules and all(rule in cfg for rule in rules)


def test_demo_config_refuses_a_shape_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        relay.demo_config("[global]\n", 1, 2)


def test_default_honk_runs_without_honk_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HONK_RELAY", "copy")
    assert "HONK_RELAY" not in relay.subject_env(relay.Subject("honk", "socks"))
    assert relay.subject_env(relay.Subject("honk[copy]", "socks", env={"HONK_RELAY": "copy"}))["HONK_RELAY"] == "copy"
