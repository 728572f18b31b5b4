"""A hundred reloads while fifty flows transfer: none is dropped, and nothing leaks (file
descriptors, tasks) or grows (resident memory within 5 %)."""

from __future__ import annotations

import asyncio
import gc

from helpers.apidaemon import running_daemon
from helpers.engines import poll
from helpers.reloading import Flow, open_fds, rss_bytes
from helpers.servers import EchoServer

from honk.daemon.app import Daemon

FLOWS = 50
RELOADS = 100
WARMUP_RELOADS = 10  # first applies import and cache; the baseline is taken after them
RSS_TOLERANCE = 0.05  # "RSS stable within 5 %"
CHUNK = b"x" * 4096
# seconds each flow rests between chunks: pacing the load (not synchronization), so fifty
# movers share the loop with the reloads instead of starving them
MOVE_PACE = 0.005


def config(with_extra: bool) -> str:
    nodes = "node {\n    extra: 'socks5://127.0.0.1:9'\n}\n" if with_extra else ""
    rules = "    dport(9) -> extra\n" if with_extra else ""
    return (
        "global {\n    data_dir: ./var\n    tcp_check_url: ''\n    check_interval: 3600s\n}\n"
        "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
        f"{nodes}routing {{\n{rules}    fallback: direct\n}}\n"
    )


class Movers:
    """Each flow echoes chunk after chunk; ``pause`` holds them all between chunks, so
    memory and tasks are counted with no transfer half-done."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.running.set()
        self.waiting = 0

    async def between_rounds(self) -> None:
        if not self.running.is_set():
            self.waiting += 1
            await self.running.wait()
            self.waiting -= 1

    async def pause(self) -> None:
        self.running.clear()
        await poll(lambda: self.waiting == FLOWS, "every mover to finish its chunk")


async def transfer(
    flow: Flow, movers: Movers, stop: asyncio.Event, rounds: list[int], failures: list[str]
) -> None:
    index = len(rounds)
    rounds.append(0)
    while not stop.is_set():
        await movers.between_rounds()
        if not await flow.echoes(CHUNK):
            failures.append(f"flow {index} stopped echoing after {rounds[index]} rounds")
            return
        rounds[index] += 1
        await asyncio.sleep(MOVE_PACE)


async def reload_as(daemon: Daemon, with_extra: bool) -> None:
    daemon.config_path.write_text(config(with_extra))
    report = await daemon.reload()
    assert ("outbound extra@v" in " ".join(report.built)) is with_extra
    assert "inbound lan" in report.reused


TEST_TASKS = ("transfer", "StreamReader.readexactly", "test_a_hundred_reloads_drop_no_flow_and_leak_nothing")


def settled_counts() -> tuple[int, int, int]:
    """Open fds, the daemon's tasks (the movers' own reads come and go), resident bytes."""
    gc.collect()
    daemon_tasks = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ not in TEST_TASKS]
    return open_fds(), len(daemon_tasks), rss_bytes()


async def test_a_hundred_reloads_drop_no_flow_and_leak_nothing(tmp_path):
    with EchoServer() as echo:
        async with running_daemon(tmp_path, config(False)) as daemon:
            port = daemon.inbounds["lan"].bound.port
            flows = [await Flow.open(port, echo.port) for _ in range(FLOWS)]
            stop, rounds, failures, gate = asyncio.Event(), [], [], Movers()
            movers = [asyncio.ensure_future(transfer(flow, gate, stop, rounds, failures)) for flow in flows]
            for i in range(WARMUP_RELOADS):
                await reload_as(daemon, i % 2 == 0)
            await gate.pause()
            fds, tasks, rss = settled_counts()
            gate.running.set()
            before = list(rounds)
            for i in range(RELOADS):
                await reload_as(daemon, i % 2 == 0)
            await poll(
                lambda: all(now > then + 1 for now, then in zip(rounds, before, strict=True)),
                "every flow to move again after the last reload",
            )
            await gate.pause()
            after_fds, after_tasks, after_rss = settled_counts()
            stop.set()
            gate.running.set()
            await asyncio.gather(*movers)
            print(
                f"\nsoak: fds {fds} -> {after_fds}, daemon tasks {tasks} -> {after_tasks}, "
                f"RSS {rss / 2**20:.1f} -> {after_rss / 2**20:.1f} MiB ({(after_rss - rss) / rss:+.1%})"
            )
            assert failures == []
            assert len(daemon.tracker) == FLOWS  # all still open
            assert after_fds == fds, f"file descriptors {fds} -> {after_fds}"
            assert after_tasks == tasks, f"tasks {tasks} -> {after_tasks}"
            assert abs(after_rss - rss) <= RSS_TOLERANCE * rss, f"RSS {rss} -> {after_rss}"
            assert daemon.applier.running.versions["extra"] == (WARMUP_RELOADS + RELOADS) // 2
            for flow in flows:
                await flow.close()
