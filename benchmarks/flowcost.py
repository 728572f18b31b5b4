"""The loop thread's per-flow work on the SOCKS fast path: one Shadowsocks flow, from the
engine's request to its end, with no socket and no thread.

    .venv/bin/python -m benchmarks.flowcost [--quick] [--profile]

Why it matters: the relay engine's worker costs per flow about what all of ss-local costs
(the same syscalls, mostly kernel time; issue 33), so what the loop thread does per flow is
what honk adds, and it bounds the Shadowsocks connection rate against ss-local. The load
tool's rate rows measure it inside four busy processes; this measures the Python part alone,
with no peer and no socket. Single runs still move by several per cent on a shared machine:
compare two builds by the medians of interleaved runs.

How: a mixed inbound with a Shadowsocks node (``127.0.0.1``, never dialled) serves its fast
path over a recording engine that answers ``hs_connect`` with a flow id, as the compiled
engine does. Each flow is one ``socks_request``, then the events a short flow receives
(opened, first byte with the totals so far, final bytes, end) handed to the flow as the
engine hands them. The rows: the whole flow, and two of its parts alone (the route decision
and the engine dial's plan), each the median of batches of process CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import print_profile
from honk._fast import relay as _relay
from honk.config.spec import GlobalSpec, InboundSpec, RoutingSpec, Spec
from honk.core.clock import MonotonicClock
from honk.core.errors import FlowClosed
from honk.core.net import Address, FlowMeta, Network

FLOWS = 20_000  # flows per batch (--quick: a quarter)
BATCHES = 5  # the rows give the median batch
WARM_FLOWS = 2_000  # flows before measuring: caches, the allocator, the collector's generations
PROFILE_LINES = 30
TARGET = Address("127.0.0.2", 8080)  # an IP literal: the route needs no DNS, the engine dials itself
# what a short proxied flow receives after its request, in the compiled engine's order
SHORT_FLOW_EVENTS = (
    (_relay.EV_OPEN, 0, 0),
    (_relay.EV_FIRST_BYTE, 100, 100),
    (_relay.EV_BYTES, 100, 100),
    (_relay.EV_END, _relay.END_CLEAN, 0),
)


class RecordingEngine:
    """What the fast path needs of the relay engine, with no worker: ``hs_connect`` records
    the flow's listener and answers a flow id; anything else a short flow does not call."""

    implementation = "compiled"  # the flows' engine name, as over the compiled engine

    def __init__(self) -> None:
        self.closed = False
        self.last_id = 0
        self.listeners: dict[int, Any] = {}

    def listen(self, fd: int, listener: Any) -> int:
        return 1

    def unlisten(self, lid: int, drop: bool = False) -> None:
        pass

    def accepted(self, lid: int) -> int:
        return 0

    def hs_connect(
        self, token: int, ip: str, port: int, mark: int, listener: Any, framing: Any = None, head: bytes = b""
    ) -> int:
        self.last_id += 1
        self.listeners[self.last_id] = listener
        return self.last_id

    def hs_reject(self, token: int, code: int) -> None:
        raise RuntimeError(f"the benchmark's flow was refused (SOCKS reply {code:#04x})")

    def cancel(self, flow_id: int, code: int = 0) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _spec() -> Spec:
    userinfo = base64.urlsafe_b64encode(b"aes-256-gcm:benchmark").decode().rstrip("=")
    from helpers.inprocess import node_from_link  # tests/helpers: the link parsed as honk reads it

    return Spec(
        global_=GlobalSpec(),
        inbounds=(InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0),),
        nodes=(node_from_link(f"ss://{userinfo}@127.0.0.1:9#node"),),
        routing=RoutingSpec(rules=(), fallback="node"),
    )


def _batches(step: Callable[[int], object], flows: int) -> float:
    """Median µs of CPU per call of ``step`` over BATCHES batches of ``flows`` calls."""
    per_call = []
    for _ in range(BATCHES):
        start = time.process_time()
        for i in range(flows):
            step(i)
        per_call.append((time.process_time() - start) / flows * 1e6)
    return statistics.median(per_call)


async def _measure(flows: int, profile: bool) -> dict[str, float]:
    from helpers.inprocess import mixed_inbound

    engine = RecordingEngine()
    async with mixed_inbound(_spec(), MonotonicClock(), engine=engine) as (inbound, dispatcher):
        path = inbound._fast.paths[0]

        def one_flow(i: int) -> None:
            path.socks_request(i, "127.0.0.1", 40000 + (i & 8191), TARGET.host, TARGET.port)
            flow = engine.listeners.pop(engine.last_id)
            now = time.monotonic()
            for kind, a, b in SHORT_FLOW_EVENTS:
                flow.relay_event(kind, a, b, now)

        meta = FlowMeta(Network.TCP, Address("127.0.0.1", 40000), TARGET, "lan")
        routed = dispatcher.route_now(meta)

        def route(_i: int) -> None:
            dispatcher.route_now(meta)

        def plan(_i: int) -> None:
            dial = dispatcher.engine_dial(routed)
            dial.failed(FlowClosed("the benchmark drops its dial"))  # neutral: nothing charged to the node

        for i in range(WARM_FLOWS):
            one_flow(i)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for i in range(flows):
                one_flow(i)
            profiler.disable()
            print_profile(profiler, f"{flows} flows", PROFILE_LINES)
        figures = {"flow": _batches(one_flow, flows), "route": _batches(route, flows)}
        figures["plan"] = _batches(plan, flows)
        tracker = dispatcher.tracker
        # every flow was tracked when it opened and released at its end: the path ran in full
        figures["opened"], figures["live"] = float(tracker.opened), float(len(tracker))
        return figures


def _tests_on_path() -> None:
    helpers = str(Path(__file__).resolve().parent.parent / "tests")
    if helpers not in sys.path:
        sys.path.insert(0, helpers)


def figures(quick: bool = False, profile: bool = False) -> dict[str, float]:
    """µs of the loop thread's CPU: per flow, per route decision, per engine dial's plan."""
    _tests_on_path()
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as honk run's loop
        return runner.run(_measure(FLOWS // 4 if quick else FLOWS, profile))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flowcost")
    parser.add_argument("--quick", action="store_true", help="a quarter of the flows per batch")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one batch first")
    args = parser.parse_args()
    got = figures(args.quick, args.profile)
    for name in ("flow", "route", "plan"):
        print(f"{name}: {got[name]:.2f} us")


if __name__ == "__main__":
    main()
