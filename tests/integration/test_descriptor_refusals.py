"""A spent descriptor budget refuses new flows at once and cleanly (SOCKS5 0x01 on the engine's
fast path and on asyncio, HTTP 503), counts them, and charges no node; flows are admitted again
as soon as descriptors are free. The budget's count of open descriptors is the one thing the
test sets (``/proc/self/fd`` of this test process is not the daemon's to spend), and the budget's
clock, so that when it counts again is not left to the test's pace."""

from __future__ import annotations

import asyncio

import aiohttp
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import api_base, api_block, bearer, metric_samples, quiet_global, running_daemon
from helpers.chaos import chaos_node
from helpers.servers import EchoServer

from honk.connection.descriptors import RECOUNT_INTERVAL, DescriptorBudget
from honk.core.clock import FakeClock

STEP = 5.0  # seconds: the most one answer may take; a refusal must come at once, far below
SECRET = "s3cret"
LIMIT = 1024
RESERVE = 256


class OpenCount:
    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def config(tmp_path, link: str) -> str:  # noqa: ANN001
    return (
        quiet_global(tmp_path / "var")
        + f"""inbound {{
    lan: 'mixed://127.0.0.1:0'
    users: 'mixed://bob:builder@127.0.0.1:0'
}}
node {{
    n1: '{link}'
}}
routing {{
    fallback: n1
}}
"""
        + api_block(SECRET)
    )


async def http_connect(port: int, target: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
    finally:
        await close_writer(writer)


async def test_a_spent_budget_refuses_at_once_charges_no_node_and_recovers(tmp_path):
    with EchoServer() as echo:
        async with chaos_node("n1") as node, running_daemon(tmp_path, config(tmp_path, node.link)) as daemon:
            count = OpenCount(LIMIT)  # every descriptor in use
            budget_clock = FakeClock()  # when the budget may count again is the test's to say
            daemon.dispatcher.descriptors = DescriptorBudget(
                budget_clock, limit=LIMIT, reserve=RESERVE, counter=count, stats=daemon.stats
            )
            lan, users = daemon.inbounds["lan"].bound.port, daemon.inbounds["users"].bound.port
            target = ("127.0.0.1", echo.port)

            accepted = node.stats.accepted  # (the start's UDP probe may have reached it)
            dials = daemon.stats.outbounds.get("n1")
            started = asyncio.get_running_loop().time()
            _r, writer, code, _tail = await socks5_open(lan, *target)  # the relay engine's fast path
            await close_writer(writer)
            assert code == 0x01
            _r, writer, code, _tail = await socks5_open(users, *target, auth=("bob", "builder"))  # asyncio
            await close_writer(writer)
            assert code == 0x01
            head = await http_connect(lan, f"127.0.0.1:{echo.port}")
            assert head.startswith(b"HTTP/1.1 503"), head
            assert asyncio.get_running_loop().time() - started < STEP / 2  # refused at once, not timed out

            assert node.stats.accepted == accepted  # nothing was dialled
            assert daemon.stats.outbounds.get("n1") == dials  # no dial counted against the node
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{api_base(daemon)}/metrics", headers=bearer(SECRET)) as response:
                    samples = metric_samples(await response.text())
            assert samples[("honk_descriptor_refusals_total", frozenset())] == 3
            assert samples[("honk_process_max_fds", frozenset())] > 0

            count.value = 100  # the burst is over
            budget_clock.advance(RECOUNT_INTERVAL)
            reader, writer, code, _tail = await socks5_open(lan, *target)
            try:
                assert code == 0
                writer.write(b"ping")
                assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"ping"
            finally:
                await close_writer(writer)
            assert node.stats.succeeded == 1
