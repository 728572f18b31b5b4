"""Selection under real failure modes (issue 32), on a real daemon with scripted SOCKS5 nodes.

One daemon serves three groups at once, a URLTest, a Fallback and a Score group, each over its
own four chaos nodes (``helpers/chaos.py``) on loopback. The nodes differ only in per-chunk
latency, so the first is the best for every policy: its probes and its flows answer fastest,
and it comes first in declaration order for the Fallback. Each group has an echo origin of its
own, routed by port. Flows start at a steady rate for every group together; each carries a
token, and the chaos node that forwarded it names the node that served it.

Each test turns the best node of every group into one failure mode at t0 and checks, per policy:

* no healthy node is ever marked dead or demoted (sampled while the flows run);
* URLTest and Fallback leave the failing node within ``ESCAPE_WITHIN`` seconds, and afterwards
  most flows go to the best remaining node;
* Score fails at most one flow that started after its first failure became visible, and then
  puts most flows on the best remaining node.

The daemon runs on a :class:`~helpers.leapclock.LeapClock`, taken past the registration grace
at start so failures count at once; timeouts are short (``connect_timeout`` 500 ms,
``response_timeout`` 1 s, ``check_interval`` 1 s) so a scenario takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

import aiohttp
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, running_daemon
from helpers.chaos import ChaosNode, chaos_node
from helpers.leapclock import LeapClock
from helpers.origins import generate_204
from helpers.servers import echo_server

from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.core.net import Network

POLICIES = ("urltest", "fallback", "score")
NODES = 4
# seconds per forwarded chunk: node 0 is the best. Like real nodes, none answers in loopback time
# (Score compares each latency with the best one's: a best of 1 ms would read every other node as
# equally far behind, and their order would be setup noise).
CHUNK_DELAYS = (0.020, 0.045, 0.070, 0.095)
CONNECT_DELAY = 0.020  # seconds every node takes to answer a CONNECT
FLOW_RATE = 20  # flows per second per group
FLOW_TIMEOUT = 3.0  # seconds a flow waits for its echo before it counts as failed
WARM_FLOWS = 30  # flows per group before t0
SCENARIO_SECONDS = 6.0  # flows after t0
ESCAPE_WITHIN = 15.0  # seconds: "URLTest and Fallback leave a node failing >= 30 % of flows within 15 s"
AFTER_ESCAPE_SHARE = 0.9  # of the flows after the escape, on the best remaining node
MEASURED_WITHIN = 20.0  # seconds the first probes may take to measure every node
SECRET = "selection"
STEP = 10.0  # seconds: the bound on any other wait


@dataclass
class Flow:
    policy: str
    token: bytes
    started: float
    ended: float = 0.0
    ok: bool = False
    node: int | None = None  # the index of the chaos node that forwarded it (None: none did)


@dataclass
class World:
    clock: LeapClock
    nodes: dict[str, list[ChaosNode]]
    origins: dict[str, int]
    lan_port: int = 0
    daemon: object = None
    flows: list[Flow] = field(default_factory=list)
    healthy_marked: list[str] = field(default_factory=list)  # what ever wrongly marked a healthy node

    def node_ids(self, policy: str) -> list:
        plane = self.daemon.plane
        return [plane.outbounds[f"{policy[0]}{i}"].runtime.node_id for i in range(NODES)]


def config(probe_port: int, nodes: dict[str, list[ChaosNode]], origins: dict[str, int]) -> str:
    node_lines = "".join(
        f"    {policy[0]}{i}: '{node.link}'\n"
        for policy, group in nodes.items()
        for i, node in enumerate(group)
    )
    group_lines = "".join(
        f"    g_{policy} {{\n        filter: name({', '.join(f'{policy[0]}{i}' for i in range(NODES))})\n"
        f"        policy: {policy}\n    }}\n"
        for policy in POLICIES
    )
    rules = "".join(f"    dport({origins[policy]}) -> g_{policy}\n" for policy in POLICIES)
    return (
        f"""global {{
    data_dir: ./var
    tcp_check_url: 'http://127.0.0.1:{probe_port}/generate_204'
    check_interval: 1s
    check_tolerance: 5ms
    connect_timeout: 500ms
    response_timeout: 1s
    preconnect_node_count: 0
}}
"""
        + LAN_INBOUND
        + "node {\n"
        + node_lines
        + "}\ngroup {\n"
        + group_lines
        + "}\n"
        + "routing {\n"
        + rules
        + "    fallback: block\n}\n"
        + api_block(SECRET)
    )


@contextlib.asynccontextmanager
async def world(tmp_path):
    clock = LeapClock()
    async with contextlib.AsyncExitStack() as stack:
        probe = await stack.enter_async_context(generate_204())
        nodes = {
            policy: [
                await stack.enter_async_context(chaos_node(f"{policy[0]}{i}", seed=i)) for i in range(NODES)
            ]
            for policy in POLICIES
        }
        for group in nodes.values():
            for node, delay in zip(group, CHUNK_DELAYS, strict=True):
                node.behaviour.chunk_delay = delay
                node.behaviour.connect_delay = CONNECT_DELAY
        origins = {policy: await stack.enter_async_context(echo_server()) for policy in POLICIES}
        w = World(clock, nodes, origins)
        w.daemon = await stack.enter_async_context(
            running_daemon(tmp_path, config(probe.port, nodes, origins), clock=clock)
        )
        clock.leap(REGISTRATION_GRACE + 1)  # failures count from the start
        w.lan_port = w.daemon.inbounds["lan"].bound.port
        await measured(w)
        yield w


async def measured(w: World) -> None:
    """Wait until probes have measured every node of every group."""
    alive = w.daemon.health.alive
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MEASURED_WITHIN
    while not all(
        alive.average(nid, Domain.TCP, Family.V4) is not None
        for policy in POLICIES
        for nid in w.node_ids(policy)
    ):
        assert loop.time() < deadline, "probes never measured every node"
        await asyncio.sleep(0.05)


_tokens = itertools.count()


async def one_flow(w: World, policy: str) -> Flow:
    token = f"{policy}-{next(_tokens):06d}".encode()
    flow = Flow(policy, token, w.clock.now())
    w.flows.append(flow)
    writer = None
    try:
        reader, writer, code, _ = await asyncio.wait_for(
            socks5_open(w.lan_port, "127.0.0.1", w.origins[policy]), FLOW_TIMEOUT
        )
        if code == 0:
            writer.write(token + b"\n")
            echoed = await asyncio.wait_for(reader.readline(), FLOW_TIMEOUT)
            flow.ok = echoed == token + b"\n"
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        flow.ok = False
    finally:
        flow.ended = w.clock.now()
        if writer is not None:
            await close_writer(writer)
    for index, node in enumerate(w.nodes[policy]):
        if any(record.first_up.startswith(token) for record in node.records):
            flow.node = index
    return flow


async def run_flows(w: World, count: int) -> None:
    """``count`` flows per group at FLOW_RATE, while watching the healthy nodes."""
    watcher = asyncio.ensure_future(watch_healthy(w))
    tasks = []
    try:
        for _ in range(count):
            tasks += [asyncio.ensure_future(one_flow(w, policy)) for policy in POLICIES]
            await asyncio.sleep(1 / FLOW_RATE)  # pacing the load, not synchronization
        await asyncio.gather(*tasks)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def watch_healthy(w: World) -> None:
    """Record every moment a healthy node (every node but the first) is dead or demoted."""
    alive = w.daemon.health.alive
    while True:
        for policy in POLICIES:
            for i, nid in enumerate(w.node_ids(policy)[1:], start=1):
                if not alive.tcp_alive(nid, Family.V4):
                    w.healthy_marked.append(f"{policy}{i} dead")
                if alive.demoted(nid):
                    w.healthy_marked.append(f"{policy}{i} demoted")
        await asyncio.sleep(0.05)


def trace(flows: list[Flow]) -> str:
    """The flows in start order: the serving node's index, ``x`` for a failed flow."""
    return "".join("x" if not f.ok else str(f.node) for f in flows)


def flows_after(w: World, policy: str, t0: float) -> list[Flow]:
    return [f for f in w.flows if f.policy == policy and f.started >= t0]


def escape_time(flows: list[Flow], t0: float) -> float | None:
    """Seconds from t0 until every later flow went elsewhere than node 0, or None."""
    last_on_failing = max((f.started for f in flows if f.node == 0 or not f.ok), default=None)
    if last_on_failing is None:
        return 0.0
    if last_on_failing == flows[-1].started:
        return None
    return last_on_failing - t0


def share_on(flows: list[Flow], node: int) -> float:
    return sum(1 for f in flows if f.node == node) / max(len(flows), 1)


def failed_after_first_visible(flows: list[Flow]) -> int:
    failed = [f for f in flows if not f.ok]
    if not failed:
        return 0
    visible = min(f.ended for f in failed)
    return sum(1 for f in failed if f.started > visible)


async def scenario(tmp_path, fail) -> tuple[World, float]:  # noqa: ANN001
    async with world(tmp_path) as w:
        await run_flows(w, WARM_FLOWS)
        for policy in POLICIES:
            steady = [f for f in w.flows if f.policy == policy][-10:]
            assert share_on(steady, 0) >= AFTER_ESCAPE_SHARE, (policy, trace(steady))
            fail(w.nodes[policy][0])
        t0 = w.clock.now()
        await run_flows(w, int(SCENARIO_SECONDS * FLOW_RATE))
        return w, t0


def check_escape(w: World, t0: float, *, healthy_only: bool = True) -> dict[str, float]:
    """The per-policy targets of the issue; the escape time of each policy."""
    if healthy_only:
        assert w.healthy_marked == [], sorted(set(w.healthy_marked))
    escapes = {}
    for policy in POLICIES:
        flows = flows_after(w, policy, t0)
        escape = escape_time(flows, t0)
        assert escape is not None and escape <= ESCAPE_WITHIN, (policy, escape, trace(flows))
        later = [f for f in flows if f.started > t0 + escape]
        assert later, (policy, "no flow after the escape")
        assert share_on(later, 1) >= AFTER_ESCAPE_SHARE, (policy, trace(flows))
        if policy == "score":
            assert failed_after_first_visible(flows) <= 1, (policy, trace(flows))
        escapes[policy] = escape
    return escapes


async def test_the_best_node_keeps_every_flow_in_steady_state(tmp_path):
    async with world(tmp_path) as w:
        await run_flows(w, WARM_FLOWS + 20)
        assert w.healthy_marked == []
        for policy in POLICIES:
            flows = [f for f in w.flows if f.policy == policy][10:]
            assert all(f.ok for f in flows), policy
            assert share_on(flows, 0) >= AFTER_ESCAPE_SHARE, (policy, trace(flows))


async def test_jittery_equal_nodes_are_never_marked_dead_or_demoted(tmp_path):
    async with world(tmp_path) as w:
        for group in w.nodes.values():
            for node in group:
                node.behaviour.chunk_delay = 0.005
                node.behaviour.connect_jitter = 0.040
        await run_flows(w, WARM_FLOWS + 40)
        assert w.healthy_marked == []
        assert all(f.ok for f in w.flows)


def _blackhole(node: ChaosNode) -> None:
    node.behaviour.blackhole = True


def _refuse_half(node: ChaosNode) -> None:
    node.behaviour.refuse_share = 0.5


def _reset_after_reply(node: ChaosNode) -> None:
    node.behaviour.reset_after = 0


def _silent_after_reply(node: ChaosNode) -> None:
    node.behaviour.silent = True


@pytest.mark.parametrize(
    "fail",
    [_blackhole, _refuse_half, _reset_after_reply, _silent_after_reply],
    ids=["blackhole", "refuse-half", "reset-after-reply", "silent-after-reply"],
)
async def test_every_policy_leaves_a_failing_best_node_without_blaming_a_healthy_one(tmp_path, fail):
    w, t0 = await scenario(tmp_path, fail)
    check_escape(w, t0)


async def test_a_recovered_best_node_is_used_again_by_urltest_after_its_revival(tmp_path):
    async with world(tmp_path) as w:
        await run_flows(w, WARM_FLOWS)
        for policy in POLICIES:
            w.nodes[policy][0].behaviour.refuse_share = 1.0
        t0 = w.clock.now()
        await run_flows(w, int(SCENARIO_SECONDS * FLOW_RATE))
        check_escape(w, t0)
        alive = w.daemon.health.alive
        failing = w.node_ids("urltest")[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP
        while alive.tcp_alive(failing, Family.V4):  # its probes fail too: 3 in a row kill it
            assert loop.time() < deadline, "the refusing node never died"
            await asyncio.sleep(0.05)
        for policy in POLICIES:
            w.nodes[policy][0].behaviour.refuse_share = 0.0  # it recovers
        recovered = w.clock.now()
        deadline = loop.time() + STEP
        while not alive.tcp_alive(failing, Family.V4):  # the recovery probes, after the 5 s cooldown
            assert loop.time() < deadline, "the recovered node was never revived"
            await asyncio.sleep(0.05)
        revived = w.clock.now() - recovered
        assert not alive.demoted(failing)  # its strikes belonged to the failure that killed it
        mark = len(w.flows)
        await run_flows(w, 20)
        urltest = [f for f in w.flows[mark:] if f.policy == "urltest"]
        assert share_on(urltest[5:], 0) >= AFTER_ESCAPE_SHARE, trace(urltest)
        fallback = [f for f in w.flows[mark:] if f.policy == "fallback"]
        assert share_on(fallback, 1) >= AFTER_ESCAPE_SHARE, trace(fallback)  # no failback (GH-B-23)
        assert revived <= STEP


async def test_a_dead_ipv4_node_shows_alive_false_to_dashboards(tmp_path):
    async with world(tmp_path) as w:
        w.nodes["urltest"][3].behaviour.refuse_share = 1.0  # its probes fail: 3 in a row kill it
        alive = w.daemon.health.alive
        dead = w.node_ids("urltest")[3]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STEP
        while alive.tcp_alive(dead, Family.V4):
            assert loop.time() < deadline, "the refusing node never died"
            await asyncio.sleep(0.05)
        async with (
            aiohttp.ClientSession() as http,
            http.get(api_base(w.daemon) + "/proxies", headers=bearer(SECRET)) as resp,
        ):
            proxies = (await resp.json())["proxies"]
        assert proxies["u3"]["alive"] is False
        assert proxies["u0"]["alive"] is True


async def test_a_node_reached_over_ipv6_whose_server_is_down_is_skipped_and_shows_dead(tmp_path):
    """A node whose server is ``[::1]`` is judged in its own health family, IPv6: when its server
    goes away, its IPv6 TCP state dies, the group skips it and dashboards see ``alive: false``
    (before, selection read IPv4 only, where this node had no state, and kept serving it)."""
    clock = LeapClock()
    async with contextlib.AsyncExitStack() as stack:
        probe = await stack.enter_async_context(generate_204())
        v6 = await stack.enter_async_context(chaos_node("v6", host="::1"))
        v4 = await stack.enter_async_context(chaos_node("v4"))
        v4.behaviour.chunk_delay = 0.02  # the IPv6 node is the better one
        origin = await stack.enter_async_context(echo_server())
        text = (
            f"""global {{
    data_dir: ./var
    tcp_check_url: 'http://127.0.0.1:{probe.port}/generate_204'
    check_interval: 1s
    check_tolerance: 5ms
    connect_timeout: 500ms
    preconnect_node_count: 0
}}
"""
            + LAN_INBOUND
            + f"node {{\n    v6: '{v6.link}'\n    v4: '{v4.link}'\n}}\n"
            + "group {\n    g {\n        filter: name(v6, v4)\n        policy: urltest\n    }\n}\n"
            + "routing {\n    fallback: g\n}\n"
            + api_block(SECRET)
        )
        daemon = await stack.enter_async_context(running_daemon(tmp_path, text, clock=clock))
        clock.leap(REGISTRATION_GRACE + 1)
        w = World(
            clock, {"urltest": [v6, v4]}, {"urltest": origin}, daemon.inbounds["lan"].bound.port, daemon
        )
        node_v6 = daemon.plane.outbounds["v6"].runtime.node_id
        assert daemon.plane.outbounds["v6"].health_family == 6
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MEASURED_WITHIN
        while daemon.plane.groups.resolve("g", Network.TCP, peek=True).leaf.name != "v6":
            assert loop.time() < deadline, "the IPv6 node never became the URLTest's pick"
            await asyncio.sleep(0.05)
        assert (await one_flow(w, "urltest")).node == 0
        await v6.close()  # the server goes away
        deadline = loop.time() + STEP
        while daemon.health.alive.tcp_alive(node_v6, Family.V6):  # 3 failed probes in a row
            assert loop.time() < deadline, "the IPv6 node never died in its own family"
            await asyncio.sleep(0.05)
        flows = [await one_flow(w, "urltest") for _ in range(5)]
        assert all(f.ok and f.node == 1 for f in flows), trace(flows)
        async with (
            aiohttp.ClientSession() as http,
            http.get(api_base(daemon) + "/proxies", headers=bearer(SECRET)) as resp,
        ):
            proxies = (await resp.json())["proxies"]
        assert proxies["v6"]["alive"] is False and proxies["v4"]["alive"] is True
