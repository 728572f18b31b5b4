"""A client → router → server test bed of three network namespaces, for transparent proxying.

::

    client ns                 router ns (honk runs here)                 server ns
    cli0 192.0.2.2/24 ── veth ── lan 192.0.2.1/24 | wan 198.51.100.1/24 ── veth ── srv0 198.51.100.2/24
         2001:db8:1::2/64           2001:db8:1::1/64 | 2001:db8:2::1/64               2001:db8:2::2/64
    default via the router     IPv4 and IPv6 forwarding on               default via the router

Use :func:`testbed` (a context manager; root, or it skips — with CI=true it fails). Everything
it creates lives in its namespaces (``hk-<hex>``), which are deleted on exit with every
interface, route, rule and nft table inside them; processes it started are killed by the PID
of the real interpreter (``ip netns exec`` execs it).

In a namespace:

* :meth:`Testbed.exec` runs a command; :meth:`Testbed.curl` runs curl in the client namespace;
* :meth:`Testbed.spawn` starts ``module:function`` of a Python module in a subprocess and waits
  for its ready line (:func:`announce_ready`); :meth:`Testbed.call` runs one to completion.

Ready-made peers for those: :func:`serve` (HTTP/raw TCP answering with the peer's address, UDP
echo naming the sender) for the server namespace, :func:`udp_exchange` and :func:`tls_hello`
for the client namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers.hello import client_hello
from helpers.netns import scratch_netns
from helpers.peers import CURL_MAX_TIME, require_binary

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = TESTS_DIR.parent
READY_TIMEOUT = 20.0  # seconds for a cold interpreter to import and bind
CALL_TIMEOUT = 20.0  # seconds a one-shot call may take
STOP_TIMEOUT = 5.0  # seconds a stopped process has before it is killed
PEER_TIMEOUT = 5.0  # seconds a client helper waits for an answer
READY = "ready"

# the imported module is told to run `function(*args)`: argv[1] is "module:function"
_BOOT = (
    "import importlib, sys; m, _, f = sys.argv[1].partition(':'); "
    "getattr(importlib.import_module(m), f)(*sys.argv[2:])"
)


@dataclass(frozen=True, slots=True)
class Addresses:
    v4: str
    v6: str


CLIENT = Addresses("192.0.2.2", "2001:db8:1::2")
ROUTER_LAN = Addresses("192.0.2.1", "2001:db8:1::1")
ROUTER_WAN = Addresses("198.51.100.1", "2001:db8:2::1")
SERVER = Addresses("198.51.100.2", "2001:db8:2::2")
PREFIX_V4 = 24
PREFIX_V6 = 64

CLIENT_IF, LAN_IF, WAN_IF, SERVER_IF = "cli0", "lan0", "wan0", "srv0"


def announce_ready(detail: str = "") -> None:
    """What a spawned function prints once it serves: the ready line with its real PID."""
    print(f"{READY} pid={os.getpid()} {detail}".rstrip(), flush=True)


class NsProcess:
    """A Python function running in a namespace; its output lines are collected as they arrive."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.pid: int | None = None  # the interpreter's own PID, from its ready line
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        self._eof = 0
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str]) -> None:  # noqa: ANN001 - a text pipe
        for line in stream:
            with self._cond:
                lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof += 1
            self._cond.notify_all()

    def wait_for(
        self, pattern: str, *, stream: str = "stdout", timeout: float = READY_TIMEOUT, after: int = 0
    ) -> re.Match[str]:
        """The first line (from index ``after``) of ``stream`` matching ``pattern``; AssertionError
        on timeout or when the process ends first."""
        rx = re.compile(pattern)
        lines = self.stdout if stream == "stdout" else self.stderr
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = after
            while True:
                for line in lines[seen:]:
                    if found := rx.search(line):
                        return found
                seen = len(lines)
                if self._eof == len(self._readers):
                    raise AssertionError(f"process ended before {pattern!r}:\n{self.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.output()}")
                self._cond.wait(left)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> str:
        found = self.wait_for(rf"^{READY} pid=(\d+)(.*)$", timeout=timeout)
        self.pid = int(found.group(1))
        return found.group(2).strip()

    def output(self) -> str:
        with self._cond:
            return "\n".join(["-- stdout", *self.stdout, "-- stderr", *self.stderr])

    def stop(self) -> None:
        """SIGTERM the interpreter (and the launcher, should they differ), then SIGKILL after
        :data:`STOP_TIMEOUT`."""
        pids = {self.proc.pid, *([self.pid] if self.pid else [])}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)
        for reader in self._readers:
            reader.join(STOP_TIMEOUT)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


@dataclass
class Testbed:
    __test__ = False  # pytest: not a test class

    client: str  # namespace names
    router: str
    server: str
    lan: str = LAN_IF  # the router's interface toward the client
    wan: str = WAN_IF  # and toward the server
    processes: list[NsProcess] = field(default_factory=list)

    client_ip = CLIENT
    router_lan_ip = ROUTER_LAN
    router_wan_ip = ROUTER_WAN
    server_ip = SERVER

    def exec(
        self, ns: str, *argv: str, check: bool = True, timeout: float = CALL_TIMEOUT, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:  # noqa: A002 - as subprocess.run
        """Run ``argv`` in namespace ``ns``."""
        return subprocess.run(
            ["ip", "netns", "exec", ns, *argv],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            input=input,
        )

    def _python(self, ns: str, target: str, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        paths = [str(REPO_DIR), str(TESTS_DIR), str(TESTS_DIR / "integration")]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
        # the absolute interpreter: a shim on PATH would put a wrapper's PID between us and it
        return ["ip", "netns", "exec", ns, sys.executable, "-c", _BOOT, target, *args], env

    def spawn(
        self, ns: str, target: str, *args: str, ready: bool = True, timeout: float = READY_TIMEOUT
    ) -> NsProcess:
        """Run ``target`` (``"module:function"``, importable from the repository, ``tests/`` or
        ``tests/integration/``) with string ``args`` in namespace ``ns``; with ``ready``, wait
        for its :func:`announce_ready` line. Stopped when the test bed closes."""
        argv, env = self._python(ns, target, args)
        process = NsProcess(argv, env)
        self.processes.append(process)
        if ready:
            try:
                process.wait_ready(timeout)
            except BaseException:
                process.stop()
                raise
        return process

    def call(self, ns: str, target: str, *args: str, timeout: float = CALL_TIMEOUT) -> str:
        """Run ``target`` to completion in ``ns``; its stdout (AssertionError with its stderr
        when it fails)."""
        argv, env = self._python(ns, target, args)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            raise AssertionError(f"{target}{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """curl in the client namespace, quiet, bounded, without proxy variables."""
        curl = require_binary("curl")
        return subprocess.run(
            ["ip", "netns", "exec", self.client, curl, "-sS", "--max-time", str(CURL_MAX_TIME), *args],
            capture_output=True,
            text=True,
            timeout=CURL_MAX_TIME + CALL_TIMEOUT,
            env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
        )

    def close(self) -> None:
        processes, self.processes = self.processes, []
        for process in processes:
            process.stop()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=CALL_TIMEOUT)


def _build(bed: Testbed) -> None:
    cli, rtr, srv = bed.client, bed.router, bed.server
    for ns in (cli, rtr, srv):
        _ip("-n", ns, "link", "set", "lo", "up")
    _ip("link", "add", CLIENT_IF, "netns", cli, "type", "veth", "peer", "name", LAN_IF, "netns", rtr)
    _ip("link", "add", SERVER_IF, "netns", srv, "type", "veth", "peer", "name", WAN_IF, "netns", rtr)
    for ns, ifname, ips in (
        (cli, CLIENT_IF, CLIENT),
        (rtr, LAN_IF, ROUTER_LAN),
        (rtr, WAN_IF, ROUTER_WAN),
        (srv, SERVER_IF, SERVER),
    ):
        _ip("-n", ns, "addr", "add", f"{ips.v4}/{PREFIX_V4}", "dev", ifname)
        _ip("-n", ns, "-6", "addr", "add", f"{ips.v6}/{PREFIX_V6}", "dev", ifname, "nodad")
        _ip("-n", ns, "link", "set", ifname, "up")
    for ns, gateway in ((cli, ROUTER_LAN), (srv, ROUTER_WAN)):
        _ip("-n", ns, "route", "add", "default", "via", gateway.v4)
        _ip("-n", ns, "-6", "route", "add", "default", "via", gateway.v6)
    bed.exec(rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    bed.exec(rtr, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")


@contextlib.contextmanager
def testbed(what: str = "transparent proxy tests", *binaries: str) -> Iterator[Testbed]:
    """Three namespaces wired client → router → server (see the module docstring); ``binaries``
    are further peers the tests need (CI: missing ones fail)."""
    with contextlib.ExitStack() as stack:
        names = [stack.enter_context(scratch_netns(what, *binaries)) for _ in range(3)]
        bed = Testbed(*names)
        stack.callback(bed.close)  # processes stop before their namespaces go
        _build(bed)
        yield bed


testbed.__test__ = False  # type: ignore[attr-defined]  # pytest: not a test function


# --- peers to spawn -----------------------------------------------------------------------------

MAX_HEAD = 65536  # bytes a peer reads of a request head
HTTP_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ")


def _hello(peer: str) -> bytes:
    return f"hello from server, peer={peer}".encode()


def _answer_tcp(conn: socket.socket, peer: str) -> None:
    with conn:
        conn.settimeout(PEER_TIMEOUT)
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < MAX_HEAD:
                chunk = conn.recv(MAX_HEAD)
                if not chunk:
                    break
                data += chunk
                if not data.startswith(HTTP_METHODS):
                    break  # raw bytes (a ClientHello): answer at once
            body = _hello(peer)
            if data.startswith(HTTP_METHODS):
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(body), body)
                )
            else:
                conn.sendall(body + b"\n")
        except OSError:
            pass


def _tcp_loop(sock: socket.socket) -> None:
    while True:
        conn, peer = sock.accept()
        threading.Thread(target=_answer_tcp, args=(conn, _unmapped(peer[0])), daemon=True).start()


def _udp_loop(sock: socket.socket) -> None:
    while True:
        data, peer = sock.recvfrom(MAX_HEAD)
        sock.sendto(b"echo:" + data + b" seen-from=" + _unmapped(peer[0]).encode(), peer)


def _unmapped(host: str) -> str:
    return host[7:] if host.startswith("::ffff:") else host


def serve(tcp_ports: str = "80", udp_ports: str = "") -> None:
    """Dual-stack servers until killed: TCP ports answer ``hello from server, peer=<address>``
    (as an HTTP response to a request, raw otherwise); UDP ports echo ``echo:<data>
    seen-from=<address>``. Ports are comma-separated."""
    threads = []
    for kind, ports, loop in (
        (socket.SOCK_STREAM, tcp_ports, _tcp_loop),
        (socket.SOCK_DGRAM, udp_ports, _udp_loop),
    ):
        for port in filter(None, ports.split(",")):
            sock = socket.socket(socket.AF_INET6, kind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", int(port)))
            if kind == socket.SOCK_STREAM:
                sock.listen(64)
            threads.append(threading.Thread(target=loop, args=(sock,), daemon=True))
    for thread in threads:
        thread.start()
    announce_ready()
    sys.stdin.read()  # until the test bed closes our stdin or kills us


def udp_exchange(host: str, port: str, *payloads: str) -> None:
    """Send each payload from one socket and print one JSON line per reply:
    ``{"reply": text, "source": [host, port]}`` (``{"error": ...}`` when none came)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(PEER_TIMEOUT)
        for payload in payloads:
            sock.sendto(payload.encode(), (host, int(port)))
            try:
                data, source = sock.recvfrom(MAX_HEAD)
            except OSError as exc:
                print(json.dumps({"error": repr(exc)}), flush=True)
                continue
            print(
                json.dumps({"reply": data.decode(errors="replace"), "source": [source[0], source[1]]}),
                flush=True,
            )


def tls_hello(host: str, port: str, server_name: str) -> None:
    """Connect, send a real TLS ClientHello naming ``server_name`` and print what came back:
    ``reply:<text>``, ``eof`` (closed without a byte) or ``error:<exception>`` (a reset)."""
    hello = client_hello(server_name)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_connection((host, int(port)), timeout=PEER_TIMEOUT) as sock:
            assert sock.family == family
            sock.sendall(hello)
            data = sock.recv(MAX_HEAD)
    except OSError as exc:
        print(f"error:{type(exc).__name__}", flush=True)
        return
    print(f"reply:{data.decode(errors='replace').strip()}" if data else "eof", flush=True)
