"""UDP through VMess, VLESS and Trojan nodes against a real v2ray server.

Each test builds the node from a share link and sends DNS queries to a local
responder through ``dial_udp`` (v2ray's ``freedom`` outbound forwards them);
the answers come back through the node, named after the responder. Then the
lifecycle: two targets through one VMess endpoint (a stream each), the endpoint
ending through ``on_lost`` when the server goes away, and honk's mixed port
carrying a SOCKS5 UDP ASSOCIATE client's query through each node kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.inprocess import dns_through_honk, leaf_from_link
from helpers.peerservers import v2ray_server

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.outbound import stream_datagram

STEP = 10.0  # seconds any single wait may take
DNS_NAME = "udp.honk.test"
DNS_ANSWER = "192.0.2.61"
OTHER_NAME = "other.honk.test"
OTHER_ANSWER = "198.51.100.7"

# (protocol, transport) pairs v2ray serves here; VLESS and Trojan always over TLS
NODES = [("vmess", "tcp"), ("vmess", "ws"), ("vless", "tcp"), ("trojan", "tcp"), ("trojan", "ws")]
UDP_MODES = {"vmess": "vmess-udp", "vless": "vless-udp", "trojan": "trojan-udp"}

Reply = tuple[bytes, Address]


@contextlib.contextmanager
def _v2ray(protocol: str, transport: str, monkeypatch):
    with v2ray_server(protocol, transport=transport) as peer:
        if peer.tls:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        yield peer


async def _ask(endpoint, replies: asyncio.Queue[Reply], dns: UdpDnsResponder, name: str, qid: int) -> Reply:
    endpoint.send(build_query(name, qid), Address(dns.host, dns.port))
    return await asyncio.wait_for(replies.get(), STEP)


async def _until(condition, what: str) -> None:
    """Poll ``condition`` until it holds, at most STEP seconds."""
    deadline = time.monotonic() + STEP
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {STEP}s: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(("protocol", "transport"), NODES)
def test_a_dns_query_crosses_the_node_and_the_answer_names_the_responder(
    run, monkeypatch, protocol, transport
) -> None:
    async def main(link: str, dns: UdpDnsResponder) -> None:
        leaf = leaf_from_link(link)
        assert (leaf.capabilities.udp, leaf.capabilities.udp_mode) == (True, UDP_MODES[protocol])
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        endpoint = await leaf.dial_udp(
            lambda data, source: replies.put_nowait((data, source)), time.monotonic() + STEP
        )
        try:
            for qid in (0x1111, 0x2222):  # a second datagram rides the same stream
                data, source = await _ask(endpoint, replies, dns, DNS_NAME, qid)
                assert source == Address(dns.host, dns.port)
                assert parse_answer(data) == (qid, 0, [DNS_ANSWER])
        finally:
            endpoint.close()
        assert endpoint.closed

    with _v2ray(protocol, transport, monkeypatch) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(peer.share_link(), dns))


def test_one_vmess_endpoint_reaches_two_targets_on_a_stream_each(run, monkeypatch) -> None:
    async def main(link: str, first: UdpDnsResponder, second: UdpDnsResponder) -> None:
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        endpoint = await leaf_from_link(link).dial_udp(
            lambda data, source: replies.put_nowait((data, source)), time.monotonic() + STEP
        )
        try:
            data, source = await _ask(endpoint, replies, first, DNS_NAME, 1)
            assert (source, parse_answer(data)) == (Address(first.host, first.port), (1, 0, [DNS_ANSWER]))
            data, source = await _ask(endpoint, replies, second, OTHER_NAME, 2)
            assert (source, parse_answer(data)) == (Address(second.host, second.port), (2, 0, [OTHER_ANSWER]))
            assert endpoint.streams == 2
        finally:
            endpoint.close()

    with (
        _v2ray("vmess", "tcp", monkeypatch) as peer,
        UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as first,
        UdpDnsResponder({OTHER_NAME: OTHER_ANSWER}) as second,
    ):
        run(main(peer.share_link(), first, second))
        udp_requests = [line for line in peer.accepted() if " accepted udp:" in line]
        assert len(udp_requests) == 2, udp_requests


def test_past_the_stream_bound_the_oldest_target_stream_is_closed_and_reopens_on_use(
    run, monkeypatch
) -> None:
    monkeypatch.setattr(stream_datagram, "MAX_STREAMS_PER_ENDPOINT", 2)

    async def main(peer, responders: list[UdpDnsResponder]) -> None:
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        lost: list[HonkError | None] = []
        endpoint = await leaf_from_link(peer.share_link()).dial_udp(
            lambda data, source: replies.put_nowait((data, source)), time.monotonic() + STEP, lost.append
        )
        try:
            for qid, dns in enumerate([*responders, responders[0]]):
                data, source = await _ask(endpoint, replies, dns, DNS_NAME, qid)
                assert (source, parse_answer(data)) == (Address(dns.host, dns.port), (qid, 0, [DNS_ANSWER]))
                assert endpoint.streams <= 2
            await _until(lambda: peer.carriers() == 2, "v2ray holds two streams")
            assert lost == []  # closing the oldest is no loss
        finally:
            endpoint.close()

    with contextlib.ExitStack() as stack:
        peer = stack.enter_context(_v2ray("vless", "tcp", monkeypatch))
        responders = [stack.enter_context(UdpDnsResponder({DNS_NAME: DNS_ANSWER})) for _ in range(3)]
        run(main(peer, responders))
        udp_requests = [line for line in peer.accepted() if " accepted udp:" in line]
        assert len(udp_requests) == 4, udp_requests  # the first target's stream was opened twice


@pytest.mark.parametrize("protocol", ["vmess", "vless", "trojan"])
def test_the_endpoint_reports_its_loss_once_when_the_server_goes_away(run, monkeypatch, protocol) -> None:
    async def main(dns: UdpDnsResponder) -> None:
        with contextlib.ExitStack() as server:
            peer = server.enter_context(_v2ray(protocol, "tcp", monkeypatch))
            replies: asyncio.Queue[Reply] = asyncio.Queue()
            lost: list[HonkError | None] = []
            endpoint = await leaf_from_link(peer.share_link()).dial_udp(
                lambda data, source: replies.put_nowait((data, source)), time.monotonic() + STEP, lost.append
            )
            await _ask(endpoint, replies, dns, DNS_NAME, 3)
            await asyncio.to_thread(server.close)  # stops v2ray
            await _until(lambda: endpoint.closed, "the endpoint ends")
            assert len(lost) == 1 and isinstance(lost[0], HonkError)
            endpoint.send(build_query(DNS_NAME, 4), Address(dns.host, dns.port))  # dropped, not raised
            endpoint.close()
            assert len(lost) == 1

    with UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(dns))


def test_closing_the_endpoint_reports_no_error(run, monkeypatch) -> None:
    async def main(link: str, dns: UdpDnsResponder) -> None:
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        lost: list[HonkError | None] = []
        endpoint = await leaf_from_link(link).dial_udp(
            lambda data, source: replies.put_nowait((data, source)), time.monotonic() + STEP, lost.append
        )
        await _ask(endpoint, replies, dns, DNS_NAME, 5)
        endpoint.close()
        endpoint.close()
        assert lost == [None]

    with _v2ray("trojan", "tcp", monkeypatch) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(peer.share_link(), dns))


@pytest.mark.parametrize(("protocol", "transport"), [("vmess", "tcp"), ("vless", "tcp"), ("trojan", "tcp")])
def test_honk_carries_socks5_udp_through_a_v2ray_node(run, monkeypatch, protocol, transport) -> None:
    async def main(link: str, dns: UdpDnsResponder) -> None:
        assert await dns_through_honk(link, dns.address, DNS_NAME, 9) == (9, 0, [DNS_ANSWER])

    with _v2ray(protocol, transport, monkeypatch) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(peer.share_link(), dns))
