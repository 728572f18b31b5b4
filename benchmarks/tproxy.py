"""Throughput through the router: client → honk (TPROXY, direct outbound) → server, against
the same path with plain forwarding.

    .venv/bin/python -m benchmarks.tproxy [--quick]

The test bed is the one the transparent-proxy tests use (``tests/helpers/testbed.py``: three
network namespaces joined by veth pairs, the router forwarding IPv4 and IPv6). The load is
iperf3 (Debian package ``iperf3``): its server in the server namespace, its client in the
client namespace sending to the server's address, one TCP stream, counted at the receiver.

* ``forwarding``: the router only routes (the baseline, measured in the same run);
* ``honk``: ``honk run`` in the router namespace with ``lan_interface`` set to the router's
  LAN side, so its nftables table diverts the stream to the transparent listener, which
  relays it to a direct dial of the original destination.

Each is measured ``reps`` times, alternating, and the medians are compared; the target is
honk ≥ 0.5 × forwarding. Every run checks who the server saw: the client for forwarding,
the router (honk's dial) through honk, so a run that bypassed honk cannot count. Needs root
(namespaces, nftables); without it the rows say why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.5  # issue 10: throughput through honk ≥ 0.5 × plain forwarding
TPROXY_PORT = 7893
IPERF_PORT = 5201
IPERF_SLACK = 15.0  # seconds past the run an iperf3 client may take before it is killed


def _helpers() -> None:
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def honk_config(lan: str, data_dir: str) -> str:
    return (
        f"global {{\n    data_dir: {data_dir}\n    lan_interface: {lan}\n    tproxy_port: {TPROXY_PORT}\n"
        "    tcp_check_url: ''\n    check_interval: 3600s\n    dial_mode: ip\n}\n"
        "routing {\n    fallback: direct\n}\n"
    )


def iperf(bed, seconds: float, server_log: Path, peer: str) -> float:  # noqa: ANN001 - a Testbed
    """Bits per second the server received from one stream, which ``peer`` must have sent."""
    done = bed.exec(
        bed.client,
        "iperf3",
        "-c",
        bed.server_ip.v4,
        "-p",
        str(IPERF_PORT),
        "-t",
        f"{seconds:g}",
        "-J",
        timeout=seconds + IPERF_SLACK,
    )
    seen = re.findall(r"Accepted connection from (\S+), port", server_log.read_text())
    if not seen or seen[-1] != peer:
        raise RuntimeError(f"the server saw {seen[-1] if seen else 'nobody'}, not {peer}")
    return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"])


def measure(reps: int, seconds: float) -> dict[str, list[float]]:
    _helpers()
    from helpers.proc import HonkProcess
    from helpers.testbed import testbed

    figures: dict[str, list[float]] = {"forwarding": [], "honk": []}
    with (
        testbed("the transparent throughput benchmark", "iperf3", "nft") as bed,
        tempfile.TemporaryDirectory(prefix="honk-bench-") as tmp,
    ):
        log = Path(tmp) / "iperf3.log"
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                bed.server,
                "iperf3",
                "-s",
                "-p",
                str(IPERF_PORT),
                "--logfile",
                str(log),
                "--forceflush",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client, router = bed.client_ip.v4, bed.router_wan_ip.v4
        try:
            config = Path(tmp) / "router.dae"
            config.write_text(honk_config(bed.lan, tmp))
            iperf(bed, 1.0, log, client)  # the server is up (a refused connect raises) and the path warm
            for _ in range(reps):
                figures["forwarding"].append(iperf(bed, seconds, log, client))
                with HonkProcess(config, netns=bed.router) as honk:
                    honk.wait_for(r"honk ready")
                    figures["honk"].append(iperf(bed, seconds, log, router))
        finally:
            server.kill()
            server.wait()
    return figures


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    missing = [tool for tool in ("iperf3", "nft", "ip") if shutil.which(tool) is None]
    if missing:
        return [
            ("transparent TCP throughput", "skipped", f"missing {', '.join(missing)} (make bench-peers)", "")
        ]
    try:
        figures = measure(2 if quick else 5, 2.0 if quick else 5.0)
    except BaseException as exc:  # noqa: BLE001 - pytest's skip (no root) and a failed run alike
        if isinstance(exc, KeyboardInterrupt):
            raise
        return [("transparent TCP throughput", "skipped", f"{type(exc).__name__}: {exc}"[:200], "")]
    plain = statistics.median(figures["forwarding"])
    honk = statistics.median(figures["honk"])
    ratio = honk / plain
    return [
        ("forwarding only (client → router → server)", f"{plain / 1e9:.2f} Gbit/s", "baseline", ""),
        (
            "through honk (TPROXY, direct)",
            f"{honk / 1e9:.2f} Gbit/s",
            f"{ratio:.2f}x of forwarding",
            "met" if ratio >= TARGET_RATIO else f"missed (target ≥ {TARGET_RATIO}x)",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tproxy")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with contextlib.suppress(BrokenPipeError):
        for row in run(quick=args.quick):
            print(" | ".join(row))


if __name__ == "__main__":
    main()
