"""Persisting the last real TCP delay (GH-E-12, GH-E-13; area E suggested test 6), with the
health service's delay writer on a fake clock and a real SQLite file."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from helpers.engines import poll

from honk.alive.health import Status
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import DELAY_PERSIST_INTERVAL
from honk.config.spec import GlobalSpec, NodeSpec, Spec
from honk.connection.plane import build_plane
from honk.control.health import HealthService
from honk.core.clock import FakeClock
from honk.core.statedb import StateDB, state_db_path

DAY = 24 * 3600.0


def plane_with_node(tmp_path, clock, node_id):
    spec = Spec(
        global_=GlobalSpec(
            data_dir=str(tmp_path), tcp_check_url=(), udp_check_dns=("127.0.0.1:9",), check_interval=3600.0
        ),
        nodes=(NodeSpec(name="tokyo", protocol="socks5", host="127.0.0.1", port=9, id=node_id),),
    )
    return build_plane(spec, clock, 1)


async def settle():
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.fixture
def node_id():
    return uuid.uuid4()


async def started(tmp_path, clock, node_id) -> HealthService:
    service = HealthService(clock, watch_network=False)
    await service.start(plane_with_node(tmp_path, clock, node_id))
    await service.runner.stop()  # no probes: the test feeds the outcomes
    return service


def saved(tmp_path):
    db = StateDB(state_db_path(tmp_path))
    try:
        return db.load_delays(now_wall=0.0, max_age=float("inf"))
    finally:
        db.close()


async def wait_saved(tmp_path, node_id):
    await poll(lambda: node_id in saved(tmp_path), "the delay writer to write the sample")
    return saved(tmp_path)[node_id]


async def test_a_real_sample_is_written_after_sixty_seconds(tmp_path, node_id):
    clock = FakeClock()
    service = await started(tmp_path, clock, node_id)
    service.alive.notify_check_success(node_id, Domain.TCP, Family.V4, 0.080)
    clock.advance(DELAY_PERSIST_INTERVAL - 1)
    await settle()
    assert node_id not in saved(tmp_path)
    clock.advance(1)
    delay, at = await wait_saved(tmp_path, node_id)
    assert delay == pytest.approx(0.080) and at == pytest.approx(clock.wall() - DELAY_PERSIST_INTERVAL)
    await service.stop()


async def test_a_sample_just_under_a_day_old_is_restored_without_liveness(tmp_path, node_id):
    clock = FakeClock()
    db = StateDB(state_db_path(tmp_path))
    db.save_delays({node_id: (0.080, clock.wall() - (DAY - 60))})
    db.close()
    service = await started(tmp_path, clock, node_id)
    assert service.alive.node(node_id).latencies.last_real_sample()[1] == pytest.approx(0.080)
    for domain in Domain:
        assert service.alive.status(node_id, domain, Family.V4) is Status.UNKNOWN
    await service.stop()


async def test_a_sample_a_second_over_a_day_old_is_not_restored(tmp_path, node_id):
    clock = FakeClock()
    db = StateDB(state_db_path(tmp_path))
    db.save_delays({node_id: (0.080, clock.wall() - DAY - 1)})
    db.close()
    service = await started(tmp_path, clock, node_id)
    assert service.alive.node(node_id).latencies.last_real_sample() is None
    await service.stop()


async def test_a_placeholder_is_never_written(tmp_path, node_id):
    clock = FakeClock()
    service = await started(tmp_path, clock, node_id)
    service.alive.record_dial_failure(node_id, Family.V4)
    service.alive.record_dial_failure(node_id, Family.V4)
    assert service.alive.node(node_id).latencies.last() is not None  # the placeholder is there
    clock.advance(DELAY_PERSIST_INTERVAL)
    await settle()
    await service.stop()
    assert node_id not in saved(tmp_path)
