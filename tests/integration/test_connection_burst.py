"""A connection burst through a Trojan/TLS node against a real v2ray server, with honk started
under ``ulimit -n 1024``: every client gets an answer (a success or a clean refusal), the API keeps
answering within a second during and after the burst, honk's descriptors come back to their
baseline within the half-close timeout, and a bulk transfer through the same node works right
after. honk runs as a real process; the burst is the relay benchmark's rate cycle (SOCKS5
CONNECT, 100 bytes each way, close), 5,000 connections at concurrency 64, twice."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.aio import close_writer, socks5_open
from helpers.burst import burst, echo_once
from helpers.peerservers import v2ray_server
from helpers.proc import HonkProcess, LoggedProcess
from helpers.servers import EchoServer

NOFILE = 1024  # `ulimit -n 1024`: soft and hard
# a limit whose flow share (half of it: the reserve is capped at half a small limit) cannot hold
# 64 flows, so the burst meets the descriptor budget and part of it is refused, cleanly
TIGHT_NOFILE = 200
CONNECTIONS = 5_000
CONCURRENCY = 64
BURSTS = 2
API_ANSWER = 1.0  # seconds the API may take to answer, during and after the burst
API_POLL = 0.1  # seconds between the API checks of the watcher thread
HALF_CLOSE = 3.0  # the config's half_close_timeout (seconds)
FD_SLACK = 8  # descriptors above the baseline still "back" (a probe, a pooled pipe pair or two)
STEP = 30.0  # seconds: the most any one wait may take (a burst itself is timed by its clients)
BULK = 16 * 1024 * 1024  # bytes echoed through the node after the bursts
SECRET = "s3cret"


def config(tmp_path: Path, link: str) -> str:
    return f"""global {{
    data_dir: {tmp_path / "var"}
    tcp_check_url: ''
    udp_check_dns: ''
    check_interval: 3600s
    preconnect_node_count: 0
    half_close_timeout: {HALF_CLOSE:g}s
    log_level: info
}}
inbound {{
    lan: 'mixed://127.0.0.1:0'
}}
node {{
    trojan: '{link}'
}}
routing {{
    fallback: trojan
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{SECRET}'
    }}
}}
"""


class ApiWatch:
    """A thread asking the API for /version every API_POLL seconds; the slowest answer it got,
    every failure (a timeout or an error) it saw, and the most descriptors honk held meanwhile."""

    def __init__(self, base: str, process: LoggedProcess) -> None:
        self.base = base
        self.process = process
        self.peak_fds = 0
        self.slowest = 0.0
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        request = urllib.request.Request(
            f"{self.base}/version", headers={"Authorization": f"Bearer {SECRET}"}
        )
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=API_ANSWER * 5) as response:
                    response.read()
                    if response.status != 200:
                        self.failures.append(f"status {response.status}")
            except OSError as exc:
                self.failures.append(repr(exc))
            took = time.monotonic() - started
            self.slowest = max(self.slowest, took)
            self.answers += 1
            self.peak_fds = max(self.peak_fds, self.process.open_fds())
            self._stop.wait(API_POLL)

    def __enter__(self) -> ApiWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(STEP)


async def bulk_echo(port: int, target: tuple[str, int]) -> bool:
    """BULK random bytes through honk to an echo server and back, intact."""
    reader, writer, code, _tail = await socks5_open(port, *target)
    if code != 0:
        return False
    data = os.urandom(BULK)

    async def send() -> None:
        writer.write(data)
        await writer.drain()

    sender = asyncio.ensure_future(send())
    received = await asyncio.wait_for(reader.readexactly(BULK), STEP)
    await sender
    await close_writer(writer)
    return hashlib.sha256(received).digest() == hashlib.sha256(data).digest()


async def fds_back(process: LoggedProcess, baseline: int) -> int:
    deadline = time.monotonic() + HALF_CLOSE + STEP
    while (count := process.open_fds()) > baseline + FD_SLACK and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return count


@pytest.mark.parametrize("nofile", [NOFILE, TIGHT_NOFILE])
async def test_a_burst_through_a_tls_node_answers_every_client_and_leaves_honk_serving(tmp_path, nofile):
    with EchoServer() as echo, v2ray_server("trojan") as peer:
        conf = tmp_path / "honk.dae"
        conf.write_text(config(tmp_path, peer.share_link()))
        with HonkProcess(conf, env={"SSL_CERT_FILE": str(peer.ca_path)}, nofile=nofile) as honk:
            host, port = honk.inbound()
            api_host, api_port = honk.bound("api")
            api_base = f"http://{api_host}:{api_port}"
            await asyncio.to_thread(api_version, api_base)  # the web stack loads at the first request
            async with echo_once() as origin:
                warm = await burst((host, port), ("127.0.0.1", origin.port), 10, 1)
                assert warm.outcomes["ok"] == 10, warm
                await fds_back(honk, honk.open_fds())
                baseline = honk.open_fds()
                with ApiWatch(api_base, honk) as api:
                    results = []
                    for _ in range(BURSTS):
                        results.append(
                            await burst((host, port), ("127.0.0.1", origin.port), CONNECTIONS, CONCURRENCY)
                        )
                    after_burst = await fds_back(honk, baseline)
                for result in results:
                    assert result.total == CONNECTIONS
                    assert result.outcomes["unanswered"] == 0 and result.outcomes["broken"] == 0, result
                    assert set(result.codes) <= {0x01}, result  # a refusal is the clean general failure
                    assert result.outcomes["ok"] > 0, result
                if nofile == TIGHT_NOFILE:
                    assert sum(r.outcomes["refused"] for r in results) > 0  # the budget was met
                    assert any("descriptor budget spent" in line for line in honk.lines)
                assert api.failures == [] and api.answers > 0
                assert api.slowest < API_ANSWER, f"the API took {api.slowest:.2f}s"
                assert api.peak_fds <= nofile
                assert after_burst <= baseline + FD_SLACK, (after_burst, baseline)
            assert await bulk_echo(port, ("127.0.0.1", echo.port)), "\n".join(honk.lines[-30:])
            assert not [line for line in honk.lines if "unhandled error in the event loop" in line]
            rates = ", ".join(f"{r.rate:,.0f} conn/s ({dict(r.outcomes)})" for r in results)
            print(
                f"\nburst through Trojan/TLS under nofile={nofile}: {rates}; API slowest "
                f"{api.slowest * 1000:.0f} ms; fds {baseline} -> peak {api.peak_fds} -> {after_burst}"
            )


def api_version(base: str) -> None:
    request = urllib.request.Request(f"{base}/version", headers={"Authorization": f"Bearer {SECRET}"})
    with urllib.request.urlopen(request, timeout=STEP) as response:
        assert response.status == 200
