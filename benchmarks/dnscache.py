"""DNS: cached answers per second, the figure that says what a LAN's resolver load costs honk.

    .venv/bin/python -m benchmarks.dnscache [--quick]

Most of a router's DNS traffic is answered from the cache (the same few hundred names asked
again and again), so the cost of a hit bounds how many clients one core serves. Two rows:

* through :meth:`DnsService.handle` without sockets: parse, request rules, cache lookup,
  TTL rewrite, address learning, render, over 1,000 warmed names asked round-robin (the
  upstream is a stand-in that answers at once; it is asked only while warming);
* through the standalone UDP listener on loopback: a client process keeps a window of
  queries in flight and counts the answers; the figure includes the kernel's loopback and
  the client's share of the CPUs.

Each row runs four seconds (``--quick``: two), about ten in all.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

NAMES = 1_000  # distinct names in the cache, asked round-robin
ENTRY_SECONDS = 4.0  # seconds of queries through the service's entry (quick: half)
ENTRY_BATCH = 1_000  # queries between two looks at the clock
UDP_SECONDS = 4.0  # seconds of UDP load (quick: half)
UDP_WINDOW = 64  # queries the client keeps in flight
UDP_RECV_TIMEOUT = 0.2  # seconds the client waits for an answer before re-filling its window
ENTRY_TARGET = 20_000.0  # answers/s through the entry, one core
UDP_TARGET = 10_000.0  # answers/s through the UDP listener
ANSWER_TTL = 3600  # seconds: nothing expires during a run

# The UDP client, run in its own process so it does not share honk's GIL: it sends queries for
# names 0..n-1 round-robin with UDP_WINDOW in flight and prints the answers it got per second.
CLIENT = r"""
import socket, sys, time
import dns.message
host, port, names, seconds, window, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
queries = [dns.message.make_query(f"host{i}.bench.test", "A").to_wire() for i in range(names)]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect((host, port))
sock.settimeout(wait)
sent = got = 0
def send():
    global sent
    sock.send(queries[sent % names])
    sent += 1
for _ in range(window):
    send()
started = time.monotonic()
deadline = started + seconds
while time.monotonic() < deadline:
    try:
        sock.recv(4096)
    except TimeoutError:
        for _ in range(window):
            send()
        continue
    got += 1
    send()
print(got / (time.monotonic() - started))
"""


class _Upstream:
    """Stands for the upstream: an A record for any name, at once."""

    timeout = 5.0

    def __init__(self) -> None:
        self.calls = 0

    async def exchange(self, destination, query, wire, client, *, tcp=False):  # noqa: ANN001, ANN201
        import dns.message
        import dns.rrset

        self.calls += 1
        answer = dns.message.make_response(query)
        answer.answer.append(dns.rrset.from_text(query.question[0].name, ANSWER_TTL, "IN", "A", "10.0.0.1"))
        return answer


def _service():  # noqa: ANN202 - (DnsService, _Upstream)
    from honk.config.spec import DnsSpec, DnsUpstreamSpec
    from honk.core.clock import MonotonicClock
    from honk.dns.service import DnsService

    upstream = _Upstream()
    spec = DnsSpec(upstreams=(DnsUpstreamSpec("default", "udp", "192.0.2.53"),))
    return DnsService(spec, None, MonotonicClock(), exchanger=upstream), upstream  # type: ignore[arg-type]


def _queries() -> list[bytes]:
    import dns.message

    return [dns.message.make_query(f"host{i}.bench.test", "A").to_wire() for i in range(NAMES)]


async def _entry(seconds: float) -> tuple[float, int]:
    """(answers/s through DnsService.handle, upstream exchanges) over ``seconds`` of cached answers."""
    from honk.core.net import Address

    service, upstream = _service()
    queries = _queries()
    client = Address("192.168.1.10", 53000)
    for query in queries:  # warm: every name cached
        await service.handle(query, client, None)
    count = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for i in range(count, count + ENTRY_BATCH):
            await service.handle(queries[i % NAMES], client, None)
        count += ENTRY_BATCH
    assert service.stats.queries[("default", "cached")] == count, "every measured answer is a hit"
    return count / elapsed, upstream.calls


async def _udp(seconds: float) -> tuple[float, int]:
    """(answers/s through the UDP listener on loopback, cache hits while measuring)."""
    from honk.config.spec import DnsBindSpec
    from honk.core.clock import MonotonicClock
    from honk.dns.listener import DnsListener

    service, _ = _service()
    for query in _queries():
        await service.handle(query, None, None)
    listener = DnsListener(DnsBindSpec("127.0.0.1", 0, udp=True, tcp=False), service, MonotonicClock())
    await listener.start()
    try:
        assert listener.bound is not None
        hits = service.cache.hits
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, listener.bound.host, str(listener.bound.port), str(NAMES),
            str(seconds), str(UDP_WINDOW), str(UDP_RECV_TIMEOUT), stdout=subprocess.PIPE)
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"the UDP client failed ({process.returncode})")
        return float(out.decode().strip()), service.cache.hits - hits
    finally:
        await listener.aclose()


def figures(quick: bool = False) -> dict[str, float]:
    entry, exchanges = asyncio.run(_entry(ENTRY_SECONDS / 2 if quick else ENTRY_SECONDS))
    udp, hits = asyncio.run(_udp(UDP_SECONDS / 2 if quick else UDP_SECONDS))
    return {"entry_per_s": entry, "exchanges": exchanges, "udp_per_s": udp, "udp_hits": hits}


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    print("dns cache benchmark ...", file=sys.stderr, flush=True)
    f = figures(quick)
    return [
        (f"cached answers through DnsService.handle ({NAMES:,} names, no sockets)",
         f"{f['entry_per_s']:,.0f}/s", f">= {ENTRY_TARGET:,.0f}/s",
         "met" if f["entry_per_s"] >= ENTRY_TARGET else "NOT met"),
        (f"cached answers through the UDP listener on loopback ({UDP_WINDOW} in flight)",
         f"{f['udp_per_s']:,.0f}/s", f">= {UDP_TARGET:,.0f}/s",
         "met" if f["udp_per_s"] >= UDP_TARGET else "NOT met"),
    ]


def main() -> None:
    from benchmarks import relay

    rows = run(quick="--quick" in sys.argv)
    print(relay.format_table(["dns cache", "honk", "target", "status"], [list(r) for r in rows]))


if __name__ == "__main__":
    main()
