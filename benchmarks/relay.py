"""Relay throughput and connection rate through honk's mixed port, against direct loopback.

honk runs as its own process (``honk run``) on a generated config whose only
route is ``direct``; the load generator runs in this process. The baseline is
the same load sent straight to the origin server on loopback.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.proc import HonkProcess  # noqa: E402
from helpers.socks import socks5_connect  # noqa: E402

CHUNK = 256 * 1024
BULK_BYTES = 1 << 30  # 1 GiB per bulk run
CONNECTIONS = 2_000
CONCURRENCY = 16


class Sink:
    """Origin server: reads and discards (bulk), or answers 100 bytes then closes (rate)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "bulk":
                while conn.recv_into(bytearray(CHUNK)):
                    pass
                conn.sendall(b"k")
            else:
                data = conn.recv(100)
                conn.sendall(data)

    def close(self) -> None:
        self.listener.close()


def _connect(proxy, port):
    if proxy is None:
        return socket.create_connection(("127.0.0.1", port))
    sock, rep = socks5_connect(proxy, "127.0.0.1", port)
    if rep != 0:
        raise RuntimeError(f"SOCKS5 reply {rep}")
    return sock


def bulk(proxy, port: int, total: int) -> float:
    """MB/s for one stream uploading ``total`` bytes."""
    sock = _connect(proxy, port)
    buf = b"\0" * CHUNK
    start = time.perf_counter()
    sent = 0
    while sent < total:
        sent += sock.send(buf)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    elapsed = time.perf_counter() - start
    sock.close()
    return total / elapsed / 1e6


def rate(proxy, port: int, n: int) -> float:
    """Connections per second: connect, 100-byte echo, close, at CONCURRENCY."""

    def one(_: int) -> None:
        sock = _connect(proxy, port)
        sock.sendall(b"x" * 100)
        got = 0
        while got < 100:
            chunk = sock.recv(100)
            if not chunk:
                break
            got += len(chunk)
        sock.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, range(n)))
    return n / (time.perf_counter() - start)


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    total = BULK_BYTES // 8 if quick else BULK_BYTES
    conns = CONNECTIONS // 4 if quick else CONNECTIONS
    bulk_sink, rate_sink = Sink("bulk"), Sink("rate")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench.dae"
        cfg.write_text("global {\n    log_level: info\n    data_dir: ./var\n}\n"
                       "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
                       "routing {\n    fallback: direct\n}\n")
        with HonkProcess(cfg, env={"PYTHONWARNINGS": "ignore"}) as honk:
            proxy = honk.inbound()
            direct_bulk, honk_bulk = bulk(None, bulk_sink.port, total), bulk(proxy, bulk_sink.port, total)
            direct_rate, honk_rate = rate(None, rate_sink.port, conns), rate(proxy, rate_sink.port, conns)
    bulk_sink.close()
    rate_sink.close()
    return [
        ("bulk upload, 1 stream (MB/s), vs direct", f"{honk_bulk:,.0f}", f"{direct_bulk:,.0f}",
         f"{honk_bulk / direct_bulk:.2f}x"),
        (f"connect+echo+close, c={CONCURRENCY} (conn/s), vs direct", f"{honk_rate:,.0f}",
         f"{direct_rate:,.0f}", f"{honk_rate / direct_rate:.2f}x"),
    ]
