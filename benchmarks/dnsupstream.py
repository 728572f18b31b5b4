"""DNS upstreams: what a cache miss costs per transport, against loopback resolvers.

    .venv/bin/python -m benchmarks.dnsupstream [--quick]

A cache miss waits for an exchange with the upstream; on loopback the network costs
nothing, so what is left is the transport's own work on both ends. Per transport,
through :meth:`Exchanger.exchange` and the direct outbound (honk's whole miss path
below the cache: routing, the dial or the pooled connection, framing, TLS/HTTP/2/QUIC,
parsing the reply):

* ``warm``: the median of sequential queries for fresh names on the upstream's
  reused connection (plain UDP and TCP have none: a socket or a TCP connection each);
* ``first``: the first query, connection set-up included (TLS or QUIC handshake);
* ``added``: ``warm`` minus the median of the same query sent by a bare UDP socket
  to the same resolver: what the transport and honk add to the resolver's own answer.

udp, tcp, DoT and DoH go to Debian's dnsdist (``tests/helpers/dnsdist.py``) in front of a
Python responder; DoQ and DoH3 to an aioquic server in a thread of its own (Debian 12 has
no DoQ server), so their figures carry aioquic's Python server and are not comparable
with dnsdist's. About five seconds (``--quick``: about two).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

QUERIES = 400  # sequential misses per transport (quick: a quarter)
TARGET_ADDED_MS = 2.0  # what a warm encrypted miss may add on loopback, milliseconds
STEP = 5.0  # seconds any one query may take
TRANSPORTS = ("udp", "tcp", "tls", "https", "quic", "h3")


def _helpers() -> None:
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def _records(count: int) -> dict[str, str]:
    return {f"n{i}.bench.test": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}" for i in range(count)}


@contextlib.contextmanager
def _quic_server(records: dict[str, str], cert) -> Iterator[int]:  # noqa: ANN001 - a trustme leaf
    """The aioquic DoQ/DoH3 server on a loop in its own thread; yields its port."""
    from helpers.doq import doq_server

    loop = asyncio.new_event_loop()
    ready: asyncio.Future[int] = loop.create_future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with doq_server(records, cert) as peer:
            ready.set_result(peer.port)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="bench-doq", daemon=True)
    thread.start()
    port = asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(ready), STEP), loop).result()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(STEP)
        loop.close()


def _bare_udp(address: tuple[str, int], names: list[str]) -> list[float]:
    """Seconds per query of a bare UDP client asking ``names`` one after another."""
    import dns.message

    times = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(STEP)
        sock.connect(address)
        for name in names:
            wire = dns.message.make_query(name, "A").to_wire()
            started = time.perf_counter()
            sock.send(wire)
            sock.recv(4096)
            times.append(time.perf_counter() - started)
    return times


async def _through_honk(uri: str, names: list[str]) -> tuple[float, list[float]]:
    """(the first query's seconds, every later one's) through an Exchanger over the direct outbound."""
    import dns.message

    from honk.config.dns import parse_upstream_uri
    from honk.config.spec import Spec
    from honk.connection.dispatch import Dispatcher
    from honk.connection.plane import SystemResolver, build_plane
    from honk.connection.tracker import ConnectionTracker
    from honk.core.clock import MonotonicClock
    from honk.core.net import Address
    from honk.dns.upstream import Destination, Exchanger

    clock = MonotonicClock()
    spec = Spec()
    dispatcher = Dispatcher(
        build_plane(spec, clock, 1),
        ConnectionTracker(clock),
        clock,
        spec.global_,
        SystemResolver(clock, STEP),
    )
    exchanger = Exchanger(dispatcher, clock)
    protocol, host, port = parse_upstream_uri(uri)
    target = Destination("bench", protocol, Address(host, port))
    times = []
    try:
        for name in names:
            query = dns.message.make_query(name, "A")
            wire = query.to_wire()
            started = time.perf_counter()
            reply = await exchanger.exchange(target, query, wire, None)
            times.append(time.perf_counter() - started)
            assert reply.answer, f"{uri}: no answer for {name}"
    finally:
        await exchanger.aclose()
    return times[0], times[1:]


def figures(quick: bool = False) -> dict[str, dict[str, float]]:
    """Per transport: ``first``, ``warm`` and ``added`` in seconds (and the bare UDP baseline)."""
    _helpers()
    import trustme
    from helpers.dnsdist import Backend, dnsdist

    count = QUERIES // 4 if quick else QUERIES
    records = _records(count * (len(TRANSPORTS) + 1) + 1)
    names = iter(records)
    ca = trustme.CA()
    results: dict[str, dict[str, float]] = {}
    saved = os.environ.get("SSL_CERT_FILE")
    with (
        Backend(records) as backend,
        dnsdist(backend.address, ca=ca) as front,
        _quic_server(records, ca.issue_cert("127.0.0.1")) as quic_port,
    ):
        os.environ["SSL_CERT_FILE"] = str(front.ca_path)  # honk trusts the system store; this is it here
        try:
            baseline = statistics.median(
                _bare_udp((front.host, front.plain_port), [next(names) for _ in range(count)])
            )
            results["bare udp"] = {"first": 0.0, "warm": baseline, "added": 0.0}
            uris = {
                "udp": f"udp://{front.host}:{front.plain_port}",
                "tcp": f"tcp://{front.host}:{front.plain_port}",
                "tls": f"tls://{front.host}:{front.dot_port}",
                "https": f"https://{front.host}:{front.doh_port}/dns-query",
                "quic": f"quic://127.0.0.1:{quic_port}",
                "h3": f"h3://127.0.0.1:{quic_port}",
            }
            for kind in TRANSPORTS:
                first, warm = asyncio.run(_through_honk(uris[kind], [next(names) for _ in range(count)]))
                median = statistics.median(warm)
                results[kind] = {"first": first, "warm": median, "added": median - baseline}
        finally:
            if saved is None:
                os.environ.pop("SSL_CERT_FILE", None)
            else:
                os.environ["SSL_CERT_FILE"] = saved
    return results


LABELS = {
    "udp": "udp (dnsdist)",
    "tcp": "tcp (dnsdist)",
    "tls": "DoT (dnsdist)",
    "https": "DoH h2 (dnsdist)",
    "quic": "DoQ (aioquic server)",
    "h3": "DoH3 (aioquic server)",
}


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    print("dns upstream benchmark ...", file=sys.stderr, flush=True)
    f = figures(quick)
    base = f["bare udp"]["warm"]
    rows = [("cache miss, bare UDP client to dnsdist (the baseline)", f"{base * 1e3:.3f} ms", "", "")]
    for kind in TRANSPORTS:
        r = f[kind]
        encrypted = kind in ("tls", "https", "quic", "h3")
        ok = r["added"] * 1e3 <= TARGET_ADDED_MS
        rows.append(
            (
                f"cache miss via {LABELS[kind]}: warm (first {r['first'] * 1e3:.1f} ms)",
                f"{r['warm'] * 1e3:.3f} ms (+{r['added'] * 1e3:.3f})",
                f"+<= {TARGET_ADDED_MS:.1f} ms" if encrypted else "",
                ("met" if ok else "NOT met") if encrypted else "",
            )
        )
    return rows


def main() -> None:
    from benchmarks import relay

    rows = run(quick="--quick" in sys.argv)
    print(relay.format_table(["dns upstream", "honk", "target", "status"], [list(r) for r in rows]))


if __name__ == "__main__":
    main()
