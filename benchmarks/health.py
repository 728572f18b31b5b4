"""The probe scheduler at router scale: 5,000 registered nodes, one periodic cycle.

    .venv/bin/python -m benchmarks.health [--nodes 5000] [--quick]

Two measurements, both in this process on loopback:

* scheduler: one cycle with a prober that answers at once, so what is measured is
  the runner's own work per node (queueing, workers, tickets, publishing the
  result into the health state). Process CPU time per node per cycle, the
  median of several cycles; the target is under 50 µs.
* real cycle: the same 5,000 nodes as real SOCKS5 leaves built by honk's
  registry, all pointing at one local TCP server, probed with the raw TCP check
  (no check URL) at the default admission bound. Wall time of the cycle, its CPU
  time, and the peak number of probes in flight (it must not pass the bound).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family, ProbeSample
from honk.alive.prober import NodeProber
from honk.alive.runner import HealthRunner, UdpOutcome
from honk.alive.thresholds import PROBE_CONCURRENCY, REGISTRATION_GRACE
from honk.config.spec import DEFAULT_CHECK_INTERVAL, GlobalSpec, NodeSpec, Spec
from honk.connection.plane import build_plane
from honk.control.health import node_leaves
from honk.core.clock import MonotonicClock

SCHEDULER_TARGET_US = 50.0  # "under 50 µs of scheduler time per node per cycle, excluding I/O"
NODES = 5000  # "5,000 registered nodes"


class InstantProber:
    """Answers every probe at once: the cycle's cost is the scheduler's alone."""

    def families(self, node_id):  # noqa: ANN001, ANN201
        return (Family.V4,)

    def udp_capable(self, node_id):  # noqa: ANN001, ANN201
        return False

    async def probe_tcp(self, node_id, family):  # noqa: ANN001, ANN201
        return ProbeSample(0.010)

    async def probe_udp(self, node_id, family):  # noqa: ANN001, ANN201
        return UdpOutcome(ProbeSample(0.010))

    async def probe_url(self, node_id, url, method=None):  # noqa: ANN001, ANN201
        return ProbeSample(0.010)


async def scheduler_cost(nodes: int, cycles: int) -> list[float]:
    """CPU seconds per node of each of ``cycles`` cycles over ``nodes`` nodes."""
    clock = MonotonicClock()
    alive = AliveDialerSet(clock)
    for i in range(nodes):
        alive.register_node(uuid.uuid4(), f"n{i}")
    runner = HealthRunner(alive, InstantProber(), clock, check_interval=DEFAULT_CHECK_INTERVAL)
    per_node = []
    for _ in range(cycles):
        started = time.process_time()
        await runner.run_cycle()
        per_node.append((time.process_time() - started) / nodes)
    assert runner.probes_run == nodes * cycles
    return per_node


async def _serve_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def real_cycle(nodes: int) -> dict[str, float]:
    clock = MonotonicClock()
    server = await asyncio.start_server(_serve_and_close, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    spec = Spec(
        global_=GlobalSpec(tcp_check_url=(), connect_timeout=5.0),
        nodes=tuple(
            NodeSpec(name=f"n{i}", protocol="socks5", host="127.0.0.1", port=port, id=uuid.uuid4())
            for i in range(nodes)
        ),
    )
    plane = build_plane(spec, clock, 1)
    leaves = node_leaves(plane)
    alive = AliveDialerSet(clock)
    for node_id, leaf in leaves.items():
        alive.register_node(node_id, leaf.name)
    prober = NodeProber(leaves, spec.global_, clock)
    runner = HealthRunner(alive, prober, clock, check_interval=DEFAULT_CHECK_INTERVAL)
    wall, cpu = time.monotonic(), time.process_time()
    await runner.run_cycle()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    server.close()
    await server.wait_closed()
    ok = sum(1 for n in alive.nodes() if n.peek(Domain.TCP, Family.V4) and n.latencies.last_real_sample())
    return {"nodes": len(leaves), "ok": ok, "wall_s": wall, "cpu_s": cpu, "peak": runner.peak_in_flight}


def run(quick: bool = False, nodes: int = NODES) -> list[tuple[str, str, str, str]]:
    """Rows (what, honk, target, status) for the benchmark table."""
    cycles = 3 if quick else 7
    per_node = asyncio.run(scheduler_cost(nodes, cycles))
    median_us = statistics.median(per_node) * 1e6
    real = asyncio.run(real_cycle(nodes))
    grace_note = f"(grace {REGISTRATION_GRACE:.0f} s not waited: results count, deaths do not)"
    return [
        (
            f"scheduler CPU per node per cycle ({nodes} nodes, median of {cycles})",
            f"{median_us:.1f} µs",
            f"< {SCHEDULER_TARGET_US:.0f} µs",
            "met" if median_us < SCHEDULER_TARGET_US else "NOT met",
        ),
        (
            f"real cycle: {real['nodes']} SOCKS5 leaves, raw TCP check, loopback",
            f"{real['wall_s']:.2f} s wall, {real['cpu_s'] * 1e6 / real['nodes']:.0f} µs CPU/node",
            f"{real['ok']}/{real['nodes']} ok",
            "completed" if real["ok"] == real["nodes"] else "INCOMPLETE",
        ),
        (
            "peak probes in flight",
            str(real["peak"]),
            f"<= {PROBE_CONCURRENCY}",
            "met" if real["peak"] <= PROBE_CONCURRENCY else "NOT met",
        ),
        ("", "", "", grace_note),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.health")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(args.quick, args.nodes):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
