"""The setup-failure retry round in the dial path (GH-B-21, GH-B-15, GH-K-77, issue 32), with
real group and health state and leaves whose dials the test scripts."""

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
from honk.connection.dispatch import FAIR_DIAL_SHARE, Dispatcher, Routed, _fair_chance
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.errors import DialError, DialTimeout, TargetRefused
from honk.core.net import Address, FlowMeta, Network
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager
from honk.outbound.base import DialedStream
from honk.outbound.runtime import NodeRuntime

V4 = Family.V4


class ScriptedLeaf:
    def __init__(self, name: str, alive: AliveDialerSet, clock: FakeClock) -> None:
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


def setup(policy: Policy = Policy.URLTEST, leaf_class: type = ScriptedLeaf):
    clock = FakeClock()
    alive = AliveDialerSet(clock)
    leaves = {n: leaf_class(n, alive, clock) for n in ("a", "b", "c", "d")}
    clock.advance(REGISTRATION_GRACE + 1)
    for n, ms in zip(leaves, (10, 20, 30, 40), strict=True):
        alive.notify_check_success(leaves[n].runtime.node_id, Domain.TCP, V4, ms / 1000)
    members = NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in leaves)),))
    spec = Spec(
        nodes=tuple(NodeSpec(n, "socks5") for n in leaves),
        groups=(GroupSpec("auto", policy=policy, filters=(members,), has_filter_lines=True),),
    )
    manager = GroupManager.build(spec, leaves, health=HealthFilter(alive), clock=clock)
    plane = SimpleNamespace(groups=manager, admission=None, generation=1)
    dispatcher = Dispatcher(plane, ConnectionTracker(clock), clock, spec.global_, None)
    selection = manager.resolve("auto", Network.TCP)
    meta = FlowMeta(
        Network.TCP, source=Address("127.0.0.1", 1), target=Address("127.0.0.1", 2), inbound="lan"
    )
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


async def test_a_refusal_another_member_then_reaches_counts_against_the_refusing_node():
    alive, leaves, dispatcher, routed = setup()
    leaves["a"].fail = TargetRefused("a", 5, "refused by the node")
    served, dialed = await dispatcher.dial_routed(routed)
    dialed.sock.close()
    assert served.leaf is leaves["b"]  # the flow is rescued
    assert node(alive, leaves["a"]).dial_failures == 1  # b reached the target: the refusal was a's
    (await dispatcher.dial_routed(routed))[1].sock.close()
    assert node(alive, leaves["a"]).strikes == 1
    assert dispatcher.plane.groups.resolve("auto", Network.TCP).leaf is leaves["b"]


async def test_a_target_every_member_refuses_blames_no_node():
    alive, leaves, dispatcher, routed = setup()
    for leaf in leaves.values():
        leaf.fail = TargetRefused(leaf.name, 5, "refused by the target")
    with pytest.raises(TargetRefused) as info:
        await dispatcher.dial_routed(routed)
    assert info.value.outbound == "a"
    assert [leaves[n].dials for n in "abcd"] == [1, 1, 1, 1]
    assert all(node(alive, leaf).dial_failures == 0 for leaf in leaves.values())
    assert not any(node(alive, leaf).outcomes for leaf in leaves.values())


async def test_a_fallback_retries_its_next_members_in_declaration_order_and_moves_its_pin_off_a_struck_member():
    alive, leaves, dispatcher, routed = setup(Policy.FALLBACK)
    assert routed.leaf is leaves["a"]
    leaves["a"].fail = TargetRefused("a", 5, "refused by the node")
    leaves["b"].fail = DialError("b", "connect", "refused")
    served, dialed = await dispatcher.dial_routed(routed)
    dialed.sock.close()
    assert served.leaf is leaves["c"] and [leaves[n].dials for n in "abcd"] == [1, 1, 1, 0]
    (await dispatcher.dial_routed(routed))[1].sock.close()
    assert node(alive, leaves["a"]).strikes == 1
    # a is still alive, but it fails flows: the pin moves to the first member without strikes
    assert dispatcher.plane.groups.resolve("auto", Network.TCP).leaf is leaves["c"]


async def test_a_load_balance_gets_no_retry_round():
    _, leaves, dispatcher, routed = setup(Policy.LOADBALANCE)
    routed.leaf.fail = DialError(routed.leaf.name, "connect", "refused")
    with pytest.raises(DialError):
        await dispatcher.dial_routed(routed)
    assert sum(leaf.dials for leaf in leaves.values()) == 1


class TimingLeaf(ScriptedLeaf):
    """A leaf whose dial blackholes until its deadline, on the fake clock, and records the deadlines."""

    def __init__(self, name: str, alive: AliveDialerSet, clock: FakeClock) -> None:
        super().__init__(name, alive, clock)
        self.clock = clock
        self.deadlines: list[float] = []
        self.blackhole = False

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        self.deadlines.append(deadline)
        if self.blackhole:
            self.dials += 1
            self.clock.advance(max(deadline - self.clock.now(), 0.0))
            raise DialTimeout(self.name, "connect", "timed out")
        return await super().dial_tcp(target, deadline)


def timed_setup(policy: Policy):
    return setup(policy, TimingLeaf)


async def test_a_urltest_retry_round_after_a_timeout_gets_a_fresh_deadline_and_blames_only_the_timed_out_node():
    alive, leaves, dispatcher, routed = timed_setup(Policy.URLTEST)
    timeout = dispatcher.global_spec.connect_timeout
    leaves["a"].blackhole = True
    start = dispatcher.clock.now()
    served, dialed = await dispatcher.dial_routed(routed)
    dialed.sock.close()
    assert served.leaf is leaves["b"]
    assert leaves["a"].deadlines == [start + timeout]
    assert leaves["b"].deadlines == [start + 2 * timeout]  # fresh: a had spent all of its own (GH-B-21)
    assert node(alive, leaves["a"]).dial_failures == 1  # a had its full connect_timeout: fair evidence
    assert node(alive, leaves["b"]).dial_failures == 0 and not node(alive, leaves["b"]).demoted


async def test_a_score_retry_is_not_tried_once_the_shared_deadline_is_spent():
    alive, leaves, dispatcher, routed = timed_setup(Policy.SCORE)
    first = routed.leaf
    first.blackhole = True
    with pytest.raises(DialTimeout):
        await dispatcher.dial_routed(routed)
    others = [leaf for leaf in leaves.values() if leaf is not first]
    assert all(leaf.deadlines == [] for leaf in others)  # GH-K-77: one shared deadline, already spent
    assert all(node(alive, leaf).dial_failures == 0 for leaf in others)


async def test_a_timeout_of_a_dial_that_started_with_less_than_its_fair_share_blames_nobody():
    alive, leaves, dispatcher, routed = timed_setup(Policy.URLTEST)
    timeout = dispatcher.global_spec.connect_timeout
    leaves["a"].fail = DialError("a", "connect", "refused")  # fails fast: the round gets a fresh deadline
    leaves["b"].blackhole = leaves["c"].blackhole = leaves["d"].blackhole = True
    with pytest.raises(DialError):
        await dispatcher.dial_routed(routed)
    # b timed out with its whole fresh deadline: fair. c and d started with nothing left: neutral.
    assert leaves["b"].deadlines[0] - timeout <= dispatcher.clock.now() - timeout
    assert node(alive, leaves["b"]).dial_failures == 1
    assert leaves["c"].dials == 0 and leaves["d"].dials == 0  # the round stops at a spent deadline
    assert node(alive, leaves["c"]).dial_failures == 0 and node(alive, leaves["d"]).dial_failures == 0


def test_only_a_timeout_squeezed_below_half_of_connect_timeout_is_neutral():
    timeout, deadline = 3.0, 100.0
    assert _fair_chance(DialTimeout("n", "connect", "t"), deadline - timeout, deadline, timeout)
    assert _fair_chance(
        DialTimeout("n", "connect", "t"), deadline - FAIR_DIAL_SHARE * timeout, deadline, timeout
    )
    assert not _fair_chance(
        DialTimeout("n", "connect", "t"), deadline - 1.4, deadline, timeout
    )  # a permit wait ate it
    assert not _fair_chance(DialTimeout("n", "connect", "t"), None, deadline, timeout)  # never started
    assert _fair_chance(
        DialError("n", "connect", "refused"), deadline - 0.1, deadline, timeout
    )  # an answer is evidence
