"""The control API at router scale: what a dashboard's reads cost honk's event loop and its data path.

    .venv/bin/python -m benchmarks.api [--quick] [--profile]

One honk daemon runs in a subprocess (this module with ``--serve``): 2,000 SOCKS5 nodes on
closed ports, a Selector and a URLTest group over all of them, routing fallback direct, the
Clash/native API on a loopback port behind a secret, nothing probed (no check URL, check
interval one hour). Before anything is measured every node gets a health history: ten TCP
probe successes and a few delay tests against two URLs, so ``GET /proxies`` carries full
``history`` and ``extra`` for every leaf.

* endpoints: ``GET /proxies``, ``/providers/proxies``, ``/metrics``, ``/v1/nodes`` and
  ``/v1/groups`` from an aiohttp client in this process, one request at a time. Two figures
  per request: the response time the client sees (median and p99), and the daemon's worst
  event-loop stall while it was served: inside the daemon a timer wakes every millisecond and
  records how late it woke; the largest lateness during one request is the time no flow could
  move. The target is on ``/proxies``: its worst stall at 2,000 nodes.
* data path: a 64-byte echo through honk's mixed inbound (HTTP CONNECT to a loopback echo
  server, blocking sockets in this process), paced one round trip every 5 ms so the run spans
  several dashboard polls; (a) with the API idle, (b) while a dashboard (a third process) polls
  ``GET /proxies`` once a second and holds the /traffic, /memory, /connections and /logs
  WebSocket streams open. Two figures each: round trips on one established tunnel, and new
  tunnels (connect, CONNECT, one echo, close; paced every 25 ms). The ratios (b)/(a) of p50
  and p99 are reference figures. An established tunnel is relayed by the native engine's
  worker thread when honk's extensions are built (the row names the engine), so a loop stall
  reaches it only through the Python relay; new tunnels are accepted, parsed, routed and
  dialled on the loop. ``HONK_RELAY=copy`` in the environment (the daemon inherits it) puts
  the established tunnel on the Python relay.

The stall timer runs only while the endpoints are measured; it is off for the echo runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import math
import os
import pstats
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

STALL_TARGET_MS = 100.0  # "worst loop stall of GET /proxies at 2,000 nodes <= 100 ms"
NODES = 2000  # the router scale ("the label sets stay bounded with 2,000 nodes")
SECRET = "s"
FIRST_NODE_PORT = (
    20000  # node i names 127.0.0.1:FIRST_NODE_PORT+i: below the ephemeral range, nothing listens
)
PROBES_PER_NODE = 10  # TCP probe successes seeded per node: mihomo shows the last 10 tests
DELAY_URLS = ("https://www.gstatic.com/generate_204", "https://cp.cloudflare.com/generate_204")
DELAY_TESTS_PER_URL = 2  # delay tests seeded per node and URL: the `extra` map has two URLs
BASE_RTT = 0.040  # seconds: the seeded samples spread from here ...
RTT_SPREAD = 0.200  # ... over this range, by node and sample, so no two nodes rank alike
ENDPOINTS = ("/proxies", "/providers/proxies", "/metrics", "/v1/nodes", "/v1/groups")
TARGET_ENDPOINT = "/proxies"
STREAMS = ("/traffic", "/memory", "/connections", "/logs")
REQUESTS = 50  # timed requests per endpoint
QUICK_REQUESTS = 10
ROUND_TRIPS = 1000  # echo round trips per data-path run
QUICK_ROUND_TRIPS = 200
WARMUP_ROUND_TRIPS = 50  # untimed, once, before the first data-path run
ECHO_BYTES = 64
PACE = 0.005  # seconds between round trips: 1,000 of them span ~5 dashboard polls
TUNNELS = 200  # new tunnels per data-path run
QUICK_TUNNELS = 40
TUNNEL_PACE = 0.025  # seconds between new tunnels: 200 of them span ~5 dashboard polls
POLL_INTERVAL = 1.0  # seconds between the dashboard's GET /proxies (metacubexd's refresh)
TICK = 0.001  # seconds: the stall timer's period
START_TIMEOUT = 120.0  # seconds for the daemon to start, seed and report ready
READY_TIMEOUT = 30.0  # seconds for the dashboard to have its streams open and one poll done
REPLY_TIMEOUT = 30.0  # seconds for any one answer on a control pipe
PROFILE_CALLS = 5  # /proxies builds profiled in --profile
PROFILE_LINES = 30

ROOT = Path(__file__).resolve().parent.parent


# --- pure helpers ------------------------------------------------------------------------------


def config_text(
    nodes: int, data_dir: str | os.PathLike, secret: str = SECRET, first_port: int = FIRST_NODE_PORT
) -> str:
    """The .dae config: ``nodes`` SOCKS5 nodes, a Selector and a URLTest group over all of
    them (a group without a filter takes every node), routing fallback direct, nothing probed,
    the API on a free loopback port."""
    lines = "".join(f"    n{i}: 'socks5://127.0.0.1:{first_port + i}'\n" for i in range(nodes))
    return f"""global {{
    data_dir: '{data_dir}'
    log_level: warn
    tcp_check_url: ''
    check_interval: 3600s
}}
inbound {{
    lan: 'mixed://127.0.0.1:0'
}}
node {{
{lines}}}
group {{
    select {{
        policy: selector
    }}
    fastest {{
        policy: min_moving_avg
    }}
}}
routing {{
    fallback: direct
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{secret}'
    }}
}}
"""


def seeded_rtt(node: int, sample: int) -> float:
    """The seeded sample ``sample`` of node ``node``, in seconds: spread, repeatable."""
    return BASE_RTT + RTT_SPREAD * (((node * 7919 + sample * 104729) % 1000) / 1000)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): an observed sample, the maximum for q=100."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def parse_kv(line: str) -> dict[str, str]:
    """``word key=value key=value`` -> {key: value}; bare words are dropped."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def ratio_text(after: float, before: float) -> str:
    return f"x{after / before:.2f}" if before > 0 else "n/a"


def size_text(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


@dataclass
class EndpointFigures:
    path: str
    times_ms: list[float]  # response time per request, as the client saw it
    stalls_ms: list[float]  # the daemon's worst loop stall per request
    size: int  # body bytes of the last answer


@dataclass
class Samples:
    """Times in µs."""

    us: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.us)

    @property
    def p99(self) -> float:
        return percentile(self.us, 99)

    def text(self) -> str:
        return f"p50 {us_text(self.p50)}, p99 {us_text(self.p99)}, max {us_text(max(self.us))}"


def us_text(us: float) -> str:
    return f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.1f} ms"


@dataclass
class PathFigures:
    """One data-path run: round trips on the established tunnel, and new tunnels."""

    echo: Samples
    setup: Samples


@dataclass
class Figures:
    nodes: int
    endpoints: list[EndpointFigures]
    idle: PathFigures
    busy: PathFigures
    engine: str = "?"  # the relay engine of the established tunnel
    dashboard: dict[str, object] = field(default_factory=dict)


def rows(figures: Figures) -> list[tuple[str, str, str, str]]:
    """Rows (what, honk, target, status) for the benchmark table."""
    out = []
    for e in figures.endpoints:
        honk = (
            f"median {statistics.median(e.times_ms):.1f} ms, p99 {percentile(e.times_ms, 99):.1f} ms; "
            f"stall median {statistics.median(e.stalls_ms):.1f} ms, worst {max(e.stalls_ms):.1f} ms"
        )
        what = f"GET {e.path} ({figures.nodes} nodes, {size_text(e.size)}, {len(e.times_ms)} requests)"
        if e.path == TARGET_ENDPOINT:
            worst = max(e.stalls_ms)
            out.append(
                (
                    what,
                    honk,
                    f"worst stall <= {STALL_TARGET_MS:.0f} ms",
                    "met" if worst <= STALL_TARGET_MS else "NOT met",
                )
            )
        else:
            out.append((what, honk, "", "reference"))
    idle, busy = figures.idle, figures.busy
    kinds = (
        (f"echo {ECHO_BYTES} B, one tunnel ({figures.engine} relay)", "echo", len(idle.echo.us)),
        (f"new tunnel (CONNECT + {ECHO_BYTES} B echo)", "setup", len(idle.setup.us)),
    )
    for label, key, count in kinds:
        a, b = getattr(idle, key), getattr(busy, key)
        out.append((f"{label}, API idle ({count})", a.text(), "", "reference"))
        out.append((f"{label}, dashboard polling ({count})", b.text(), "", "reference"))
        out.append(
            (
                "  ratio dashboard/idle",
                f"p50 {ratio_text(b.p50, a.p50)}, p99 {ratio_text(b.p99, a.p99)}",
                "",
                "reference",
            )
        )
    d = figures.dashboard
    if d:
        frames = ", ".join(f"{path.lstrip('/')} {n}" for path, n in dict(d.get("frames", {})).items())
        out.append(
            (
                "  dashboard during (b)",
                f"{d.get('polls', 0)} polls of /proxies "
                f"(median {float(d.get('poll_ms', 0.0)):.0f} ms); frames: {frames}",
                "",
                "errors: " + str(d.get("errors", 0)),
            )
        )
    return out


# --- the daemon side (--serve) -----------------------------------------------------------------


def seed_health(daemon) -> int:  # noqa: ANN001 - honk.daemon.app.Daemon
    """Every node's history: probe successes (recorded whatever the registration grace) and
    delay tests against two URLs. The number of nodes seeded."""
    from honk.alive.outcome import Domain, Family

    alive = daemon.health.alive
    nodes = sorted(alive.nodes(), key=lambda n: n.name)
    for index, node in enumerate(nodes):
        for sample in range(PROBES_PER_NODE):
            alive.notify_check_success(node.node_id, Domain.TCP, Family.V4, seeded_rtt(index, sample))
        for u, url in enumerate(DELAY_URLS):
            for t in range(DELAY_TESTS_PER_URL):
                alive.record_delay_test(node.node_id, Family.V4, seeded_rtt(index, 100 + u * 10 + t), url)
    return len(nodes)


class StallMonitor:
    """A timer that wakes every TICK and keeps the worst lateness since the last read."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.ticked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            before = clock()
            await asyncio.sleep(TICK)
            late = clock() - before - TICK
            if late > self.worst:
                self.worst = late
            self.ticked.set()

    async def read(self) -> float:
        """The worst lateness (s) since the last read, once a fresh tick has recorded any
        stall that ended just before this call; then start over."""
        self.ticked.clear()
        await self.ticked.wait()
        worst, self.worst = self.worst, 0.0
        return worst


async def _wait_idle_runner(daemon, timeout: float) -> None:  # noqa: ANN001
    """The first periodic cycle (raw TCP checks of closed ports) runs at start; let it end."""
    runner = daemon.health.runner
    deadline = time.monotonic() + timeout
    while runner is not None and (runner.cycles == 0 or runner.in_flight or runner.queued):
        if time.monotonic() > deadline:
            raise TimeoutError("the first health cycle did not end")
        await asyncio.sleep(0.05)


async def serve(config: Path) -> None:
    """Run the daemon; answer ``read`` (worst stall since the last read, ms), ``watch``,
    ``unwatch`` and ``quit`` on stdin, one line each, on stdout."""
    from honk.daemon.app import Daemon

    daemon = Daemon(config)
    await daemon.start()
    try:
        await _wait_idle_runner(daemon, START_TIMEOUT / 2)
        seeded = seed_health(daemon)
        assert daemon.api is not None and daemon.api.bound is not None, "the config enables the API"
        host, port = daemon.api.bound
        members = {name: len(daemon.plane.groups.members(name)) for name in ("select", "fastest")}
        loop = asyncio.get_running_loop()
        commands = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
        monitor = StallMonitor()
        print(
            f"ready api={host}:{port} lan={daemon.inbounds['lan'].bound.port} seeded={seeded} "
            f"select={members['select']} fastest={members['fastest']}",
            flush=True,
        )
        while line := (await commands.readline()).decode().strip():
            if line == "watch":
                monitor.start()
                await monitor.read()
                print("ok", flush=True)
            elif line == "read":
                print(f"stall ms={await monitor.read() * 1000:.3f}", flush=True)
            elif line == "unwatch":
                await monitor.stop()
                print("ok", flush=True)
            elif line == "quit":
                break
        await monitor.stop()
    finally:
        await daemon.shutdown(0.0)


# --- the dashboard (--dashboard) ---------------------------------------------------------------


async def dashboard(base: str, secret: str) -> None:
    """Poll GET /proxies every POLL_INTERVAL and hold the four streams open, as a dashboard tab
    does; print ``ready`` once every stream is open and one poll is done, and a JSON summary
    when stdin closes."""
    import aiohttp

    frames = {path: 0 for path in STREAMS}
    polls: list[float] = []
    errors = 0
    opened: set[str] = set()
    ready = asyncio.Event()

    def check_ready() -> None:
        if polls and opened == set(STREAMS) and all(frames[p] for p in STREAMS if p != "/logs"):
            ready.set()  # /logs speaks only when something is logged

    async def stream(session: aiohttp.ClientSession, path: str) -> None:
        nonlocal errors
        level = "?level=info&" if path == "/logs" else "?"
        async with session.ws_connect(f"{base}{path}{level}token={secret}") as ws:
            opened.add(path)
            check_ready()
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    json.loads(message.data)
                    frames[path] += 1
                    check_ready()
                else:
                    errors += 1
                    break

    async def poll(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        headers = {"Authorization": f"Bearer {secret}"}
        next_at = time.monotonic()
        while True:
            started = time.monotonic()
            async with session.get(f"{base}/proxies", headers=headers) as response:
                body = await response.read()
                if response.status != 200:
                    errors += 1
            json.loads(body)  # the dashboard's own work, in its own process
            polls.append((time.monotonic() - started) * 1000)
            check_ready()
            next_at += POLL_INTERVAL
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.ensure_future(stream(session, p)) for p in STREAMS]
        tasks.append(asyncio.ensure_future(poll(session)))
        await asyncio.wait_for(ready.wait(), READY_TIMEOUT)
        print("ready", flush=True)
        counted_from = (len(polls), dict(frames))
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent's "stop"
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if task.done() and not task.cancelled() and task.exception() is not None:
                errors += 1
    during = polls[counted_from[0] :]
    print(
        json.dumps(
            {
                "polls": len(during),
                "poll_ms": statistics.median(during) if during else 0.0,
                "frames": {p: frames[p] - counted_from[1][p] for p in STREAMS},
                "errors": errors,
            }
        ),
        flush=True,
    )


# --- the measuring side ------------------------------------------------------------------------


class Child:
    """A subprocess of this module spoken to by lines on its stdin and stdout."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.api", *argv],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout: float = REPLY_TIMEOUT) -> str:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer from {self.proc.args[3:]} in {timeout:.0f} s") from None
        if got is None:
            raise RuntimeError(f"{self.proc.args[3:]} exited ({self.proc.wait()})")
        return got

    def ask(self, command: str, timeout: float = REPLY_TIMEOUT) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.line(timeout)

    def close(self, command: str = "quit", timeout: float = REPLY_TIMEOUT) -> None:
        """Ask the child to end (its ``finally`` runs), and make sure it did."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait(timeout)


async def endpoint_figures(daemon: Child, base: str, requests: int) -> list[EndpointFigures]:
    import aiohttp

    out = []
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        daemon.ask("watch")
        for path in ENDPOINTS:
            async with session.get(base + path) as response:  # warm-up: connection and caches
                if response.status != 200:
                    raise RuntimeError(f"GET {path}: {response.status} {await response.text()}")
                await response.read()
            daemon.ask("read")
            times, stalls, size = [], [], 0
            for _ in range(requests):
                started = time.perf_counter()
                async with session.get(base + path) as response:
                    body = await response.read()
                times.append((time.perf_counter() - started) * 1000)
                assert response.status == 200, (path, response.status)
                size = len(body)
                stalls.append(float(parse_kv(daemon.ask("read"))["ms"]))
            out.append(EndpointFigures(path, times, stalls, size))
        daemon.ask("unwatch")
    return out


def _echo(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)


def _echo_server(listener: socket.socket) -> None:
    """Echo every connection, each on its own thread, until the listener closes."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_echo, args=(conn,), daemon=True).start()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the tunnel closed")
        buf += chunk
    return bytes(buf)


def open_tunnel(lan_port: int, echo_port: int) -> socket.socket:
    """One HTTP CONNECT through honk's mixed inbound to the echo server."""
    sock = socket.create_connection(("127.0.0.1", lan_port), timeout=REPLY_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    target = f"127.0.0.1:{echo_port}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the mixed inbound closed the CONNECT")
        head += chunk
    status = head.split(b"\r\n", 1)[0]
    if status.split(b" ")[1:2] != [b"200"]:
        raise ConnectionError(f"CONNECT refused: {status!r}")
    return sock


PAYLOAD = bytes(range(ECHO_BYTES))


def _round_trip(sock: socket.socket) -> None:
    sock.sendall(PAYLOAD)
    if _recv_exactly(sock, ECHO_BYTES) != PAYLOAD:
        raise AssertionError("the echo came back changed")


def echo_run(sock: socket.socket, count: int, pace: float = PACE) -> Samples:
    clock = time.perf_counter
    rtts = []
    for _ in range(count):
        started = clock()
        _round_trip(sock)
        rtts.append((clock() - started) * 1e6)
        time.sleep(pace)
    return Samples(rtts)


def tunnel_run(lan_port: int, echo_port: int, count: int, pace: float = TUNNEL_PACE) -> Samples:
    """``count`` new tunnels, each timed from connect to its first echo back, then closed."""
    clock = time.perf_counter
    times = []
    for _ in range(count):
        started = clock()
        with open_tunnel(lan_port, echo_port) as sock:
            _round_trip(sock)
            times.append((clock() - started) * 1e6)
        time.sleep(pace)
    return Samples(times)


def tunnel_engine(base: str, echo_port: int) -> str:
    """The relay engine honk reports for the open flow to the echo server."""
    request = urllib.request.Request(base + "/v1/connections", headers={"Authorization": f"Bearer {SECRET}"})
    with urllib.request.urlopen(request, timeout=REPLY_TIMEOUT) as response:
        listed = json.loads(response.read())
    flows = listed["connections"] if isinstance(listed, dict) else listed
    engines = {f.get("engine") for f in flows if str(f.get("target", "")).endswith(f":{echo_port}")}
    return "/".join(sorted(str(e) for e in engines)) or "?"


def data_path(
    lan_port: int, base: str, quick: bool
) -> tuple[PathFigures, PathFigures, str, dict[str, object]]:
    round_trips = QUICK_ROUND_TRIPS if quick else ROUND_TRIPS
    tunnels = QUICK_TUNNELS if quick else TUNNELS
    with socket.create_server(("127.0.0.1", 0)) as listener:
        echo_port = listener.getsockname()[1]
        threading.Thread(target=_echo_server, args=(listener,), daemon=True).start()
        with open_tunnel(lan_port, echo_port) as sock:
            echo_run(sock, WARMUP_ROUND_TRIPS)
            engine = tunnel_engine(base, echo_port)
            idle = PathFigures(echo_run(sock, round_trips), tunnel_run(lan_port, echo_port, tunnels))
            board = Child(["--dashboard", base])
            try:
                ready = board.line(READY_TIMEOUT + 10)
                if ready != "ready":
                    raise RuntimeError(f"dashboard: {ready}")
                busy = PathFigures(echo_run(sock, round_trips), tunnel_run(lan_port, echo_port, tunnels))
                summary = json.loads(board.ask("stop"))
            finally:
                board.close("stop")
    return idle, busy, engine, summary


def measure(quick: bool = False, nodes: int = NODES) -> Figures:
    with tempfile.TemporaryDirectory(prefix="honk-bench-api-") as tmp:
        config = Path(tmp) / "honk.dae"
        config.write_text(config_text(nodes, Path(tmp) / "var"))
        daemon = Child(["--serve", str(config)])
        try:
            ready = parse_kv(daemon.line(START_TIMEOUT))
            if (
                int(ready["seeded"]) != nodes
                or int(ready["select"]) != nodes
                or int(ready["fastest"]) != nodes
            ):
                raise RuntimeError(f"the daemon came up with the wrong world: {ready}")
            base = f"http://{ready['api']}"
            endpoints = asyncio.run(endpoint_figures(daemon, base, QUICK_REQUESTS if quick else REQUESTS))
            idle, busy, engine, summary = data_path(int(ready["lan"]), base, quick)
        finally:
            daemon.close()
    return Figures(nodes, endpoints, idle, busy, engine, summary)


def run(quick: bool = False, nodes: int = NODES) -> list[tuple[str, str, str, str]]:
    """Rows (what, honk, target, status) for the benchmark table."""
    return rows(measure(quick, nodes))


# --- profiling (--profile) ---------------------------------------------------------------------


async def _profile(nodes: int, calls: int) -> None:
    """cProfile what GET /proxies does on the loop (the views and the JSON encoding), in
    this process, over the same seeded world."""
    from honk.api import clash_views
    from honk.api.jsonio import ENCODE_SLICE
    from honk.daemon.app import Daemon

    with tempfile.TemporaryDirectory(prefix="honk-bench-api-") as tmp:
        config = Path(tmp) / "honk.dae"
        config.write_text(config_text(nodes, Path(tmp) / "var"))
        daemon = Daemon(config)
        await daemon.start()
        try:
            await _wait_idle_runner(daemon, START_TIMEOUT / 2)
            seed_health(daemon)

            def body() -> str:  # get_proxies' work, as in honk.api.clash.routes, without the loop turns
                plane = daemon.plane
                ctx = clash_views.ProxyContext(
                    plane, daemon.health.alive, daemon.health.group_checks, daemon.mode.global_choice
                )
                return clash_views.proxies_json(ctx)

            body()
            built_ms = []
            for _ in range(calls):  # without the profiler first
                started = time.perf_counter()
                size = len(body())
                built_ms.append((time.perf_counter() - started) * 1000)
            print(
                f"--- GET /proxies body, {nodes} nodes, {size / 1e6:.2f} MB: built and encoded in a median "
                f"{statistics.median(built_ms):.1f} ms (of {calls}, no profiler; the server spreads it "
                f"over loop turns of {ENCODE_SLICE} objects)"
            )
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                body()
            profiler.disable()
            print(f"--- the same {calls} builds under cProfile")
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(PROFILE_LINES)
            stats.sort_stats("tottime").print_stats(PROFILE_LINES)
        finally:
            await daemon.shutdown(0.0)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REQUESTS} requests per endpoint, {QUICK_ROUND_TRIPS} echo round trips",
    )
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--profile", action="store_true", help="cProfile the GET /proxies views instead")
    parser.add_argument("--serve", metavar="CONFIG", help=argparse.SUPPRESS)  # the daemon subprocess
    parser.add_argument("--dashboard", metavar="BASE", help=argparse.SUPPRESS)  # the dashboard subprocess
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve)))
    elif args.dashboard:
        asyncio.run(dashboard(args.dashboard, SECRET))
    elif args.profile:
        asyncio.run(_profile(args.nodes, PROFILE_CALLS))
    else:
        for row in run(args.quick, args.nodes):
            print(" | ".join(row))


if __name__ == "__main__":
    main()
