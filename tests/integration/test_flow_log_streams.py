"""Connection logs against a real ``honk run`` at ``log_level: info``: every flow (SOCKS5
CONNECT, HTTP CONNECT, a SOCKS5 UDP association) has a ``[TCP]``/``[UDP]`` line in mihomo's
shape on the Clash ``/logs`` stream and a ``flow opened`` line on stderr; a ``level=debug``
reader (Clash or native) gets debug lines while the daemon's stderr stays at info."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from helpers.proc import HonkProcess
from helpers.servers import EchoServer
from helpers.socks import socks5_connect, socks5_udp_exchange

SECRET = "flow-log-secret"
STEP = 10.0  # seconds: the most one expected line may take to arrive
DEBUG_LINE = re.compile(r"^\S+ DEBUG ")  # a stderr line at debug (honk's `<time> <LEVEL> <logger> …`)


def config(data_dir: str, direct_port: int) -> str:
    return f"""global {{
    log_level: info
    data_dir: {data_dir}
    tcp_check_url: ''
    check_interval: 3600s
    preconnect_node_count: 0
}}
inbound {{
    lan: 'mixed://127.0.0.1:0'
}}
group {{
    Proxy {{
        policy: select
        filter: name(direct)
        default: direct
    }}
}}
routing {{
    dport({direct_port}) -> direct
    fallback: Proxy
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{SECRET}'
    }}
}}
"""


class UdpEcho:
    """A UDP server on 127.0.0.1 that sends every datagram back."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data, peer = self.sock.recvfrom(65535)
                self.sock.sendto(data, peer)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[tuple[EchoServer, EchoServer, UdpEcho]]:
    ruled, fallback, udp = EchoServer(), EchoServer(), UdpEcho()
    try:
        yield ruled, fallback, udp
    finally:
        ruled.close()
        fallback.close()
        udp.close()


@pytest.fixture
def honk(tmp_path, servers) -> Iterator[HonkProcess]:
    cfg = tmp_path / "honk.dae"
    cfg.write_text(config(str(tmp_path / "var"), servers[0].port))
    with HonkProcess(cfg) as process:
        process.wait_for(r"honk ready ")
        yield process


@contextlib.asynccontextmanager
async def api(honk: HonkProcess) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    host, port = honk.bound("api")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        yield http, f"http://{host}:{port}"


async def next_json(resp: aiohttp.ClientResponse) -> dict:
    line = await asyncio.wait_for(resp.content.readline(), STEP)
    assert line.endswith(b"\n"), line
    return json.loads(line)


async def frame_matching(read, pattern: str, key: str) -> dict:  # noqa: ANN001 - an async () -> dict
    """The first frame whose ``key`` matches ``pattern`` (frames before it are skipped)."""
    rx = re.compile(pattern)
    while True:
        frame = await read()
        if rx.search(frame.get(key, "")):
            return frame


def http_connect(proxy: tuple[str, int], port: int) -> None:
    """An HTTP CONNECT tunnel through the mixed port to 127.0.0.1:``port``, one echo round."""
    with socket.create_connection(proxy, timeout=STEP) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"


def socks_connect(proxy: tuple[str, int], port: int) -> None:
    sock, rep = socks5_connect(proxy, "127.0.0.1", port)
    with sock:
        assert rep == 0
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"


async def test_every_flow_has_a_mihomo_line_on_clash_logs_and_a_flow_opened_line_on_stderr(honk, servers):
    ruled, fallback, udp = servers
    proxy = honk.inbound("lan")
    async with (
        api(honk) as (http, base),
        http.get(f"{base}/logs", params={"level": "info"}) as chunked,
        http.ws_connect(f"{base}/logs", params={"level": "info"}) as ws,
    ):
        assert chunked.status == 200  # the reader is subscribed once its headers are out

        async def ws_frame() -> dict:
            msg = await asyncio.wait_for(ws.receive(), STEP)
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            return json.loads(msg.data)

        await asyncio.to_thread(socks_connect, proxy, ruled.port)  # the SOCKS5 (fast) path
        await asyncio.to_thread(http_connect, proxy, fallback.port)  # the asyncio dispatcher's relay
        reply = await asyncio.to_thread(socks5_udp_exchange, proxy, ("127.0.0.1", udp.port), b"dgram")
        assert reply[-5:] == b"dgram"
        source = r"127\.0\.0\.1:\d+"
        expected = [
            rf"^\[TCP\] {source} --> 127\.0\.0\.1:{ruled.port} match DstPort\({ruled.port}\) using DIRECT$",
            rf"^\[TCP\] {source} --> 127\.0\.0\.1:{fallback.port} match Match using Proxy\[DIRECT\]$",
            rf"^\[UDP\] {source} --> 127\.0\.0\.1:{udp.port} match Match using Proxy\[DIRECT\]$",
        ]
        for pattern in expected:
            for read in (lambda: next_json(chunked), ws_frame):
                frame = await frame_matching(read, pattern, "payload")
                assert frame["type"] == "info"

    honk.wait_for(
        rf"INFO honk\.connection flow opened network=tcp inbound=lan source={source} "
        rf"target=127\.0\.0\.1:{ruled.port} rule=dport\({ruled.port}\) chain=direct$",
        STEP,
    )
    honk.wait_for(
        rf"flow opened network=tcp inbound=lan source={source} target=127\.0\.0\.1:{fallback.port} "
        r"rule=fallback chain=Proxy>direct$",
        STEP,
    )
    honk.wait_for(
        rf"flow opened network=udp inbound=lan source={source} target=127\.0\.0\.1:{udp.port} "
        r"rule=fallback chain=Proxy>direct$",
        STEP,
    )
    assert not [line for line in honk.lines if "[TCP]" in line or "[UDP]" in line]


async def test_a_debug_reader_gets_debug_lines_while_stderr_stays_at_info(honk, servers):
    ignored = r"PATCH /configs ignored keys honk does not apply: bogus"
    async with api(honk) as (http, base):
        async with (
            http.get(f"{base}/logs", params={"level": "debug"}) as clash,
            http.get(f"{base}/v1/logs", params={"level": "debug"}) as native,
        ):
            assert clash.status == 200 and native.status == 200
            async with http.patch(f"{base}/configs", json={"bogus": 1}) as resp:
                assert resp.status == 204
            frame = await frame_matching(lambda: next_json(clash), ignored, "payload")
            assert frame["type"] == "debug"
            line = await frame_matching(lambda: next_json(native), ignored, "message")
            assert (line["level"], line["logger"]) == ("debug", "honk.api.clash")
            async with http.get(f"{base}/configs") as resp:
                assert (await resp.json())["log-level"] == "info"  # the daemon's, not the reader's
        # the readers are gone: a debug line reaches nobody, and stderr never had one
        async with http.get(f"{base}/logs", params={"level": "info"}) as info:
            assert info.status == 200
            async with http.patch(f"{base}/configs", json={"bogus": 2}) as resp:
                assert resp.status == 204
            await asyncio.to_thread(socks_connect, honk.inbound("lan"), servers[0].port)
            frame = await frame_matching(lambda: next_json(info), r"^\[TCP\] ", "payload")
            assert frame["type"] == "info"
    honk.wait_for(r"INFO honk\.connection flow opened network=tcp ", STEP)
    assert not [line for line in honk.lines if DEBUG_LINE.search(line)]
