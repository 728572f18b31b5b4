"""The daemon's health service end to end: real nodes (danted, ss-server) probed through their
own dial paths against local HTTP and DNS servers, health kept across a reload, the delay
written to the state database on stop."""

from __future__ import annotations

import uuid

import pytest
from helpers.aio import close_writer, socks5_open
from helpers.dns import UdpDnsResponder
from helpers.engines import poll
from helpers.origins import generate_204
from helpers.peers import require_binary
from helpers.peerservers import danted, ss_server

from honk.alive.health import Status
from honk.alive.outcome import Domain, Family
from honk.core.statedb import StateDB, state_db_path
from honk.daemon.app import Daemon


def write_config(path, *, check_port, dns_port, socks_port, ss_port, with_ss=True):
    ss = f"    ss: 'ss://{_ss_userinfo()}@127.0.0.1:{ss_port}'\n" if with_ss else ""
    path.write_text(
        "global {\n"
        "    data_dir: ./var\n"
        f"    tcp_check_url: 'http://127.0.0.1:{check_port}/generate_204'\n"
        f"    udp_check_dns: '127.0.0.1:{dns_port}'\n"
        "    check_interval: 3600s\n"
        "}\n"
        "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
        f"node {{\n    socks: 'socks5://127.0.0.1:{socks_port}'\n{ss}}}\n"
        "group {\n    proxy {\n        policy: min_moving_avg\n    }\n}\n"
        "routing {\n    fallback: proxy\n}\n"
    )


def _ss_userinfo() -> str:
    import base64

    return base64.urlsafe_b64encode(b"chacha20-ietf-poly1305:health-pass").decode().rstrip("=")


def ids_by_name(daemon) -> dict[str, uuid.UUID]:
    return {n.name: n.id for n in daemon.plane.spec.nodes}


@pytest.fixture
def peers():
    require_binary("danted")
    require_binary("ss-server")
    with danted() as socks, ss_server("chacha20-ietf-poly1305", "health-pass") as ss:
        yield socks, ss


async def test_every_node_is_probed_through_its_own_path_and_health_survives_reload(tmp_path, peers):
    socks, ss = peers
    cfg = tmp_path / "honk.dae"
    async with generate_204() as origin:
        with UdpDnsResponder({"www.google.com": "10.0.0.1"}) as dns:
            write_config(
                cfg, check_port=origin.port, dns_port=dns.port, socks_port=socks.port, ss_port=ss.port
            )
            daemon = Daemon(cfg)
            await daemon.start()
            try:
                alive = daemon.health.alive
                ids = ids_by_name(daemon)

                def probed() -> bool:
                    return all(
                        alive.status(ids[n], d, Family.V4) is Status.ALIVE
                        for n in ("socks", "ss")
                        for d in Domain
                    )

                await poll(probed, "TCP and UDP results of both nodes")
                assert origin.requests >= 4  # two rounds per node
                assert dns.queries >= 2
                for name in ("socks", "ss"):
                    delay = alive.node(ids[name]).latencies.last_real_sample()[1]
                    assert 0 < delay < 1.0

                # a real flow through the URLTest group counts as its use (idle sleep is woken by it)
                runner = daemon.health.runner
                runner._last_used["proxy"] -= 100.0
                before = runner._last_used["proxy"]
                reader, writer, code, _ = await socks5_open(
                    daemon.inbounds["lan"].bound.port, "127.0.0.1", origin.port
                )
                assert code == 0
                await close_writer(writer)
                assert runner._last_used["proxy"] > before

                write_config(
                    cfg,
                    check_port=origin.port,
                    dns_port=dns.port,
                    socks_port=socks.port,
                    ss_port=ss.port,
                    with_ss=False,
                )
                assert await daemon.reload()
                assert ids["ss"] not in alive and ids["socks"] in alive
                assert alive.status(ids["socks"], Domain.TCP, Family.V4) is Status.ALIVE  # kept
            finally:
                await daemon.shutdown(0.0)
    db = StateDB(state_db_path(tmp_path / "var"))
    try:
        stored = db.load_delays(now_wall=0.0, max_age=float("inf"))
    finally:
        db.close()
    assert set(stored) == {ids["socks"]}  # the removed node was forgotten
