"""Warm-up (honk.connection.warm, design area I): startup preconnect, the Selector pin and the
UDP warm set, over a real plane whose nodes' server is a loopback listener, on a FakeClock."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
import uuid

import pytest

from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.config.links import parse_node_link, with_node_id
from honk.config.spec import (
    PRECONNECT_AUTO,
    GlobalSpec,
    GroupSpec,
    Policy,
    Spec,
    name_filter,
)
from honk.connection.plane import build_plane
from honk.connection.warm import (
    PRECONNECT_AUTO_NODES,
    REPAIR_INTERVAL,
    UDP_WARM_CONCURRENCY,
    WarmUp,
    pin_targets,
    preconnect_candidates,
    udp_warm_targets,
)
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.group.events import GroupEvent, SelectionMoved
from honk.group.filter import HealthFilter
from honk.outbound.mux import pool_for
from honk.outbound.runtime import WarmOwner

BOUND = 500  # loop iterations a polled condition may take
VMESS_ID = "b831381d-6324-4d53-ad4f-8cda48b30811"


@pytest.fixture
def server():
    """The nodes' server: a loopback listener (the kernel completes connections from its backlog)."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield listener.getsockname()[1]


def _socks(name: str, port: int):
    return parse_node_link(f"socks5://{name}:pw@127.0.0.1:{port}", name)  # distinct users: distinct nodes


def _mux(name: str, port: int):
    """A VMess mux node; each name its own user id, so each its own node (NodeId)."""
    user = str(uuid.uuid5(uuid.UUID(VMESS_ID), name))
    body = {
        "v": "2",
        "ps": name,
        "add": "127.0.0.1",
        "port": str(port),
        "id": user,
        "aid": "0",
        "net": "tcp",
        "type": "none",
        "tls": "",
        "host": name,
    }
    node = parse_node_link("vmess://" + base64.b64encode(json.dumps(body).encode()).decode(), name)
    return with_node_id(dataclasses.replace(node, params=(*node.params, ("mux", "1"))))


def _selector(name: str, members: tuple[str, ...], default: str | None = None) -> GroupSpec:
    return GroupSpec(
        name, policy=Policy.SELECTOR, filters=(name_filter(*members),), has_filter_lines=True, default=default
    )


def _urltest(name: str, members: tuple[str, ...]) -> GroupSpec:
    return GroupSpec(name, policy=Policy.URLTEST, filters=(name_filter(*members),), has_filter_lines=True)


def _plane(nodes, groups, clock, *, preconnect: int = PRECONNECT_AUTO, udp_warm: int = 0, health=None):
    glob = GlobalSpec(preconnect_node_count=preconnect, udp_warm_node_count=udp_warm)
    spec = Spec(global_=glob, nodes=tuple(nodes), groups=tuple(groups))
    return build_plane(spec, clock, 1, health=health)


async def _until(condition, what: str) -> None:
    for _ in range(BOUND):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def _entries(plane) -> dict[str, int]:
    return {
        name: leaf.runtime.ready.entries
        for name, leaf in plane.outbounds.items()
        if leaf.runtime is not None and leaf.runtime.ready.entries
    }


# --- startup preconnect ---------------------------------------------------------------------------


def test_preconnect_takes_current_picks_first_then_configuration_order_and_skips_mux_nodes(server):
    clock = FakeClock()
    nodes = [_mux("m1", server), _mux("m2", server)] + [_socks(f"n{i}", server) for i in range(1, 13)]
    plane = _plane(nodes, [_selector("pick", ("n1", "n9", "m1"), default="n9")], clock)
    names = [leaf.name for leaf in preconnect_candidates(plane, PRECONNECT_AUTO)]
    assert names == ["n9", "n1", "n2", "n3", "n4", "n5", "n6", "n7"]  # 'auto': at most eight
    assert len(names) == PRECONNECT_AUTO_NODES
    assert [leaf.name for leaf in preconnect_candidates(plane, 3)] == ["n9", "n1", "n2"]
    assert preconnect_candidates(plane, 0) == []
    assert len(preconnect_candidates(plane, 20)) == 12  # an explicit count covers every bare node


async def test_preconnect_deposits_one_bare_connection_per_candidate_and_owns_nothing(server):
    clock = FakeClock()
    nodes = [_mux("m1", server)] + [_socks(f"n{i}", server) for i in range(1, 13)]
    plane = _plane(nodes, [_selector("pick", ("n1", "n2"))], clock)
    warm = WarmUp(clock, lambda: plane)
    assert await warm.preconnect(plane) == PRECONNECT_AUTO_NODES
    assert _entries(plane) == {f"n{i}": 1 for i in range(1, 9)}
    assert all(not runtime.warm for runtime in plane.runtimes.values())  # a seed, not a retention
    assert warm.preconnected == PRECONNECT_AUTO_NODES


async def test_preconnect_zero_deposits_nothing(server):
    clock = FakeClock()
    plane = _plane([_socks(f"n{i}", server) for i in range(1, 4)], [], clock, preconnect=0)
    assert await WarmUp(clock, lambda: plane).preconnect(plane) == 0
    assert _entries(plane) == {}


async def test_a_preconnected_connection_serves_the_first_dial_without_connecting(server):
    clock = FakeClock()
    plane = _plane([_socks("n1", server)], [], clock)
    await WarmUp(clock, lambda: plane).preconnect(plane)
    leaf = plane.outbounds["n1"]
    sock = await leaf.connect_server(clock.now() + 1)
    try:
        assert (leaf.runtime.ready.hits, leaf.runtime.ready.entries) == (1, 0)
        assert not leaf.runtime.dials  # no dial was made: the pool served it
    finally:
        sock.close()


# --- the Selector pin -----------------------------------------------------------------------------


def test_two_selectors_choosing_one_node_pin_it_once_and_a_sub_group_pins_its_pick(server):
    clock = FakeClock()
    nodes = [_socks(n, server) for n in ("a", "b", "c")]
    groups = [_selector("one", ("a", "b"), default="b"), _selector("two", ("b", "c"), default="b")]
    plane = _plane(nodes, groups, clock)
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["b"]
    nested = [
        _selector("inner", ("c",)),
        GroupSpec("outer", policy=Policy.SELECTOR, subgroups=("inner",), has_filter_lines=True),
    ]
    plane = _plane(nodes, nested, clock)
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["c"]


def test_a_selector_choosing_a_node_pins_that_node_even_when_a_group_shares_its_name(server):
    clock = FakeClock()
    nodes = [_socks(n, server) for n in ("a", "b")]
    # upstream honk's own config: node `a` and a group `a` (here picking b); `one` picks the node
    groups = [_selector("one", ("a",), default="a"), _selector("a", ("b",))]
    plane = _plane(nodes, groups, clock)
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["a", "b"]


def test_an_unhealthy_explicit_choice_is_still_pinned(server):
    clock = FakeClock()
    alive = AliveDialerSet(clock)
    nodes = [_socks(n, server) for n in ("a", "b")]
    for node in nodes:
        alive.register_node(node.id, node.name)
    clock.advance(REGISTRATION_GRACE + 1)
    for _ in range(3):
        alive.notify_check_failure(nodes[1].id, Domain.TCP, Family.V4)
    plane = _plane(
        nodes,
        [_selector("pick", ("a", "b"), default="b")],
        clock,
        health=HealthFilter(alive, GroupChecks(clock)),
    )
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["b"]  # health never substitutes


async def test_a_choice_change_wakes_the_pin_at_once_and_the_repair_pass_refills_what_was_consumed(server):
    clock = FakeClock()
    nodes = [_socks(n, server) for n in ("a", "b")]
    plane = _plane(nodes, [_selector("pick", ("a", "b"))], clock, preconnect=0)
    warm = WarmUp(clock, lambda: plane)

    def route(event: GroupEvent) -> None:  # as the daemon routes a selection move
        if isinstance(event, SelectionMoved):
            warm.wake()

    plane.groups.sink = route
    a, b = plane.outbounds["a"].runtime, plane.outbounds["b"].runtime
    warm.start()
    try:
        await _until(lambda: a.ready.entries == 1, "the first pass warms the choice")
        assert a.warm == WarmOwner.SELECTOR_PIN and not b.warm
        plane.groups.select("pick", "b")  # no clock advance: the wake alone runs the pass
        await _until(lambda: b.ready.entries == 1, "the new choice warmed")
        assert b.warm == WarmOwner.SELECTOR_PIN
        assert not a.warm and a.ready.entries == 0  # the old choice let go: its reuse drained
        assert warm.passes == 2
        await _until(lambda: clock.sleepers == 1, "the pass done, the repair timer armed")
        b.ready.take(clock.now()).close()  # a flow consumed it
        await asyncio.sleep(0)
        assert b.ready.entries == 0 and warm.passes == 2  # nothing before the repair pass
        clock.advance(REPAIR_INTERVAL)
        await _until(lambda: b.ready.entries == 1, "the repair pass refilled it")
        assert warm.passes == 3
    finally:
        await warm.stop()
    assert not b.warm  # stopping lets every pin go


# --- the UDP warm set -----------------------------------------------------------------------------

# five groups over twelve mux nodes and one bare SOCKS5 node; with N = 2 each gives its top two
# reusable UDP leaves (declaration order: nothing is measured), m1 twice
UDP_GROUPS = [
    _urltest("g0", ("m0", "m1", "m2")),
    _urltest("g1", ("m1", "m3", "m4")),
    _urltest("g2", ("s1", "m5", "m6")),
    _urltest("g3", ("m7", "m8")),
    _urltest("g4", ("m9", "m10", "m11")),
]
# every group's first before any group's second, deduplicated, cut at 4 x N = 8: m10 is left out
UDP_WARM_SET = ["m0", "m1", "m5", "m7", "m9", "m3", "m6", "m8"]


def _udp_plane(server, clock, udp_warm: int, groups=UDP_GROUPS):
    nodes = [_mux(f"m{i}", server) for i in range(12)] + [_socks("s1", server)]
    return _plane(nodes, groups, clock, preconnect=0, udp_warm=udp_warm)


def test_the_udp_warm_set_takes_each_groups_top_two_reranked_deduplicated_and_capped(server):
    plane = _udp_plane(server, FakeClock(), 2)
    assert [leaf.name for leaf in udp_warm_targets(plane, 2).values()] == UDP_WARM_SET
    assert [leaf.name for leaf in udp_warm_targets(plane, 1).values()] == [
        "m0",
        "m1",
        "m5",
        "m7",
    ]  # top 1, cap 4
    assert udp_warm_targets(plane, 0) == {}  # opt-in: N = 0 warms nothing
    # N above 3 still takes at most three per group: every mux node here (cap 20)
    assert {leaf.name for leaf in udp_warm_targets(plane, 5).values()} == {f"m{i}" for i in range(12)}


def test_a_selector_gives_its_udp_choice_alone_and_bare_nodes_never_join(server):
    groups = [_selector("pick", ("s1", "m3", "m4"), default="m4"), _selector("bare", ("s1",))]
    plane = _udp_plane(server, FakeClock(), 3, groups)
    assert [leaf.name for leaf in udp_warm_targets(plane, 3).values()] == ["m4"]


async def test_the_udp_warm_set_holds_its_nodes_with_at_most_four_carrier_opens_at_once(server):
    clock = FakeClock()
    plane = _udp_plane(server, clock, 2)
    gate = asyncio.Event()
    running: list[str] = []
    peak = 0
    for leaf in plane.outbounds.values():
        if getattr(leaf, "mux", False):
            leaf.open_mux_carrier = _gated(leaf, gate, running)
    warm = WarmUp(clock, lambda: plane)
    attempt = asyncio.ensure_future(warm.udp_pass())
    try:
        await _until(lambda: len(running) == UDP_WARM_CONCURRENCY, "four carrier opens under way")
        for _ in range(20):  # the others wait for a slot, however long the first take
            await asyncio.sleep(0)
            peak = max(peak, len(running))
        assert peak == UDP_WARM_CONCURRENCY == 4
        gate.set()
        await attempt
        held = {
            leaf.name
            for leaf in plane.outbounds.values()
            if leaf.runtime is not None and leaf.runtime.warm & WarmOwner.UDP_WARM
        }
        assert held == set(UDP_WARM_SET) and len(warm.udp_held) == 8
        opened = {
            leaf.name
            for leaf in plane.outbounds.values()
            if getattr(leaf, "mux", False) and pool_for(leaf).carrier_count
        }
        assert opened == set(UDP_WARM_SET)  # one carrier each, the ninth node none
    finally:
        gate.set()
        await warm.stop()
        _close_carriers(plane)


async def test_a_node_leaving_the_udp_warm_set_keeps_its_carrier_while_a_selector_pins_it(server):
    clock = FakeClock()
    nodes = [_mux("m0", server), _mux("m1", server)]
    plane = _plane(nodes, [_selector("pick", ("m0", "m1"), default="m0")], clock, preconnect=0, udp_warm=1)
    warm = WarmUp(clock, lambda: plane)
    m0 = plane.outbounds["m0"]
    try:
        await asyncio.gather(warm.pin_pass(), warm.udp_pass())
        carrier = pool_for(m0).carriers[0]
        assert m0.runtime.warm == WarmOwner.SELECTOR_PIN | WarmOwner.UDP_WARM
        assert pool_for(m0).opened == 1  # the two owners share the node's one carrier
        plane.groups.select("pick", "m1", Network.UDP)  # UDP's choice moves, TCP's stays
        await asyncio.gather(warm.pin_pass(), warm.udp_pass())
        assert m0.runtime.warm == WarmOwner.SELECTOR_PIN  # the UDP bit let go, the pin kept
        assert pool_for(m0).carriers == [carrier] and carrier.usable
        plane.groups.select("pick", "m1", Network.TCP)
        await warm.pin_pass()
        assert not m0.runtime.warm and carrier.closed  # the last owner gone: its idle carrier closes
    finally:
        await warm.stop()
        _close_carriers(plane)


def _gated(leaf, gate: asyncio.Event, running: list[str]):
    """``leaf``'s carrier open, held at ``gate`` (a server slow to answer) and counted in ``running``."""
    opener = leaf.open_mux_carrier

    async def open_carrier(deadline: float):
        running.append(leaf.name)
        try:
            await gate.wait()
            return await opener(deadline)
        finally:
            running.remove(leaf.name)

    return open_carrier


def _close_carriers(plane) -> None:
    for leaf in plane.outbounds.values():
        if getattr(leaf, "mux", False):
            pool_for(leaf).close()


def test_a_score_group_gives_its_rank_order_and_a_fallback_its_eligible_members_in_order(server):
    groups = [
        GroupSpec(
            "scored", policy=Policy.SCORE, filters=(name_filter("m0", "m1", "m2"),), has_filter_lines=True
        ),
        GroupSpec(
            "backup",
            policy=Policy.FALLBACK,
            filters=(name_filter("s1", "m7", "m8", "m9"),),
            has_filter_lines=True,
        ),
    ]
    plane = _udp_plane(server, FakeClock(), 2, groups)
    scored = plane.groups.udp_warm_leaves("scored", Family.V4, 2, lambda leaf: True)
    assert len(scored) == 2 and {leaf.name for leaf in scored} <= {"m0", "m1", "m2"}
    assert (
        scored[0].name == plane.groups.resolve("scored", Network.UDP, peek=True).leaf.name
    )  # its winner first
    names = [leaf.name for leaf in udp_warm_targets(plane, 2).values()]
    assert names == [scored[0].name, "m7", scored[1].name, "m8"]


# --- setup quality: warm-up's one Score report (GH-F-26, GH-K-03) -----------------------------


class SetupRecorder:
    """The Score performance provider's surface warm-up reaches: setup samples, recorded."""

    def __init__(self) -> None:
        self.samples: list[tuple] = []

    def score(self, group, network, target, family, candidates, now):  # noqa: ANN001, ANN201
        return [None] * len(candidates)

    def observe_setup(self, group, network, target, family, node_id, latency, now) -> None:  # noqa: ANN001
        self.samples.append((group, network, target, family, node_id, round(latency, 6)))


class TimedConnector:
    """A node's connector whose connection takes ``seconds`` of the fake clock to open."""

    def __init__(self, inner, clock: FakeClock, seconds: float) -> None:  # noqa: ANN001
        self.inner, self.clock, self.seconds = inner, clock, seconds

    async def connect(self, server, deadline: float):  # noqa: ANN001, ANN201
        sock = await self.inner.connect(server, deadline)
        self.clock.advance(self.seconds)
        return sock


def _score(name: str, members: tuple[str, ...], final: str | None = None) -> GroupSpec:
    return GroupSpec(
        name, policy=Policy.SCORE, filters=(name_filter(*members),), has_filter_lines=True, final=final
    )


async def test_a_pinned_connection_reports_its_opening_time_to_every_score_group_of_the_node(server):
    clock = FakeClock()
    nodes = [_socks(n, server) for n in ("a", "b", "c")]
    groups = [
        _selector("pick", ("a", "b"), default="a"),
        _score("s1", ("a", "b")),
        _score("s2", ("b", "c"), final="a"),
        _urltest("plain", ("a", "b")),
    ]
    plane = _plane(nodes, groups, clock, preconnect=0)
    recorder = plane.groups.score.performance = SetupRecorder()
    a = plane.outbounds["a"]
    a.connector = TimedConnector(a.connector, clock, 0.042)
    warm = WarmUp(clock, lambda: plane)
    try:
        await warm.pin_pass()
        assert a.runtime.ready.entries == 1
        # one targetless sample (no target, no target family: the aggregate layer) per Score group
        # reaching the node, a final included; a URLTest takes none
        node = a.runtime.node_id
        assert recorder.samples == [
            ("s1", Network.TCP, None, None, node, 0.042),
            ("s2", Network.TCP, None, None, node, 0.042),
        ]
        # setup quality only: no reliability outcome, no counter
        assert plane.groups.score.evidence.stats().aggregate_entries == 0
        assert plane.groups.score.stats()["groups"] == []
    finally:
        await warm.stop()


async def test_a_failed_warm_opening_reports_nothing_to_score():
    clock = FakeClock()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # closed below: connecting is refused
    plane = _plane(
        [_socks("a", port)], [_selector("pick", ("a",)), _score("s1", ("a",))], clock, preconnect=0
    )
    recorder = plane.groups.score.performance = SetupRecorder()
    warm = WarmUp(clock, lambda: plane)
    try:
        await warm.pin_pass()
        assert plane.outbounds["a"].runtime.ready.entries == 0
        assert recorder.samples == []
        assert plane.groups.score.evidence.stats().aggregate_entries == 0  # no failure either
    finally:
        await warm.stop()


async def test_a_udp_warm_carrier_reports_its_opening_time_as_udp_setup_quality(server):
    clock = FakeClock()
    plane = _plane(
        [_mux("m0", server), _mux("m1", server)],
        [_score("s1", ("m0", "m1"))],
        clock,
        preconnect=0,
        udp_warm=1,
    )
    recorder = plane.groups.score.performance = SetupRecorder()
    for leaf in plane.outbounds.values():
        if getattr(leaf, "mux", False):
            leaf.open_mux_carrier = _timed_carrier(leaf, clock, 0.031)
    warm = WarmUp(clock, lambda: plane)
    try:
        await warm.udp_pass()
        (held,) = [
            plane.outbounds[name] for name in ("m0", "m1") if pool_for(plane.outbounds[name]).carrier_count
        ]
        assert recorder.samples == [("s1", Network.UDP, None, None, held.runtime.node_id, 0.031)]
    finally:
        await warm.stop()
        _close_carriers(plane)


def _timed_carrier(leaf, clock: FakeClock, seconds: float):  # noqa: ANN001, ANN202
    opener = leaf.open_mux_carrier

    async def open_carrier(deadline: float):  # noqa: ANN202
        carrier = await opener(deadline)
        clock.advance(seconds)
        return carrier

    return open_carrier
