"""Run every benchmark and print the tables of figures and target ratios.

    make bench                    # or: .venv/bin/python -m benchmarks [--quick]

* kernels: the compiled ``_fast`` kernels against their pure-Python twins;
* groups:  the per-flow plan through three nested groups of 50 members each
  (``benchmarks/groups.py``);
* score:   Score's per-flow cost: each business reporter event (begin, setup, TX, RX
  published and throttled, settle) and the plan through 50-member Score groups, alone and
  nested, over 1,000 warmed targets (``benchmarks/score.py``; ``--no-score`` skips it);
* api:     the control API at 2,000 nodes: response time and event-loop stall of the
  dashboard's reads, and a 64-byte echo through the mixed inbound with and without a
  dashboard polling (``benchmarks/api.py``; ``--no-api`` skips it);
* reload:  a reload at 2,000 nodes (unchanged, one node moved, one added) against the
  full build, with the event loop's worst stall (``benchmarks/reload.py``);
* tproxy:  throughput through the router's transparent path (client → honk's TPROXY
  listener → direct → server, in three network namespaces) against plain forwarding,
  with iperf3 (``benchmarks/tproxy.py``; root; ``--no-tproxy`` skips it);
* health:  the probe scheduler over 5,000 nodes (its own CPU per node per cycle,
  and one real cycle of raw TCP checks on loopback; see ``benchmarks/health.py``);
* relay:   honk's mixed port against direct loopback, a splicing forwarder
  (haproxy), socat, pproxy on uvloop and microsocks, all driven by the native
  load tool ``benchmarks/loadgen.c`` (see ``benchmarks/relay.py``);
* shadowsocks: honk with an ``ss://`` node against shadowsocks-libev's ss-local,
  both into one ss-server per cipher (bulk, one stream; ``--no-ss`` skips them);
* warm:  time to the first response byte of a new flow through a Selector's VMess Mux.Cool
  node, its carrier kept warm against opened by the flow (``benchmarks/warm.py``;
  ``--no-warm`` skips it);
* v2ray: honk with a ``vmess://``, ``trojan://`` or ``vless://`` node against a
  v2ray client, both into one v2ray server per protocol (VMess over TCP, Trojan
  and VLESS over TLS; bulk on one stream and the connection rate; ``--no-v2ray``
  skips them);
* geodata: a full-size geosite.dat loaded and compiled (time, resident memory) and the
  router's domain matcher over its largest list (lookups/s) (``benchmarks/geodata.py``;
  ``--no-geodata`` skips it);
* dns:   cached DNS answers per second, through the service's entry without sockets and through
  the UDP listener on loopback (``benchmarks/dnscache.py``; ``--no-dns`` skips it);
* dns upstream: a cache miss's latency per upstream transport (udp, tcp, DoT, DoH, DoQ, DoH3)
  against loopback resolvers, and what each adds to a bare UDP query
  (``benchmarks/dnsupstream.py``; ``--no-dns-upstream`` skips it);
* flowcost: the loop thread's CPU per Shadowsocks flow on the SOCKS fast path, request to
  end, over a recording engine (``benchmarks/flowcost.py``): absolute figures with no
  baseline, so not part of the default run; ``python -m benchmarks.flowcost [--profile]``;
* selection: issue 32's scenario x policy table, URLTest, Fallback and Score over four chaos
  nodes that blackhole, refuse, reset or go silent (``benchmarks/selection.py``; about 28
  minutes, ``--quick`` about 11), not part of the default run: ``--selection`` adds it, or
  run ``python -m benchmarks.selection`` on its own.

The full run takes about 16 minutes on two cores (the v2ray rows about 4 of them, the
score rows about 3), ``--quick`` about three. The figures and every run's raw output also
go to ``benchmarks/results/*.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

from benchmarks import (
    api,
    dnscache,
    dnsupstream,
    geodata,
    groups,
    health,
    kernels,
    relay,
    reload,
    score,
    selection,
    tproxy,
    warm,
)


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every `finally`, which stops the subjects


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="one repetition of short runs (~2 minutes)")
    parser.add_argument(
        "--only",
        help="comma-separated subjects to measure (e.g. direct,honk, "
        "ss-local,honk[ss] or v2ray,honk[v2ray]; a paired subject also "
        "by name:tag, e.g. honk[v2ray]:vmess)",
    )
    parser.add_argument("--no-ss", action="store_true", help="skip the Shadowsocks rows (ss-local, honk[ss])")
    parser.add_argument(
        "--no-v2ray", action="store_true", help="skip the VMess, Trojan and VLESS rows (v2ray, honk[v2ray])"
    )
    parser.add_argument(
        "--loadgen-threads",
        type=int,
        default=None,
        help="client threads of the load tool (default: one per CPU)",
    )
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel benchmarks")
    parser.add_argument("--no-health", action="store_true", help="skip the probe-scheduler benchmark")
    parser.add_argument("--no-groups", action="store_true", help="skip the group plan benchmark")
    parser.add_argument("--no-score", action="store_true", help="skip the Score reporter and plan benchmark")
    parser.add_argument("--no-api", action="store_true", help="skip the control API benchmark")
    parser.add_argument("--no-reload", action="store_true", help="skip the reload benchmark")
    parser.add_argument("--no-tproxy", action="store_true", help="skip the transparent throughput benchmark")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-up first-byte benchmark")
    parser.add_argument(
        "--no-geodata", action="store_true", help="skip the geodata load and lookup benchmark"
    )
    parser.add_argument("--no-dns", action="store_true", help="skip the cached DNS answers benchmark")
    parser.add_argument(
        "--no-dns-upstream",
        action="store_true",
        help="skip the cache-miss latency per DNS upstream transport",
    )
    parser.add_argument(
        "--selection",
        action="store_true",
        help="add the selection scenario table (issue 32; ~28 min, ~11 with --quick)",
    )
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)

    plan = relay.QUICK if args.quick else relay.FULL
    if args.loadgen_threads:
        plan = dataclasses.replace(plan, loadgen_threads=args.loadgen_threads)
    started = time.monotonic()
    try:  # before anything of ours runs, so the load average is other people's work
        busy = relay.busy_warning(Path("/proc/loadavg").read_text(), os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        busy = ""
    if busy:
        print(f"warning: {busy}", file=sys.stderr, flush=True)

    kernel_rows: list[tuple[str, str, str, str]] = [] if args.no_kernels else kernels.run(quick=args.quick)
    health_rows: list[tuple[str, str, str, str]] = [] if args.no_health else health.run(quick=args.quick)
    group_rows: list[tuple[str, str, str, str]] = [] if args.no_groups else groups.run(quick=args.quick)
    score_rows: list[tuple[str, ...]] = [] if args.no_score else score.run(quick=args.quick)
    api_rows: list[tuple[str, str, str, str]] = [] if args.no_api else api.run(quick=args.quick)
    reload_rows: list[tuple[str, str, str, str]] = [] if args.no_reload else reload.run(quick=args.quick)
    tproxy_rows: list[tuple[str, str, str, str]] = [] if args.no_tproxy else tproxy.run(quick=args.quick)
    warm_rows: list[tuple[str, ...]] = [] if args.no_warm else warm.run(quick=args.quick)
    geodata_rows: list[tuple[str, str, str, str]] = [] if args.no_geodata else geodata.run(quick=args.quick)
    dns_rows: list[tuple[str, str, str, str]] = [] if args.no_dns else dnscache.run(quick=args.quick)
    upstream_rows: list[tuple[str, str, str, str]] = (
        [] if args.no_dns_upstream else dnsupstream.run(quick=args.quick)
    )
    selection_results, selection_table = selection.run(quick=args.quick) if args.selection else ({}, "")
    print("relay benchmarks:", file=sys.stderr, flush=True)
    report = relay.run(
        plan,
        only=set(args.only.split(",")) if args.only else None,
        shadowsocks=not args.no_ss,
        v2ray_rows=not args.no_v2ray,
    )
    if busy:
        report.problems.insert(0, busy)
    elapsed = time.monotonic() - started

    if kernel_rows:
        print(relay.format_table(["kernel", "honk", "baseline", "ratio"], [list(r) for r in kernel_rows]))
        print()
    if health_rows:
        print(
            relay.format_table(["health probes", "honk", "target", "status"], [list(r) for r in health_rows])
        )
        print()
    if group_rows:
        print(relay.format_table(["group plans", "honk", "target", "status"], [list(r) for r in group_rows]))
        print()
    if score_rows:
        print(relay.format_table(score.HEADER, [list(r) for r in score_rows]))
        print()
    if api_rows:
        print(relay.format_table(["control API", "honk", "target", "status"], [list(r) for r in api_rows]))
        print()
    if reload_rows:
        print(relay.format_table(["reload", "honk", "against", "status"], [list(r) for r in reload_rows]))
        print()
    if tproxy_rows:
        print(
            relay.format_table(["router path", "honk", "against", "status"], [list(r) for r in tproxy_rows])
        )
        print()
    if warm_rows:
        print(relay.format_table(warm.HEADER, [list(r) for r in warm_rows]))
        print()
    if geodata_rows:
        print(relay.format_table(["geodata", "honk", "target", "status"], [list(r) for r in geodata_rows]))
        print()
    if dns_rows:
        print(relay.format_table(["dns cache", "honk", "target", "status"], [list(r) for r in dns_rows]))
        print()
    if upstream_rows:
        print(
            relay.format_table(["dns upstream", "honk", "target", "status"], [list(r) for r in upstream_rows])
        )
        print()
    if selection_table:
        print(selection_table)
        print()
    subjects = report.measured()
    paired: dict[str, list[str]] = {}  # each sink family's heading -> its measured subjects
    for s in report.subjects:
        if s.sink is not None and s.name in subjects:
            paired.setdefault(s.sink.heading, []).append(s.name)
    plain = [name for name in subjects if not any(name in names for names in paired.values())]
    print(
        f"relay figures ({'quick' if args.quick else 'full'} run, median of {plan.reps}; "
        f"{os.cpu_count()} CPUs; MB = 10^6 bytes)"
    )
    if plain:
        print(relay.figures_table(plan, plain, report.metrics))
        print()
    for heading, names in paired.items():
        print(heading)
        print(relay.figures_table(plan, names, report.metrics))
        print()
    for s in report.subjects:
        line = f"  {s.name}: {s.note}" + (f" [{s.version}]" if s.version else "")
        print(line + (f" -- SKIPPED: {s.skip}" if s.skip else ""))
    for problem in report.problems:
        print(f"  problem: {problem}")
    if report.targets:
        print()
        print(relay.targets_table(report.targets))
        met = sum(t["status"] == "met" for t in report.targets)
        print(f"targets met: {met} of {len(report.targets)}")

    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    out = results / time.strftime("relay-%Y%m%d-%H%M%S.json")
    out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "quick": args.quick,
                "seconds": round(elapsed, 1),
                "machine": {
                    "cpus": os.cpu_count(),
                    "kernel": platform.release(),
                    "python": platform.python_version(),
                },
                "kernels": kernel_rows,
                "health": health_rows,
                "groups": group_rows,
                "score": score_rows,
                "api": api_rows,
                "reload": reload_rows,
                "tproxy": tproxy_rows,
                "warm": warm_rows,
                "geodata": geodata_rows,
                "dns": dns_rows,
                "dns_upstream": upstream_rows,
                "selection": selection_results,
                **report.as_json(),
            },
            indent=2,
        )
    )
    print(
        f"\n{len(subjects)} subjects in {elapsed:.0f}s; raw figures in {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the subjects were stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
