"""Selection under misbehaving nodes (issue 32): how each group policy copes, scenario by scenario.

    .venv/bin/python -m benchmarks.selection [--quick] [--policies urltest,fallback,score]
                                             [--scenarios steady,blackhole,...] [--json PATH]

Each (scenario, policy) pair is one run of its own: a fresh honk daemon in this process (on
uvloop, as ``honk run``), four chaos nodes (``tests/helpers/chaos.py``: SOCKS5 servers on
loopback whose behaviour the run changes) as ``socks5://127.0.0.1:PORT`` nodes n1..n4, a group
``g`` over them with the policy, the routing's fallback to ``g``, health checks every 5 s to a
loopback 204 origin through each node, and the Clash API. Each node has a latency L (20, 80,
140, 200 ms): L before its CONNECT reply and L/2 before each chunk each way, so a probe's second
round (what URLTest ranks by) and a flow's echo both see L, and n1 is clearly the best. The
daemon runs on a clock leapt past the 60 s registration grace once it started (tests'
``LeapClock``): a honk that has run a while, whose nodes' failures count at once.

A load driver opens 10 flows/s through honk's mixed port, each a SOCKS5 CONNECT to a loopback
echo origin, 100 bytes written and awaited back (at most 20 s per flow), for a warm-up (20 s)
and then the scenario's window (60 s); at t0, the window's start, the scenario strikes n1:

* steady: nothing happens;
* jittery: no best node: from the start all four have L = 20 ms plus a connect jitter of 0-40 ms;
* blackhole: n1 accepts connections and never answers;
* refuse50: n1 refuses half of its CONNECTs (0x05);
* reset: n1 resets each flow right after its success reply;
* silent: n1 answers success, then forwards nothing;
* refuse-then-recover: n1 refuses every CONNECT for 40 s, then works again.

The figures, per scenario and policy (flows and nodes matched by the flow id each flow writes
first, which the node that carried it records):

* fail: flows that failed among those started after the window's first failure became visible
  (the first failed flow ended): what a policy could have avoided;
* slow: flows in the window that worked but took 1 s or more (a blackholed node's flows do
  when honk retries them elsewhere after its connect timeout);
* escape: seconds from t0 until a rolling 2-second window of flows has >= 90 % succeed on
  another node than n1 (the window starts then); "never" when no window does;
* best: the share of flows (from the escape on, up to the recovery) carried by the best
  remaining node (n2; n1 in steady; none in jittery);
* sw/m: changes of the node carrying consecutive successful flows in the window, per minute;
* dead: healthy nodes that /proxies ever showed as not alive (polled once a second);
* back: refuse-then-recover only: seconds from the recovery until n1 carries a flow again;
* now: the share of /proxies reads, from the escape on, whose Clash ``now`` names the node that
  carried most of the flows of the second before the read.

``--quick`` shortens everything (10 s warm-up, 20 s window, recovery after 10 s, 10 s per flow):
a smoke run. The full run takes about 28 minutes (21 runs of about 80 s, one daemon each),
``--quick`` about 11; neither is part of ``make bench`` (``python -m benchmarks --selection``
adds it there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parent.parent
POLICIES = {"urltest": "min_moving_avg", "fallback": "fallback", "score": "score"}  # dae spellings
SCENARIOS = {
    "steady": "best node healthy",
    "jittery": "jittery equal nodes",
    "blackhole": "best node blackholes from t0",
    "refuse50": "best node refuses 50 %",
    "reset": "best node resets after reply",
    "silent": "best node silent after reply",
    "refuse-then-recover": "best node refuses, recovers",
}
NODES = ("n1", "n2", "n3", "n4")  # configuration order; n1 is the best, the one that goes bad
# seconds, per node: 60 ms apart, more than the default check_tolerance (50 ms), so a URLTest
# moves back to a recovered n1 (its hysteresis keeps it off a node less than that better)
LATENCIES = (0.020, 0.080, 0.140, 0.200)
JITTERY_LATENCY, JITTER = 0.020, 0.040  # seconds: the jittery scenario's equal nodes
BAD, BEST_REMAINING = "n1", "n2"
FLOW_RATE = 10.0  # flows per second
PAYLOAD_SIZE = 100  # bytes each flow writes and waits for
FLOW_TAG = b"flow "  # how each flow's payload starts, its id after it
SLOW_FLOW = 1.0  # seconds: a flow that took longer worked, but not as a user would like
ESCAPE_SPAN, ESCAPE_SHARE = 2.0, 0.9  # the rolling window of the escape, and the share elsewhere
MONITOR_EVERY = 1.0  # seconds between reads of /proxies
API_TIMEOUT = 5.0  # seconds one read of /proxies may take
CHECK_INTERVAL = "5s"
SECRET = "selection-bench"


@dataclass(frozen=True)
class Timing:
    warmup: float  # seconds of flows before t0
    window: float  # seconds of flows from t0
    recover_after: float  # seconds from t0 until refuse-then-recover's node works again
    flow_timeout: float  # seconds one flow may take in all


FULL = Timing(warmup=20.0, window=60.0, recover_after=40.0, flow_timeout=20.0)
QUICK = Timing(warmup=10.0, window=20.0, recover_after=10.0, flow_timeout=10.0)


def _helpers() -> None:
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


# --- one run -------------------------------------------------------------------------------------


@dataclass
class Flow:
    id: int
    started: float  # seconds since the run's start
    ended: float = 0.0
    ok: bool = False
    error: str = ""
    node: str | None = None  # the chaos node that carried its bytes, if any did


@dataclass
class Sample:
    """One read of /proxies."""

    at: float  # seconds since the run's start
    now: str | None  # the group's Clash `now`; None when the read failed
    alive: dict[str, bool] = field(default_factory=dict)


@dataclass
class Run:
    scenario: str
    policy: str
    timing: Timing
    t0: float  # seconds since the run's start
    flows: list[Flow]
    samples: list[Sample]
    node_stats: dict[str, dict[str, int]]


def _base_behaviour(scenario: str, index: int):  # noqa: ANN202 - helpers.chaos.ChaosBehaviour
    from helpers.chaos import ChaosBehaviour

    if scenario == "jittery":
        return ChaosBehaviour(
            connect_delay=JITTERY_LATENCY, connect_jitter=JITTER, chunk_delay=JITTERY_LATENCY / 2
        )
    return ChaosBehaviour(connect_delay=LATENCIES[index], chunk_delay=LATENCIES[index] / 2)


def _strike(scenario: str, node) -> None:  # noqa: ANN001 - helpers.chaos.ChaosNode
    """What the scenario does to n1 at t0."""
    behaviour = node.behaviour
    if scenario == "blackhole":
        behaviour.blackhole = True
    elif scenario == "refuse50":
        behaviour.refuse_share = 0.5
    elif scenario == "reset":
        behaviour.reset_after = 0
    elif scenario == "silent":
        behaviour.silent = True
    elif scenario == "refuse-then-recover":
        behaviour.refuse_share = 1.0


def _config(data_dir: Path, check_port: int, links: Sequence[tuple[str, str]], policy: str) -> str:
    nodes = "".join(f"    {name}: '{link}'\n" for name, link in links)
    members = ", ".join(name for name, _ in links)
    return f"""global {{
    data_dir: {data_dir}
    log_level: warning
    tcp_check_url: 'http://127.0.0.1:{check_port}/generate_204'
    udp_check_dns: '127.0.0.1:53'
    check_interval: {CHECK_INTERVAL}
}}
inbound {{
    lan: 'mixed://127.0.0.1:0'
}}
node {{
{nodes}}}
group {{
    g {{
        filter: name({members})
        policy: {POLICIES[policy]}
    }}
}}
routing {{
    fallback: g
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{SECRET}'
    }}
}}
"""


async def _one_flow(flow: Flow, lan_port: int, echo_port: int, timeout: float, since: float) -> None:
    """A SOCKS5 CONNECT through honk to the echo origin, the payload there and back."""
    from helpers.socks import encode_address

    loop = asyncio.get_running_loop()
    payload = FLOW_TAG + f"{flow.id:07d} ".encode()
    payload = payload.ljust(PAYLOAD_SIZE, b"-")
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", lan_port)
            writer.write(b"\x05\x01\x00")  # version 5, one method: no auth
            if await reader.readexactly(2) != b"\x05\x00":
                flow.error = "greeting"
                return
            writer.write(b"\x05\x01\x00" + encode_address("127.0.0.1", echo_port))
            head = await reader.readexactly(4)
            tail = {1: 6, 4: 18}.get(head[3])
            await reader.readexactly(tail if tail is not None else (await reader.readexactly(1))[0] + 2)
            if head[1] != 0:
                flow.error = f"reply 0x{head[1]:02x}"
                return
            writer.write(payload)
            flow.ok = await reader.readexactly(len(payload)) == payload
            flow.error = "" if flow.ok else "corrupt"
    except TimeoutError:
        flow.error = "timeout"
    except asyncio.IncompleteReadError:
        flow.error = "eof"
    except ConnectionResetError:
        flow.error = "reset"
    except OSError as exc:
        flow.error = f"errno {exc.errno}"
    finally:
        flow.ended = loop.time() - since
        if writer is not None:
            writer.close()


async def _drive(lan_port: int, echo_port: int, since: float, duration: float, timeout: float) -> list[Flow]:
    """FLOW_RATE flows a second for ``duration`` seconds from ``since``; returns once all ended."""
    loop = asyncio.get_running_loop()
    flows: list[Flow] = []
    tasks = []
    for i in range(int(duration * FLOW_RATE)):
        due = since + i / FLOW_RATE
        await asyncio.sleep(max(0.0, due - loop.time()))  # pacing, not synchronisation
        flow = Flow(i, started=loop.time() - since)
        flows.append(flow)
        tasks.append(asyncio.create_task(_one_flow(flow, lan_port, echo_port, timeout, since)))
    await asyncio.gather(*tasks)
    return flows


async def _monitor(base: str, since: float, stop: asyncio.Event, limit: int) -> list[Sample]:
    """/proxies once a second (at most ``limit`` reads) until ``stop``: g's `now`, each node's alive."""
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(limit):
            at = loop.time() - since
            try:
                async with asyncio.timeout(API_TIMEOUT), http.get(base + "/proxies") as resp:
                    proxies = (await resp.json())["proxies"]
                samples.append(Sample(at, proxies["g"]["now"], {n: bool(proxies[n]["alive"]) for n in NODES}))
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
                samples.append(Sample(at, None))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), MONITOR_EVERY)
            if stop.is_set():
                break
    return samples


async def _run(scenario: str, policy: str, timing: Timing) -> Run:
    _helpers()
    from helpers.apidaemon import api_base, running_daemon
    from helpers.chaos import chaos_node
    from helpers.leapclock import LeapClock
    from helpers.origins import generate_204
    from helpers.servers import echo_server

    from honk.alive.thresholds import REGISTRATION_GRACE

    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="honk-selection-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            echo_port = await stack.enter_async_context(echo_server())
            check = await stack.enter_async_context(generate_204())
            nodes = {}
            for index, name in enumerate(NODES):
                nodes[name] = await stack.enter_async_context(
                    chaos_node(
                        name, seed=index + 1, behaviour=_base_behaviour(scenario, index), clock=loop.time
                    )
                )
            text = _config(
                Path(tmp) / "var", check.port, [(n, node.link) for n, node in nodes.items()], policy
            )
            clock = LeapClock()
            daemon = await stack.enter_async_context(running_daemon(Path(tmp), text, clock=clock))
            clock.leap(REGISTRATION_GRACE + 1)  # a honk that has run a while: failures count at once
            since = loop.time()
            t0 = timing.warmup
            stop = asyncio.Event()
            limit = int((timing.warmup + timing.window + timing.flow_timeout) / MONITOR_EVERY) + 10
            monitor = asyncio.create_task(_monitor(api_base(daemon), since, stop, limit))
            drive = asyncio.create_task(
                _drive(
                    daemon.inbounds["lan"].bound.port,
                    echo_port,
                    since,
                    timing.warmup + timing.window,
                    timing.flow_timeout,
                )
            )
            try:
                await asyncio.sleep(max(0.0, since + t0 - loop.time()))
                _strike(scenario, nodes[BAD])
                if scenario == "refuse-then-recover":
                    await asyncio.sleep(max(0.0, since + t0 + timing.recover_after - loop.time()))
                    nodes[BAD].behaviour.refuse_share = 0.0
                flows = await drive
            finally:
                stop.set()
                drive.cancel()
                samples = await monitor
                await asyncio.gather(drive, return_exceptions=True)
            _attribute(flows, nodes, echo_port)
            node_stats = {name: dataclasses.asdict(node.stats) for name, node in nodes.items()}
    return Run(scenario, policy, timing, t0, flows, samples, node_stats)


def _attribute(flows: list[Flow], nodes: dict, echo_port: int) -> None:
    """Each flow's node: the one whose record of a CONNECT to the echo origin starts with its id."""
    by_id = {flow.id: flow for flow in flows}
    for name, node in nodes.items():
        for record in node.records:
            if (
                record.target is None
                or record.target[1] != echo_port
                or not record.first_up.startswith(FLOW_TAG)
            ):
                continue
            with contextlib.suppress(ValueError, IndexError):
                flow = by_id.get(int(record.first_up[len(FLOW_TAG) :].split()[0]))
                if flow is not None:
                    flow.node = name


# --- the figures ---------------------------------------------------------------------------------


def figures(run: Run) -> dict[str, object]:
    """The table's figures of one run (and a few more for the JSON)."""
    t0, end = run.t0, run.t0 + run.timing.window
    window = sorted((f for f in run.flows if t0 <= f.started < end), key=lambda f: f.started)
    bad = BAD if run.scenario not in ("steady", "jittery") else None
    recovery = t0 + run.timing.recover_after if run.scenario == "refuse-then-recover" else None
    failed = [f for f in window if not f.ok]
    visible = min(f.ended for f in failed) if failed else None  # the first failure became visible
    out: dict[str, object] = {
        "flows": len(window),
        "failed": len(failed),
        "failed_in_warmup": sum(not f.ok for f in run.flows if f.started < t0),
        "failed_after_visible": sum(1 for f in failed if f.started > visible) if failed else 0,
        "slow": sum(f.ok and f.ended - f.started >= SLOW_FLOW for f in window),
        "errors": _counts(f.error for f in failed),
        "carried": _counts(f.node or "none" for f in window if f.ok),
    }
    escape = None
    if bad is not None:
        escape = _escape(
            [f for f in window if recovery is None or f.started < recovery],
            bad,
            t0,
            recovery if recovery is not None else end,
        )
        out["escape_s"] = escape
    best = BEST_REMAINING if bad is not None else ("n1" if run.scenario == "steady" else None)
    if best is not None and (bad is None or escape is not None):
        after = [
            f
            for f in window
            if f.started >= t0 + (escape or 0.0) and (recovery is None or f.started < recovery)
        ]
        out["best_share"] = sum(f.ok and f.node == best for f in after) / len(after) if after else None
    carriers = [f.node for f in window if f.ok and f.node is not None]
    switches = sum(1 for a, b in zip(carriers, carriers[1:], strict=False) if a != b)
    out["switches_per_min"] = switches / (run.timing.window / 60.0)
    healthy = [n for n in NODES if n != bad]
    out["healthy_dead"] = sorted({n for s in run.samples for n in healthy if s.alive.get(n) is False})
    out["api_reads_failed"] = sum(s.now is None for s in run.samples)
    nows = [(round(s.at, 1), s.now) for s in run.samples if s.now is not None]
    out["now_changes"] = [entry for i, entry in enumerate(nows) if i == 0 or entry[1] != nows[i - 1][1]]
    if recovery is not None:
        back = [f.started for f in run.flows if f.started >= recovery and f.ok and f.node == bad]
        out["back_s"] = (min(back) - recovery) if back else None
    out["now_share"] = _now_share(run, t0 + (escape or 0.0), end)
    out["node_stats"] = run.node_stats
    return out


def _escape(flows: list[Flow], bad: str, t0: float, end: float) -> float | None:
    """Seconds from t0 to the start of the first full ESCAPE_SPAN window of flows of which at
    least ESCAPE_SHARE succeeded on another node than ``bad``."""
    for i, first in enumerate(flows):
        if first.started + ESCAPE_SPAN > end:
            break
        span = [f for f in flows[i:] if f.started < first.started + ESCAPE_SPAN]
        elsewhere = sum(f.ok and f.node not in (None, bad) for f in span)
        if elsewhere >= ESCAPE_SHARE * len(span):
            return first.started - t0
    return None


def _now_share(run: Run, start: float, end: float) -> float | None:
    """Of the /proxies reads in [start, end), the share whose ``now`` names the node that carried
    most flows of the second before; reads after a second without a carried flow do not count."""
    hits = reads = 0
    for sample in run.samples:
        if sample.now is None or not start <= sample.at < end:
            continue
        carried = _counts(
            f.node for f in run.flows if f.ok and f.node and sample.at - 1.0 <= f.started < sample.at
        )
        if carried:
            reads += 1
            hits += sample.now == max(carried, key=carried.__getitem__)
    return hits / reads if reads else None


def _counts(items) -> dict[str, int]:  # noqa: ANN001
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


# --- the table -----------------------------------------------------------------------------------

COLUMNS = (
    ("fail", "failed_after_visible"),
    ("slow", "slow"),
    ("esc s", "escape_s"),
    ("best", "best_share"),
    ("sw/m", "switches_per_min"),
    ("dead", "healthy_dead"),
    ("back s", "back_s"),
    ("now", "now_share"),
)


def _cell(key: str, figures_: dict[str, object]) -> str:
    if key not in figures_:
        return "-"
    value = figures_[key]
    if key in ("escape_s", "back_s"):
        return "never" if value is None else f"{value:.1f}"
    if key in ("best_share", "now_share"):
        return "-" if value is None else f"{value:.0%}"
    if key == "switches_per_min":
        return f"{value:.1f}"
    if key == "healthy_dead":
        return ",".join(value) if value else "no"
    return str(value)


def format_table(results: dict[str, dict[str, dict[str, object]]], policies: Sequence[str]) -> str:
    """One row per scenario; per policy a group of columns, its name above the group."""
    header = ["scenario"] + [name for _ in policies for name, _ in COLUMNS]
    rows = [
        [s] + [_cell(key, results[s].get(p, {})) for p in policies for _, key in COLUMNS] for s in results
    ]
    width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, width, strict=True))
        ).rstrip()

    groups, at = [" " * width[0]], 1
    for policy in policies:
        span = sum(width[at : at + len(COLUMNS)]) + 2 * (len(COLUMNS) - 1)
        groups.append(f" {policy} ".center(span, "-"))
        at += len(COLUMNS)
    return "\n".join(
        ["  ".join(groups), line(header), line(["-" * w for w in width]), *(line(r) for r in rows)]
    )


LEGEND = """fail: window flows started after its first failure was visible that failed; slow: window flows
that worked but took >= 1 s; esc s: t0 to the first 2 s of flows >= 90 % carried elsewhere than n1;
best: share on the best remaining node (n2; n1 when steady) from the escape on; sw/m: carrier
changes per minute; dead: healthy nodes /proxies showed dead; back s: the recovery to n1's next
flow; now: reads of the Clash `now` naming the node that carried the last second's flows.
""" + textwrap.fill("; ".join(f"{key}: {title}" for key, title in SCENARIOS.items()), 100)


# --- entry points --------------------------------------------------------------------------------


def measure(
    timing: Timing, policies: Sequence[str], scenarios: Sequence[str], progress=None
) -> dict[str, dict[str, dict[str, object]]]:  # noqa: ANN001
    """scenario -> policy -> figures, one fresh daemon per pair."""
    results: dict[str, dict[str, dict[str, object]]] = {s: {} for s in scenarios}
    total, done = len(scenarios) * len(policies), 0
    for scenario in scenarios:
        for policy in policies:
            done += 1
            if progress is not None:
                progress(f"selection: {scenario} x {policy} ({done}/{total})")
            started = time.monotonic()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                results[scenario][policy] = figures(runner.run(_run(scenario, policy, timing)))
            results[scenario][policy]["seconds"] = round(time.monotonic() - started, 1)
    return results


def run(quick: bool = False) -> tuple[dict, str]:
    """For ``python -m benchmarks --selection``: every scenario and policy; (results, table)."""
    results = measure(
        QUICK if quick else FULL,
        tuple(POLICIES),
        tuple(SCENARIOS),
        progress=lambda text: print(text, file=sys.stderr, flush=True),
    )
    return results, format_table(results, tuple(POLICIES))


def _names(text: str | None, known: Sequence[str], what: str) -> tuple[str, ...]:
    if not text:
        return tuple(known)
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.selection")
    parser.add_argument("--quick", action="store_true", help="short warm-up and window (a smoke run)")
    parser.add_argument("--policies", help=f"comma-separated, of {','.join(POLICIES)} (default: all)")
    parser.add_argument("--scenarios", help=f"comma-separated, of {','.join(SCENARIOS)} (default: all)")
    parser.add_argument("--warmup", type=float, help="seconds of flows before t0")
    parser.add_argument("--window", type=float, help="seconds of flows from t0")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this path")
    parser.add_argument(
        "--log",
        type=Path,
        help="honk's warnings and errors go to this file (default: only errors, to stderr)",
    )
    args = parser.parse_args(argv)
    policies = _names(args.policies, tuple(POLICIES), "policies")
    scenarios = _names(args.scenarios, tuple(SCENARIOS), "scenarios")
    timing = QUICK if args.quick else FULL
    if args.warmup is not None:
        timing = dataclasses.replace(timing, warmup=args.warmup)
    if args.window is not None:
        timing = dataclasses.replace(
            timing, window=args.window, recover_after=min(timing.recover_after, args.window / 2)
        )
    handler = logging.FileHandler(args.log) if args.log else logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING if args.log else logging.ERROR)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)

    started = time.monotonic()
    results = measure(
        timing, policies, scenarios, progress=lambda text: print(text, file=sys.stderr, flush=True)
    )
    elapsed = time.monotonic() - started
    print(
        f"selection under misbehaving nodes ({'quick' if args.quick else 'full'} run: "
        f"{timing.warmup:g} s warm-up, {timing.window:g} s window, {FLOW_RATE:g} flows/s; {elapsed:.0f} s)"
    )
    print(format_table(results, policies))
    print(LEGEND)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "quick": args.quick,
                    "seconds": round(elapsed, 1),
                    "timing": dataclasses.asdict(timing),
                    "rate": FLOW_RATE,
                    "latencies_ms": dict(zip(NODES, (round(x * 1000) for x in LATENCIES), strict=True)),
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
