"""/metrics on a running daemon (acceptance 4): the text parses with prometheus_client's parser,
a selection change, a dial failure and a node death each move their series, and the series count
stays bounded with 2,000 nodes however many targets are dialled. Real sockets on loopback, the API
listener the daemon binds from its config, an aiohttp client."""

from __future__ import annotations

import asyncio
import gc
import socket

import aiohttp
import pytest
from aiohttp import web
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import (
    LAN_INBOUND,
    api_base,
    api_block,
    bearer,
    metric_samples,
    quiet_global,
    running_daemon,
)
from helpers.engines import poll
from helpers.servers import free_port
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import PROBE_DEATH_THRESHOLD
from honk.control.errors import ApplyError
from honk.core.net import Address, Network
from honk.daemon.app import Daemon
from honk.proto.socks5 import build_udp_datagram

SECRET = "metrics-s3cret"
LINK_PASSWORD = "LinkPassw0rd"  # in every node link; must never reach the exposition
SOCKS_OK = 0x00
BIG = 2000  # nodes in the bounded-series test (the acceptance's number)
STATES_PER_NODE = 6  # three health domains x two address families
# series that do not scale with nodes: fixed families, fixed label sets, one inbound, one group
SERIES_OVERHEAD = 200
EXTRA_DIALS = 200  # dials to distinct targets after which the series count must be unchanged

ROUTED = """node {{
{nodes}}}
group {{
    proxy {{
        filter: name(a, b)
    }}
}}
routing {{
    fallback: proxy
}}
{subscription}"""


def config(closed: int, extra_nodes: int = 0, subscription_url: str = "") -> str:
    """Nodes a and b (a first: the Selector's default), and ``extra_nodes`` more, all socks5 links with
    a password to a closed port; distinct users keep their NodeIds distinct."""
    lines = [
        f"    a: 'socks5://honk:{LINK_PASSWORD}@127.0.0.1:{closed}'\n",
        f"    b: 'socks5://honk:{LINK_PASSWORD}-b@127.0.0.1:{closed}'\n",
    ]
    lines += [
        f"    n{i}: 'socks5://u{i}:{LINK_PASSWORD}{i}@127.0.0.1:{closed}'\n" for i in range(extra_nodes)
    ]
    subscription = f"subscription {{\n    paid: '{subscription_url}'\n}}\n" if subscription_url else ""
    routed = ROUTED.format(nodes="".join(lines), subscription=subscription)
    return quiet_global() + LAN_INBOUND + routed + api_block(SECRET)


async def scrape_text(daemon: Daemon) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(api_base(daemon) + "/metrics", headers=bearer(SECRET)) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
            return await response.text()


async def scrape(daemon: Daemon) -> dict[tuple[str, frozenset], float]:
    return metric_samples(await scrape_text(daemon))


def at(parsed: dict, name: str, **labels: str) -> float | None:
    return parsed.get((name, frozenset(labels.items())))


def dial_errors(parsed: dict, network: str, kind: str) -> float | None:
    return at(parsed, "honk_dials_total", network=network, result="error", kind=kind)


def node_id(daemon: Daemon, name: str):  # noqa: ANN201 - uuid.UUID
    return next(n.node_id for n in daemon.health.alive.nodes() if n.name == name)


async def socks_dial(daemon: Daemon, host: str, port: int) -> int:
    """One SOCKS5 CONNECT through the mixed inbound; the reply code."""
    _, writer, reply, _ = await socks5_open(daemon.inbounds["lan"].bound.port, host, port)
    await close_writer(writer)
    return reply


async def test_a_selector_write_moves_the_groups_selection_changes(tmp_path):
    async with running_daemon(tmp_path, config(free_port())) as daemon:
        before = await scrape(daemon)
        assert at(before, "honk_group_selection_changes_total", group="proxy", network="tcp") == 0
        assert await daemon.select("proxy", "b", Network.TCP) == [Network.TCP]
        after = await scrape(daemon)
        assert at(after, "honk_group_selection_changes_total", group="proxy", network="tcp") == 1
        assert at(after, "honk_group_selection_changes_total", group="proxy", network="udp") == 0
        await daemon.select("proxy", "b")  # both networks: TCP already serves b, UDP moves from a
        after = await scrape(daemon)
        assert at(after, "honk_group_selection_changes_total", group="proxy", network="tcp") == 1
        assert at(after, "honk_group_selection_changes_total", group="proxy", network="udp") == 1


async def test_a_refused_socks5_dial_through_the_mixed_inbound_counts_as_a_dial_error(tmp_path):
    async with running_daemon(tmp_path, config(free_port())) as daemon:
        before = await scrape(daemon)
        assert dial_errors(before, "tcp", "dial") == 0
        assert await socks_dial(daemon, "origin.example", 443) != SOCKS_OK  # node a's server is closed
        await poll(lambda: daemon.stats.dials[("tcp", "error", "dial")] == 1, "the dial to be counted")
        after = await scrape(daemon)
        assert dial_errors(after, "tcp", "dial") == 1
        assert at(after, "honk_dials_total", network="tcp", result="ok", kind="") == 0
        assert dial_errors(after, "tcp", "timeout") == 0


async def test_a_udp_endpoint_dial_through_a_dead_node_counts_on_the_udp_network(tmp_path):
    loop = asyncio.get_running_loop()
    async with running_daemon(tmp_path, config(free_port())) as daemon:
        reader, writer, reply, bound = await socks5_open(
            daemon.inbounds["lan"].bound.port, "0.0.0.0", 0, cmd=3
        )
        assert reply == SOCKS_OK
        relay = ("127.0.0.1", int.from_bytes(bound[-2:], "big"))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.setblocking(False)
            client.bind(("127.0.0.1", 0))
            await loop.sock_sendto(client, build_udp_datagram(Address("192.0.2.7", 53), b"query"), relay)
            await poll(lambda: daemon.stats.dials[("udp", "error", "dial")] >= 1, "the UDP dial to fail")
        await close_writer(writer)
        parsed = await scrape(daemon)
        assert dial_errors(parsed, "udp", "dial") == 1
        assert dial_errors(parsed, "tcp", "dial") == 0


async def test_a_node_death_moves_its_alive_series_to_zero(tmp_path):
    async with running_daemon(tmp_path, config(free_port())) as daemon:
        alive = daemon.health.alive
        a = node_id(daemon, "a")
        alive.notify_check_success(a, Domain.TCP, Family.V4, 0.02)
        assert at(await scrape(daemon), "honk_node_alive", node="a", domain="tcp", family="ipv4") == 1
        # the state machine as probes drive it; forced, since the node is still in its registration grace
        for _ in range(PROBE_DEATH_THRESHOLD[Domain.TCP]):
            alive.notify_check_failure(a, Domain.TCP, Family.V4, force=True)
        parsed = await scrape(daemon)
        assert at(parsed, "honk_node_alive", node="a", domain="tcp", family="ipv4") == 0
        assert at(parsed, "honk_node_alive", node="b", domain="tcp", family="ipv4") is None  # unknown


async def test_probe_durations_reloads_and_process_gauges_are_exported(tmp_path):
    async with running_daemon(tmp_path, config(free_port())) as daemon:
        runner = daemon.health.runner
        await poll(lambda: runner.in_flight == 0 and runner.queued == 0, "the start's probes to end")
        before = await scrape(daemon)
        await runner.run_cycle()  # per node a raw TCP connect and a UDP round to the closed port
        assert await daemon.reload()
        cfg = daemon.config_path
        cfg.write_text(cfg.read_text() + "routing {\n")  # a syntax error: the reload is refused
        with pytest.raises(ApplyError):
            await daemon.reload()
        parsed = await scrape(daemon)
        for kind in ("tcp", "udp"):
            for sample in ("honk_probe_duration_seconds_count", "honk_probe_duration_seconds_bucket"):
                labels = {
                    "kind": kind,
                    "result": "error",
                    **({"le": "+Inf"} if sample.endswith("bucket") else {}),
                }
                assert at(parsed, sample, **labels) - at(before, sample, **labels) == 2, (sample, kind)
        assert at(parsed, "honk_probe_duration_seconds_count", kind="tcp", result="ok") == 0
        assert at(parsed, "honk_reloads_total", result="applied", error="") == 1
        assert at(parsed, "honk_reloads_total", result="refused", error="config") == 1  # FileRefused
        assert at(parsed, "honk_process_open_fds") > 0
        assert at(parsed, "honk_uptime_seconds") >= 0


async def test_subscription_refreshes_count_accepted_unchanged_and_failed(tmp_path):
    body = {"text": "socks5://127.0.0.1:1081#sub-one\n", "status": 200}

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=body["text"], status=body["status"])

    app = web.Application()
    app.router.add_get("/sub", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        text = config(free_port(), subscription_url=f"http://127.0.0.1:{port}/sub")
        async with running_daemon(tmp_path, text) as daemon:

            def refreshes(parsed: dict) -> dict[str, float]:
                return {
                    r: at(parsed, "honk_subscription_refreshes_total", result=r)
                    for r in ("accepted", "unchanged", "failed")
                }

            start = refreshes(await scrape(daemon))
            assert await daemon.refresh_subscription("paid")  # the same body again
            body["text"] = "socks5://127.0.0.1:1082#sub-two\n"
            assert await daemon.refresh_subscription("paid")
            body["status"] = 404
            assert not await daemon.refresh_subscription("paid")
            end = refreshes(await scrape(daemon))
            assert {r: end[r] - start[r] for r in end} == {"accepted": 1, "unchanged": 1, "failed": 1}
    finally:
        await runner.cleanup()


async def test_series_stay_bounded_with_2000_nodes_and_do_not_grow_with_dialled_targets(tmp_path):
    async with running_daemon(tmp_path, config(free_port(), extra_nodes=BIG)) as daemon:
        alive = daemon.health.alive
        assert len(alive) == BIG + 2
        for node in list(alive.nodes()):  # every state known: the most node_alive series there can be
            for domain in Domain:
                for family in Family:
                    alive.notify_check_success(node.node_id, domain, family, 0.02)
        text = await scrape_text(daemon)
        before = metric_samples(text)
        nodes = BIG + 2
        node_series = [k for k in before if k[0] == "honk_node_alive"]
        assert len(node_series) == nodes * STATES_PER_NODE
        assert len(before) <= nodes * STATES_PER_NODE + SERIES_OVERHEAD
        assert LINK_PASSWORD not in text

        for i in range(EXTRA_DIALS):  # distinct targets, each through node a (its server is closed)
            assert await socks_dial(daemon, f"t{i}.example", 1000 + i) != SOCKS_OK
        await poll(lambda: daemon.stats.dials[("tcp", "error", "dial")] == EXTRA_DIALS, "every dial counted")
        text = await scrape_text(daemon)
        after = metric_samples(text)
        assert set(after) == set(before)
        assert dial_errors(after, "tcp", "dial") == EXTRA_DIALS
        assert "t7.example" not in text and LINK_PASSWORD not in text


async def test_an_unretrieved_task_exception_is_logged_on_honks_logger_and_counted(tmp_path, caplog):
    closed = free_port()
    async with running_daemon(tmp_path, config(closed)) as daemon:

        async def fails() -> None:
            raise RuntimeError("a background task broke")

        task = asyncio.get_running_loop().create_task(fails(), name="doomed")
        await asyncio.wait([task])
        del task  # dropped unretrieved: asyncio reports it when the task is collected
        gc.collect()
        await poll(lambda: daemon.stats.loop_errors["RuntimeError"] == 1, "the loop guard's count")
        parsed = await scrape(daemon)
        assert at(parsed, "honk_loop_errors_total", exception="RuntimeError") == 1
    lines = [r for r in caplog.records if r.name == "honk.daemon" and "unhandled error" in r.getMessage()]
    assert len(lines) == 1 and "doomed" in lines[0].getMessage()
    assert lines[0].exc_info is not None and "a background task broke" in str(lines[0].exc_info[1])
