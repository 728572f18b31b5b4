"""A reload that removes a VMess Mux.Cool node, against a real v2ray server (issue 33, item 6).

Under the default ``keep`` drain a flow on the node's carrier keeps echoing after the reload and
the carrier (the physical connection v2ray sees) stays up while it carries the flow and closes
after it; a flow opened once the node is back rides a new carrier. Under ``close`` the flow ends
at the reload, and the carrier with it.
"""

from __future__ import annotations

import base64
import json

from helpers.apidaemon import quiet_global, running_daemon
from helpers.engines import poll
from helpers.peerservers import V2rayPeer, v2ray_server
from helpers.reloading import Flow
from helpers.servers import EchoServer

from honk.daemon.app import Daemon

NODE = "muxed"


def _vmess_mux_link(peer: V2rayPeer) -> str:
    fields = {
        "v": "2",
        "ps": NODE,
        "add": peer.host,
        "port": str(peer.port),
        "id": peer.uuid,
        "aid": "0",
        "scy": peer.security,
        "net": "tcp",
        "tls": "",
        "mux": "1",
    }
    return "vmess://" + base64.b64encode(json.dumps(fields).encode()).decode()


def config(peer: V2rayPeer, echo_port: int, *, with_node: bool, drain: str = "keep") -> str:
    glob = quiet_global().replace("global {\n", f"global {{\n    drain: {drain}\n", 1)
    nodes = f"node {{\n    {NODE}: '{_vmess_mux_link(peer)}'\n}}\n" if with_node else ""
    rules = f"    dport({echo_port}) -> {NODE}\n" if with_node else ""
    return (
        glob + "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
        f"{nodes}routing {{\n{rules}    fallback: direct\n}}\n"
    )


async def reload_to(daemon: Daemon, text: str) -> None:
    daemon.config_path.write_text(text)
    await daemon.reload()


async def test_keep_a_flow_on_a_removed_mux_node_runs_on_and_its_carrier_closes_after_it(tmp_path):
    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        async with running_daemon(tmp_path, config(peer, echo.port, with_node=True)) as daemon:
            port = daemon.inbounds["lan"].bound.port
            old = await Flow.open(port, echo.port)
            assert await old.echoes()
            assert peer.carriers() == 1

            await reload_to(daemon, config(peer, echo.port, with_node=False))
            assert await old.echoes(), "the flow on the removed node was cut"
            assert peer.carriers() == 1  # the retired carrier stays up while it carries the flow

            await reload_to(daemon, config(peer, echo.port, with_node=True))
            new = await Flow.open(port, echo.port)
            assert await new.echoes() and await old.echoes()
            assert peer.carriers() == 2  # the new flow did not land on the retired carrier

            await old.close()
            await poll(lambda: peer.carriers() == 1, "the retired carrier to close after its last stream")
            assert await new.echoes()
            await new.close()


async def test_close_drain_ends_the_flow_on_a_removed_mux_node_at_the_reload(tmp_path):
    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        text = config(peer, echo.port, with_node=True, drain="close")
        async with running_daemon(tmp_path, text) as daemon:
            flow = await Flow.open(daemon.inbounds["lan"].bound.port, echo.port)
            assert await flow.echoes()
            await reload_to(daemon, config(peer, echo.port, with_node=False, drain="close"))
            assert await flow.ended()
            await poll(lambda: peer.carriers() == 0, "the drained flow's carrier to close")
            await flow.close()
