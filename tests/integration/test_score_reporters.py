"""Score reporting on every business path of a running daemon (issue 11, GH-K-24), over real
loopback sockets: SOCKS5 CONNECT (fast path on and off), HTTP CONNECT and absolute-form HTTP
forwarding, a direct setup failure, UDP ASSOCIATE, nested Score groups, a flow outside Score,
and honk's own DNS exchanges. Each test reads the evidence cells and cohorts the flow fed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import dns.message
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, quiet_global, running_daemon
from helpers.dns import DnsResponder
from helpers.engines import poll
from helpers.peerservers import danted
from helpers.servers import HttpOrigin, echo_server, free_port

from honk.core.net import Address, Network
from honk.daemon.app import Daemon
from honk.dns.upstream import Destination, Exchanger
from honk.group.score.attempt import Traversal
from honk.group.score.keys import ScoreTarget
from honk.proto.socks5 import build_udp_datagram, parse_udp_datagram

STEP = 5.0  # seconds: the most one exchange may take
LOOPBACK = "127.0.0.1"
DIRECT = ("builtin", "direct")  # the builtin direct leaf's NodeId
MIXED = "Smart"  # Score group: builtin direct plus the danted node
ONLY_DIRECT = "Local"  # Score group: builtin direct only (deterministic selection)
ONLY_PEER = "Remote"  # Score group: the danted node only (deterministic selection)
OUTER = "Outer"  # Score group whose one member is the group ONLY_DIRECT
RETRY = "Retry"  # Score group: a node whose server refuses, then the builtin direct
PAYLOAD = b"honk score reporters"
FLOW_NAME = "score.test"
UDP_READ = 65536
IDLE_MARGIN = 1.0  # seconds past udp_idle_timeout for a sweep that must expire the association
SOCKS_UDP_ASSOCIATE = 3
SOCKS_OK = 0
SOCKS_REFUSED = 5


def _config(peer_port: int, rules: list[tuple[int, str]], refused_port: int | None = None) -> str:
    """A daemon with the Score groups, ``dport(port) -> group`` rules, the rest direct."""
    routing = "".join(f"    dport({port}) -> {group}\n" for port, group in rules)
    refused = refused_port if refused_port is not None else free_port()
    return (
        quiet_global()
        + LAN_INBOUND
        + f"node {{\n    peer: 'socks5://{LOOPBACK}:{peer_port}'\n    gone: 'socks5://{LOOPBACK}:{refused}'\n}}\n"
        "group {\n"
        f"    {MIXED} {{\n        filter: name(direct, peer)\n        policy: score\n    }}\n"
        f"    {ONLY_DIRECT} {{\n        filter: name(direct)\n        policy: score\n    }}\n"
        f"    {ONLY_PEER} {{\n        filter: name(peer)\n        policy: score\n    }}\n"
        f"    {OUTER} {{\n        filter: group({ONLY_DIRECT})\n        policy: score\n    }}\n"
        f"    {RETRY} {{\n        filter: name(gone, direct)\n        policy: score\n    }}\n"
        "}\n"
        f"routing {{\n{routing}    fallback: direct\n}}\n"
    )


@pytest.fixture
def peer() -> Iterator[int]:
    """A real SOCKS5 peer (Dante): required with CI=true, skipped elsewhere when missing."""
    with danted() as socks:
        yield socks.port


@contextlib.asynccontextmanager
async def daemon_for(tmp_path, peer_port: int, rules: list[tuple[int, str]]) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp_path, _config(peer_port, rules)) as daemon:
        yield daemon


def lan_port(daemon: Daemon) -> int:
    return daemon.inbounds["lan"].bound.port


def score(daemon: Daemon):
    return daemon.plane.groups.score


def node_ids(daemon: Daemon, group: str) -> set:
    return {node for name, node in daemon.plane.groups.score_membership() if name == group}


def traversal(group: str, network: Network, port: int, node) -> Traversal:
    return Traversal(group, network, ScoreTarget.of(LOOPBACK, port), node)


def exact(daemon: Daemon, step: Traversal):
    """The exact evidence cell of ``step`` (None when none was created)."""
    return score(daemon).evidence.layers(step.group, step.network, step.target, step.node_id)[2]


def count(daemon: Daemon, step: Traversal, field: str) -> int:
    """A decayed counter of ``step``'s exact cell, rounded: the daemon's clock is real, so a
    count recorded a moment ago has decayed by a hair (0 when there is no cell)."""
    cell = exact(daemon, step)
    return 0 if cell is None else round(getattr(cell, field).value(daemon.clock.now()))


def useful(daemon: Daemon, step: Traversal) -> int:
    return count(daemon, step, "useful")


def credited(daemon: Daemon, step: Traversal) -> int:
    """Distinct reporters whose TX then RX the cohort of ``step``'s cell saw."""
    return score(daemon).cohorts.reporters(step.cohort_cell(), daemon.clock.now())


def served(daemon: Daemon, group: str, network: Network, port: int) -> list[Traversal]:
    """The traversals of ``group`` whose exact cell for the target holds a useful completion."""
    steps = [traversal(group, network, port, node) for node in node_ids(daemon, group)]
    return [step for step in steps if useful(daemon, step) > 0]


async def echo_once(port: int, target_port: int) -> None:
    reader, writer, code, _ = await socks5_open(port, LOOPBACK, target_port)
    assert code == SOCKS_OK
    writer.write(PAYLOAD)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP) == PAYLOAD
    await close_writer(writer)


# --- 1. SOCKS5 CONNECT ---------------------------------------------------------------------------


@pytest.mark.parametrize("group", [MIXED, ONLY_DIRECT, ONLY_PEER])
@pytest.mark.parametrize("fastpath", ["on", "off"])
async def test_a_socks5_connect_relayed_through_score_leaves_a_useful_completion_on_the_served_node(
    tmp_path, monkeypatch, peer, fastpath, group
):
    """MIXED lets Score pick; ONLY_DIRECT pins the fast path's engine connect (a direct leaf, an IP
    target), ONLY_PEER the Python dial handed to the engine."""
    monkeypatch.setenv("HONK_FASTPATH", fastpath)
    async with echo_server() as target, daemon_for(tmp_path, peer, [(target, group)]) as daemon:
        await echo_once(lan_port(daemon), target)
        await poll(lambda: served(daemon, group, Network.TCP, target), "a useful completion")
        [step] = served(daemon, group, Network.TCP, target)  # one node served it, once
        if group == ONLY_DIRECT:
            assert step.node_id == DIRECT
        elif group == ONLY_PEER:
            assert step.node_id != DIRECT
        assert useful(daemon, step) == 1
        assert count(daemon, step, "failures") == 0
        assert credited(daemon, step) == 1  # the cohort saw the reporter's TX, then its RX


# --- 2. HTTP ------------------------------------------------------------------------------------


async def test_an_http_connect_tunnel_reports_to_score(tmp_path, peer):
    async with echo_server() as target, daemon_for(tmp_path, peer, [(target, MIXED)]) as daemon:
        reader, writer = await asyncio.open_connection(LOOPBACK, lan_port(daemon))
        authority = f"{LOOPBACK}:{target}"
        writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
        assert head.split(b" ")[1] == b"200"
        writer.write(PAYLOAD)
        assert await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP) == PAYLOAD
        await close_writer(writer)
        await poll(lambda: served(daemon, MIXED, Network.TCP, target), "a useful completion")
        [step] = served(daemon, MIXED, Network.TCP, target)
        assert credited(daemon, step) == 1


async def test_an_absolute_form_http_forward_reports_to_score(tmp_path, peer):
    with HttpOrigin() as origin:
        async with daemon_for(tmp_path, peer, [(origin.port, MIXED)]) as daemon:
            reader, writer = await asyncio.open_connection(LOOPBACK, lan_port(daemon))
            writer.write(f"GET {origin.url('/')} HTTP/1.1\r\nHost: {LOOPBACK}:{origin.port}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
            assert head.split(b" ")[1] == b"200"
            body = HttpOrigin.body_for("/")
            assert await asyncio.wait_for(reader.readexactly(len(body)), STEP) == body
            await close_writer(writer)  # the upstream connection ends with it: the reporter settles
            await poll(lambda: served(daemon, MIXED, Network.TCP, origin.port), "a useful completion")
            [step] = served(daemon, MIXED, Network.TCP, origin.port)
            assert credited(daemon, step) == 1


# --- 3. a setup failure through direct ---------------------------------------------------------------


def closed_port() -> int:
    """A loopback TCP port nobody listens on (bound, never listening: a connect is refused)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fastpath", ["on", "off"])
async def test_a_refused_connect_through_direct_is_a_target_scoped_setup_failure(
    tmp_path, monkeypatch, peer, fastpath
):
    monkeypatch.setenv("HONK_FASTPATH", fastpath)
    port = closed_port()
    async with daemon_for(tmp_path, peer, [(port, ONLY_DIRECT)]) as daemon:
        reader, writer, code, _ = await socks5_open(lan_port(daemon), LOOPBACK, port)
        await close_writer(writer)
        assert code == SOCKS_REFUSED
        step = traversal(ONLY_DIRECT, Network.TCP, port, DIRECT)
        await poll(
            lambda: exact(daemon, step) is not None and count(daemon, step, "setup_failures") == 1,
            "a setup failure",
        )
        cohorts = score(daemon).cohorts
        assert cohorts.open_episode(step.cohort_cell()) is not None  # the target's own cell failed
        assert step.node_cells()
        assert all(cohorts.open_episode(cell) is None for cell in step.node_cells())  # not the node's


# --- 4. UDP ASSOCIATE ---------------------------------------------------------------------------


class _Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.transport.sendto(data, addr)


@contextlib.asynccontextmanager
async def udp_server(*, echo: bool) -> AsyncIterator[int]:
    """A loopback UDP port that echoes, or swallows every datagram (no reply, no ICMP)."""
    loop = asyncio.get_running_loop()
    protocol = _Echo if echo else asyncio.DatagramProtocol
    transport, _ = await loop.create_datagram_endpoint(protocol, local_addr=(LOOPBACK, 0))
    try:
        yield transport.get_extra_info("sockname")[1]
    finally:
        transport.close()


@dataclass
class Association:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    relay: tuple[str, int]
    sock: socket.socket

    def send(self, port: int, data: bytes) -> None:
        self.sock.sendto(build_udp_datagram(Address(LOOPBACK, port), data), self.relay)

    async def receive(self) -> bytes:
        loop = asyncio.get_running_loop()
        return parse_udp_datagram(await asyncio.wait_for(loop.sock_recv(self.sock, UDP_READ), STEP)).payload


@contextlib.asynccontextmanager
async def associate(daemon: Daemon) -> AsyncIterator[Association]:
    reader, writer, code, bound = await socks5_open(lan_port(daemon), "0.0.0.0", 0, cmd=SOCKS_UDP_ASSOCIATE)
    assert code == SOCKS_OK
    relay = (socket.inet_ntoa(bound[:4]), struct.unpack("!H", bound[4:6])[0])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.bind((LOOPBACK, 0))
    try:
        yield Association(reader, writer, relay, sock)
    finally:
        sock.close()
        await close_writer(writer)


async def test_a_udp_reply_publishes_rx_and_closing_the_association_settles_a_success(tmp_path, peer):
    async with udp_server(echo=True) as target, daemon_for(tmp_path, peer, [(target, ONLY_DIRECT)]) as daemon:
        step = traversal(ONLY_DIRECT, Network.UDP, target, DIRECT)
        async with associate(daemon) as assoc:
            assoc.send(target, PAYLOAD)
            assert await assoc.receive() == PAYLOAD
            await poll(lambda: credited(daemon, step) == 1, "the reply's RX published to the cohort")
            assert count(daemon, step, "attempts") == 0  # not settled while open
        await poll(lambda: useful(daemon, step) == 1, "the association's close to settle a success")
        assert count(daemon, step, "failures") == 0


async def test_a_udp_target_that_never_answers_settles_a_timeout_failure_at_idle_expiry(tmp_path, peer):
    async with (
        udp_server(echo=False) as target,
        daemon_for(tmp_path, peer, [(target, ONLY_DIRECT)]) as daemon,
    ):
        step = traversal(ONLY_DIRECT, Network.UDP, target, DIRECT)
        async with associate(daemon) as assoc:
            assoc.send(target, PAYLOAD)
            await poll(lambda: exact(daemon, step) is not None, "the target's route to be admitted")
            tracker = daemon.tracker
            idle = daemon.dispatcher.global_spec.udp_idle_timeout
            relay_idle = daemon.dispatcher.global_spec.relay_idle_timeout
            assert len(tracker.sweep_idle(daemon.clock.now() + idle + IDLE_MARGIN, relay_idle, idle)) == 1
            assert await asyncio.wait_for(assoc.reader.read(), STEP) == b""  # the association ended
        assert count(daemon, step, "failures") == 1  # after setup, no response: a (timeout) failure
        assert count(daemon, step, "successes") == 0
        assert count(daemon, step, "setup_failures") == 0


# --- 5. nested attribution -----------------------------------------------------------------------


async def test_a_flow_through_nested_score_groups_reports_to_each_group_once(tmp_path, peer):
    async with echo_server() as target, daemon_for(tmp_path, peer, [(target, OUTER)]) as daemon:
        await echo_once(lan_port(daemon), target)
        outer = traversal(OUTER, Network.TCP, target, DIRECT)
        inner = traversal(ONLY_DIRECT, Network.TCP, target, DIRECT)
        await poll(lambda: useful(daemon, outer) and useful(daemon, inner), "both groups' completions")
        for step in (outer, inner):
            assert count(daemon, step, "attempts") == 1
            assert count(daemon, step, "useful") == 1
            assert credited(daemon, step) == 1


# --- 6. a flow outside Score -----------------------------------------------------------------------


async def test_a_flow_routed_to_direct_outside_any_score_group_creates_no_score_cell(tmp_path, peer):
    async with echo_server() as target, daemon_for(tmp_path, peer, [(target, "direct")]) as daemon:
        before = score(daemon).evidence.stats()
        await echo_once(lan_port(daemon), target)
        await poll(lambda: len(daemon.tracker) == 0, "the flow to end")
        after = score(daemon).evidence.stats()
        assert (after.exact_entries, after.aggregate_entries) == (
            before.exact_entries,
            before.aggregate_entries,
        )
        assert (after.exact_entries, after.aggregate_entries) == (0, 0)


# --- 7. honk's own DNS exchanges -------------------------------------------------------------------


def _query() -> tuple[dns.message.Message, bytes]:
    query = dns.message.make_query(FLOW_NAME, "A")
    return query, query.to_wire()


async def _exchange(daemon: Daemon, port: int, outbound: str | None = None) -> dns.message.Message:
    query, wire = _query()
    exchanger = Exchanger(daemon.dispatcher, daemon.clock)
    return await exchanger.exchange(
        Destination("up", "udp", Address(LOOPBACK, port), outbound), query, wire, None
    )


async def test_a_dns_exchange_over_udp_direct_reports_on_a_udp_cell(tmp_path, peer):
    with DnsResponder({FLOW_NAME: "192.0.2.1"}) as upstream:
        async with daemon_for(tmp_path, peer, [(upstream.port, ONLY_DIRECT)]) as daemon:
            reply = await _exchange(daemon, upstream.port)
            assert reply.answer
            udp = traversal(ONLY_DIRECT, Network.UDP, upstream.port, DIRECT)
            tcp = traversal(ONLY_DIRECT, Network.TCP, upstream.port, DIRECT)
            assert useful(daemon, udp) == 1
            assert exact(daemon, tcp) is None  # no TCP carrier was used


async def test_a_truncated_udp_dns_reply_then_the_tcp_retry_report_on_both_carriers(tmp_path, peer):
    with DnsResponder({FLOW_NAME: "192.0.2.1"}, truncate_udp=True) as upstream:
        async with daemon_for(tmp_path, peer, [(upstream.port, ONLY_DIRECT)]) as daemon:
            reply = await _exchange(daemon, upstream.port)
            assert reply.answer
            assert upstream.tcp_queries == 1
            udp = traversal(ONLY_DIRECT, Network.UDP, upstream.port, DIRECT)
            tcp = traversal(ONLY_DIRECT, Network.TCP, upstream.port, DIRECT)
            assert count(daemon, udp, "successes") == 1  # the truncated answer: the carrier works
            assert count(daemon, udp, "failures") == 0
            assert useful(daemon, tcp) == 1
            assert credited(daemon, tcp) == 1


async def test_a_dns_exchange_over_udp_announces_its_reporter_to_the_cohort(tmp_path, peer):
    with DnsResponder({FLOW_NAME: "192.0.2.1"}) as upstream:
        async with daemon_for(tmp_path, peer, [(upstream.port, ONLY_DIRECT)]) as daemon:
            await _exchange(daemon, upstream.port)
            assert credited(daemon, traversal(ONLY_DIRECT, Network.UDP, upstream.port, DIRECT)) == 1


async def test_a_forced_udp_dns_upstream_reports_its_udp_carrier_on_a_udp_cell(tmp_path, peer):
    with DnsResponder({FLOW_NAME: "192.0.2.1"}) as upstream:
        async with daemon_for(tmp_path, peer, []) as daemon:
            await _exchange(daemon, upstream.port, outbound=ONLY_DIRECT)
            assert useful(daemon, traversal(ONLY_DIRECT, Network.UDP, upstream.port, DIRECT)) == 1
            assert exact(daemon, traversal(ONLY_DIRECT, Network.TCP, upstream.port, DIRECT)) is None


# --- 8. no target in Score's logs ------------------------------------------------------------------


async def test_score_and_the_groups_never_log_a_flows_target(tmp_path, peer, caplog):
    caplog.set_level(logging.DEBUG, logger="honk.group")  # every level of the groups and Score
    async with (
        echo_server() as target,
        udp_server(echo=True) as udp_target,
        daemon_for(tmp_path, peer, [(target, MIXED), (udp_target, ONLY_DIRECT)]) as daemon,
    ):
        await echo_once(lan_port(daemon), target)
        async with associate(daemon) as assoc:
            assoc.send(udp_target, PAYLOAD)
            assert await assoc.receive() == PAYLOAD
        await poll(lambda: served(daemon, MIXED, Network.TCP, target), "the TCP flow to settle")
        await poll(
            lambda: useful(daemon, traversal(ONLY_DIRECT, Network.UDP, udp_target, DIRECT)) == 1,
            "the UDP association to settle",
        )
    score_records = [r for r in caplog.records if r.name.startswith("honk.group")]
    for record in score_records:
        text = record.getMessage()
        for port in (target, udp_target):
            assert f"{LOOPBACK}:{port}" not in text and str(port) not in text, text


# --- the setup retry: one failure recorded, the served leaf reported ------------------------------


async def test_a_score_setup_retry_records_the_failed_node_and_reports_the_leaf_that_served(tmp_path, peer):
    async with echo_server() as target, daemon_for(tmp_path, peer, [(target, RETRY)]) as daemon:
        gone = next(node for node in node_ids(daemon, RETRY) if node != DIRECT)
        await echo_once(lan_port(daemon), target)  # the first pick (config order) is refused
        await poll(
            lambda: useful(daemon, traversal(RETRY, Network.TCP, target, DIRECT)) == 1,
            "the retried leaf's useful completion",
        )
        failed = score(daemon).evidence.layers(RETRY, Network.TCP, None, gone)[0]
        assert failed is not None and round(failed.setup_failures.value(daemon.clock.now())) == 1
        assert useful(daemon, traversal(RETRY, Network.TCP, target, gone)) == 0
