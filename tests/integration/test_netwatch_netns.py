"""NetworkWatcher against the real kernel: a veth pair in a private network namespace.

The watcher runs in a child process started with ``ip netns exec`` (the daemon
watches its own namespace), printing ``ready`` once started and one line per
``on_change`` call. Lines are read with bounded waits; "nothing happens" is a
bounded wait that must time out. Namespace tests need root and ``ip``: they skip
outside CI and fail under CI=true.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.peers import require

from honk.alive.netwatch import NetworkWatcher
from honk.core.clock import MonotonicClock

REPO = Path(__file__).resolve().parents[2]
SETTLE = 0.05  # seconds: small, so each step's line comes quickly
LINE_WAIT = 10.0  # seconds: bound on waiting for one expected line
QUIET = 1.5  # seconds without a line that count as "the burst is over" (linkwatch batches up to 1 s)

WATCHER = """
import asyncio, sys
from honk.alive.netwatch import NetworkWatcher
from honk.core.clock import MonotonicClock

async def main():
    watcher = NetworkWatcher(lambda reason: print(reason, flush=True), MonotonicClock(), settle=float(sys.argv[2]))
    await watcher.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    await watcher.stop()
    print("stopped", flush=True)

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""

# The health service's wiring (honk/control/health.py): the watcher calls HealthRunner.network_changed,
# which calls AliveDialerSet.notify_network_change. One node is dead deep in its cooldown; the prober
# answers every probe at once. A network change must prime it and its probe must revive it.
HEALTH = """
import asyncio, sys, uuid
from honk.alive.health import AliveDialerSet
from honk.alive.netwatch import NetworkWatcher
from honk.alive.outcome import Domain, Family, ProbeSample
from honk.alive.runner import HealthRunner
from honk.core.clock import MonotonicClock

class Instant:
    def families(self, node_id): return (Family.V4,)
    def udp_capable(self, node_id): return False
    async def probe_tcp(self, node_id, family): return ProbeSample(0.01)

async def main():
    clock = MonotonicClock()
    alive = AliveDialerSet(clock)
    node = uuid.uuid4()
    alive.register_node(node, "n")
    for _ in range(3):
        alive.notify_check_failure(node, Domain.TCP, Family.V4, force=True)
    state = alive.node(node).state(Domain.TCP, Family.V4)
    state.cooldown, state.due_at = 300.0, clock.now() + 300.0
    alive.subscribe(lambda nid, d, f, up: print("revived" if up else "died", flush=True))
    runner = HealthRunner(alive, Instant(), clock, check_interval=3600.0)
    watcher = NetworkWatcher(runner.network_changed, clock, settle=float(sys.argv[1]))
    await watcher.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await watcher.stop()
    await runner.stop()

asyncio.run(main())
"""


def _require_netns() -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "needs root (ip netns add)"
    elif shutil.which("ip") is None:
        problem = "needs iproute2's ip"
    if problem:
        require(False, problem)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns() -> Iterator[str]:
    """A namespace with lo up and a veth pair hkw0 (192.0.2.1/24, 2001:db8:1::1/64) <-> hkw1, both up.

    IPv6 DAD is off in it, so bringing a link up does not add a late address event a second later.
    """
    _require_netns()
    name = f"honk-nw-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", name)
    try:
        for conf in ("all", "default"):
            _ip("netns", "exec", name, "sh", "-c", f"echo 0 > /proc/sys/net/ipv6/conf/{conf}/accept_dad")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "hkw0", "type", "veth", "peer", "name", "hkw1")
        _ip("-n", name, "addr", "add", "192.0.2.1/24", "dev", "hkw0")
        _ip("-n", name, "addr", "add", "2001:db8:1::1/64", "dev", "hkw0", "nodad")
        _ip("-n", name, "link", "set", "hkw0", "up")
        _ip("-n", name, "link", "set", "hkw1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)


class Watcher:
    """The child process and a thread that queues its stdout lines."""

    def __init__(self, ns: str, loop: str, script: str = WATCHER) -> None:
        args = [loop, str(SETTLE)] if script is WATCHER else [str(SETTLE)]
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def next_line(self, wait: float = LINE_WAIT) -> str:
        try:
            return self.lines.get(timeout=wait)
        except queue.Empty:
            err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
            raise AssertionError(f"no line from the watcher within {wait} s; stderr: {err[-2000:]}") from None

    def settled(self) -> list[str]:
        """Every line until QUIET seconds pass without one (bounded by LINE_WAIT)."""
        extra: list[str] = []
        while len(extra) < 20:
            try:
                extra.append(self.lines.get(timeout=QUIET))
            except queue.Empty:
                return extra
        raise AssertionError(f"the watcher never settled: {extra}")

    def stop(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=LINE_WAIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=LINE_WAIT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def watcher_in(netns: str) -> Iterator:
    started: list[Watcher] = []

    def start(loop: str = "uvloop") -> Watcher:
        watcher = Watcher(netns, loop)
        started.append(watcher)
        assert watcher.next_line() == "ready"
        return watcher

    yield start
    for watcher in started:
        watcher.kill()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_link_down_then_up_is_reported_as_a_link_change_each_time(netns, watcher_in, loop):
    watcher = watcher_in(loop)
    _ip("-n", netns, "link", "set", "hkw0", "down")
    assert watcher.next_line() == "link"
    watcher.settled()  # late linkwatch/route events of the same flap
    _ip("-n", netns, "link", "set", "hkw0", "up")
    assert watcher.next_line() == "link"
    watcher.settled()
    assert watcher.stop() == 0
    assert watcher.next_line() == "stopped"


def test_same_link_state_and_non_main_routes_are_quiet_but_address_and_main_route_are_not(netns, watcher_in):
    watcher = watcher_in()
    # An MTU change repeats hkw0's state (known from the start-up dump); routes outside main do not count.
    _ip("-n", netns, "link", "set", "hkw0", "mtu", "1400")
    _ip("-n", netns, "route", "add", "198.51.100.0/24", "via", "192.0.2.2", "table", "100")
    _ip("-n", netns, "route", "add", "local", "203.0.113.7", "dev", "hkw0", "table", "local")
    assert watcher.settled() == []

    _ip("-n", netns, "route", "add", "198.51.100.0/24", "via", "192.0.2.2")
    assert watcher.next_line() == "route"
    assert watcher.settled() == []

    _ip("-n", netns, "addr", "add", "192.0.2.9/24", "dev", "hkw0")
    assert watcher.next_line() == "address"
    assert watcher.settled() == []

    _ip("-n", netns, "-6", "addr", "del", "2001:db8:1::1/64", "dev", "hkw0")
    assert watcher.next_line() == "address"
    watcher.settled()


def test_a_link_flap_reaches_notify_network_change_and_one_probe_revives_a_dead_node(netns):
    """Acceptance: a veth going down in the namespace calls notify_network_change through the
    runner; the dead state in a 300 s cooldown is probed at once and one success revives it."""
    child = Watcher(netns, "asyncio", script=HEALTH)
    try:
        assert child.next_line() == "ready"
        assert child.settled() == []  # nothing happens without a network change
        _ip("-n", netns, "link", "set", "hkw0", "down")
        assert child.next_line() == "revived"
        assert child.stop() == 0
    finally:
        child.kill()


def test_deleting_the_veth_is_a_link_change(netns, watcher_in):
    watcher = watcher_in()
    _ip("-n", netns, "link", "del", "hkw0")
    assert watcher.next_line() == "link"


async def test_start_dumps_a_baseline_and_stop_is_idempotent_in_the_current_namespace():
    """Subscribing needs no privilege; the baseline dump fills in the loopback link (ifindex 1)."""
    watcher = NetworkWatcher(lambda reason: None, MonotonicClock(), settle=SETTLE)
    await watcher.start()
    try:
        assert watcher.running
        assert 1 in watcher.seen.links
        assert watcher.seen.links[1].flags & 0x1  # lo is up
    finally:
        await watcher.stop()
    await watcher.stop()
    assert not watcher.running
