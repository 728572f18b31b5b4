"""UDP over Mux.Cool (honk.outbound.mux_udp) against a real v2ray server and local DNS responders.

A VMess or VLESS node with ``mux=1`` carries its UDP associations as Mux.Cool
UDP sessions on the node's shared carriers: the tests ask DNS questions of two
responders through one association and count the physical connections v2ray
sees, check that a carrier the node keeps warm serves the association's first
datagram without a new connection, and that the carrier's loss ends the
association once, with the carrier's error.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.inprocess import leaf_from_link
from helpers.peerservers import v2ray_server

from honk.core.net import Address
from honk.outbound.mux import pool_for
from honk.outbound.mux_udp import MuxDatagramEndpoint
from honk.outbound.runtime import WarmOwner

STEP = 10.0  # seconds any single wait may take
POLL = 0.01
DNS_NAME = "mux.honk.test"
DNS_ANSWER = "192.0.2.71"
OTHER_NAME = "other.honk.test"
OTHER_ANSWER = "198.51.100.17"

Reply = tuple[bytes, Address]


def _mux_leaf(peer):
    leaf = leaf_from_link(peer.share_link(), params=(("mux", "1"),))
    assert leaf.mux and leaf.runtime is not None
    return leaf


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + STEP
    while not condition():
        assert time.monotonic() < deadline, f"not within {STEP}s: {what}"
        await asyncio.sleep(POLL)


async def _ask(endpoint, replies: asyncio.Queue[Reply], dns: UdpDnsResponder, name: str, qid: int) -> Reply:
    endpoint.send(build_query(name, qid), Address(dns.host, dns.port))
    return await asyncio.wait_for(replies.get(), STEP)


def _dial(leaf, replies: asyncio.Queue[Reply], lost: list | None = None):
    return leaf.dial_udp(
        lambda data, source: replies.put_nowait((data, source)),
        time.monotonic() + STEP,
        on_lost=(lost.append if lost is not None else None),
    )


@pytest.mark.parametrize("protocol", ["vmess", "vless"])
def test_two_targets_of_one_association_ride_one_carrier_as_a_session_each(
    run, monkeypatch, protocol
) -> None:
    async def main(leaf, first: UdpDnsResponder, second: UdpDnsResponder) -> None:
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        endpoint = await _dial(leaf, replies)
        assert isinstance(endpoint, MuxDatagramEndpoint)
        pool = pool_for(leaf)
        try:
            for qid in (1, 2):  # the second datagram is a Keep frame of the same session
                data, source = await _ask(endpoint, replies, first, DNS_NAME, qid)
                assert (source, parse_answer(data)) == (
                    Address(first.host, first.port),
                    (qid, 0, [DNS_ANSWER]),
                )
            data, source = await _ask(endpoint, replies, second, OTHER_NAME, 3)
            assert (source, parse_answer(data)) == (Address(second.host, second.port), (3, 0, [OTHER_ANSWER]))
            assert endpoint.sessions == 2
            assert pool.carrier_count == 1 and pool.opened == 1
            assert peer.carriers() == 1  # one physical connection for both targets
        finally:
            endpoint.close()
            pool.close()

    with (
        v2ray_server(protocol, mux=True) as peer,
        UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as first,
        UdpDnsResponder({OTHER_NAME: OTHER_ANSWER}) as second,
    ):
        if peer.tls:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        run(main(_mux_leaf(peer), first, second))


def test_a_warm_carrier_serves_a_new_association_without_a_new_connection(run) -> None:
    async def main(leaf, dns: UdpDnsResponder) -> None:
        pool = pool_for(leaf)
        assert await pool.ensure_carrier(leaf.open_mux_carrier, time.monotonic() + STEP)  # the warm carrier
        await _until(lambda: peer.carriers() == 1, "v2ray to see the warm carrier")
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        endpoint = await _dial(leaf, replies)
        try:
            data, _ = await _ask(endpoint, replies, dns, DNS_NAME, 7)
            assert parse_answer(data) == (7, 0, [DNS_ANSWER])
            assert pool.opened == 1 and peer.carriers() == 1
        finally:
            endpoint.close()
            pool.close()

    with v2ray_server("vmess", mux=True) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(_mux_leaf(peer), dns))


def test_the_carriers_loss_ends_the_association_once_with_its_error(run) -> None:
    async def main(leaf, dns: UdpDnsResponder) -> None:
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        lost: list = []
        endpoint = await _dial(leaf, replies, lost)
        data, _ = await _ask(endpoint, replies, dns, DNS_NAME, 9)
        assert parse_answer(data) == (9, 0, [DNS_ANSWER])
        carrier = pool_for(leaf).carriers[0]
        carrier.channel.abort()  # the physical connection breaks under the session
        await _until(lambda: endpoint.closed, "the association to end")
        assert len(lost) == 1 and lost[0] is not None
        assert lost[0] is carrier.sessions.failure  # the carrier's one error, not a new one
        endpoint.send(build_query(DNS_NAME, 10), Address(dns.host, dns.port))
        assert endpoint.dropped == 1 and len(lost) == 1

    with v2ray_server("vmess", mux=True) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(_mux_leaf(peer), dns))


def test_a_vless_node_held_by_both_owners_drains_only_when_the_last_lets_go_and_its_association_goes_on(
    run, monkeypatch
) -> None:
    async def main(leaf, dns: UdpDnsResponder) -> None:
        runtime, pool = leaf.runtime, pool_for(leaf)
        runtime.hold(WarmOwner.SELECTOR_PIN)  # the TCP path's owner
        runtime.hold(WarmOwner.UDP_WARM)  # the UDP path's owner
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        live = await _dial(leaf, replies)
        try:
            assert parse_answer((await _ask(live, replies, dns, DNS_NAME, 1))[0]) == (1, 0, [DNS_ANSWER])
            carrier = pool.carriers[0]
            assert not runtime.let_go(WarmOwner.SELECTOR_PIN)  # the UDP owner keeps the shared pool
            assert pool.carriers == [carrier] and carrier.usable
            assert runtime.let_go(WarmOwner.UDP_WARM)  # the last owner: future reuse drains
            assert carrier.retired and not carrier.closed
            assert parse_answer((await _ask(live, replies, dns, DNS_NAME, 2))[0]) == (2, 0, [DNS_ANSWER])
            later = await _dial(leaf, asyncio.Queue())  # a new association takes a new carrier
            assert pool.opened == 2 and carrier not in [c for c in pool.carriers if c.usable]
            later.close()
        finally:
            live.close()
        await _until(lambda: carrier.closed, "the retired carrier to close once its association ended")
        pool.close()

    with v2ray_server("vless", mux=True) as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        run(main(_mux_leaf(peer), dns))
