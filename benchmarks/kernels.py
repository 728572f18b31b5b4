"""The compiled ``_fast`` kernels against their pure-Python twins.

Each row times the same loop of calls on the compiled module (``honk`` column)
and on the twin (``baseline`` column); the ratio is compiled / twin. A kernel
whose compiled module is not built reports "not built" and the twin's rate.
The two ``tlsverify`` rows compare OpenSSL 3.0 with and without the built-in EC
key method (``prefer_builtin_keys``), each side in a process of its own: decoding
an EC server certificate, and full TLS 1.3 handshakes in memory (both ends' CPU).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

OPS = 2_000_000  # calls per row for the cheap kernels (a NodeId row: lookups); the Beta, cell and rank rows run OPS // 40
TLS_DECODES = 20_000  # EC certificate decodes per tlsverify side (a tenth with --quick)
TLS_HANDSHAKES = 2_000  # in-memory TLS 1.3 handshakes per tlsverify side (a tenth with --quick)


def _movavg_update(mod, n: int) -> None:
    update = mod.HalvingAverage().update
    for i in range(n):
        update(0.001 * (i & 255))


def _ema_update(mod, n: int) -> None:
    update = mod.Ema().update
    for i in range(n):
        update(0.001 * (i & 255))


def _weighted_mean_add(mod, n: int) -> None:
    add = mod.WeightedMean().add
    for i in range(n):
        add(0.001 * (i & 255))


def _ring_push(mod, n: int) -> None:
    push = mod.LatencyRing(10).push
    for i in range(n):
        push(float(i), 0.001 * (i & 255), (i & 15) == 0)


def _decay_add_value(mod, n: int) -> None:
    counter = mod.DecayedCounter(1800.0)
    add = counter.add
    value = counter.value
    for i in range(n):
        add(1.0, float(i))
        value(i + 0.5)


def _beta_lower_bound(mod, n: int) -> None:
    bound = mod.beta_lower_bound
    for i in range(n):
        bound(float(i % 97), float(i % 13), 0.95, 1.0, 1.0, 2.0)


def _cell_record_read(mod, n: int) -> None:
    from honk._fast.outcome import Outcome

    glob, family, exact = mod.EvidenceCell(1), mod.EvidenceCell(2), mod.EvidenceCell(3)
    cells = (glob, family, exact)
    read = mod.read_cells
    for i in range(n):  # a settled flow records into its three layers; the next rank re-reads them
        now = float(i)
        for cell in cells:
            cell.record(Outcome.FAILURE if i % 17 == 0 else Outcome.USEFUL, now)
        read(cells, now + 0.5)


def _rank_read_order(mod, n: int) -> None:
    from honk._fast.outcome import Outcome

    cell = importlib.import_module(mod.__name__.replace("rank_", "cell_"))
    members = [(i, ("m", f"node-{i}", True)) for i in range(8)]
    rows = ({}, {}, {})
    for i, (_, member) in enumerate(members):
        for layer, row in enumerate(rows):
            c = row[member[1]] = cell.EvidenceCell(i * 3 + layer)
            for k in range(20 + i):
                c.record(Outcome.USEFUL if k % 9 else Outcome.FAILURE, float(k))
    utilities = [None, 0.5, 0.7, None, 0.9, 0.2, None, 0.4]
    for _ in range(n):  # the standings are reused, so this is the read and the order, not the bounds
        nodes = [member[1] for _, member in members]
        out = mod.candidates(
            members, utilities, *(mod.aligned(nodes, row) for row in rows), None, None, None, 100.0, 120.0
        )
        mod.order(out, 0.05)


def _nodeid_lookup(mod, n: int) -> None:
    ids = [mod.NodeId(int=(i + 1) * 0x9E3779B97F4A7C15) for i in range(50)]
    row = {node: i for i, node in enumerate(ids)}  # a rank's row of cells by node
    get = row.get
    for _ in range(n // 50):
        for node in ids:
            get(node)


# (row label, kernel, loop over one implementation module, calls per OPS)
ROWS: tuple[tuple[str, str, Callable[[object, int], None], float], ...] = (
    ("movavg.HalvingAverage.update", "movavg", _movavg_update, 1.0),
    ("movavg.Ema.update", "movavg", _ema_update, 1.0),
    ("movavg.WeightedMean.add", "movavg", _weighted_mean_add, 1.0),
    ("ring.LatencyRing.push (cap 10)", "ring", _ring_push, 1.0),
    ("decay.DecayedCounter add+value", "decay", _decay_add_value, 0.5),
    ("beta.beta_lower_bound", "beta", _beta_lower_bound, 1 / 40),
    ("cell: 3 records + read_cells", "cell", _cell_record_read, 1 / 40),
    ("rank: candidates + order, 8 members", "rank", _rank_read_order, 1 / 40),
    ("nodeid: dict lookup by NodeId", "nodeid", _nodeid_lookup, 1.0),
)


# One process per side: tlsverify.prefer_builtin_keys() changes OpenSSL for the rest of a process.
# argv: "builtin" or "providers", the certificate decodes to time, the handshakes to time.
_TLS_KEYS = r"""
import ssl, sys, time, trustme
sys.path.insert(0, "tests")
from helpers.tls_rig import handshake  # a full handshake in memory
from honk._fast import tlsverify_c
side, decodes, handshakes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if side == "builtin":
    assert tlsverify_c.prefer_builtin_keys()
ca = trustme.CA()
leaf = ca.issue_cert("localhost")
der = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
assert tlsverify_c._builtin_key(der) is (side == "builtin")
start = time.process_time()
for _ in range(decodes):
    tlsverify_c._builtin_key(der)
decode_rate = decodes / (time.process_time() - start)
server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
leaf.configure_cert(server)
client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ca.configure_trust(client)
start = time.process_time()
for _ in range(handshakes):  # TLS 1.3: both ends' CPU
    handshake((client, server))
print(decode_rate, handshakes / (time.process_time() - start))
"""


def _tls_key_rows(quick: bool) -> list[tuple[str, str, str, str]]:
    """OpenSSL's built-in EC key method (``tlsverify.prefer_builtin_keys``) against the provider
    decoders: decoding an EC server certificate, and whole handshakes with one."""
    import subprocess
    import sys
    from pathlib import Path

    decodes, handshakes = (
        (TLS_DECODES // 10, TLS_HANDSHAKES // 10) if quick else (TLS_DECODES, TLS_HANDSHAKES)
    )
    rates = {}
    for side in ("builtin", "providers"):
        done = subprocess.run(
            [sys.executable, "-c", _TLS_KEYS, side, str(decodes), str(handshakes)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )  # the repository: tests/helpers
        if done.returncode != 0:
            return [("tlsverify: EC certificate keys (ops/s)", "failed", done.stderr.strip()[-60:], "-")]
        rates[side] = [float(x) for x in done.stdout.split()]
    (decode, shake), (decode0, shake0) = rates["builtin"], rates["providers"]
    return [
        (
            "tlsverify: decode an EC server certificate (ops/s), built-in key vs providers",
            f"{decode:,.0f}",
            f"{decode0:,.0f}",
            f"{decode / decode0:.2f}x",
        ),
        (
            "tlsverify: full TLS 1.3 handshake, EC certificate, both ends (ops/s), built-in vs providers",
            f"{shake:,.0f}",
            f"{shake0:,.0f}",
            f"{shake / shake0:.2f}x",
        ),
    ]


def _rate(loop: Callable[[object, int], None], mod, n: int) -> float:
    start = time.perf_counter()
    loop(mod, n)
    return n / (time.perf_counter() - start)


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    ops = OPS // 10 if quick else OPS
    rows = []
    for label, kernel, loop, share in ROWS:
        n = max(1, int(ops * share))
        twin = importlib.import_module(f"honk._fast.{kernel}_py")
        try:
            compiled_mod = importlib.import_module(f"honk._fast.{kernel}_c")
        except ImportError:
            rows.append((f"{label} (ops/s)", "not built", f"{_rate(loop, twin, n):,.0f}", "-"))
            continue
        compiled = _rate(loop, compiled_mod, n)
        python = _rate(loop, twin, n)
        rows.append(
            (f"{label} (ops/s), vs twin", f"{compiled:,.0f}", f"{python:,.0f}", f"{compiled / python:.2f}x")
        )
    try:
        importlib.import_module("honk._fast.tlsverify_c")
    except ImportError:
        rows.append(("tlsverify: EC certificate keys (ops/s)", "not built", "-", "-"))
    else:
        rows.extend(_tls_key_rows(quick))
    return rows


if __name__ == "__main__":
    for row in run():
        print("  ".join(row))
