"""dial_mode for transparent flows: which meta routing sees and what each leaf dials, for every
mode; the reality check of ``domain`` (learned names, the resolver, its bound on the clock);
names learned from DNS when sniffing finds none; direct, block and (must) keeping the IP; and
sniffing a stream's first bytes for at most the sniffing timeout of the clock."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from helpers.hello import client_hello

from honk.config.load import load_text
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.errors import HonkError
from honk.core.net import Address, FlowMeta, Network
from honk.inbound.sniffing import (
    DialMode,
    FlowPlan,
    keeps_original_ip,
    plan_flow,
    sniff_first_bytes,
    sniff_stream,
)
from honk.proto.sniff import NEED_MORE

ORIGINAL_IP = ipaddress.ip_address("192.0.2.10")
ORIGINAL = Address(str(ORIGINAL_IP), 443)
OTHER_IP = ipaddress.ip_address("198.51.100.20")
META = FlowMeta(Network.TCP, Address("10.0.0.2", 40000), ORIGINAL, "lan")
CONNECT_TIMEOUT = 3.0
SNIFFING_TIMEOUT = 0.03

CONFIG = """
global {
    connect_timeout: 3s
}
node {
    proxy: 'socks5://127.0.0.1:1080'
}
routing {
    domain(suffix: blocked.test) -> block
    domain(full: video.test) -> proxy
    domain(full: pinned.test) -> proxy(must)
    domain(full: home.test) -> direct
    dip(192.0.2.0/24) && dport(443) -> proxy
    fallback: direct
}
"""


def dispatcher(resolver=None) -> Dispatcher:  # noqa: ANN001
    spec = load_text(CONFIG, "dae")
    clock = FakeClock()

    async def no_lookup(host: str) -> list:
        raise AssertionError(f"routing looked {host} up")

    return Dispatcher(
        build_plane(spec, clock, 1), ConnectionTracker(clock), clock, spec.global_, resolver or no_lookup
    )


async def must_not_resolve(host: str) -> list:
    raise AssertionError(f"{host} was looked up without need")


def learned(*names: str):  # noqa: ANN201
    table = {ORIGINAL_IP: list(names)}
    return lambda ip: table.get(ip, [])


async def plan(
    mode: str,
    sniffed: str | None,
    *,
    names=None,
    resolver=must_not_resolve,  # noqa: ANN001
    clock: FakeClock | None = None,
) -> FlowPlan:
    return await plan_flow(
        mode,
        META,
        sniffed,
        learned_names=names,
        resolver=resolver,
        clock=clock or FakeClock(),
        verify_timeout=CONNECT_TIMEOUT,
    )


async def routed_outbound(flow: FlowPlan) -> str:
    return (await dispatcher().route(flow.meta)).outbound


def by_name(name: str) -> FlowMeta:
    return FlowMeta(Network.TCP, META.source, Address(name, ORIGINAL.port), "lan", resolved=ORIGINAL_IP)


# --- the table, row by row ---------------------------------------------------------------------


async def test_ip_mode_routes_and_dials_the_original_ip_whatever_was_sniffed():
    flow = await plan("ip", "video.test", names=learned("video.test"))
    assert flow.meta == META and flow.name is None
    assert await routed_outbound(flow) == "proxy"  # the dip rule
    assert flow.dial_target("socks5") == ORIGINAL


async def test_domain_mode_routes_a_name_learned_for_the_ip_and_proxies_dial_it():
    flow = await plan("domain", "video.test", names=learned("video.test"))
    assert flow.meta == by_name("video.test") and flow.verified
    assert await routed_outbound(flow) == "proxy"  # the domain rule
    assert flow.dial_target("socks5") == Address("video.test", 443)
    assert flow.dial_target("direct") == ORIGINAL


async def test_domain_mode_verifies_a_sniffed_name_the_resolver_answers_with_the_ip():
    asked = []

    async def resolver(host: str) -> list:
        asked.append(host)
        return [OTHER_IP, ORIGINAL_IP]

    flow = await plan("domain", "blocked.test", resolver=resolver)
    assert asked == ["blocked.test"]
    assert flow.meta == by_name("blocked.test") and flow.verified
    assert await routed_outbound(flow) == "block"


@pytest.mark.parametrize("answer", [[OTHER_IP], [], HonkError("no such name"), OSError("unreachable")])
async def test_domain_mode_keeps_the_ip_decision_when_the_name_fails_the_reality_check(answer):
    async def resolver(host: str) -> list:
        if isinstance(answer, Exception):
            raise answer
        return answer

    flow = await plan("domain", "blocked.test", names=learned("other.test"), resolver=resolver)
    assert flow == FlowPlan(META, ORIGINAL)  # routed and dialled by the IP
    assert await routed_outbound(flow) == "proxy"
    assert flow.dial_target("socks5") == ORIGINAL


async def test_domain_mode_gives_up_verifying_after_the_connect_timeout_of_the_clock():
    clock = FakeClock()
    never = asyncio.Event()

    async def resolver(host: str) -> list:
        await never.wait()
        return [ORIGINAL_IP]

    task = asyncio.create_task(plan("domain", "blocked.test", resolver=resolver, clock=clock))
    while clock.sleepers == 0:
        await asyncio.sleep(0)
    clock.advance(CONNECT_TIMEOUT - 0.001)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.001)
    assert await asyncio.wait_for(task, 1) == FlowPlan(META, ORIGINAL)


async def test_domain_plus_keeps_the_ip_decision_but_proxies_dial_the_sniffed_name_unverified():
    flow = await plan("domain+", "blocked.test")  # no lookup: must_not_resolve
    assert flow.meta == META and flow.name == "blocked.test"
    assert await routed_outbound(flow) == "proxy"  # by the IP, not the block rule of the name
    assert flow.dial_target("socks5") == Address("blocked.test", 443)
    assert flow.dial_target("direct") == ORIGINAL


async def test_domain_plus_does_not_route_by_a_learned_name():
    assert await plan("domain+", None, names=learned("blocked.test")) == FlowPlan(META, ORIGINAL)


async def test_domain_plusplus_routes_by_the_sniffed_name_unverified_and_proxies_dial_it():
    flow = await plan("domain++", "blocked.test")
    assert flow.meta == by_name("blocked.test") and not flow.verified
    assert await routed_outbound(flow) == "block"
    nameless = await plan("domain++", "elsewhere.test")
    # no domain rule matches the name: the IP rules still see the original IP
    assert await routed_outbound(nameless) == "proxy"
    assert nameless.dial_target("socks5") == Address("elsewhere.test", 443)


@pytest.mark.parametrize("mode", ["domain", "domain++"])
async def test_without_a_sniffed_name_a_learned_name_routes_as_verified(mode):
    flow = await plan(mode, None, names=learned("Blocked.Test.", "video.test"))
    assert flow.meta == by_name("blocked.test") and flow.verified
    assert await routed_outbound(flow) == "block"


@pytest.mark.parametrize("mode", ["domain", "domain+", "domain++"])
async def test_without_any_name_the_flow_is_routed_and_dialled_by_its_ip(mode):
    assert await plan(mode, None, names=learned()) == FlowPlan(META, ORIGINAL)
    assert await plan(mode, None) == FlowPlan(META, ORIGINAL)


@pytest.mark.parametrize("mode", ["domain", "domain+", "domain++"])
async def test_an_ip_literal_is_no_name(mode):
    assert await plan(mode, "198.51.100.20") == FlowPlan(META, ORIGINAL)


async def test_a_broken_learned_names_table_costs_only_the_learning():
    def broken(ip):  # noqa: ANN001, ANN202
        raise RuntimeError("cache corrupted")

    assert await plan("domain++", None, names=broken) == FlowPlan(META, ORIGINAL)


def test_an_unknown_mode_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"ip, domain, domain\+, domain\+\+"):
        DialMode.parse("fake-ip")
    assert DialMode.parse(" Domain++ ") is DialMode.DOMAIN_PLUSPLUS


# --- direct, block and (must) keep the original IP ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "outbound", "keeps_ip"),
    [
        ("blocked.test", "block", True),
        ("home.test", "direct", True),
        ("pinned.test", "proxy", True),  # proxy(must)
        ("video.test", "proxy", False),
    ],
)
async def test_direct_block_and_must_decisions_dial_the_original_ip(name, outbound, keeps_ip):
    d = dispatcher()
    flow = await plan("domain++", name)
    routed = await d.route(flow.meta)
    assert routed.outbound == outbound
    assert keeps_original_ip(routed) is keeps_ip
    expected = ORIGINAL if keeps_ip else Address(name, 443)
    assert flow.dial_target(routed.leaf.protocol, keeps_original_ip(routed)) == expected


async def test_the_routing_carries_the_must_flag_of_the_rule_that_decided():
    d = dispatcher()
    assert (await d.route(by_name("pinned.test"))).must
    assert not (await d.route(by_name("video.test"))).must


# --- sniffing the first bytes ----------------------------------------------------------------------


class QueueConn:
    """A client stream whose bytes the test hands over (b"" is EOF)."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()

    async def receive(self) -> bytes:
        return await self.chunks.get()


async def started(clock: FakeClock, coro) -> asyncio.Task:  # noqa: ANN001
    task = asyncio.create_task(coro)
    while clock.sleepers == 0 and not task.done():
        await asyncio.sleep(0)
    return task


def test_the_stream_sniffer_names_tls_and_http_and_gives_up_on_other_protocols():
    assert sniff_stream(client_hello("video.test")) == "video.test"
    assert sniff_stream(b"GET / HTTP/1.1\r\nHost: video.test:8080\r\n\r\n") == "video.test"
    assert sniff_stream(client_hello("video.test")[:20]) == NEED_MORE
    assert sniff_stream(b"GE") == NEED_MORE
    assert sniff_stream(b"SSH-2.0-OpenSSH_9.6\r\n") is None


async def test_a_server_first_protocol_waits_only_the_sniffing_timeout_of_the_clock():
    clock, conn = FakeClock(), QueueConn()
    task = await started(clock, sniff_first_bytes(conn, clock, SNIFFING_TIMEOUT))
    clock.advance(SNIFFING_TIMEOUT / 2)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(SNIFFING_TIMEOUT / 2)
    assert await asyncio.wait_for(task, 1) == (b"", None)


async def test_bytes_read_before_the_timeout_are_kept_for_the_upstream():
    clock, conn = FakeClock(), QueueConn()
    hello = client_hello("video.test")
    task = await started(clock, sniff_first_bytes(conn, clock, SNIFFING_TIMEOUT))
    conn.chunks.put_nowait(hello[:30])  # a ClientHello cut short: NEED_MORE
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    clock.advance(SNIFFING_TIMEOUT)
    assert await asyncio.wait_for(task, 1) == (hello[:30], None)


async def test_a_client_hello_in_pieces_is_named_without_waiting_for_the_timeout():
    clock, conn = FakeClock(), QueueConn()
    hello = client_hello("video.test")
    task = await started(clock, sniff_first_bytes(conn, clock, SNIFFING_TIMEOUT))
    conn.chunks.put_nowait(hello[:30])
    conn.chunks.put_nowait(hello[30:])
    assert await asyncio.wait_for(task, 1) == (hello, "video.test")
    assert clock.sleepers == 0  # the deadline's timer is gone


async def test_a_client_that_closes_ends_sniffing_with_what_it_sent():
    clock, conn = FakeClock(), QueueConn()
    task = await started(clock, sniff_first_bytes(conn, clock, SNIFFING_TIMEOUT))
    conn.chunks.put_nowait(b"GET / HT")
    conn.chunks.put_nowait(b"")
    assert await asyncio.wait_for(task, 1) == (b"GET / HT", None)
