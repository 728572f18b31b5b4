"""dae's ``-> direct(mark: N)``: flows a marked rule decides are dialled direct with that socket
mark (upstream honk and dae), every other direct flow with honk's bypass mark."""

from __future__ import annotations

import os
import socket

import pytest

from honk.config.load import load_text
from honk.config.spec import GlobalSpec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.net import Address, FlowMeta, Network
from honk.outbound.direct import BYPASS_MARK, SO_MARK

CONFIG = """
routing {
    dport(2001) -> direct(mark: 0x800)
    dport(2002) -> must_direct(mark: 2048)
    fallback: direct
}
"""


def dispatcher(text: str = CONFIG) -> Dispatcher:
    clock = FakeClock()
    plane = build_plane(load_text(text, "dae"), clock, 1)
    return Dispatcher(plane, ConnectionTracker(clock), clock, GlobalSpec(connect_timeout=5.0), None)


def flow(port: int, host: str = "127.0.0.1") -> FlowMeta:
    return FlowMeta(Network.TCP, Address("127.0.0.1", 40000), Address(host, port), "lan")


def test_a_marked_rule_dials_direct_with_its_mark_and_other_flows_with_the_bypass_mark():
    d = dispatcher()
    marked, must_marked, plain = (d.route_now(flow(port)) for port in (2001, 2002, 2003))
    assert marked.leaf.name == plain.leaf.name == "direct"
    assert marked.leaf.engine_plan(marked.meta.target).mark == 0x800
    assert must_marked.must and must_marked.leaf is marked.leaf  # one twin per mark
    assert plain.leaf.engine_plan(plain.meta.target).mark == BYPASS_MARK


def test_the_fallback_mark_applies_to_the_fallback_decision():
    d = dispatcher("routing {\n    dport(1) -> block\n    fallback: direct(mark: 0x1234)\n}\n")
    routed = d.route_now(flow(443))
    assert routed.leaf.engine_plan(routed.meta.target).mark == 0x1234


@pytest.mark.skipif(os.geteuid() != 0, reason="SO_MARK needs CAP_NET_ADMIN (run as root)")
async def test_the_python_dial_of_a_marked_rule_carries_the_mark_on_its_socket():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        d = dispatcher(CONFIG.replace("dport(2001)", f"dport({port})"))
        routed, dialed = await d.dial_routed(d.route_now(flow(port)))
        with dialed.sock:
            assert dialed.sock.getsockopt(socket.SOL_SOCKET, SO_MARK) == 0x800
        server.accept()[0].close()
