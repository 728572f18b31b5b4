"""Probe RTTs as Score's quality baseline (GH-K-32, GH-K-39, GH-K-64): a ranked probe of a node a
Score group holds reaches the first-choice heuristic under the configured probe's scope, and
nothing else; a probe never counts as availability evidence."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from types import SimpleNamespace

from honk.alive.outcome import Domain, Family
from honk.config.spec import GlobalSpec, GroupSpec, NodeSpec, Policy, Spec
from honk.connection.plane import build_plane
from honk.control.health import HealthService
from honk.core.clock import FakeClock
from honk.core.net import Network

PROBE_RTT = 0.120  # seconds
TCP = Network.TCP
V4 = Family.V4


def _plane(tmp_path, clock, nodes, policy):
    spec = Spec(
        global_=GlobalSpec(
            data_dir=str(tmp_path),
            tcp_check_url=("http://127.0.0.1:9/generate_204",),
            udp_check_dns=("127.0.0.1:9",),
            check_interval=3600.0,
        ),
        nodes=tuple(nodes),
        groups=(GroupSpec(name="auto", policy=policy),),  # no filter line: every node
    )
    return build_plane(spec, clock, 1)


@contextlib.asynccontextmanager
async def _world(tmp_path, policy: Policy):
    """Two nodes in one group of ``policy`` and the health service over them, with no probe
    runner of its own: the test reports the probe outcomes."""
    clock = FakeClock()
    a, b = _node("a"), _node("b")
    plane = _plane(tmp_path, clock, (a, b), policy)
    service = HealthService(clock, watch_network=False)
    await service.start(plane)
    await service.runner.stop()
    try:
        yield SimpleNamespace(
            clock=clock,
            a=a.id,
            b=b.id,
            score=plane.groups.score,
            alive=service.alive,
            service=service,
            plane=plane,
        )
    finally:
        await service.stop()


def _node(name: str) -> NodeSpec:
    return NodeSpec(name=name, protocol="socks5", host="127.0.0.1", port=9, id=uuid.uuid4())


async def test_a_ranked_tcp_probe_of_a_score_member_feeds_the_probe_baseline(tmp_path):
    async with _world(tmp_path, Policy.SCORE) as w:
        w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT)
        w.alive.notify_check_success(w.b, Domain.TCP, V4, PROBE_RTT * 4)
        a, b = w.score.performance.score("auto", TCP, None, V4, (w.a, w.b), w.clock.now())
        assert a is not None and b is not None
        assert a > b  # the faster probe ranks better within its own scope


async def test_a_fallback_probe_sample_is_not_a_baseline(tmp_path):
    async with _world(tmp_path, Policy.SCORE) as w:
        w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT, rank=False)
        assert len(w.score.performance) == 0


async def test_probes_of_nodes_outside_score_groups_reach_no_score_state(tmp_path):
    async with _world(tmp_path, Policy.URLTEST) as w:
        w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT)
        assert len(w.score.performance) == 0


async def test_a_probe_never_recovers_or_qualifies_a_node(tmp_path):
    async with _world(tmp_path, Policy.SCORE) as w:
        for _ in range(10):
            w.clock.advance(1.0)
            w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT)
        stats = w.score.evidence.stats()
        assert stats.exact_entries == 0 and stats.aggregate_entries == 0
        assert not w.score.evidence.qualified("auto", TCP, w.a, w.clock.now())


async def test_a_probe_in_flight_across_a_reload_never_reaches_the_cleared_baseline(tmp_path, monkeypatch):
    """A committed reload clears the probe baselines (GH-K-12). A probe started before it must
    not refill them, even one that finishes while the health service is still taking the new
    plane (its registration may wait on the state database)."""
    async with _world(tmp_path, Policy.SCORE) as w:
        ticket = w.alive.issue_ticket()  # a probe started under the old plane, still running
        w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT)
        assert len(w.score.performance) == 1
        w.plane.groups.commit_score(w.clock.now())  # the reload's commit: baselines cleared
        assert len(w.score.performance) == 0
        registering, release = asyncio.Event(), asyncio.Event()
        register = w.service._register

        async def slow_register(plane):  # noqa: ANN001, ANN202 - the database's thread hop, held open
            registering.set()
            await release.wait()
            await register(plane)

        monkeypatch.setattr(w.service, "_register", slow_register)
        applying = asyncio.create_task(w.service.apply(w.plane))
        await registering.wait()
        assert not w.alive.notify_check_success(w.a, Domain.TCP, V4, PROBE_RTT, ticket=ticket)  # stale now
        assert len(w.score.performance) == 0
        release.set()
        await applying
