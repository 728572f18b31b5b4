"""Drains of outbound versions: the tracker finds a version's flows, the Drainer applies the
policy on the injected clock, the counters and /metrics families show it (RL-47..51, RL-68, RL-70)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from helpers.apidaemon import metric_samples
from helpers.tracking import FakeHandle
from prometheus_client.exposition import generate_latest

from honk.api import clash_views, metrics, native_views
from honk.config.policies import CLOSE, KEEP, close_after
from honk.connection.tracker import ConnectionTracker, TrackedFlow
from honk.control.drain import Drainer, outbound_tag
from honk.core.clock import FakeClock
from honk.core.errors import OUTBOUND_DRAINED_TEXT, FlowClosed, HonkError, OutboundDrained
from honk.core.net import Address, Network
from honk.core.stats import RuntimeStats

GRACE = 30.0  # seconds of a close_after drain
ONE_HOUR = 3600.0
SOON = 1.0  # seconds: a guard against a hang, never a synchronisation


def _open(
    tracker: ConnectionTracker,
    clock: FakeClock,
    version: str,
    *,
    inbound: str = "lan",
    session: object | None = None,
    user: str | None = None,
) -> tuple[TrackedFlow, FakeHandle]:
    handle = FakeHandle(clock)
    flow = tracker.open(
        handle,
        network=Network.TCP,
        inbound=inbound,
        source=Address("127.0.0.1", 50000),
        target=Address("example.com", 443),
        rule="fallback",
        chain=("proxy",),
        plane_generation=1,
        outbound_version=version,
        user=user,
        session=session,
    )
    return flow, handle


def _drained(handle: FakeHandle) -> bool:
    return len(handle.closed_with) == 1 and isinstance(handle.closed_with[0], OutboundDrained)


# --- the error and the tracker ----------------------------------------------------------------------


def test_outbound_drained_reads_exactly_the_required_text_and_is_a_closing_on_purpose():
    error = OutboundDrained()
    assert str(error) == "the outbound this flow was opened on was drained" == OUTBOUND_DRAINED_TEXT
    assert isinstance(error, HonkError) and isinstance(error, FlowClosed)


def test_close_version_closes_only_the_flows_of_that_version_while_two_versions_of_a_tag_coexist():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    _, old1 = _open(tracker, clock, "proxy@v1")
    _, old2 = _open(tracker, clock, "proxy@v1")
    _, new = _open(tracker, clock, "proxy@v2")
    _, other = _open(tracker, clock, "direct@v1")
    assert tracker.versions_with_flows() == {"proxy@v1": 2, "proxy@v2": 1, "direct@v1": 1}

    assert tracker.close_version("proxy@v1", OutboundDrained()) == 2

    assert _drained(old1) and _drained(old2)
    assert new.closed_with == [] and other.closed_with == []
    assert tracker.close_version("proxy@v1", OutboundDrained()) == 0  # already closing: not asked twice


def test_a_snapshot_carries_the_outbound_version_and_user_of_each_flow():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    _open(tracker, clock, "proxy@v7", user="alice")
    [info] = tracker.snapshot()
    assert (info.outbound_version, info.user) == ("proxy@v7", "alice")


def test_close_session_and_close_inbound_close_only_their_own_flows():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    session_a, session_b = object(), object()
    _, a = _open(tracker, clock, "proxy@v1", session=session_a)
    _, b = _open(tracker, clock, "proxy@v1", session=session_b)
    _, other_inbound = _open(tracker, clock, "proxy@v1", inbound="wan")

    assert tracker.close_session(None, "revoked") == 0  # sessionless flows belong to no session
    assert tracker.close_session(session_a, "revoked") == 1
    assert len(a.closed_with) == 1 and b.closed_with == []
    assert tracker.close_inbound("wan", "inbound removed") == 1
    assert len(other_inbound.closed_with) == 1 and b.closed_with == []


def test_a_drained_flow_ends_with_a_log_line_carrying_the_drain_text(caplog):
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    flow, _ = _open(tracker, clock, "proxy@v1")
    tracker.close_version("proxy@v1", OutboundDrained())
    with caplog.at_level(logging.INFO, logger="honk.connection"):
        flow.release()
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flow ended")]
    assert f'reason="{OUTBOUND_DRAINED_TEXT}"' in line
    assert "outbound_version=proxy@v1" in line and "error=OutboundDrained" in line


def test_both_connection_views_carry_the_flows_outbound_version():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    _open(tracker, clock, "proxy@v2", user="alice")
    [info] = tracker.snapshot()
    clash = clash_views.connection_view(info, {}, {})
    assert clash["outbound_version"] == "proxy@v2" and clash["metadata"]["inboundUser"] == "alice"
    assert native_views.conn_view(info)["outbound_version"] == "proxy@v2"


# --- the Drainer --------------------------------------------------------------------------------------


def test_outbound_tag_is_the_text_before_the_version_mark():
    assert outbound_tag("proxy@v3") == "proxy"
    assert outbound_tag("a@b@v12") == "a@b"
    assert outbound_tag("plain-name") == "plain-name"  # a leaf built without an outbound_id


async def test_a_close_drain_closes_the_versions_flows_now_and_counts_them_by_policy():
    clock = FakeClock()
    tracker, stats = ConnectionTracker(clock), RuntimeStats()
    drainer = Drainer(tracker, clock, stats)
    _, old = _open(tracker, clock, "proxy@v1")
    _, new = _open(tracker, clock, "proxy@v2")

    drainer.drain("proxy@v1", CLOSE)

    assert _drained(old) and new.closed_with == []
    assert stats.drained_flows == {"close": 1}


async def test_a_keep_drain_closes_nothing_and_counts_the_version_as_draining_while_it_holds_flows():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    drainer = Drainer(tracker, clock, RuntimeStats())
    flow, handle = _open(tracker, clock, "proxy@v1")
    _open(tracker, clock, "proxy@v2")

    drainer.drain("proxy@v1", KEEP)

    assert handle.closed_with == []
    assert drainer.draining() == {"proxy": 1}
    flow.release()
    assert drainer.draining() == {}  # no flow left on it: forgotten


async def test_close_after_fires_on_the_clock_at_the_grace_and_not_before():
    clock = FakeClock()
    tracker, stats = ConnectionTracker(clock), RuntimeStats()
    drainer = Drainer(tracker, clock, stats)
    _, handle = _open(tracker, clock, "proxy@v1")

    drainer.drain("proxy@v1", close_after(GRACE))
    await asyncio.sleep(0)  # the timer task starts its sleep
    clock.advance(GRACE - 0.001)
    await asyncio.sleep(0)
    assert handle.closed_with == [] and drainer.pending == 1
    assert drainer.draining() == {"proxy": 1}

    clock.advance(0.001)
    await asyncio.sleep(0)
    assert _drained(handle)
    assert drainer.pending == 0
    assert stats.drained_flows == {"close_after": 1}


async def test_aclose_cancels_a_one_hour_close_after_timer_at_once_and_closes_nothing():
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    drainer = Drainer(tracker, clock, RuntimeStats())
    _, handle = _open(tracker, clock, "proxy@v1")
    drainer.drain("proxy@v1", close_after(ONE_HOUR))
    await asyncio.sleep(0)
    assert clock.sleepers == 1

    await asyncio.wait_for(drainer.aclose(), SOON)  # the clock never moves: only a cancel can end it

    assert drainer.pending == 0 and clock.sleepers == 0
    assert handle.closed_with == []
    drainer.drain("proxy@v2", close_after(ONE_HOUR))  # after shutdown: no new timer
    assert drainer.pending == 0


# --- counters and /metrics ---------------------------------------------------------------------------


def test_reload_results_are_kept_by_result_and_error_variant():
    stats = RuntimeStats()
    stats.reload_result(True, None)
    stats.reload_result(False, "disruptive")
    stats.reload_result(False, "disruptive")
    stats.reload(False)  # a refusal without its variant (the daemon's bool)
    assert stats.reloads == {("applied", ""): 1, ("refused", "disruptive"): 2, ("refused", "invalid"): 1}


def _stand_in(stats: RuntimeStats, drainer: Drainer | None, epoch: int | None) -> SimpleNamespace:
    clock = FakeClock()
    control = SimpleNamespace(
        clock=clock,
        started_at=clock.now(),
        started_wall=clock.wall(),
        plane=None,
        stats=stats,
        tracker=SimpleNamespace(snapshot=list, totals=lambda: (0, 0)),
        health=SimpleNamespace(alive=SimpleNamespace(nodes=lambda: iter(()))),
        drainer=drainer,
        generation=4,
    )
    if epoch is not None:
        control.epoch = epoch
    return control


def _scrape(control: SimpleNamespace) -> dict:
    return metric_samples(generate_latest(metrics.HonkCollector(control)).decode())


async def test_metrics_show_reloads_by_error_the_epoch_draining_versions_and_drained_flows():
    clock = FakeClock()
    tracker, stats = ConnectionTracker(clock), RuntimeStats()
    drainer = Drainer(tracker, clock, stats)
    _open(tracker, clock, "proxy@v1")
    _open(tracker, clock, "proxy@v2")
    _open(tracker, clock, "hk@v1")
    _open(tracker, clock, "hk@v3")
    drainer.drain("proxy@v1", KEEP)
    drainer.drain("hk@v1", KEEP)
    drainer.drain("hk@v3", CLOSE)  # closing, still live until its relay ends
    stats.reload_result(True, None)
    stats.reload_result(False, "bind")

    parsed = _scrape(_stand_in(stats, drainer, epoch=9))

    def at(name: str, **labels: str) -> float | None:
        return parsed.get((name, frozenset(labels.items())))

    assert at("honk_reloads_total", result="applied", error="") == 1
    assert at("honk_reloads_total", result="refused", error="bind") == 1
    assert at("honk_reloads_total", result="refused", error="disruptive") == 0  # listed before it happens
    assert at("honk_plane_epoch") == 9
    assert at("honk_outbound_draining_versions", tag="proxy") == 1
    assert at("honk_outbound_draining_versions", tag="hk") == 2
    assert at("honk_drained_flows_closed_total", policy="close") == 1
    assert at("honk_drained_flows_closed_total", policy="close_after") == 0


def test_the_epoch_gauge_falls_back_to_the_plane_generation_without_a_reconciler():
    parsed = _scrape(_stand_in(RuntimeStats(), None, epoch=None))
    assert parsed[("honk_plane_epoch", frozenset())] == 4
    assert not any(name == "honk_outbound_draining_versions" for name, _ in parsed)
