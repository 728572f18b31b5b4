"""What a reload costs at router scale, against rebuilding everything.

    .venv/bin/python -m benchmarks.reload [--quick]

One daemon in this process: 2,000 SOCKS5 nodes on closed ports, a Selector and a URLTest
group over all of them, a mixed inbound on loopback, nothing probed. Measured, each as the
median over several runs:

* the full build: plan from empty and prepare (binding nothing): what a reload cost when
  every reload rebuilt everything, and what ``honk check`` does;
* an unchanged reload (the file read, lowered, planned; everything reused);
* a reload that changes one node's address (one outbound rebuilt, both groups rebuilt,
  a new plane published, the old version drained);
* a reload that adds one node.

For each reload also the event loop's worst stall while it ran (a 1 ms timer records how
late it wakes): the time no new flow could be accepted or routed. The ratios are a reload
against the full build; they are reference figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

NODES = 2000
FIRST_NODE_PORT = 20000  # node i is 127.0.0.1:FIRST_NODE_PORT+i; nothing listens there


def config(data_dir: Path, *, moved: bool = False, added: bool = False) -> str:
    nodes = [f"    n{i}: 'socks5://127.0.0.1:{FIRST_NODE_PORT + i}'" for i in range(NODES)]
    if moved:
        nodes[0] = f"    n0: 'socks5://127.0.0.1:{FIRST_NODE_PORT - 1}'"
    if added:
        nodes.append(f"    extra: 'socks5://127.0.0.1:{FIRST_NODE_PORT - 2}'")
    return (
        f"global {{\n    data_dir: {data_dir}\n    tcp_check_url: ''\n    check_interval: 3600s\n}}\n"
        "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
        "node {\n" + "\n".join(nodes) + "\n}\n"
        "group {\n    pick {\n        policy: select\n    }\n    auto {\n        policy: min_moving_avg\n    }\n}\n"
        "routing {\n    fallback: pick\n}\n"
    )


class StallMeter:
    """A 1 ms timer on the loop; the worst lateness seen since :meth:`reset`."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - before - 0.001)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def reset(self) -> None:
        self.worst = 0.0

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def settled_probes(daemon, limit: float = 60.0) -> None:  # noqa: ANN001
    """Wait until the health runner has no probe queued or running."""
    runner = daemon.health.runner
    deadline = time.monotonic() + limit
    while runner is not None and (runner._queue or runner._running) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def measure(reps: int) -> dict[str, tuple[float, float]]:
    from honk.daemon.app import Daemon, check_file

    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "honk.dae"
        cfg.write_text(config(Path(tmp) / "var"))
        full = []
        for _ in range(reps):
            started = time.perf_counter()
            await check_file(cfg)
            full.append(time.perf_counter() - started)
        out["full build (plan from empty + prepare)"] = (statistics.median(full), 0.0)
        daemon = Daemon(cfg)
        await daemon.start()
        await settled_probes(daemon)  # the start's first probe round is not the reload's cost
        meter = StallMeter()
        meter.start()
        try:
            for name, texts in (
                ("reload, unchanged", [config(Path(tmp) / "var")] * 2),
                (
                    "reload, one node moved",
                    [config(Path(tmp) / "var", moved=True), config(Path(tmp) / "var")],
                ),
                (
                    "reload, one node added",
                    [config(Path(tmp) / "var", added=True), config(Path(tmp) / "var")],
                ),
            ):
                times, stalls = [], []
                for _ in range(reps):
                    for index, text in enumerate(texts):
                        cfg.write_text(text)
                        await settled_probes(daemon)
                        meter.reset()
                        started = time.perf_counter()
                        await daemon.reload()
                        if index == 0:  # the second one puts the file back
                            times.append(time.perf_counter() - started)
                            stalls.append(meter.worst)
                out[name] = (statistics.median(times), max(stalls))
        finally:
            await meter.stop()
            await daemon.shutdown(0.0)
    return out


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    figures = asyncio.run(measure(3 if quick else 7))
    full = figures["full build (plan from empty + prepare)"][0]
    rows = [("full build (plan from empty + prepare)", f"{full * 1000:.0f} ms", "baseline", "")]
    for name, (seconds, stall) in figures.items():
        if name.startswith("reload"):
            rows.append(
                (
                    name,
                    f"{seconds * 1000:.0f} ms, worst stall {stall * 1000:.0f} ms",
                    f"{seconds / full:.2f}x of the full build",
                    "reference",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reload")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(quick=args.quick):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
