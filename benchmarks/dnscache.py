"""DNS: cached answers per second, the figure that says what a LAN's resolver load costs honk.

    .venv/bin/python -m benchmarks.dnscache [--quick]

Most of a router's DNS traffic is answered from the cache (the same few hundred names asked
again and again), so the cost of a hit bounds how many clients one core serves. Each row sets
honk against a baseline measured in the same run, not against an invented target:

* through :meth:`DnsService.handle` without sockets: request rules, cache lookup, TTL
  rewrite, address learning and the answer's bytes, over 1,000 warmed names asked
  round-robin (the upstream is a stand-in that answers at once; it is asked only while
  warming), against the same service with its bytes path off: the dnspython path (parse
  the query, parse the cached reply, render) every hit took before;
* through the standalone UDP listener on loopback: a client process keeps a window of
  queries in flight and counts the answers, against dnsdist's packet cache answering the
  same client loop (Debian's dnsdist, in front of the tests' backend, warmed with the same
  names; the row says so when it is not installed or does not start), and against a
  trivial asyncio UDP responder sending canned answers: the ceiling of a Python service
  behind this client.

Each measurement runs four seconds (``--quick``: two), about twenty in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

NAMES = 1_000  # distinct names in the cache, asked round-robin
ENTRY_SECONDS = 4.0  # seconds of queries through the service's entry (quick: half)
ENTRY_BATCH = 1_000  # queries between two looks at the clock
UDP_SECONDS = 4.0  # seconds of UDP load (quick: half)
UDP_WINDOW = 64  # queries the client keeps in flight
UDP_RECV_TIMEOUT = 0.2  # seconds the client waits for an answer before re-filling its window
ANSWER_TTL = 3600  # seconds: nothing expires during a run
WARM_TIMEOUT = 2.0  # seconds a warming query may take (dnsdist asks its backend once per name)
DNSDIST_MAX_TTL = 86_400  # seconds dnsdist's packet cache keeps an answer

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


def _names() -> list[str]:
    return [f"host{i}.bench.test" for i in range(NAMES)]


def _queries() -> list[bytes]:
    import dns.message

    return [dns.message.make_query(name, "A").to_wire() for name in _names()]


async def _entry(seconds: float, *, from_bytes: bool = True) -> tuple[float, int]:
    """(answers/s through DnsService.handle, upstream exchanges) over ``seconds`` of cached answers;
    ``from_bytes`` False: with the bytes path off, every hit through dnspython."""
    from honk.core.net import Address

    service, upstream = _service()
    if not from_bytes:
        service._fast_hit = lambda *_args: None  # type: ignore[method-assign]
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


def _client(host: str, port: int, seconds: float) -> float:
    """Answers/s the UDP client process got from ``host:port`` over ``seconds``."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CLIENT,
            host,
            str(port),
            str(NAMES),
            str(seconds),
            str(UDP_WINDOW),
            str(UDP_RECV_TIMEOUT),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip())


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
        bound = listener.bound
        rate = await asyncio.get_running_loop().run_in_executor(
            None, _client, bound.host, bound.port, seconds
        )
        return rate, service.cache.hits - hits
    finally:
        await listener.aclose()


async def _trivial(seconds: float) -> float:
    """Answers/s of the same client against an asyncio UDP responder that sends a canned answer
    per name (its id patched): no rules, no cache, no learning."""
    import dns.message
    import dns.rrset

    canned: dict[bytes, bytes] = {}
    for query in _queries():
        message = dns.message.from_wire(query)
        reply = dns.message.make_response(message)
        reply.answer.append(dns.rrset.from_text(message.question[0].name, ANSWER_TTL, "IN", "A", "10.0.0.1"))
        canned[query[2:]] = reply.to_wire()[2:]

    class Responder(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            answer = canned.get(data[2:])
            if answer is not None:
                self.transport.sendto(data[:2] + answer, addr)  # type: ignore[attr-defined]

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(Responder, local_addr=("127.0.0.1", 0))
    try:
        host, port = transport.get_extra_info("sockname")[:2]
        return await loop.run_in_executor(None, _client, host, port, seconds)
    finally:
        transport.close()


@contextlib.contextmanager
def _dnsdist_cache() -> Iterator[tuple[str, int]]:
    """dnsdist on loopback with a packet cache, in front of the tests' backend (answers for
    every bench name), every name asked once so that the cache holds them all."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from helpers.dnsdist import Backend
    from helpers.peerservers import LOOPBACK, _serving, _workdir, udp_bound

    records = {name: "10.0.0.1" for name in _names()}
    with Backend(records) as backend, _workdir("dnsdist-cache") as tmp:
        conf = Path(tmp) / "dnsdist.conf"

        def launch(port: int) -> tuple[list[str], list]:  # noqa: ANN202 - (argv, probes)
            conf.write_text(
                'setSecurityPollSuffix("")\n'
                f'setLocal("{LOOPBACK}:{port}")\n'
                f'newServer({{address="{backend.address[0]}:{backend.address[1]}"}})\n'
                "getServer(0):setUp()\n"
                f"getPool(''):setCache(newPacketCache({NAMES * 2}, {{maxTTL={DNSDIST_MAX_TTL}}}))\n"
            )
            return [
                shutil.which("dnsdist") or "dnsdist",
                "--supervised",
                "--disable-syslog",
                "-C",
                str(conf),
            ], [udp_bound(port)]

        with _serving("dnsdist", Path(tmp), launch) as port:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((LOOPBACK, port))
                sock.settimeout(WARM_TIMEOUT)
                for query in _queries():
                    sock.send(query)
                    sock.recv(4096)
            asked = backend.queries
            yield LOOPBACK, port
            if backend.queries != asked:
                raise RuntimeError("dnsdist asked its backend while measuring: not every answer was cached")


def _dnsdist(seconds: float) -> float | None:
    """Answers/s of the same client against dnsdist's packet cache; None when dnsdist is not installed."""
    if shutil.which("dnsdist") is None:
        return None
    try:
        with _dnsdist_cache() as (host, port):
            return _client(host, port, seconds)
    except RuntimeError as exc:  # helpers.peerservers.PeerStartError: the row says so, the others still run
        print(f"dnsdist baseline unavailable: {exc}", file=sys.stderr)
        return None


def figures(quick: bool = False) -> dict[str, float | None]:
    seconds = ENTRY_SECONDS / 2 if quick else ENTRY_SECONDS
    entry, exchanges = asyncio.run(_entry(seconds))
    dnspython, _ = asyncio.run(_entry(seconds, from_bytes=False))
    udp_seconds = UDP_SECONDS / 2 if quick else UDP_SECONDS
    udp, hits = asyncio.run(_udp(udp_seconds))
    return {
        "entry_per_s": entry,
        "entry_dnspython_per_s": dnspython,
        "exchanges": exchanges,
        "udp_per_s": udp,
        "udp_hits": hits,
        "dnsdist_per_s": _dnsdist(udp_seconds),
        "trivial_per_s": asyncio.run(_trivial(udp_seconds)),
    }


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    print("dns cache benchmark ...", file=sys.stderr, flush=True)
    f = figures(quick)
    entry, udp, dnsdist, trivial = f["entry_per_s"], f["udp_per_s"], f["dnsdist_per_s"], f["trivial_per_s"]
    assert entry is not None and udp is not None and trivial is not None and f["entry_dnspython_per_s"]
    return [
        (
            f"cached answers through DnsService.handle ({NAMES:,} names, no sockets)",
            f"{entry:,.0f}/s",
            f"dnspython path {f['entry_dnspython_per_s']:,.0f}/s",
            f"{entry / f['entry_dnspython_per_s']:.1f}x it",
        ),
        (
            f"cached answers through the UDP listener on loopback ({UDP_WINDOW} in flight)",
            f"{udp:,.0f}/s",
            "dnsdist unavailable" if dnsdist is None else f"dnsdist packet cache {dnsdist:,.0f}/s",
            "" if dnsdist is None else f"{udp / dnsdist:.2f} of it",
        ),
        (
            "the same client against a trivial asyncio responder (canned answers)",
            f"{udp:,.0f}/s",
            f"ceiling {trivial:,.0f}/s",
            f"{udp / trivial:.2f} of it",
        ),
    ]


def main() -> None:
    from benchmarks import relay

    rows = run(quick="--quick" in sys.argv)
    print(
        relay.format_table(
            ["dns cache", "honk", "baseline (same run)", "honk / baseline"], [list(r) for r in rows]
        )
    )


if __name__ == "__main__":
    main()
