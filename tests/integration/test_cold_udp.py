"""Cold URLTest UDP preparation end to end (design area G, issue 12 acceptance 3).

honk's mixed port routes everything to a URLTest of three unmeasured nodes: a black hole (a
SOCKS5 server that accepts and never answers), dante and ss-server. A SOCKS5 UDP client's DNS
query must come back through dante within the preparation deadline: the black-holed attempt
started first, is aborted and drained when dante's endpoint is ready, and is no health failure
of its node. The process's file descriptors and tasks come back to where they were.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import threading
import time

from helpers.aio import close_writer, socks5_open
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.peerservers import danted, ss_server
from helpers.socks import encode_address

from honk.config.links import parse_node_link
from honk.config.spec import (
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.stagger import preparation_deadline
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import MonotonicClock
from honk.core.net import Network
from honk.core.stats import RuntimeStats, StaggerCounts
from honk.inbound.mixed import MixedInbound

CONNECT_TIMEOUT = 2.0  # seconds: the preparation deadline is then max(10 s, 8 s) = 10 s
STEP = 5.0  # seconds any single wait may take
DNS_NAME = "cold.honk.test"
DNS_ANSWER = "192.0.2.77"
SS_METHOD = "chacha20-ietf-poly1305"


class BlackHole:
    """A TCP server that accepts, reads what it is sent and never answers; it notes when each
    connection is closed by the client (the aborted attempt drained)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.closed_by_client = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted += 1
                threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while conn.recv(1024):  # read and never answer, until the client gives up
                pass
            self.closed_by_client.set()

    def close(self) -> None:
        self.sock.close()


class TrafficLog:
    """A node's health sink (``NodeRuntime.traffic``): what real traffic told the node's health."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def dial(self, outcome, family, latency=None, pool_hit=False) -> None:  # noqa: ANN001
        self.events.append("dial-ok" if outcome is None else "dial-failed")

    def packets_failed(self, family: int) -> None:
        self.events.append("udp-failed")

    def packets_answered(self, family: int) -> None:
        self.events.append("udp-answered")


def _group(name: str, members: tuple[str, ...]) -> GroupSpec:
    return GroupSpec(name, policy=Policy.URLTEST, filters=(name_filter(*members),), has_filter_lines=True)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_cold_udp_flow_through_an_unmeasured_urltest_escapes_a_black_hole(run) -> None:
    async def main(
        hole: BlackHole, dante_port: int, ss_port: int, dns: UdpDnsResponder, second: UdpDnsResponder
    ) -> None:
        userinfo = base64.urlsafe_b64encode(f"{SS_METHOD}:cold-secret".encode()).decode().rstrip("=")
        nodes = (
            parse_node_link(f"socks5://127.0.0.1:{hole.port}", "hole"),
            parse_node_link(f"socks5://127.0.0.1:{dante_port}", "dante"),
            parse_node_link(f"ss://{userinfo}@127.0.0.1:{ss_port}", "ss"),
        )
        clock = MonotonicClock()
        glob = GlobalSpec(connect_timeout=CONNECT_TIMEOUT)
        inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
        spec = Spec(
            global_=glob,
            inbounds=(inbound_spec,),
            nodes=nodes,
            groups=(_group("auto", ("hole", "dante", "ss")),),
            routing=RoutingSpec(rules=(), fallback="auto"),
        )
        plane = build_plane(spec, clock, 1)
        traffic = {name: TrafficLog() for name in ("hole", "dante", "ss")}
        for name, log in traffic.items():
            plane.outbounds[name].runtime.traffic = log
        assert [s.leaf.name for s in plane.groups.cold_udp_candidates("auto")] == ["hole", "dante", "ss"]
        tracker = ConnectionTracker(clock)
        dispatcher = Dispatcher(plane, tracker, clock, glob, SystemResolver(clock, CONNECT_TIMEOUT))
        dispatcher.stats = stats = RuntimeStats()
        inbound = MixedInbound(inbound_spec, dispatcher, clock)
        await inbound.start()
        fds, tasks = _open_fds(), len(asyncio.all_tasks())
        try:
            reader, writer, code, tail = await socks5_open(inbound.bound.port, "0.0.0.0", 0, cmd=3)
            assert code == 0
            relay_port = int.from_bytes(tail[4:6], "big")
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.setblocking(False)
                udp.connect(("127.0.0.1", relay_port))
                header = b"\x00\x00\x00" + encode_address(*dns.address)
                await loop.sock_sendall(udp, header + build_query(DNS_NAME, 9))
                reply = await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
                elapsed = time.monotonic() - started
                # a second target of the same association: the prepared sub-link serves it, no new race
                other = b"\x00\x00\x00" + encode_address(*second.address)
                await loop.sock_sendall(udp, other + build_query(DNS_NAME, 10))
                again = await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
                # a race's loser of the same version ending (closed unpublished) drops nothing
                [tracked] = [f for f in tracker._flows.values() if f.network is Network.UDP]
                association = tracked._handle
                version = tracked.outbound_version
                kept = association._endpoints[version]
                association._endpoint_lost(version, None, object())  # an endpoint it never held
                assert association._endpoints[version] is kept and not kept.closed
                await loop.sock_sendall(udp, header + build_query(DNS_NAME, 11))
                third = await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
                assert parse_answer(third[len(header) :]) == (11, 0, [DNS_ANSWER])
            assert parse_answer(reply[len(header) :]) == (9, 0, [DNS_ANSWER])
            assert elapsed < preparation_deadline(CONNECT_TIMEOUT)
            assert parse_answer(again[len(other) :]) == (10, 0, [DNS_ANSWER])
            [flow] = [f for f in tracker.snapshot() if f.network is Network.UDP]  # one association
            assert flow.chain[-1] == "dante"  # served by the second candidate
            assert hole.accepted == 1  # the black hole was tried first ...
            assert await asyncio.to_thread(hole.closed_by_client.wait, STEP)  # ... then aborted and drained
            assert "udp-failed" not in traffic["hole"].events and not plane.outbounds["hole"].runtime.dials
            assert "udp-answered" in traffic["dante"].events
            assert stats.udp_stagger == StaggerCounts(plans=1, attempts=2, wins=1, drained=1)  # one race
            assert stats.outbounds["dante"].connections == 1 and "hole" not in stats.outbounds
            await close_writer(writer)
            tracker.close_all("test over")
            await asyncio.wait_for(tracker.wait_idle(), STEP)
        finally:
            await inbound.aclose()
            tracker.close_all("test over")
            await asyncio.wait_for(tracker.wait_idle(), STEP)
        for _ in range(50):  # closes finish on the next loop iterations
            if _open_fds() <= fds and len(asyncio.all_tasks()) <= tasks:
                break
            await asyncio.sleep(0.01)
        assert _open_fds() <= fds
        assert len(asyncio.all_tasks()) <= tasks

    hole = BlackHole()
    try:
        with (
            danted() as dante,
            ss_server(SS_METHOD, "cold-secret", udp=True) as ss,
            UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns,
            UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as second,
        ):
            run(main(hole, dante.port, ss.port, dns, second))
    finally:
        hole.close()
