"""Relay benchmarks: honk's mixed port against real peers, all driven by one native load tool.

Every subject runs as its own process on loopback and is measured in the same run:

* ``direct``: no proxy. The load tool connects to its own origin, so this row is
  the ceiling of the load tool itself (client and origin together).
* ``haproxy``: ``mode tcp`` with ``option splice-request``/``splice-response``/
  ``splice-auto``. haproxy does not speak SOCKS, so it forwards to the origin's
  port directly: its figures are the limit of a kernel-splicing forwarder, not
  of a SOCKS proxy (no handshake, no per-connection destination).
* ``socat``: a plain forwarder forking one process per connection (``-b 128 KiB``).
  Its idle-connection RSS is not measured: 1,000 forked processes share pages.
* ``pproxy``: the Python SOCKS5 peer, from ``benchmarks/.peers-venv`` where
  uvloop is installed too. pproxy calls ``uvloop.install()`` by itself whenever
  ``uvloop`` is importable and prints ``Using uvloop``; the harness checks that
  line and notes the row if it is missing.
* ``microsocks``: the C SOCKS5 server from Debian (one thread per connection).
* ``honk``: ``honk run`` on a generated ``.dae`` config (mixed port, ``fallback:
  direct``, ``log_level: warn``) with ``HONK_RELAY`` unset; when honk's relay reads
  ``HONK_RELAY``, an extra ``honk[copy]`` subject runs with ``HONK_RELAY=copy``.

Paired rows measure a protocol's own client against honk on the same server. Per
tag the harness starts one sink (a :class:`Sink`, which dials the origin) and two
subjects relay into it: ``<peer>:<tag>``, the protocol's SOCKS5 client, and
``honk[<family>]:<tag>``, honk's mixed port with the sink as its one node (a share
link) and ``routing { fallback: <node> }``. Bulk is measured on one stream up and
down: MB/s, the client's CPU seconds per GiB, and the sink's separately. Both clients
of a pair run at once, and their connection-rate runs alternate (ABBA: the pair takes
turns going first), so that drift on a shared host falls on both alike; as root the
kernel's TIME-WAIT sockets are capped during those runs (``tcp_max_tw_buckets``,
restored after), so that no run's connect() pays for the sockets the runs before it left.
``--only ss-local,honk[ss]`` selects every tag's row of each; ``honk[ss]:chacha``
just one.

* Shadowsocks, per cipher (aes-256-gcm as ``aes256``, chacha20-ietf-poly1305 as
  ``chacha``): an ``ss-server`` sink, ``ss-local:<tag>`` and ``honk[ss]:<tag>``.
  Bulk only; honk is held to ss-local's throughput and CPU per GiB.
* v2ray, per protocol (see :mod:`benchmarks.v2ray`; ``vmess`` over TCP with
  aes-128-gcm, ``trojan`` and ``vless`` over TLS): a v2ray server sink with a
  ``freedom`` outbound, ``v2ray:<tag>`` (a v2ray client) and ``honk[v2ray]:<tag>``.
  The connection rate is measured too; honk is held to the v2ray client's
  throughput and connection rate. The TLS sinks make a throwaway CA when they
  start: the v2ray client trusts it in its config, honk through ``SSL_CERT_FILE``.

The load tool (``loadgen.c``, built with ``cc -O2`` into ``benchmarks/.build/``)
holds both ends: an origin thread on a fixed loopback port and an epoll client
that speaks SOCKS5 no-auth CONNECT or connects directly. Modes: bulk (1 and 8
streams, up and down, MB/s counted at the receiving end), rate (connect +
handshake + 100-byte echo + close at concurrency 16 and 64), latency (1-byte
ping-pong on one connection) and idle (1,000 open connections). The subject's
CPU time (utime+stime of every process in its process group, plus reaped
children) and RSS (VmRSS) come from ``/proc``.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib.util
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from benchmarks import v2ray

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = HERE / ".build"
PEERS_VENV = HERE / ".peers-venv"
LOADGEN_SRC = HERE / "loadgen.c"
LOADGEN = BUILD / "loadgen"
GIB = 1 << 30
LOOPBACK = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# A pair's connection rates start from the same few TIME-WAIT sockets: tens of thousands left by
# the run before (each lasts 60 s on Linux) slow every connect() on loopback, and would make the
# second of a pair look slower than it is. Measured here: a v2ray client went from 1,775 to 785
# conn/s with 40,000 of them around.
TIME_WAIT_SETTLED = 2000  # TIME-WAIT sockets left before a rate run starts
TIME_WAIT_PATIENCE = 70.0  # seconds waited at most (longer than their 60 s lifetime)


@dataclass(frozen=True)
class Plan:
    """How much of each measurement to run."""

    reps: int
    bulk_warmup: float
    bulk_seconds: float
    rate_warmup: float
    rate_seconds: float
    latency_count: int
    idle_count: int
    streams: tuple[int, ...] = (1, 8)
    concurrency: tuple[int, ...] = (16, 64)
    loadgen_threads: int = min(os.cpu_count() or 1, 8)  # one client thread per core: measured best
    sink_streams: tuple[int, ...] = (1,)  # bulk streams measured through the subjects of a sink
    # rate runs per concurrency of each client of a sink, interleaved with its pair's: the pair's
    # ratio is a target, and one run's figure moves by 10-15 % on a shared 2-CPU host
    pair_rate_reps: int = 5


FULL = Plan(
    reps=3,
    bulk_warmup=0.3,
    bulk_seconds=2.0,
    rate_warmup=0.5,
    rate_seconds=3.0,
    latency_count=20_000,
    idle_count=1_000,
)
QUICK = Plan(
    reps=1,
    bulk_warmup=0.2,
    bulk_seconds=0.8,
    rate_warmup=0.3,
    rate_seconds=1.0,
    latency_count=5_000,
    idle_count=1_000,
    pair_rate_reps=1,
)


# ---------------------------------------------------------------- parsing and statistics


def parse_kv(line: str) -> dict[str, str]:
    """``key=value`` words of one load-tool line; other words are ignored."""
    out: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key:
            out[key] = value
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def parse_stat(text: str) -> dict[str, int | str]:
    """The fields of ``/proc/PID/stat`` the harness uses (``comm`` may hold spaces and parentheses)."""
    rest = text[text.rindex(")") + 2 :].split()
    return {
        "state": rest[0],
        "ppid": int(rest[1]),
        "pgrp": int(rest[2]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "cutime": int(rest[13]),
        "cstime": int(rest[14]),
    }


def parse_vmrss_kb(status: str) -> int:
    """VmRSS in kB from ``/proc/PID/status``; 0 for a zombie, which has none."""
    m = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.M)
    return int(m.group(1)) if m else 0


def _group_members(pgid: int) -> Iterator[tuple[int, dict[str, int | str]]]:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_stat(Path(entry.path, "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if stat["pgrp"] == pgid:
            yield int(entry.name), stat


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds of a process group: each member's own time plus that of the children it reaped."""
    ticks = sum(
        int(s["utime"]) + int(s["stime"]) + int(s["cutime"]) + int(s["cstime"])
        for _, s in _group_members(pgid)
    )
    return ticks / CLK_TCK


def group_rss_kb(pgid: int) -> int:
    total = 0
    for pid, _ in _group_members(pgid):
        with contextlib.suppress(OSError):
            total += parse_vmrss_kb(Path(f"/proc/{pid}/status").read_text())
    return total


# ---------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """``subject.metric OP factor x peer.peer_metric``, e.g. honk bulk >= 0.9 x haproxy's."""

    label: str
    metric: str
    op: str  # ">=" or "<="
    factor: float
    peer: str
    peer_metric: str = ""


def evaluate(target: Target, subject: str, metrics: dict[str, dict[str, float]]) -> dict[str, object]:
    value = metrics.get(subject, {}).get(target.metric)
    ref = metrics.get(target.peer, {}).get(target.peer_metric or target.metric)
    out: dict[str, object] = {
        "label": target.label,
        "subject": subject,
        "peer": target.peer,
        "value": value,
        "reference": ref,
        "op": target.op,
        "factor": target.factor,
    }
    if value is None or ref is None:
        return {**out, "ratio": None, "status": "n/a"}
    bound = target.factor * ref
    met = value >= bound if target.op == ">=" else value <= bound
    return {**out, "ratio": value / ref if ref else None, "status": "met" if met else "NOT met"}


def targets(plan: Plan) -> list[Target]:
    """The ratios the relay issue asks of honk, each against a peer measured in the same run."""
    out: list[Target] = []
    for n in plan.streams:
        for d in ("up", "down"):
            what = f"bulk {d}, {n} stream{'s' if n > 1 else ''}"
            out.append(Target(f"{what} >= 0.9 x haproxy", f"bulk_{d}_{n}", ">=", 0.9, "haproxy"))
            out.append(Target(f"{what} >= 2 x pproxy", f"bulk_{d}_{n}", ">=", 2.0, "pproxy"))
    for c in plan.concurrency:
        out.append(Target(f"conn/s c={c} >= 2 x pproxy", f"rate_{c}", ">=", 2.0, "pproxy"))
        out.append(Target(f"conn/s c={c} >= 1.0 x microsocks", f"rate_{c}", ">=", 1.0, "microsocks"))
    out.append(Target("added p50 latency <= 1.5 x haproxy", "added_p50_us", "<=", 1.5, "haproxy"))
    for n in plan.streams:
        for d in ("up", "down"):
            out.append(
                Target(
                    f"CPU/GiB bulk {d}, {n} stream{'s' if n > 1 else ''} <= 1.5 x haproxy",
                    f"cpu_{d}_{n}",
                    "<=",
                    1.5,
                    "haproxy",
                )
            )
    out.append(Target("RSS per idle connection <= pproxy", "idle_kb_per_conn", "<=", 1.0, "pproxy"))
    out.append(
        Target(
            "idle RSS, demo config <= 1.5 x pproxy idle RSS",
            "demo_rss_mb",
            "<=",
            1.5,
            "pproxy",
            "start_rss_mb",
        )
    )
    return out


SS_RATE_RATIO = 0.8  # the burst issue: Shadowsocks connections at least 0.8 x ss-local's rate
TLS_BULK_RATIO = 1.5  # the burst issue: bulk TLS (Trojan, VLESS) at least 1.5 x the v2ray client


def ss_targets(plan: Plan, tag: str) -> list[Target]:
    """What the Shadowsocks relay issues ask of ``honk[ss]:<tag>``, against ss-local on the same sink:
    at least its bulk throughput, at most its CPU per GiB, and 0.8 x its connection rate."""
    out: list[Target] = []
    peer = f"ss-local:{tag}"
    for n in plan.sink_streams:
        for d in ("up", "down"):
            what = f"bulk {d}, {n} stream{'s' if n > 1 else ''}"
            out.append(Target(f"{what} >= 1.0 x {peer}", f"bulk_{d}_{n}", ">=", 1.0, peer))
            out.append(Target(f"client CPU/GiB {what} <= 1.0 x {peer}", f"cpu_{d}_{n}", "<=", 1.0, peer))
    for c in plan.concurrency:
        out.append(
            Target(f"conn/s c={c} >= {SS_RATE_RATIO} x {peer}", f"rate_{c}", ">=", SS_RATE_RATIO, peer)
        )
    return out


def v2ray_targets(plan: Plan, tag: str) -> list[Target]:
    """What the v2ray relay issue asks of ``honk[v2ray]:<tag>``, against the v2ray client on the same
    sink: at least its bulk throughput and at least its connection rate."""
    out: list[Target] = []
    peer = f"v2ray:{tag}"
    ratio = TLS_BULK_RATIO if v2ray.uses_tls(tag) else 1.0  # TLS records move with no Python in the byte path
    for n in plan.sink_streams:
        for d in ("up", "down"):
            out.append(
                Target(
                    f"bulk {d}, {n} stream{'s' if n > 1 else ''} >= {ratio} x {peer}",
                    f"bulk_{d}_{n}",
                    ">=",
                    ratio,
                    peer,
                )
            )
    for c in plan.concurrency:
        out.append(Target(f"conn/s c={c} >= 1.0 x {peer}", f"rate_{c}", ">=", 1.0, peer))
    return out


# ---------------------------------------------------------------- table


def metric_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(key, label, format) of the figures table, in print order."""
    rows: list[tuple[str, str, str]] = []
    for n in plan.streams:
        for d in ("up", "down"):
            rows.append((f"bulk_{d}_{n}", f"bulk {d}, {n} stream{'s' if n > 1 else ''} (MB/s)", "{:,.0f}"))
    for n in plan.streams:
        for d in ("up", "down"):
            rows.append((f"cpu_{d}_{n}", f"CPU, bulk {d} {n} (s/GiB)", "{:.2f}"))
    for n in plan.sink_streams:
        for d in ("up", "down"):
            rows.append((f"sink_cpu_{d}_{n}", f"sink CPU, bulk {d} {n} (s/GiB)", "{:.2f}"))
    for c in plan.concurrency:
        rows.append((f"rate_{c}", f"connect+echo+close c={c} (conn/s)", "{:,.0f}"))
        rows.append((f"rate_{c}_errors", f"  errors, c={c}", "{:,.0f}"))
        rows.append((f"rate_{c}_cpu_ms", f"  CPU per conn, c={c} (ms)", "{:.2f}"))
        rows.append((f"rate_{c}_sink_cpu_ms", f"  sink CPU per conn, c={c} (ms)", "{:.2f}"))
        rows.append((f"rate_{c}_of_floor", f"  share of the OpenSSL floor, c={c}", "{:.2f}"))
    rows += [
        ("lat_p50_us", "round trip p50 (us)", "{:.1f}"),
        ("lat_p99_us", "round trip p99 (us)", "{:.1f}"),
        ("added_p50_us", "added p50 vs direct (us)", "{:+.1f}"),
        ("start_rss_mb", "RSS after start (MB)", "{:.1f}"),
        ("idle_kb_per_conn", f"RSS per idle conn, {plan.idle_count:,} open (KB)", "{:.1f}"),
        ("demo_rss_mb", "RSS after start, demo config (MB)", "{:.1f}"),
        ("loadgen_cores_bulk", "load tool CPU, bulk (cores busy)", "{:.2f}"),
        ("loadgen_cores_rate", "load tool CPU, conn rate (cores busy)", "{:.2f}"),
    ]
    return rows


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """First column left-aligned, the others right-aligned; a dashed rule under the header."""
    width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, width, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in width]), *(line(r) for r in rows)])


def figures_table(plan: Plan, subjects: list[str], metrics: dict[str, dict[str, float]]) -> str:
    rows = []
    for key, label, fmt in metric_rows(plan):
        values = [metrics.get(s, {}).get(key) for s in subjects]
        if all(v is None for v in values):
            continue
        rows.append([label, *("-" if v is None else fmt.format(v) for v in values)])
    return format_table(["metric", *subjects], rows)


def targets_table(results: list[dict[str, object]]) -> str:
    def num(v: object) -> str:
        if not isinstance(v, float | int):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"

    rows = []
    for r in results:
        ratio = r["ratio"]
        rows.append(
            [
                f"{r['subject']}: {r['label']}",
                num(r["value"]),
                num(r["reference"]),
                "-" if not isinstance(ratio, float) else f"{ratio:.2f}x",
                str(r["status"]),
            ]
        )
    return format_table(["target", "honk", "peer", "ratio", "status"], rows)


# ---------------------------------------------------------------- processes

_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def raise_fd_limit() -> None:
    """1,000 idle proxied connections need ~2,000 descriptors in the subject; children inherit this."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class SubjectFailed(RuntimeError):
    pass


# what ends one subject's measurement (recorded as a problem) while the others go on: it failed
# to start, the load tool failed or timed out, or its output lacked a figure
MEASURE_FAILURES = (
    SubjectFailed,
    RuntimeError,
    subprocess.TimeoutExpired,
    KeyError,
    ValueError,
    ZeroDivisionError,
)


class Running:
    """One subject process in its own session; :meth:`stop` kills its whole process group."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.pgid = self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_port(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SubjectFailed(f"exited with {self.proc.returncode}: {self.log_text()[-800:]}")
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
                return
            time.sleep(0.05)
        raise SubjectFailed(f"port {port} not accepting after {timeout}s: {self.log_text()[-800:]}")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        self._log.close()


# ---------------------------------------------------------------- subjects


@dataclass
class Subject:
    name: str
    kind: str  # "direct", "forward" (no SOCKS), "socks" or "floor" (the load tool speaks the sink's protocol)
    note: str = ""
    skip: str = ""
    version: str = ""
    env: dict[str, str] = field(default_factory=dict)
    build: Callable[[int, int, Path], list[str]] | None = None  # (port, origin_port, workdir) -> argv
    sink: Sink | None = None  # a pair's subjects: the server they relay into (see measure_sink_subjects)

    def selected(self, only: set[str]) -> bool:
        """Named in ``--only``, by its full name or the part before ``:`` (``honk[ss]`` = every cipher)."""
        return self.name in only or self.name.partition(":")[0] in only


# Shadowsocks ciphers measured (the short tag names the rows) and the sinks' password.
SS_CIPHERS = {"aes256": "aes-256-gcm", "chacha": "chacha20-ietf-poly1305"}
SS_PASSWORD = "honk-bench"


@dataclass
class Sink:
    """One server a pair of subjects relays into, started once for both; it dials the origin.

    The pair is ``<peer>:<tag>`` (the protocol's own client) and ``honk[<family>]:<tag>``
    (honk's mixed port with the node :meth:`link`). Both get :meth:`env` on top of
    their own environment.
    """

    family: ClassVar[str]  # "ss" or "v2ray": the ``honk[...]`` name and the --no-* switch
    peer: ClassVar[str]  # the reference client's subject name before ``:``
    server: ClassVar[str]  # the sink program, for messages
    heading: ClassVar[str]  # printed above the family's figures
    rate: ClassVar[bool] = False  # connection rate measured too, not only bulk

    tag: str
    port: int
    running: Running | None = field(default=None, init=False)
    argv: list[str] = field(default_factory=list, init=False)  # how it was started (restart_sink)
    workdir: Path | None = field(default=None, init=False)

    @property
    def fresh_for_rates(self) -> bool:
        """Whether each subject's rate runs get a new sink process (see :func:`restart_sink`)."""
        return False

    def command(self, wd: Path) -> list[str]:
        """Write the sink's files into ``wd``; its argv."""
        raise NotImplementedError

    def client_command(self, port: int, wd: Path) -> list[str]:
        """The reference client with its SOCKS5 port on ``port``."""
        raise NotImplementedError

    def link(self) -> str:
        """The node link honk is given for this sink."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}

    def targets(self, plan: Plan) -> list[Target]:
        raise NotImplementedError


@dataclass
class SsSink(Sink):
    """An ``ss-server`` with one cipher; ``ss-local`` is the reference client."""

    family: ClassVar[str] = "ss"
    peer: ClassVar[str] = "ss-local"
    server: ClassVar[str] = "ss-server"
    heading: ClassVar[str] = (
        "Shadowsocks (each pair into the same ss-server sink; CPU = the client's, sink CPU = ss-server's)"
    )

    rate: ClassVar[bool] = True  # ss-local's connection rate is a target too

    method: str = ""

    def command(self, wd: Path) -> list[str]:
        return [
            _which("ss-server") or "ss-server",
            "-s",
            LOOPBACK,
            "-p",
            str(self.port),
            "-k",
            SS_PASSWORD,
            "-m",
            self.method,
        ]

    def client_command(self, port: int, wd: Path) -> list[str]:
        return [
            _which("ss-local") or "ss-local",
            "-s",
            LOOPBACK,
            "-p",
            str(self.port),
            "-b",
            LOOPBACK,
            "-l",
            str(port),
            "-k",
            SS_PASSWORD,
            "-m",
            self.method,
        ]

    def link(self) -> str:
        """SIP002: the userinfo is ``method:password`` in URL-safe base64."""
        userinfo = base64.urlsafe_b64encode(f"{self.method}:{SS_PASSWORD}".encode()).decode().rstrip("=")
        return f"ss://{userinfo}@{LOOPBACK}:{self.port}#sink"

    def targets(self, plan: Plan) -> list[Target]:
        return ss_targets(plan, self.tag)


@dataclass
class V2raySink(Sink):
    """A v2ray server for one tag of :mod:`benchmarks.v2ray`; a v2ray client is the reference.

    Over TLS the sink makes a throwaway CA and a certificate for localhost when it starts
    (:attr:`ca_file`); the v2ray client trusts it in its config, honk through ``SSL_CERT_FILE``.
    """

    family: ClassVar[str] = "v2ray"
    peer: ClassVar[str] = "v2ray"
    server: ClassVar[str] = "v2ray server"
    heading: ClassVar[str] = (
        "VMess, Trojan and VLESS (each pair into the same v2ray server sink; "
        "CPU = the client's, sink CPU = the v2ray server's)"
    )
    rate: ClassVar[bool] = True

    secret: str = ""  # the user id for VMess and VLESS, the password for Trojan
    ca_file: str = field(default="", init=False)

    def command(self, wd: Path) -> list[str]:
        cert = key = ""
        if v2ray.uses_tls(self.tag):
            import trustme  # a test dependency of honk; only the TLS sinks need it

            ca = trustme.CA()
            leaf = ca.issue_cert(*v2ray.TLS_NAMES)
            cert, key, self.ca_file = str(wd / "cert.pem"), str(wd / "key.pem"), str(wd / "ca.pem")
            leaf.cert_chain_pems[0].write_to_path(cert)
            leaf.private_key_pem.write_to_path(key)
            ca.cert_pem.write_to_path(self.ca_file)
        config = v2ray.server_config(self.tag, self.port, self.secret, cert, key)
        return self._argv(wd / "server.json", config)

    def client_command(self, port: int, wd: Path) -> list[str]:
        return self._argv(
            wd / "client.json", v2ray.client_config(self.tag, port, self.port, self.secret, self.ca_file)
        )

    @staticmethod
    def _argv(path: Path, config: dict[str, object]) -> list[str]:
        # v2ray 4.x stays in the foreground on -config and logs to stdout, which goes to the log file.
        return [_which("v2ray") or "v2ray", "-config", _write(path, json.dumps(config, indent=1))]

    def link(self) -> str:
        return v2ray.share_link(self.tag, self.port, self.secret)

    def env(self) -> dict[str, str]:
        return {"SSL_CERT_FILE": self.ca_file} if self.ca_file else {}

    @property
    def fresh_for_rates(self) -> bool:
        # after one subject's tens of thousands of connections a shared v2ray VMess server served
        # the next at 0.6 x, whichever client came second (most likely its replay protection)
        return self.tag == "vmess"

    def targets(self, plan: Plan) -> list[Target]:
        return v2ray_targets(plan, self.tag)


def haproxy_config(port: int, origin_port: int) -> str:
    return f"""global
    maxconn 4000

defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option splice-request
    option splice-response
    option splice-auto

frontend fe
    bind {LOOPBACK}:{port}
    default_backend be

backend be
    server origin {LOOPBACK}:{origin_port}
"""


def honk_config(port: int) -> str:
    return (
        "global {\n    log_level: warn\n    data_dir: ./var\n}\n\n"
        f"inbound {{\n    lan: 'mixed://{LOOPBACK}:{port}'\n}}\n\n"
        "routing {\n    fallback: direct\n}\n"
    )


def honk_node_config(port: int, link: str) -> str:
    """honk's mixed port routing everything to one node given by its share ``link``."""
    return (
        "global {\n    log_level: warn\n    data_dir: ./var\n}\n\n"
        f"inbound {{\n    lan: 'mixed://{LOOPBACK}:{port}'\n}}\n\n"
        f"node {{\n    sink: '{link}'\n}}\n\n"
        "routing {\n    fallback: sink\n}\n"
    )


def demo_config(text: str, lan_port: int, api_port: int) -> str:
    """``configs/demo.toml`` on free ports, with its state in the working directory."""
    subs = [
        (r"mixed://127\.0\.0\.1:\d+", f"mixed://{LOOPBACK}:{lan_port}"),
        (r'(external_controller\s*=\s*")[^"]*(")', rf"\g<1>{LOOPBACK}:{api_port}\g<2>"),
        (r'(data_dir\s*=\s*")[^"]*(")', r"\g<1>./var\g<2>"),
    ]
    for rx, repl in subs:
        text, n = re.subn(rx, repl, text)
        if n != 1:
            raise ValueError(f"demo config: expected one match of {rx!r}, found {n}")
    return text


def honk_engines() -> list[str]:
    """Extra ``HONK_RELAY`` values to measure, if honk's relay reads that variable yet."""
    for path in sorted((ROOT / "honk" / "relay").glob("*.py")):
        with contextlib.suppress(OSError):
            if "HONK_RELAY" in path.read_text():
                return ["copy"]
    return []


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def subjects() -> list[Subject]:
    out = [Subject("direct", "direct", note="no proxy: the load tool's own ceiling")]

    haproxy = _which("haproxy")
    out.append(
        Subject(
            "haproxy",
            "forward",
            version=_first_line([haproxy, "-v"]) if haproxy else "",
            note="mode tcp, forced splice-request/-response/-auto, forwards to the origin port (no SOCKS): "
            "the forwarder limit",
            skip="" if haproxy else "haproxy not installed (make bench-peers)",
            build=lambda port, origin, wd: [
                haproxy or "haproxy",
                "-db",
                "-f",
                _write(wd / "haproxy.cfg", haproxy_config(port, origin)),
            ],
        )
    )

    socat = _which("socat")
    out.append(
        Subject(
            "socat",
            "forward",
            version=_first_line(["dpkg-query", "-W", "-f=${Version}", "socat"]),
            note="fork per connection, -b 131072, forwards to the origin port (no SOCKS)",
            skip="" if socat else "socat not installed (make bench-peers)",
            build=lambda port, origin, wd: [
                socat or "socat",
                "-b",
                "131072",
                f"TCP-LISTEN:{port},bind={LOOPBACK},reuseaddr,fork,backlog=1024",
                f"TCP:{LOOPBACK}:{origin}",
            ],
        )
    )

    pproxy = PEERS_VENV / "bin" / "pproxy"
    peers_python = PEERS_VENV / "bin" / "python"
    version = ""
    if peers_python.exists():
        version = _first_line(
            [
                str(peers_python),
                "-c",
                "import asyncio, uvloop, importlib.metadata as m; "
                "uvloop.install(); asyncio.get_event_loop(); "  # what pproxy's main() does
                "print('pproxy', m.version('pproxy'), 'uvloop', uvloop.__version__)",
            ]
        )
    ok = pproxy.exists() and version.startswith("pproxy")
    out.append(
        Subject(
            "pproxy",
            "socks",
            version=version,
            env={"PYTHONUNBUFFERED": "1"},
            note="SOCKS5 on uvloop (pproxy installs it itself when importable)",
            skip="" if ok else f"pproxy on uvloop does not start from {PEERS_VENV} (make bench-peers)",
            build=lambda port, origin, wd: [str(pproxy), "-l", f"socks5://{LOOPBACK}:{port}"],
        )
    )

    microsocks = _which("microsocks")
    out.append(
        Subject(
            "microsocks",
            "socks",
            version=_first_line(["dpkg-query", "-W", "-f=${Version}", "microsocks"]),
            note="SOCKS5, thread per connection",
            skip="" if microsocks else "microsocks not installed (make bench-peers)",
            build=lambda port, origin, wd: [microsocks or "microsocks", "-i", LOOPBACK, "-p", str(port)],
        )
    )

    def honk_cmd(port: int, origin: int, wd: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "honk.cli.daemon",
            "run",
            "-c",
            _write(wd / "bench.dae", honk_config(port)),
            "--pid-file",
            str(wd / "honk.pid"),
        ]

    out.append(Subject("honk", "socks", note="mixed port -> direct, HONK_RELAY unset", build=honk_cmd))
    for engine in honk_engines():
        out.append(
            Subject(
                f"honk[{engine}]",
                "socks",
                note=f"HONK_RELAY={engine}",
                env={"HONK_RELAY": engine},
                build=honk_cmd,
            )
        )
    out += ss_subjects() + v2ray_subjects()
    return out


def sink_subjects(sink: Sink, skip: str, version: str, peer_note: str, honk_note: str) -> list[Subject]:
    """The pair relaying into ``sink``: ``<peer>:<tag>`` and ``honk[<family>]:<tag>``."""

    def peer_cmd(port: int, origin: int, wd: Path) -> list[str]:
        return sink.client_command(port, wd)

    def honk_cmd(port: int, origin: int, wd: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "honk.cli.daemon",
            "run",
            "-c",
            _write(wd / "bench.dae", honk_node_config(port, sink.link())),
            "--pid-file",
            str(wd / "honk.pid"),
        ]

    return [
        Subject(
            f"{sink.peer}:{sink.tag}",
            "socks",
            version=version,
            skip=skip,
            sink=sink,
            build=peer_cmd,
            note=peer_note,
        ),
        Subject(
            f"honk[{sink.family}]:{sink.tag}",
            "socks",
            skip=skip,
            sink=sink,
            build=honk_cmd,
            note=f"{honk_note}, HONK_RELAY unset",
        ),
    ]


def ss_subjects() -> list[Subject]:
    """``ss-local:<tag>`` and ``honk[ss]:<tag>`` per cipher, each pair sharing one sink."""
    version = _first_line(["dpkg-query", "-W", "-f=${Version}", "shadowsocks-libev"])
    missing = (
        ""
        if _which("ss-local") and _which("ss-server")
        else "shadowsocks-libev not installed (make bench-peers)"
    )
    out: list[Subject] = []
    for tag, method in SS_CIPHERS.items():
        sink = SsSink(tag, free_port(), method=method)
        out += sink_subjects(
            sink,
            missing,
            version,
            f"shadowsocks-libev ss-local ({method}) -> the {tag} ss-server sink",
            f"mixed port -> ss:// node ({method}) -> the {tag} ss-server sink",
        )
    return out


def v2ray_subjects() -> list[Subject]:
    """``v2ray:<tag>`` and ``honk[v2ray]:<tag>`` for VMess, Trojan and VLESS; a v2ray server per pair."""
    binary = _which("v2ray")
    version = _first_line([binary, "-version"]) if binary else ""
    missing = "" if binary else "v2ray not installed (make bench-peers)"
    has_trustme = importlib.util.find_spec("trustme") is not None
    out: list[Subject] = []
    for tag in v2ray.TAGS:
        secret = uuid.uuid4().hex if v2ray.protocol(tag) == "trojan" else str(uuid.uuid4())
        sink = V2raySink(tag, free_port(), secret=secret)
        what = v2ray.describe(tag)
        skip = missing or (
            ""
            if has_trustme or not v2ray.uses_tls(tag)
            else "trustme (for the TLS certificate) not importable; make venv"
        )
        out += sink_subjects(
            sink,
            skip,
            version,
            f"v2ray client, SOCKS5 -> {what} -> the {tag} v2ray server sink",
            f"mixed port -> {v2ray.protocol(tag)}:// node ({what}) -> the {tag} v2ray server sink",
        )
        if tag == "trojan":
            out.append(
                Subject(
                    f"{FLOOR_PEER}:{tag}",
                    "floor",
                    skip=skip,
                    sink=sink,
                    version=_first_line(["openssl", "version"]),
                    note=f"the load tool itself as a Trojan client on OpenSSL, straight into the {tag} "
                    "sink (no proxy): the floor of TLS connection cost on this machine",
                )
            )
    return out


FLOOR_PEER = "openssl"  # the floor subject's name before ``:`` (see measure_floor_subject)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def subject_env(subject: Subject) -> dict[str, str]:
    """The harness's environment less ``HONK_RELAY`` (default engine), plus the sink's and the subject's."""
    env = {k: v for k, v in os.environ.items() if k != "HONK_RELAY"}
    return {**env, **(subject.sink.env() if subject.sink is not None else {}), **subject.env}


# ---------------------------------------------------------------- load tool


def build_loadgen() -> Path:
    """Compile ``loadgen.c`` unless the binary is newer than the source."""
    if LOADGEN.exists() and LOADGEN.stat().st_mtime >= LOADGEN_SRC.stat().st_mtime:
        return LOADGEN
    cc = os.environ.get("CC", "cc")
    BUILD.mkdir(exist_ok=True)
    subprocess.run(
        [
            cc,
            "-O2",
            "-Wall",
            "-Wextra",
            "-pthread",
            "-o",
            str(LOADGEN),
            str(LOADGEN_SRC),
            "-lssl",
            "-lcrypto",
        ],
        check=True,
    )  # OpenSSL for the Trojan floor (libssl-dev: make build)
    return LOADGEN


class LoadGen:
    def __init__(self, path: Path, origin_port: int, plan: Plan) -> None:
        self.path, self.origin_port, self.plan = path, origin_port, plan

    def argv(self, mode: str, subject: Subject, port: int | None, *extra: str) -> list[str]:
        argv = [str(self.path), mode, "--origin-port", str(self.origin_port)]
        if subject.kind == "floor":  # the load tool is the Trojan client, straight into the sink
            sink = subject.sink
            assert isinstance(sink, V2raySink)
            return argv + [
                "--target",
                f"{LOOPBACK}:{sink.port}",
                "--trojan",
                sink.secret,
                "--tls-ca",
                sink.ca_file,
                "--sni",
                v2ray.SERVER_NAME,
                *extra,
            ]
        if subject.kind != "direct":
            argv += ["--target", f"{LOOPBACK}:{port}"]
        if subject.kind == "socks":
            argv.append("--socks")
        return argv + list(extra)

    def run(self, argv: list[str], timeout: float) -> dict[str, str]:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        lines = out.stdout.strip().splitlines()
        kv = parse_kv(lines[-1]) if lines else {}
        if out.returncode != 0 or "error" in kv or not kv:
            raise RuntimeError(
                f"loadgen {argv[1]} failed ({out.returncode}): {out.stdout.strip()} {out.stderr.strip()}"
            )
        return kv

    def bulk(self, subject: Subject, port: int | None, streams: int, direction: str) -> dict[str, str]:
        p = self.plan
        argv = self.argv(
            "bulk",
            subject,
            port,
            "--streams",
            str(streams),
            "--dir",
            direction,
            "--warmup",
            str(p.bulk_warmup),
            "--duration",
            str(p.bulk_seconds),
            "--threads",
            str(p.loadgen_threads),
        )
        return self.run(argv, timeout=p.bulk_warmup + p.bulk_seconds + 30)

    def rate(self, subject: Subject, port: int | None, concurrency: int) -> dict[str, str]:
        p = self.plan
        argv = self.argv(
            "rate",
            subject,
            port,
            "--concurrency",
            str(concurrency),
            "--warmup",
            str(p.rate_warmup),
            "--duration",
            str(p.rate_seconds),
            "--threads",
            str(p.loadgen_threads),
        )
        return self.run(argv, timeout=p.rate_warmup + p.rate_seconds + 30)

    def latency(self, subject: Subject, port: int | None) -> dict[str, str]:
        argv = self.argv("latency", subject, port, "--count", str(self.plan.latency_count), "--size", "1")
        return self.run(argv, timeout=60)

    @contextlib.contextmanager
    def idle(self, subject: Subject, port: int | None) -> Iterator[dict[str, str]]:
        """Hold ``idle_count`` open connections through the subject for the body of the ``with``."""
        argv = self.argv("idle", subject, port, "--count", str(self.plan.idle_count))
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdin is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            kv = parse_kv(line)
            if not line.startswith("ready") or "error" in kv:
                raise RuntimeError(
                    f"loadgen idle failed: {line.strip()} {proc.stderr.read() if proc.poll() else ''}"
                )
            yield kv
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------- measurement


@dataclass
class Report:
    plan: Plan
    subjects: list[Subject]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    runs: list[dict[str, object]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    targets: list[dict[str, object]] = field(default_factory=list)

    def measured(self) -> list[str]:
        return [s.name for s in self.subjects if not s.skip and s.name in self.metrics]

    def as_json(self) -> dict[str, object]:
        return {
            "plan": asdict(self.plan),
            "subjects": [
                {
                    "name": s.name,
                    "kind": s.kind,
                    "note": s.note,
                    "skip": s.skip,
                    "version": s.version,
                    "env": s.env,
                }
                for s in self.subjects
            ],
            "metrics": self.metrics,
            "runs": self.runs,
            "problems": self.problems,
            "targets": self.targets,
        }


def busy_warning(loadavg: str, cpus: int) -> str:
    """A warning when ``/proc/loadavg`` shows other work competing for the CPUs, else ''."""
    one_minute = float(loadavg.split()[0])
    if one_minute > 0.5 * cpus:
        return (
            f"load average {one_minute:.2f} on {cpus} CPUs before the run: other work competes "
            "with the subjects, figures are noisy"
        )
    return ""


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_subject(lg: LoadGen, subject: Subject, report: Report, workdir: Path) -> None:
    plan, m = report.plan, report.metrics.setdefault(subject.name, {})
    running: Running | None = None
    port: int | None = None
    try:
        if subject.build is not None:
            client = start_client(subject, lg, workdir)
            running, port = client.running, client.port
            time.sleep(1.0)  # let it settle before the idle RSS
            m["start_rss_mb"] = group_rss_kb(running.pgid) / 1024
            if subject.name == "pproxy":
                uvloop = "Using uvloop" in running.log_text()
                subject.note += (
                    "; it printed 'Using uvloop'" if uvloop else "; WARNING: it did not print 'Using uvloop'"
                )
        pgid = running.pgid if running else None

        def record(kind: str, **data: object) -> None:
            report.runs.append({"subject": subject.name, "kind": kind, **data})

        if pgid is not None and subject.name != "socat":
            before = group_rss_kb(pgid)
            with lg.idle(subject, port) as kv:
                time.sleep(0.5)
                after = group_rss_kb(pgid)
            m["idle_kb_per_conn"] = (after - before) / plan.idle_count
            record("idle", rss_before_kb=before, rss_after_kb=after, **kv)

        kv = lg.latency(subject, port)
        m["lat_p50_us"], m["lat_p99_us"] = float(kv["p50_us"]), float(kv["p99_us"])
        record("latency", **kv)

        lg_bulk: list[float] = []  # cores the load tool kept busy during the measured windows
        for streams in plan.streams:
            for direction in ("up", "down"):
                mbps, cpu = [], []
                for _ in range(plan.reps):
                    cpu0 = group_cpu_seconds(pgid) if pgid else 0.0
                    kv = lg.bulk(subject, port, streams, direction)
                    time.sleep(0.1)  # let the subject tear the streams down (socat reaps its children)
                    cpu_s = group_cpu_seconds(pgid) - cpu0 if pgid else None
                    mbps.append(float(kv["mbps"]))
                    lg_bulk.append(float(kv["loadgen_cpu"]) / float(kv["seconds"]))
                    if cpu_s is not None:
                        cpu.append(cpu_s / (int(kv["total_bytes"]) / GIB))
                    record("bulk", subject_cpu_s=cpu_s, **kv)
                m[f"bulk_{direction}_{streams}"] = median(mbps)
                if cpu:
                    m[f"cpu_{direction}_{streams}"] = median(cpu)

        lg_rate = measure_rates(lg, subject, port, report)
        m["loadgen_cores_bulk"], m["loadgen_cores_rate"] = median(lg_bulk), median(lg_rate)
    except MEASURE_FAILURES as exc:
        report.problems.append(f"{subject.name}: {exc}")
        _say(f"  {subject.name}: FAILED: {exc}")
    finally:
        if running is not None:
            running.stop()
    m = {k: v for k, v in m.items() if v is not None}
    report.metrics[subject.name] = m


def parse_time_wait(sockstat: str) -> int:
    """The ``tw`` count of ``/proc/net/sockstat``'s TCP line (TIME-WAIT sockets of both families)."""
    m = re.search(r"^TCP: .*\btw (\d+)", sockstat, re.M)
    return int(m.group(1)) if m else 0


def time_wait_sockets() -> int:
    """TCP sockets in TIME-WAIT now (the kernel's own count, cheap to read; 0 when unreadable)."""
    try:
        return parse_time_wait(Path("/proc/net/sockstat").read_text())
    except OSError:
        return 0


def settle_time_wait(report: Report, subject: Subject) -> None:
    """Wait until at most :data:`TIME_WAIT_SETTLED` TIME-WAIT sockets remain (or the patience runs out)."""
    start, left = time.monotonic(), time_wait_sockets()
    if left <= TIME_WAIT_SETTLED:
        return
    _say(f"  {subject.name}: waiting for {left:,} TIME-WAIT sockets to expire before its rate runs")
    while left > TIME_WAIT_SETTLED and time.monotonic() - start < TIME_WAIT_PATIENCE:
        time.sleep(1.0)
        left = time_wait_sockets()
    report.runs.append(
        {
            "subject": subject.name,
            "kind": "settle",
            "seconds": time.monotonic() - start,
            "time_wait_left": left,
        }
    )


@dataclass
class RateSeries:
    """One subject's rate runs at one concurrency, folded into its metrics by :meth:`record`.

    ``pgids`` names process groups (``"cpu"``: the subject, ``"sink_cpu"``: its sink) whose CPU
    milliseconds per connection are recorded too, as ``rate_<c>_<name>_ms``; for a floor subject the
    client's CPU is the load tool's own client threads' (its ``client_cpu_ms``).
    """

    subject: Subject
    port: int | None
    concurrency: int
    pgids: dict[str, int] = field(default_factory=dict)
    cps: list[float] = field(default_factory=list)
    errors: int = 0
    per_conn: dict[str, list[float]] = field(default_factory=dict)
    loadgen_cores: list[float] = field(default_factory=list)

    def run_once(self, lg: LoadGen, report: Report) -> None:
        """One connect+echo+close run of the load tool through the subject."""
        before = {name: group_cpu_seconds(pgid) for name, pgid in self.pgids.items()}
        kv = lg.rate(self.subject, self.port, self.concurrency)
        conns = max(1, int(kv["conns"]))
        for name, pgid in self.pgids.items():
            self.per_conn.setdefault(name, []).append(1000 * (group_cpu_seconds(pgid) - before[name]) / conns)
        if "client_cpu_ms" in kv:
            self.per_conn.setdefault("cpu", []).append(float(kv["client_cpu_ms"]))
        self.cps.append(float(kv["cps"]))
        self.loadgen_cores.append(float(kv["loadgen_cpu"]) / float(kv["seconds"]))
        self.errors += int(kv["errors"])
        report.runs.append({"subject": self.subject.name, "kind": "rate", **kv})

    def record(self, report: Report) -> None:
        """The medians into the subject's metrics: ``rate_<c>``, its errors and CPU per connection."""
        c, m = self.concurrency, report.metrics.setdefault(self.subject.name, {})
        m[f"rate_{c}"] = median(self.cps)
        m[f"rate_{c}_errors"] = self.errors
        for name, ms in self.per_conn.items():
            m[f"rate_{c}_{name}_ms"] = median(ms)


def measure_rates(
    lg: LoadGen, subject: Subject, port: int | None, report: Report, pgids: dict[str, int] | None = None
) -> list[float]:
    """connect+echo+close per second at each of the plan's concurrencies (see :class:`RateSeries`);
    the load tool's busy cores."""
    lg_rate: list[float] = []
    for c in report.plan.concurrency:
        series = RateSeries(subject, port, c, dict(pgids or {}))
        for _ in range(report.plan.reps):
            series.run_once(lg, report)
        series.record(report)
        lg_rate += series.loadgen_cores
    return lg_rate


def interleaved(names: list[str], reps: int) -> list[list[str]]:
    """The order of a pair's rate runs, rep by rep: the pair alternates who goes first (ABBA...),
    so that drift on the host during the runs falls on both alike."""
    return [names if rep % 2 == 0 else names[::-1] for rep in range(reps)]


TW_BUCKETS = Path("/proc/sys/net/ipv4/tcp_max_tw_buckets")  # the kernel's cap on TIME-WAIT sockets


@contextlib.contextmanager
def time_wait_capped(limit: int, path: Path = TW_BUCKETS) -> Iterator[bool]:
    """Cap the kernel's TIME-WAIT sockets (``tcp_max_tw_buckets``) at ``limit`` for the body, then
    restore it; True when it could (root). Beyond the cap a closed socket skips TIME-WAIT, so one
    subject's rate runs cannot slow the next one's connect() (see :data:`TIME_WAIT_SETTLED`)."""
    try:
        saved = path.read_text().strip()
        path.write_text(str(limit))
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            path.write_text(saved)


@dataclass
class Client:
    """A subject's process, running, and the port it listens on."""

    subject: Subject
    running: Running
    port: int


def start_client(subject: Subject, lg: LoadGen, workdir: Path) -> Client:
    """Start ``subject`` in a working directory of its own; its port accepts (else SubjectFailed)."""
    assert subject.build is not None
    port = free_port()
    wd = workdir / re.sub(r"\W", "_", subject.name)
    wd.mkdir()
    running = Running(subject.build(port, lg.origin_port, wd), subject_env(subject), wd, wd / "log.txt")
    try:
        running.wait_port(port)
    except SubjectFailed:
        running.stop()
        raise
    return Client(subject, running, port)


def measure_sink_bulk(lg: LoadGen, client: Client, report: Report) -> None:
    """Bulk through a subject into its sink: MB/s, the client's CPU/GiB and the sink's."""
    plan, m, sink = report.plan, report.metrics.setdefault(client.subject.name, {}), client.subject.sink
    assert sink is not None and sink.running is not None
    for streams in plan.sink_streams:
        for direction in ("up", "down"):
            mbps, cpu, sink_cpu = [], [], []
            for _ in range(plan.reps):
                cpu0, sink0 = group_cpu_seconds(client.running.pgid), group_cpu_seconds(sink.running.pgid)
                kv = lg.bulk(client.subject, client.port, streams, direction)
                time.sleep(0.1)  # let both ends tear the streams down
                cpu_s = group_cpu_seconds(client.running.pgid) - cpu0
                sink_s = group_cpu_seconds(sink.running.pgid) - sink0
                gib = int(kv["total_bytes"]) / GIB
                mbps.append(float(kv["mbps"]))
                cpu.append(cpu_s / gib)
                sink_cpu.append(sink_s / gib)
                report.runs.append(
                    {
                        "subject": client.subject.name,
                        "kind": "bulk",
                        "subject_cpu_s": cpu_s,
                        "sink_cpu_s": sink_s,
                        **kv,
                    }
                )
            m[f"bulk_{direction}_{streams}"] = median(mbps)
            m[f"cpu_{direction}_{streams}"] = median(cpu)
            m[f"sink_cpu_{direction}_{streams}"] = median(sink_cpu)


def measure_sink_rates(
    lg: LoadGen, clients: list[Client], report: Report, failed: Callable[[Client, Exception], None]
) -> None:
    """The connection rates of a sink's clients, interleaved run by run (:func:`interleaved`) at
    each concurrency, with TIME-WAIT capped (:func:`time_wait_capped`) so that no run inherits the
    last one's sockets; a sink that must be fresh (:attr:`Sink.fresh_for_rates`) is restarted
    before every run."""
    sink = clients[0].subject.sink
    assert sink is not None
    settle_time_wait(report, clients[0].subject)
    with time_wait_capped(TIME_WAIT_SETTLED) as capped:
        if not capped and len(clients) > 1:
            report.problems.append(
                f"{sink.server} sink {sink.tag}: TIME-WAIT not capped (needs root): "
                "each rate run starts with the sockets of the runs before it"
            )
        for c in report.plan.concurrency:
            series = {
                cl.subject.name: (cl, RateSeries(cl.subject, cl.port, c, {"cpu": cl.running.pgid}))
                for cl in clients
            }
            for order in interleaved(list(series), report.plan.pair_rate_reps):
                for name in order:
                    client, s = series[name]
                    if client not in clients:
                        continue  # it failed in an earlier run
                    try:
                        if sink.fresh_for_rates:
                            restart_sink(sink)
                        assert sink.running is not None
                        s.pgids["sink_cpu"] = sink.running.pgid
                        s.run_once(lg, report)
                    except MEASURE_FAILURES as exc:
                        clients.remove(client)
                        failed(client, exc)
            for client, s in series.values():
                if client in clients:
                    s.record(report)


def measure_sink_subjects(lg: LoadGen, subjects: list[Subject], report: Report, workdir: Path) -> None:
    """A sink's pair (or the one of it selected): each one's bulk in turn, then, when the sink's
    family asks for it, their connection rates interleaved (:func:`measure_sink_rates`). Both
    clients run throughout, so the rate runs can alternate between them."""
    sink = subjects[0].sink
    assert sink is not None
    clients: list[Client] = []

    def failed(client: Client | None, subject: Subject, exc: Exception) -> None:
        why = str(exc)
        tail = client.running.log_text().strip()[-800:] if client is not None else ""
        if tail and tail not in why:  # the subject's own words on what went wrong
            why += f"; its log: {tail}"
        report.problems.append(f"{subject.name}: {why}")
        _say(f"  {subject.name}: FAILED: {why}")

    try:
        for subject in subjects:
            _say(f"  {subject.name} ...")
            client = None
            try:
                if sink.running is None:
                    raise SubjectFailed(f"its {sink.server} sink ({sink.tag}) is not running")
                client = start_client(subject, lg, workdir)
                measure_sink_bulk(lg, client, report)
                clients.append(client)
            except MEASURE_FAILURES as exc:
                failed(client, subject, exc)
                if client is not None:
                    client.running.stop()
        if sink.rate and clients:
            _say(f"  {', '.join(cl.subject.name for cl in clients)}: connection rates, interleaved")
            measure_sink_rates(lg, clients, report, lambda cl, exc: failed(cl, cl.subject, exc))
    finally:
        for client in clients:
            client.running.stop()
    for subject in subjects:
        if subject.name in report.metrics:
            report.metrics[subject.name] = {
                k: v for k, v in report.metrics[subject.name].items() if v is not None
            }


def sink_pair(subjects: list[Subject], subject: Subject) -> list[Subject]:
    """The selected, unskipped clients of ``subject``'s sink (the peer's first), floor subjects aside."""
    return [s for s in subjects if s.sink is subject.sink and s.kind != "floor" and not s.skip]


def measure_floor_subject(lg: LoadGen, subject: Subject, report: Report) -> None:
    """Connection rate of the load tool as the sink's own client (no proxy in between): the most a
    client on this machine's OpenSSL gets out of the sink, which the TLS rows are read against."""
    sink = subject.sink
    assert sink is not None
    try:
        if sink.running is None:
            raise SubjectFailed(f"its {sink.server} sink ({sink.tag}) is not running")
        settle_time_wait(report, subject)
        measure_rates(lg, subject, None, report, {"sink_cpu": sink.running.pgid})
    except MEASURE_FAILURES as exc:
        report.problems.append(f"{subject.name}: {exc}")
        _say(f"  {subject.name}: FAILED: {exc}")
    m = report.metrics.get(subject.name, {})
    report.metrics[subject.name] = {k: v for k, v in m.items() if v is not None}


def start_sink(sink: Sink) -> None:
    """Run ``sink.argv`` in ``sink.workdir`` until its port accepts (SubjectFailed otherwise)."""
    assert sink.workdir is not None
    running = Running(
        sink.argv, subject_env(Subject(sink.server, "forward")), sink.workdir, sink.workdir / "log.txt"
    )
    try:
        running.wait_port(sink.port)
    except SubjectFailed:
        running.stop()
        raise
    sink.running = running


def restart_sink(sink: Sink) -> None:
    """A new sink process on the same port, for a subject's rate runs (:attr:`Sink.fresh_for_rates`):
    both subjects of a pair then meet a server in the same state."""
    if sink.running is not None:
        sink.running.stop()
        sink.running = None
    start_sink(sink)


@contextlib.contextmanager
def sinks(subjects: list[Subject], workdir: Path, report: Report) -> Iterator[None]:
    """Start the sink of every selected subject that has one for the body of the ``with``."""
    started = {(s.sink.family, s.sink.tag): s.sink for s in subjects if s.sink is not None and not s.skip}
    try:
        for sink in started.values():
            wd = workdir / re.sub(r"\W", "_", f"{sink.server}_{sink.tag}")
            wd.mkdir()
            try:
                sink.argv, sink.workdir = sink.command(wd), wd
            except (OSError, ImportError, ValueError) as exc:
                report.problems.append(f"{sink.server} sink {sink.tag}: {exc}")
                continue
            try:
                start_sink(sink)
            except SubjectFailed as exc:
                report.problems.append(f"{sink.server} sink {sink.tag}: {exc}")
                continue
        yield
    finally:
        for sink in started.values():
            if sink.running is not None:
                sink.running.stop()
                sink.running = None


def measure_demo_rss(report: Report, workdir: Path) -> None:
    """honk's RSS right after start on the demo config (on free ports)."""
    lan, api = free_port(), free_port()
    wd = workdir / "honk_demo"
    wd.mkdir()
    try:
        cfg = _write(wd / "demo.toml", demo_config((ROOT / "configs" / "demo.toml").read_text(), lan, api))
    except (OSError, ValueError) as exc:
        report.problems.append(f"honk demo config: {exc}")
        return
    running = Running(
        [sys.executable, "-m", "honk.cli.daemon", "run", "-c", cfg, "--pid-file", str(wd / "honk.pid")],
        subject_env(Subject("honk", "socks")),
        wd,
        wd / "log.txt",
    )
    try:
        running.wait_port(lan)
        time.sleep(1.0)
        report.metrics.setdefault("honk", {})["demo_rss_mb"] = group_rss_kb(running.pgid) / 1024
    except SubjectFailed as exc:
        report.problems.append(f"honk demo config: {exc}")
    finally:
        running.stop()


def run(
    plan: Plan, only: set[str] | None = None, shadowsocks: bool = True, v2ray_rows: bool = True
) -> Report:
    """Measure every subject (less the Shadowsocks or v2ray pairs when switched off) and judge the targets."""
    raise_fd_limit()
    lg = LoadGen(build_loadgen(), free_port(), plan)
    wanted = {"ss": shadowsocks, "v2ray": v2ray_rows}
    report = Report(plan, [s for s in subjects() if s.sink is None or wanted[s.sink.family]])
    with tempfile.TemporaryDirectory(prefix="honk-bench-") as tmp:
        for subject in report.subjects:
            if only and not subject.selected(only):
                subject.skip = subject.skip or "not selected"
        with sinks(report.subjects, Path(tmp), report):
            for subject in report.subjects:
                if subject.skip:
                    _say(f"  {subject.name}: skipped: {subject.skip}")
                    continue
                t0 = time.monotonic()
                if subject.sink is not None and subject.kind != "floor":
                    pair = sink_pair(report.subjects, subject)
                    if subject is not pair[0]:
                        continue  # measured with the first of its pair
                    measure_sink_subjects(lg, pair, report, Path(tmp))
                    _say(f"  {', '.join(s.name for s in pair)} done in {time.monotonic() - t0:.0f}s")
                    continue
                _say(f"  {subject.name} ...")
                if subject.kind == "floor":
                    measure_floor_subject(lg, subject, report)
                else:
                    measure_subject(lg, subject, report, Path(tmp))
                _say(f"  {subject.name} done in {time.monotonic() - t0:.0f}s")
        if not only or "honk" in only:
            measure_demo_rss(report, Path(tmp))
    direct = report.metrics.get("direct", {}).get("lat_p50_us")
    for m in report.metrics.values():
        if direct is not None and "lat_p50_us" in m:
            m["added_p50_us"] = m["lat_p50_us"] - direct
    for subject in report.subjects:  # how near each TLS client came to what OpenSSL allows here
        floor = report.metrics.get(f"{FLOOR_PEER}:{subject.sink.tag}", {}) if subject.sink else {}
        for c in plan.concurrency:
            mine, best = report.metrics.get(subject.name, {}).get(f"rate_{c}"), floor.get(f"rate_{c}")
            if mine and best and subject.kind == "socks":
                report.metrics[subject.name][f"rate_{c}_of_floor"] = mine / best
    honks = [s for s in report.subjects if s.name.startswith("honk") and s.name in report.metrics]
    for subject in honks:
        if subject.sink is not None:  # a pair's honk is held against its own peer, not the plain ones
            report.targets += [evaluate(t, subject.name, report.metrics) for t in subject.sink.targets(plan)]
            continue
        for t in targets(plan):
            if subject.name != "honk" and t.metric == "demo_rss_mb":
                continue  # the demo config runs on the default engine only
            report.targets.append(evaluate(t, subject.name, report.metrics))
    return report
