"""Warm-up's payoff (issue 12): time to the first response byte of a new flow through a
Selector's VMess Mux.Cool node, its carrier kept warm vs opened by the flow (cold).

    .venv/bin/python -m benchmarks.warm [--quick] [--transport tcp|tls]

Target: "warm <= 0.5 x cold on loopback" (median time to first byte).

One v2ray VMess server (aes-128-gcm) on loopback relays to the origin of the native load tool
(``benchmarks/loadgen.c``, its ``first`` mode), over each transport in turn: plain TCP, and TLS
(how VMess nodes are usually deployed; a throwaway CA issues the server's certificate). In this
process honk's plane (a Selector whose one member is the node, ``mux=1``), its dispatcher, its
mixed port and its warm-up run on one event loop, as in the daemon. A sample is one run of the
load tool: a new connection to the SOCKS5 port, CONNECT to its origin, one byte sent, the time
until it comes back.

Three baselines are measured in the same run: the load tool straight to its origin, honk's
mixed port routing to ``direct`` (honk's own per-flow cost, no node), and v2ray's own client
with Mux.Cool (the reference implementation, whose carrier stays open between samples: its
warm path). Warm samples run while warm-up holds the node (its carrier stays open between
flows); before each cold sample the node's carriers are closed and warm-up lets it go, so the
flow opens a carrier itself: a TCP connection to the server, the TLS handshake over TLS, and
the VMess request that carries Mux.Cool. The kinds alternate, so that a drift of the machine's
speed weighs on all alike.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
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
# the rows, in order: three baselines measured in the same run, then the subject
KINDS = {
    "loopback": "straight to the origin (no honk)",
    "direct": "honk, direct (no node)",
    "reference": "v2ray client, its mux carrier warm",
    "cold": "honk, cold VMess mux carrier",
    "warm": "honk, warm VMess mux carrier",
}
TRANSPORTS = {"tcp": "VMess/TCP", "tls": "VMess/TLS"}
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
        str(loadgen),
        "first",
        "--origin-port",
        str(origin),
        *through,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), STEP)
    fields = dict(item.split("=", 1) for item in out.decode().split())
    if proc.returncode != 0 or "first_byte_us" not in fields:
        raise RuntimeError(f"loadgen failed: {out.decode()} {err.decode(errors='replace')[-300:]}")
    return float(fields["first_byte_us"]) / US


async def _measure(link: str, loadgen: Path, samples: int, reference_port: int) -> dict[str, list[float]]:
    node = parse_node_link(link, "vmess-mux")
    node = with_node_id(dataclasses.replace(node, params=(*node.params, ("mux", "1"))))
    group = GroupSpec(
        "pick", policy=Policy.SELECTOR, has_filter_lines=True, filters=(name_filter(node.name),)
    )
    inbound = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(
        global_=GlobalSpec(connect_timeout=STEP, preconnect_node_count=0),
        inbounds=(inbound,),
        nodes=(node,),
        groups=(group,),
        routing=RoutingSpec(rules=(), fallback="pick"),
    )
    clock = MonotonicClock()
    plane = build_plane(spec, clock, 1)
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(plane, tracker, clock, spec.global_, SystemResolver(clock, STEP))
    mixed = MixedInbound(inbound, dispatcher, clock)
    # the baseline in the same loop: honk's mixed port routing to direct (no node at all)
    direct_spec = dataclasses.replace(
        spec, nodes=(), groups=(), routing=RoutingSpec(rules=(), fallback="direct")
    )
    direct = MixedInbound(
        inbound,
        Dispatcher(
            build_plane(direct_spec, clock, 1), tracker, clock, spec.global_, SystemResolver(clock, STEP)
        ),
        clock,
    )
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
            out["reference"].append(await _first_byte(loadgen, reference_port))
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


def run(quick: bool = False, transports: tuple[str, ...] = tuple(TRANSPORTS)) -> list[tuple[str, ...]]:
    """Rows (what, median µs, p90 µs, samples, ratio to cold, status), for each transport."""
    binary = _which("v2ray")
    if binary is None:
        return [("warm vs cold VMess mux first byte", "-", "-", "-", "-", "v2ray not installed")]
    samples = QUICK_SAMPLES if quick else SAMPLES
    loadgen = build_loadgen()
    rows = []
    for transport in transports:
        figures = _run_transport(binary, loadgen, samples, tls=transport == "tls")
        cold = statistics.median(figures["cold"])
        for kind in KINDS:
            values = sorted(figures[kind])
            median = statistics.median(values)
            p90 = values[int(0.9 * (len(values) - 1))]
            ratio = median / cold
            status = ("met" if ratio <= TARGET_RATIO else "NOT met") if kind == "warm" else "-"
            rows.append(
                (
                    f"{TRANSPORTS[transport]}: first byte, new flow, {KINDS[kind]}",
                    f"{median * US:.0f}",
                    f"{p90 * US:.0f}",
                    str(len(values)),
                    f"{ratio:.2f}",
                    status,
                )
            )
    return rows


def _run_transport(binary: str, loadgen: Path, samples: int, *, tls: bool) -> dict[str, list[float]]:
    """The samples over one transport: the v2ray server, v2ray's reference client and honk."""
    secret = str(uuid.uuid4())
    with tempfile.TemporaryDirectory(prefix="honk-warm-bench-") as tmp:
        wd = Path(tmp)
        cert = key = ca = ""
        if tls:
            import trustme  # a test dependency of honk; only the TLS transport needs it

            authority = trustme.CA()
            issued = authority.issue_cert(*v2ray.TLS_NAMES)
            cert, key, ca = str(wd / "cert.pem"), str(wd / "key.pem"), str(wd / "ca.pem")
            issued.cert_chain_pems[0].write_to_path(cert)
            issued.private_key_pem.write_to_path(key)
            authority.cert_pem.write_to_path(ca)
        server_port, client_port = free_port(), free_port()
        server = Running(
            [
                binary,
                "-config",
                _write(
                    wd / "server.json",
                    json.dumps(v2ray.server_config("vmess", server_port, secret, cert, key, tls=tls)),
                ),
            ],
            {},
            wd,
            wd / "server.log",
        )
        client = Running(
            [
                binary,
                "-config",
                _write(
                    wd / "client.json",
                    json.dumps(
                        v2ray.client_config("vmess", client_port, server_port, secret, ca, tls=tls, mux=True)
                    ),
                ),
            ],
            {},
            wd,
            wd / "client.log",
        )
        trust = os.environ.get("SSL_CERT_FILE")
        try:
            server.wait_port(server_port)
            client.wait_port(client_port)
            if ca:
                os.environ["SSL_CERT_FILE"] = ca  # honk verifies against the system store, which honours it
            link = v2ray.share_link("vmess", server_port, secret, tls=tls)
            return asyncio.run(_measure(link, loadgen, samples, client_port))
        finally:
            if trust is None:
                os.environ.pop("SSL_CERT_FILE", None)
            else:
                os.environ["SSL_CERT_FILE"] = trust
            client.stop()
            server.stop()


HEADER = ["warm-up", "median µs", "p90 µs", "samples", "ratio to cold", "status"]


def main(argv: list[str] | None = None) -> None:
    from benchmarks.relay import format_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--transport",
        choices=tuple(TRANSPORTS),
        action="append",
        help="measure only this transport (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    print("warm-up benchmark:", file=sys.stderr, flush=True)
    rows = run(args.quick, tuple(args.transport or TRANSPORTS))
    print(format_table(HEADER, [list(r) for r in rows]))


if __name__ == "__main__":
    main()
