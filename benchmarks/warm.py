"""Warm-up's payoff (issue 12): time to the first response byte of a new flow through a
Selector's VMess Mux.Cool node, its carrier kept warm vs opened by the flow (cold).

    .venv/bin/python -m benchmarks.warm [--quick]

Target: "warm <= 0.5 x cold on loopback" (median time to first byte).

One v2ray VMess server (TCP, aes-128-gcm) on loopback relays to the origin of the native load
tool (``benchmarks/loadgen.c``, its ``first`` mode). In this process honk's plane (a Selector
whose one member is the node, ``mux=1``), its dispatcher, its mixed port and its warm-up run on
one event loop, as in the daemon. A sample is one run of the load tool: a new connection to
the mixed port, SOCKS5 CONNECT to its origin, one byte sent, the time until it comes back.

Two baselines are measured in the same run: the load tool straight to its origin, and honk's
mixed port routing to ``direct`` (honk's own per-flow cost, no node). Warm samples run while
warm-up holds the node (its carrier stays open between flows); before each cold sample the
node's carriers are closed and warm-up lets it go, so the flow opens a carrier itself: a TCP
connection to the server and the VMess request that carries Mux.Cool. The four kinds alternate,
so that a drift of the machine's speed weighs on all alike.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import v2ray
from benchmarks.relay import Running, _which, _write, build_loadgen, free_port
from honk.config.links import parse_node_link, with_node_id
from honk.config.spec import (
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.connection.warm import WarmUp
from honk.core.clock import MonotonicClock
from honk.inbound.mixed import MixedInbound
from honk.outbound.mux import pool_for
from honk.outbound.runtime import WarmOwner

TARGET_RATIO = 0.5  # "warm <= 0.5 x cold on loopback"
# the rows, in order: two baselines measured in the same run, then the subject
KINDS = {"loopback": "straight to the origin (no honk)", "direct": "honk, direct (no node)",
         "cold": "honk, cold VMess mux carrier", "warm": "honk, warm VMess mux carrier"}
SAMPLES = 60  # per kind; they alternate
QUICK_SAMPLES = 15
STEP = 10.0  # seconds any one wait may take
US = 1e6


async def _first_byte(loadgen: Path, port: int | None) -> float:
    """Seconds from a new client connection to the first echoed byte through honk's mixed port
    (``port``; None: straight to the origin), as the native load tool measured them (a process
    of its own, its own origin)."""
    origin = free_port()
    through = ["--target", f"127.0.0.1:{port}", "--socks"] if port is not None else []
    proc = await asyncio.create_subprocess_exec(
        str(loadgen), "first", "--origin-port", str(origin), *through,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), STEP)
    fields = dict(item.split("=", 1) for item in out.decode().split())
    if proc.returncode != 0 or "first_byte_us" not in fields:
        raise RuntimeError(f"loadgen failed: {out.decode()} {err.decode(errors='replace')[-300:]}")
    return float(fields["first_byte_us"]) / US


async def _measure(link: str, loadgen: Path, samples: int) -> dict[str, list[float]]:
    node = parse_node_link(link, "vmess-mux")
    node = with_node_id(dataclasses.replace(node, params=(*node.params, ("mux", "1"))))
    group = GroupSpec("pick", policy=Policy.SELECTOR, has_filter_lines=True,
                      filters=(name_filter(node.name),))
    inbound = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(global_=GlobalSpec(connect_timeout=STEP, preconnect_node_count=0), inbounds=(inbound,),
                nodes=(node,), groups=(group,), routing=RoutingSpec(rules=(), fallback="pick"))
    clock = MonotonicClock()
    plane = build_plane(spec, clock, 1)
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(plane, tracker, clock, spec.global_, SystemResolver(clock, STEP))
    mixed = MixedInbound(inbound, dispatcher, clock)
    # the baseline in the same loop: honk's mixed port routing to direct (no node at all)
    direct_spec = dataclasses.replace(spec, nodes=(), groups=(), routing=RoutingSpec(rules=(), fallback="direct"))
    direct = MixedInbound(inbound, Dispatcher(build_plane(direct_spec, clock, 1), tracker, clock, spec.global_,
                                              SystemResolver(clock, STEP)), clock)
    warm = WarmUp(clock, lambda: plane)
    leaf = plane.outbounds[node.name]
    pool, runtime = pool_for(leaf), leaf.runtime
    await mixed.start()
    await direct.start()
    port = mixed.bound.port
    out: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for _ in range(samples):
            out["loopback"].append(await _first_byte(loadgen, None))
            out["direct"].append(await _first_byte(loadgen, direct.bound.port))
            await _until(lambda: not len(tracker))
            warm.start()
            await warm.pin_pass()  # the pin's carrier (the pass the daemon runs at once after a switch)
            assert pool.carrier_count == 1 and runtime.warm & WarmOwner.SELECTOR_PIN
            out["warm"].append(await _first_byte(loadgen, port))
            await _until(lambda: not len(tracker))  # the flow ended on both sides
            await warm.stop()  # cold: no owner, no carrier
            pool.close()
            await _until(lambda: pool.carrier_count == 0)
            out["cold"].append(await _first_byte(loadgen, port))
            await _until(lambda: not len(tracker))
            pool.close()
            await _until(lambda: pool.carrier_count == 0)
    finally:
        await warm.stop()
        await direct.aclose()
        await mixed.aclose()
        tracker.close_all("benchmark over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)
        runtime.close()
    return out


async def _until(condition) -> None:  # noqa: ANN001
    end = time.monotonic() + STEP
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


def run(quick: bool = False) -> list[tuple[str, ...]]:
    """Rows (what, median µs, p90 µs, samples, ratio to cold, status)."""
    binary = _which("v2ray")
    if binary is None:
        return [("warm vs cold VMess mux first byte", "-", "-", "-", "-", "v2ray not installed")]
    samples = QUICK_SAMPLES if quick else SAMPLES
    secret = str(uuid.uuid4())
    with tempfile.TemporaryDirectory(prefix="honk-warm-bench-") as tmp:
        wd = Path(tmp)
        server_port = free_port()
        config = v2ray.server_config("vmess", server_port, secret)
        server = Running([binary, "-config", _write(wd / "server.json", json.dumps(config))], {},
                         wd, wd / "server.log")
        try:
            server.wait_port(server_port)
            figures = asyncio.run(_measure(v2ray.share_link("vmess", server_port, secret), build_loadgen(), samples))
        finally:
            server.stop()
    cold = statistics.median(figures["cold"])
    rows = []
    for kind in KINDS:
        values = sorted(figures[kind])
        median = statistics.median(values)
        p90 = values[int(0.9 * (len(values) - 1))]
        ratio = median / cold
        status = ("met" if ratio <= TARGET_RATIO else "NOT met") if kind == "warm" else "-"
        rows.append((f"first byte, new flow, {KINDS[kind]}", f"{median * US:.0f}", f"{p90 * US:.0f}",
                     str(len(values)), f"{ratio:.2f}", status))
    return rows


HEADER = ["warm-up", "median µs", "p90 µs", "samples", "ratio to cold", "status"]


def main(argv: list[str] | None = None) -> None:
    from benchmarks.relay import format_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print("warm-up benchmark:", file=sys.stderr, flush=True)
    print(format_table(HEADER, [list(r) for r in run(args.quick)]))


if __name__ == "__main__":
    main()
