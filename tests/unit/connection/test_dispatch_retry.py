"""The URLTest setup-failure retry round in the dial path (GH-B-21, GH-B-15), with real group
and health state and leaves whose dials the test scripts."""

from __future__ import annotations

import socket
import uuid
from types import SimpleNamespace

import pytest

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.alive.traffic import NodeTraffic
from honk.config.spec import FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec, Policy, Spec
from honk.connection.dispatch import Dispatcher, Routed
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.errors import DialError, TargetRefused
from honk.core.net import Address, FlowMeta, Network
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.outbound.base import DialedStream
from honk.outbound.runtime import NodeRuntime

V4 = Family.V4


class ScriptedLeaf:
    def __init__(self, name: str, alive: AliveDialerSet) -> None:
        self.name = name
        self.protocol = "socks5"
        self.supports_udp = True
        self.health_family = 4
        self.runtime = NodeRuntime(uuid.uuid4(), name)
        self.runtime.traffic = NodeTraffic(alive, self.runtime.node_id)
        alive.register_node(self.runtime.node_id, name)
        self.fail: Exception | None = None
        self.dials = 0

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        self.dials += 1
        if self.fail is not None:
            raise self.fail
        a, b = socket.socketpair()
        b.close()
        return DialedStream(a)


def setup(policy: Policy = Policy.URLTEST):
    clock = FakeClock()
    alive = AliveDialerSet(clock)
    leaves = {n: ScriptedLeaf(n, alive) for n in ("a", "b", "c", "d")}
    clock.advance(REGISTRATION_GRACE + 1)
    for n, ms in zip(leaves, (10, 20, 30, 40), strict=True):
        alive.notify_check_success(leaves[n].runtime.node_id, Domain.TCP, V4, ms / 1000)
    members = NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in leaves)),))
    spec = Spec(nodes=tuple(NodeSpec(n, "socks5") for n in leaves),
                groups=(GroupSpec("auto", policy=policy, filters=(members,), has_filter_lines=True),))
    manager = GroupManager.build(spec, leaves, health=HealthFilter(alive), clock=clock)
    plane = SimpleNamespace(groups=manager, admission=None, generation=1)
    dispatcher = Dispatcher(plane, ConnectionTracker(clock), clock, spec.global_, None)
    selection = manager.resolve("auto", Network.TCP)
    meta = FlowMeta(Network.TCP, source=Address("127.0.0.1", 1), target=Address("127.0.0.1", 2), inbound="lan")
    return alive, leaves, dispatcher, Routed(meta, "auto", "fallback", selection.chain, selection.leaf, 1)


def node(alive, leaf):
    return alive.node(leaf.runtime.node_id)


async def test_a_failed_winner_is_retried_on_the_next_ranked_member_and_demoted_at_the_second_failure():
    alive, leaves, dispatcher, routed = setup()
    assert routed.leaf is leaves["a"]
    leaves["a"].fail = DialError("a", "connect", "refused")
    served, dialed = await dispatcher.dial_routed(routed)
    dialed.sock.close()
    assert served.leaf is leaves["b"] and served.chain == ("auto", "b")
    assert node(alive, leaves["a"]).strikes == 0  # a lone failure the retry rescued: no selection state
    assert dispatcher.plane.groups.resolve("auto", Network.TCP).leaf is leaves["a"]
    (await dispatcher.dial_routed(routed))[1].sock.close()  # a second failure in a row: a strike
    assert node(alive, leaves["a"]).strikes == 1
    assert dispatcher.plane.groups.resolve("auto", Network.TCP).leaf is leaves["b"]


async def test_the_round_tries_at_most_three_and_then_the_first_error_stands():
    alive, leaves, dispatcher, routed = setup()
    for leaf in leaves.values():
        leaf.fail = DialError(leaf.name, "connect", "refused")
    with pytest.raises(DialError) as info:
        await dispatcher.dial_routed(routed)
    assert info.value.outbound == "a"
    assert [leaves[n].dials for n in "abcd"] == [1, 1, 1, 1]
    assert all(node(alive, leaves[n]).dial_failures == 1 for n in "abcd")


async def test_a_target_refusal_is_not_retried():
    _, leaves, dispatcher, routed = setup()
    leaves["a"].fail = TargetRefused("a", 5, "refused by the target")
    with pytest.raises(TargetRefused):
        await dispatcher.dial_routed(routed)
    assert leaves["b"].dials == 0


async def test_other_policies_get_no_retry_round():
    _, leaves, dispatcher, routed = setup(Policy.FALLBACK)
    leaves["a"].fail = DialError("a", "connect", "refused")
    with pytest.raises(DialError):
        await dispatcher.dial_routed(routed)
    assert leaves["b"].dials == 0
