"""Warm-up (honk.connection.warm, design area I): startup preconnect and the Selector pin, over
a real plane whose nodes' server is a loopback listener, on a FakeClock."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket

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
    WarmUp,
    pin_targets,
    preconnect_candidates,
)
from honk.core.clock import FakeClock
from honk.group.filter import HealthFilter
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
    body = {"v": "2", "ps": name, "add": "127.0.0.1", "port": str(port), "id": VMESS_ID, "aid": "0", "net": "tcp",
            "type": "none", "tls": "", "host": name}
    node = parse_node_link("vmess://" + base64.b64encode(json.dumps(body).encode()).decode(), name)
    return with_node_id(dataclasses.replace(node, params=(*node.params, ("mux", "1"))))


def _selector(name: str, members: tuple[str, ...], default: str | None = None) -> GroupSpec:
    return GroupSpec(name, policy=Policy.SELECTOR, filters=(name_filter(*members),), has_filter_lines=True,
                     default=default)


def _plane(nodes, groups, clock, *, preconnect: int = PRECONNECT_AUTO, health=None):
    spec = Spec(global_=GlobalSpec(preconnect_node_count=preconnect), nodes=tuple(nodes), groups=tuple(groups))
    return build_plane(spec, clock, 1, health=health)


async def _until(condition, what: str) -> None:
    for _ in range(BOUND):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def _entries(plane) -> dict[str, int]:
    return {name: leaf.runtime.ready.entries for name, leaf in plane.outbounds.items()
            if leaf.runtime is not None and leaf.runtime.ready.entries}


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
    nested = [_selector("inner", ("c",)),
              GroupSpec("outer", policy=Policy.SELECTOR, subgroups=("inner",), has_filter_lines=True)]
    plane = _plane(nodes, nested, clock)
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["c"]


def test_an_unhealthy_explicit_choice_is_still_pinned(server):
    clock = FakeClock()
    alive = AliveDialerSet(clock)
    nodes = [_socks(n, server) for n in ("a", "b")]
    for node in nodes:
        alive.register_node(node.id, node.name)
    clock.advance(REGISTRATION_GRACE + 1)
    for _ in range(3):
        alive.notify_check_failure(nodes[1].id, Domain.TCP, Family.V4)
    plane = _plane(nodes, [_selector("pick", ("a", "b"), default="b")], clock,
                   health=HealthFilter(alive, GroupChecks(clock)))
    assert [leaf.name for leaf in pin_targets(plane).values()] == ["b"]  # health never substitutes


async def test_a_choice_change_wakes_the_pin_at_once_and_the_repair_pass_refills_what_was_consumed(server):
    clock = FakeClock()
    nodes = [_socks(n, server) for n in ("a", "b")]
    plane = _plane(nodes, [_selector("pick", ("a", "b"))], clock, preconnect=0)
    warm = WarmUp(clock, lambda: plane)
    plane.groups.on_change = lambda group, network: warm.wake()  # as the daemon wires it
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
