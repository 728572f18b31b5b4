"""The transparent inbounds on a real router: a client namespace's traffic to a server namespace
is intercepted by honk's nftables table and policy routing in the router namespace, where
TransparentInbound listeners (TPROXY TCP+UDP, REDIRECT TCP) serve it.

Proxied flows reach the server from the router's address (not the client's), IPv4 and IPv6;
UDP answers come back from the original destination; a block rule, also one matched by a
sniffed SNI under dial_mode domain++, gets the client refused; DNS datagrams go to the DNS
handler; a REDIRECT listener serves TCP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator

import pytest
from helpers.testbed import ROUTER_WAN, SERVER, Testbed, announce_ready, testbed

from honk.netlink.nftables import Interception, install_script, run_nft
from honk.netlink.routing import PolicyRouting
from honk.netlink.routing import install as install_routing

TPROXY_PORT = 15001
REDIR_PORT = 15002
HTTP_PORT = 80
BLOCKED_PORT = 8081  # the server answers there; a rule blocks it
TLS_PORT = 443
REDIRECTED_PORT = 8080
ECHO_PORT = 5353
DNS_PORT = 53
DNS_ANSWER = "answered-by-honk"

ROUTING = f"""
routing {{
    domain(suffix: blocked.test) -> block
    dport({BLOCKED_PORT}) -> block
    fallback: direct
}}
"""


# --- honk in the router namespace --------------------------------------------------------------


def run_honk(config: str) -> None:
    """The router side: transparent inbounds over a plane built from a dae text, until SIGTERM.
    ``config``: JSON with ``dae`` (the configuration text), ``inbounds`` (TransparentSpec
    fields) and ``loop`` (``asyncio`` or ``uvloop``)."""
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    cfg = json.loads(config)
    if cfg.get("loop") == "uvloop":
        import uvloop

        uvloop.run(_honk(cfg))
    else:
        asyncio.run(_honk(cfg))


async def _honk(cfg: dict) -> None:
    from honk.config.load import load_text
    from honk.connection.dispatch import Dispatcher
    from honk.connection.plane import SystemResolver, build_plane
    from honk.connection.tracker import ConnectionTracker
    from honk.core.clock import MonotonicClock
    from honk.inbound.tproxy import TransparentInbound, TransparentSpec

    spec = load_text(cfg["dae"], "dae")
    clock = MonotonicClock()
    tracker = ConnectionTracker(clock)
    glob = spec.global_
    dispatcher = Dispatcher(
        build_plane(spec, clock, 1), tracker, clock, glob, SystemResolver(clock, glob.connect_timeout)
    )

    async def dns_handler(query: bytes, client, original) -> bytes:  # noqa: ANN001
        return f"{DNS_ANSWER} for {client.host} to {original}".encode()

    inbounds = [
        TransparentInbound(TransparentSpec(**fields), dispatcher, clock, dns_handler=dns_handler)
        for fields in cfg["inbounds"]
    ]
    for inbound in inbounds:
        await inbound.start()
    sweeper = asyncio.get_running_loop().create_task(tracker.run_sweeper(1.0))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    announce_ready(" ".join(str(inbound.bound) for inbound in inbounds))
    await stop.wait()
    sweeper.cancel()
    for inbound in inbounds:
        await inbound.aclose()
    tracker.close_all("test over")
    os._exit(0)  # the relay engine's worker must not hold the exit


def start_honk(
    bed: Testbed,
    *,
    dial_mode: str = "domain",
    loop: str = "asyncio",
    tproxy: bool = True,
    redir: bool = False,
):  # noqa: ANN201 - NsProcess
    inbounds = []
    if tproxy:
        inbounds.append(
            {
                "name": "lan",
                "kind": "tproxy",
                "host": "::",
                "port": TPROXY_PORT,
                "dial_mode": dial_mode,
                "sniffing_timeout": 0.5,
            }
        )
    if redir:
        inbounds.append(
            {
                "name": "redir",
                "kind": "redir",
                "host": "::",
                "port": REDIR_PORT,
                "dial_mode": dial_mode,
                "sniffing_timeout": 0.5,
            }
        )
    dae = f"global {{\n    dial_mode: {dial_mode}\n    connect_timeout: 3s\n}}\n{ROUTING}"
    return bed.spawn(
        bed.router, "test_tproxy_netns:run_honk", json.dumps({"dae": dae, "inbounds": inbounds, "loop": loop})
    )


def intercept(bed: Testbed) -> None:
    """honk's own ruleset and policy routing, as the daemon installs them."""
    run_nft(install_script(Interception((bed.lan,), TPROXY_PORT)), netns=bed.router)
    install_routing(PolicyRouting(), bed.router)


def redirect(bed: Testbed) -> None:
    """A REDIRECT rule of the test's own (honk's table diverts everything to TPROXY instead)."""
    run_nft(
        f"""table inet hk_redirect {{
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{bed.lan}" tcp dport {REDIRECTED_PORT} redirect to :{REDIR_PORT}
    }}
}}
""",
        netns=bed.router,
    )


@pytest.fixture
def bed() -> Iterator[Testbed]:
    with testbed("transparent proxy tests", "nft", "curl") as made:
        made.spawn(
            made.server,
            "helpers.testbed:serve",
            f"{HTTP_PORT},{BLOCKED_PORT},{TLS_PORT},{REDIRECTED_PORT}",
            f"{ECHO_PORT},{DNS_PORT}",
        )
        yield made


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


# --- tests ------------------------------------------------------------------------------------


def test_without_honk_the_client_reaches_the_server_directly(bed):
    done = bed.curl(url(SERVER.v4, HTTP_PORT))
    assert done.stdout == f"hello from server, peer={bed.client_ip.v4}", done.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tproxy_tcp_is_proxied_for_ipv4_and_ipv6(bed, loop):
    honk = start_honk(bed, loop=loop)
    intercept(bed)
    for server, router in ((SERVER.v4, ROUTER_WAN.v4), (SERVER.v6, ROUTER_WAN.v6)):
        done = bed.curl(url(server, HTTP_PORT))
        assert done.stdout == f"hello from server, peer={router}", (done.stderr, honk.output())
    honk.wait_for(
        r"flow opened network=tcp inbound=lan source=\[2001:db8:1::2\]:\d+ target=\[2001:db8:2::2\]:80",
        stream="stderr",
    )


def test_a_block_rule_refuses_the_client_and_nothing_else(bed):
    honk = start_honk(bed)
    intercept(bed)
    refused = bed.curl(url(SERVER.v4, BLOCKED_PORT))
    assert refused.returncode != 0 and "hello" not in refused.stdout
    honk.wait_for(
        r"flow refused inbound=lan source=192\.0\.2\.2:\d+ target=198\.51\.100\.2:8081 error=Blocked",
        stream="stderr",
    )
    done = bed.curl(url(SERVER.v4, HTTP_PORT))  # the inbound carries on
    assert done.stdout == f"hello from server, peer={ROUTER_WAN.v4}", done.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_udp_is_answered_from_the_original_destination_for_ipv4_and_ipv6(bed, loop):
    honk = start_honk(bed, loop=loop)
    intercept(bed)
    for server, router in ((SERVER.v4, ROUTER_WAN.v4), (SERVER.v6, ROUTER_WAN.v6)):
        out = bed.call(bed.client, "helpers.testbed:udp_exchange", server, str(ECHO_PORT), "ping", "again")
        replies = [json.loads(line) for line in out.splitlines()]
        # the second datagram reaches honk through the session's connected reply socket
        assert replies == [
            {"reply": f"echo:ping seen-from={router}", "source": [server, ECHO_PORT]},
            {"reply": f"echo:again seen-from={router}", "source": [server, ECHO_PORT]},
        ], honk.output()


def test_dns_datagrams_go_to_the_dns_handler_and_are_answered_from_the_original_address(bed):
    honk = start_honk(bed)
    intercept(bed)
    out = bed.call(bed.client, "helpers.testbed:udp_exchange", SERVER.v4, str(DNS_PORT), "query")
    [reply] = [json.loads(line) for line in out.splitlines()]
    assert reply == {
        "reply": f"{DNS_ANSWER} for {bed.client_ip.v4} to {SERVER.v4}:{DNS_PORT}",
        "source": [SERVER.v4, DNS_PORT],
    }, honk.output()


def test_a_sniffed_sni_matching_a_block_rule_is_refused_under_domain_plusplus(bed):
    honk = start_honk(bed, dial_mode="domain++")
    intercept(bed)
    out = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "www.blocked.test")
    assert not out.startswith("reply:"), out
    honk.wait_for(
        r"flow refused inbound=lan source=192\.0\.2\.2:\d+ target=www\.blocked\.test:443 error=Blocked",
        stream="stderr",
    )
    out = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "fine.test")
    assert out.strip() == f"reply:hello from server, peer={ROUTER_WAN.v4}", honk.output()
    out = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v6, str(TLS_PORT), "fine.test")
    assert out.strip() == f"reply:hello from server, peer={ROUTER_WAN.v6}", honk.output()


def test_an_unverified_sni_keeps_the_ip_decision_under_domain(bed):
    """domain: the sniffed name must resolve to the destination; blocked.test does not
    resolve at all in the router namespace, so the flow is routed by its IP and passes."""
    honk = start_honk(bed, dial_mode="domain")
    intercept(bed)
    out = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "www.blocked.test")
    assert out.strip() == f"reply:hello from server, peer={ROUTER_WAN.v4}", honk.output()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_redirect_serves_tcp_for_ipv4_and_ipv6(bed, loop):
    honk = start_honk(bed, tproxy=False, redir=True, loop=loop)
    redirect(bed)
    for server, router in ((SERVER.v4, ROUTER_WAN.v4), (SERVER.v6, ROUTER_WAN.v6)):
        done = bed.curl(url(server, REDIRECTED_PORT))
        assert done.stdout == f"hello from server, peer={router}", (done.stderr, honk.output())
    honk.wait_for(
        r"flow opened network=tcp inbound=redir source=192\.0\.2\.2:\d+ target=198\.51\.100\.2:8080",
        stream="stderr",
    )


def test_a_connection_to_the_listener_itself_is_refused(bed):
    """Not diverted, addressed to the transparent port: routing it would loop back to honk."""
    honk = start_honk(bed, redir=True)
    done = bed.curl(url(bed.router_lan_ip.v4, TPROXY_PORT))
    assert done.returncode != 0
    honk.wait_for(r"flow refused inbound=lan source=192\.0\.2\.2:\d+ .* error=NotSupported", stream="stderr")
    done = bed.curl(url(bed.router_lan_ip.v4, REDIR_PORT))  # a REDIRECT port reached directly
    assert done.returncode != 0
    honk.wait_for(
        r"flow refused inbound=redir source=192\.0\.2\.2:\d+ target=- error=NotSupported", stream="stderr"
    )
