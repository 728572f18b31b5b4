"""dae's node()/sub() DNS rules in a real honk process: the daemon's own lookups of a node's
server and of a subscription's host go to the upstream the rule names.

The names end in ``.test`` (RFC 6761: no public resolver answers them), so only the loopback
responder (``helpers/dns.py``) can give their address; the node's server is a real SOCKS5 peer
(microsocks) and the subscription a local HTTP origin. Nothing here dials a public address.
"""

from __future__ import annotations

import signal
from pathlib import Path

from helpers.dns import DnsResponder
from helpers.peers import require_binary
from helpers.peerservers import microsocks
from helpers.proc import HonkProcess
from helpers.servers import EchoServer
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

SERVER = "proxy.example.test"  # the node's server name
SUB_HOST = "subs.example.test"  # the subscription URL's host
LOOPBACK = "127.0.0.1"


def write_config(path: Path, *, echo_port: int, responder: DnsResponder, rules: str, outbounds: str) -> None:
    """``outbounds``: the blocks declaring the outbound ``proxy`` the echo port is routed to."""
    path.write_text(
        "global {\n"
        f"    data_dir: '{path.parent / 'var'}'\n"
        "}\n"
        "inbound {\n"
        f"    lan: 'mixed://{LOOPBACK}:0'\n"
        "}\n"
        f"{outbounds}"
        "dns {\n"
        "    upstream {\n"
        f"        localdns: 'udp://{responder.host}:{responder.port}'\n"
        "    }\n"
        "    routing {\n"
        "        request {\n"
        f"{rules}"
        "            fallback: localdns\n"
        "        }\n"
        "    }\n"
        "}\n"
        "routing {\n"
        f"    dport({echo_port}) -> proxy\n"
        "    fallback: direct\n"
        "}\n"
    )


def node_block(port: int) -> str:
    return f"node {{\n    proxy: 'socks5://{SERVER}:{port}'\n}}\n"


def test_a_node_selected_by_a_node_rule_resolves_its_server_through_the_named_upstream(tmp_path):
    require_binary("microsocks")
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo, microsocks() as peer, DnsResponder({SERVER: LOOPBACK}) as responder:
        write_config(
            cfg,
            echo_port=echo.port,
            responder=responder,
            outbounds=node_block(peer.port),
            rules="            node(proxy) -> localdns\n",
        )
        with HonkProcess(cfg) as honk:
            sock, rep = socks5_connect(honk.inbound(), LOOPBACK, echo.port)
            try:
                assert rep == 0
                assert roundtrip(sock, b"through the node") == b"through the node"
            finally:
                sock.close()
        assert responder.counts[SERVER] >= 1


def test_without_a_rule_the_node_s_server_name_goes_to_the_system_resolver_and_does_not_resolve(tmp_path):
    require_binary("microsocks")
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo, microsocks() as peer, DnsResponder({SERVER: LOOPBACK}) as responder:
        write_config(
            cfg,
            echo_port=echo.port,
            responder=responder,
            outbounds=node_block(peer.port),
            rules="            node(other) -> localdns\n",
        )
        with HonkProcess(cfg) as honk:
            sock, rep = socks5_connect(honk.inbound(), LOOPBACK, echo.port)
            sock.close()
            assert rep != 0
            # the peer is up and the route is the node's: only its server name can have failed
            honk.wait_for(rf"flow refused .*target=127\.0\.0\.1:{echo.port} error=DialError")
        assert responder.counts[SERVER] == 0


def test_a_subscription_selected_by_a_sub_rule_is_fetched_through_the_named_upstream(tmp_path):
    """At start (before the first plane: asked through the fetch plane) and after a reload
    (through the running DNS service's exchanger)."""
    from test_subscription import Reply, SubServer

    require_binary("microsocks")
    cfg = tmp_path / "honk.dae"
    origin = SubServer()
    try:
        with EchoServer() as echo, microsocks() as peer, DnsResponder({SUB_HOST: LOOPBACK}) as responder:
            origin.replies["/sub"] = Reply(body=f"socks5://{peer.host}:{peer.port}#from-paid\n".encode())
            outbounds = (
                f"subscription {{\n    paid: 'http://{SUB_HOST}:{origin.port}/sub'\n}}\n"
                "group {\n    proxy {\n        filter: subtag(paid)\n    }\n}\n"
            )
            write_config(
                cfg,
                echo_port=echo.port,
                responder=responder,
                outbounds=outbounds,
                rules="            sub(paid) -> localdns\n",
            )
            with HonkProcess(cfg) as honk:
                honk.wait_for(r"subscription updated .*subscription=paid nodes=1")
                at_start = responder.counts[SUB_HOST]
                assert at_start >= 1
                sock, rep = socks5_connect(honk.inbound(), LOOPBACK, echo.port)
                try:
                    assert rep == 0
                    assert roundtrip(sock, b"via the subscription") == b"via the subscription"
                finally:
                    sock.close()
                mark = honk.mark()
                honk.signal(signal.SIGHUP)  # a reload downloads every subscription again
                honk.wait_for(r"subscription updated .*subscription=paid nodes=1", after=mark)
                assert responder.counts[SUB_HOST] > at_start
    finally:
        origin.close()


def test_without_a_sub_rule_the_subscription_host_goes_to_the_system_resolver_and_the_fetch_fails(tmp_path):
    from test_subscription import Reply, SubServer

    cfg = tmp_path / "honk.dae"
    origin = SubServer()
    try:
        with EchoServer() as echo, DnsResponder({SUB_HOST: LOOPBACK}) as responder:
            origin.replies["/sub"] = Reply(body=b"socks5://127.0.0.1:1#from-paid\n")
            outbounds = (
                f"subscription {{\n    paid: 'http://{SUB_HOST}:{origin.port}/sub'\n}}\n"
                "group {\n    proxy {\n        filter: subtag(paid)\n    }\n}\n"
            )
            write_config(
                cfg,
                echo_port=echo.port,
                responder=responder,
                outbounds=outbounds,
                rules="            sub(other) -> localdns\n",
            )
            with HonkProcess(cfg) as honk:
                honk.wait_for(
                    r"subscription refresh failed; previous nodes kept .*subscription=paid "
                    r"reason=dial-failed"
                )
        assert responder.counts[SUB_HOST] == 0 and origin.requests == []
    finally:
        origin.close()
