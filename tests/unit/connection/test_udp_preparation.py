"""The preparation deadline of an authoritative single-node UDP plan (GH-G-09, GH-G-10), on a FakeClock.

A UDP target routed to one proxy leaf (no cold race) prepares that leaf's endpoint under the same
absolute deadline a cold URLTest race has: ``max(10 s, 4 × connect_timeout)`` from the start of
preparation, handed to the leaf and enforced over its whole dial (resolution, admission,
negotiation), so a preparation that hangs fails exactly then: not at ``connect_timeout``, not later.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from honk.config.spec import GlobalSpec
from honk.connection.dispatch import Dispatcher
from honk.connection.stagger import preparation_deadline
from honk.connection.tracker import ConnectionTracker
from honk.connection.udp import UdpNat
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.core.stats import RuntimeStats

CLIENT = Address("192.0.2.2", 40000)
TARGET = Address("198.51.100.7", 53)
EPSILON = 1e-6  # seconds: just short of, or just past, an instant


class HangingLeaf:
    """A proxy leaf whose endpoint preparation never completes by itself (say, a server that
    accepts and never answers the negotiation); it records when it started, the deadline it
    was given, and whether it was cancelled."""

    protocol = "socks5"
    name = "slow"
    outbound_id = "slow@v1"
    capabilities = SimpleNamespace(udp=True)
    health_family = 4
    runtime = None

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.dials: list[tuple[float, float]] = []  # (started, deadline)
        self.cancelled_at: float | None = None

    async def dial_udp(self, receive, deadline: float, on_lost=None):  # noqa: ANN001, ANN201
        self.dials.append((self.clock.now(), deadline))
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled_at = self.clock.now()
            raise


class OneLeafPlane:
    """Every flow to the one leaf, through a one-hop chain: no cold race (an authoritative plan)."""

    generation = 1

    def __init__(self, leaf: HangingLeaf) -> None:
        self.leaf = leaf

    async def decide(self, meta, resolver):  # noqa: ANN001, ANN201
        return SimpleNamespace(
            route=SimpleNamespace(outbound="slow", rule="match", must=False),
            selection=SimpleNamespace(chain=("slow",), leaf=self.leaf),
        )


class Client(UdpNat):
    def _deliver(self, source: Address, data: bytes) -> None:
        pass


async def _no_resolver(host: str) -> list:
    return []


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize(("connect_timeout", "expected"), [(1.0, 10.0), (2.5, 10.0), (5.0, 20.0)])
async def test_a_single_node_udp_plan_fails_at_the_preparation_deadline_and_not_before(
    connect_timeout, expected
):
    assert preparation_deadline(connect_timeout) == expected
    clock = FakeClock()
    leaf = HangingLeaf(clock)
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(
        OneLeafPlane(leaf), tracker, clock, GlobalSpec(connect_timeout=connect_timeout), _no_resolver
    )
    dispatcher.stats = stats = RuntimeStats()
    nat = Client(dispatcher, inbound="lan", client=CLIENT)
    nat._open_flow(TARGET)
    try:
        nat._forward(TARGET, b"query")
        await _settle()
        [(started, deadline)] = leaf.dials
        assert deadline == pytest.approx(started + expected)  # the leaf is given the plan's deadline

        clock.advance(connect_timeout + EPSILON)  # connect_timeout alone ends nothing
        await _settle()
        clock.advance(started + expected - EPSILON - clock.now())
        await _settle()
        assert leaf.cancelled_at is None and TARGET not in nat._routes  # still preparing
        assert nat._pending[TARGET] == [b"query"]

        clock.advance(2 * EPSILON)  # the deadline: the preparation is cut, the plan fails
        await _settle()
        assert leaf.cancelled_at == pytest.approx(started + expected)
        route = nat._routes[TARGET]
        assert route.endpoint is None and route.sockaddr is None  # the target's datagrams are dropped
        assert not nat._endpoints and not nat._dialing and TARGET not in nat._pending
        assert stats.dials[("udp", "error", "timeout")] == 1 and len(leaf.dials) == 1
    finally:
        nat.close()
