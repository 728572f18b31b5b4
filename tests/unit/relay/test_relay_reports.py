"""Byte reports of a moving flow (issue 36), on the compiled engine and its twin, on asyncio and uvloop.

A flow that keeps moving bytes is told EV_BYTES at least every REPORT_INTERVAL, the first one
REPORT_INTERVAL after EV_OPEN, whatever the engine's other flows do (ones that went quiet with a
report owed, one that started later and copies); a flow that went quiet is told its bytes when its
own report falls due, not another flow's; and ``counters()`` is exact between reports:
the bytes a client has received are counted already. The upstream ends send at a steady rate
they pace themselves (load, not synchronization).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from dataclasses import dataclass, field

from helpers.engines import STEP, poll
from helpers.sockets import unix_pair

from honk._fast import relay_py

RATE = 256 * 1024  # bytes a second each moving flow's upstream sends
WRITE = 4 * 1024  # bytes per paced write
LOAD = 2.6  # seconds the upstreams send: two full report intervals and most of a third
LATER = 0.4  # seconds between the steady flow's OPEN and the next flow's (their reports fall due apart)
SLACK = 0.25  # seconds a report may come late on a loaded 2-core machine (the worker or the loop's turn)
DUE = relay_py.REPORT_INTERVAL + SLACK  # the longest a moving flow may go without a byte report


@dataclass
class Reports:
    """One flow's listener: when it opened and each EV_BYTES (engine time, bytes down)."""

    opened: float | None = None
    down: list[tuple[float, int]] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        if kind == relay_py.EV_OPEN:
            self.opened = t
        elif kind == relay_py.EV_BYTES:
            self.down.append((t, b))
        elif kind == relay_py.EV_END:
            self.ended.set()


@dataclass
class Flow:
    """One flow on the engine: the test's client and upstream ends, and what it was told."""

    id: int
    client: socket.socket
    upstream: socket.socket
    reports: Reports
    received: int = 0  # bytes the client end has read

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        while data := await loop.sock_recv(self.client, 1 << 16):
            self.received += len(data)


def open_flow(engine, *, copy: bool = False) -> Flow:  # noqa: ANN001 - either engine
    client, client_end = unix_pair()
    upstream_end, upstream = unix_pair()
    reports = Reports()
    flow_id = engine.add(client_end.detach(), upstream_end.detach(), reports, copy=copy)
    return Flow(flow_id, client, upstream, reports)


async def send_steadily(flow: Flow, seconds: float) -> float:
    """Send RATE bytes a second for ``seconds``; when the last write went out (time.monotonic)."""
    loop = asyncio.get_running_loop()
    chunk = b"x" * WRITE
    start, sent = time.monotonic(), 0
    while sent < RATE * seconds:
        await asyncio.sleep(max(0.0, start + sent / RATE - time.monotonic()))
        await loop.sock_sendall(flow.upstream, chunk)
        sent += WRITE
    return time.monotonic()


def check_cadence(flow: Flow, last_write: float) -> None:
    reports = flow.reports
    assert reports.opened is not None and reports.down, reports
    times = [reports.opened] + [t for t, _ in reports.down if t <= last_write] + [last_write]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    assert max(gaps) <= DUE, f"a moving flow went {max(gaps)}s without a byte report (gaps {gaps})"
    downs = [b for _, b in reports.down]
    assert downs == sorted(downs) and len(set(downs[:-1])) == len(downs[:-1]), downs


def check_quiet(flow: Flow) -> None:
    """A flow that moved WRITE bytes once was told them when its own report fell due."""
    reports = flow.reports
    assert [b for _, b in reports.down] == [WRITE], reports.down
    late = reports.down[0][0] - reports.opened
    assert late <= DUE, f"a report came {late:.3f}s after OPEN, due {relay_py.REPORT_INTERVAL}s after"


async def test_a_moving_flow_is_reported_every_interval_whatever_the_other_flows_do(engine):
    assert relay_py.REPORT_INTERVAL <= 1.0  # issue 36: counters current to within a second
    loop = asyncio.get_running_loop()
    flows: list[Flow] = []
    drains: list[asyncio.Future] = []

    def start(**kwargs: bool) -> Flow:
        flow = open_flow(engine, **kwargs)
        flows.append(flow)
        drains.append(asyncio.ensure_future(flow.drain()))
        return flow

    try:
        steady = start()
        await poll(lambda: steady.reports.opened is not None, "the steady flow's OPEN")
        await asyncio.sleep(LATER)  # scenario time: the next flow's report falls due after the steady one's
        idle = start()
        # the idle flow moves once: it owes the engine's first pending report, due after the steady flow's
        await loop.sock_sendall(idle.upstream, b"y" * WRITE)
        await poll(lambda: idle.received == WRITE, "the idle flow's one write")
        sending = asyncio.ensure_future(send_steadily(steady, LOAD))
        copying = start(copy=True)  # starts later still, and copies instead of splicing
        copy_done = await send_steadily(copying, LOAD - LATER)
        steady_done = await asyncio.wait_for(sending, STEP)
        check_cadence(steady, steady_done)
        check_cadence(copying, copy_done)
        check_quiet(idle)
    finally:
        for flow in flows:
            flow.upstream.close()
            flow.client.close()
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)


async def test_counters_are_exact_between_reports(engine):
    flow = open_flow(engine)
    drain = asyncio.ensure_future(flow.drain())
    loop = asyncio.get_running_loop()
    try:
        for n in range(1, 6):  # within the first report interval, mostly: only counters() can tell
            await loop.sock_sendall(flow.upstream, b"z" * WRITE)
            await poll(lambda n=n: flow.received == n * WRITE, f"write {n} at the client")
            counts = engine.counters(flow.id)
            assert counts is not None and counts[1] >= flow.received, (counts, flow.received)
    finally:
        flow.upstream.close()
        flow.client.close()
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)
    await asyncio.wait_for(flow.reports.ended.wait(), STEP)


async def test_a_quiet_flow_is_told_its_bytes_when_its_own_report_falls_due(engine):
    """Nothing else moves, so only the engine's report timer can tell them: a flow whose report
    is owed second but due first must not wait for the first one's due time."""
    loop = asyncio.get_running_loop()
    early = open_flow(engine)
    await poll(lambda: early.reports.opened is not None, "the early flow's OPEN")
    await asyncio.sleep(LATER)  # scenario time: the late flow's report falls due LATER after the early one's
    late = open_flow(engine)
    drains = [asyncio.ensure_future(f.drain()) for f in (early, late)]
    try:
        for flow in (late, early):  # the late flow owes its report first
            await loop.sock_sendall(flow.upstream, b"q" * WRITE)
            await poll(lambda flow=flow: flow.received == WRITE, "one write at the client")
        await poll(lambda: bool(late.reports.down), "the late flow's report")
        check_quiet(early)
        check_quiet(late)
    finally:
        for flow in (early, late):
            flow.upstream.close()
            flow.client.close()
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
