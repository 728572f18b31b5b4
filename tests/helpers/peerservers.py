"""Real upstream proxy servers on loopback for honk's interop tests.

Each helper is a context manager. It writes its own config into a fresh temp
directory, starts the server on 127.0.0.1 on a free port in a session of its own,
waits until the server really serves (bounded polling, never a fixed sleep), yields
what a client needs, and on exit stops the whole session and removes the directory.
No helper reads or touches a system instance's config, pid file, log or port.

    with tinyproxy(user="u", password="p") as http_peer, danted() as socks_peer:
        ...
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trustme

from helpers.peers import free_tcp_udp_port, require_binary
from helpers.servers import free_port

LOOPBACK = "127.0.0.1"
READY_TIMEOUT = 5.0  # seconds for a server to start serving; each takes well under 0.1 s here
STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL, and again before giving up
POLL_INTERVAL = 0.01  # seconds between readiness probes (the wait also ends at once if the server exits)
LOG_TAIL_LINES = 40  # lines of a server's own output quoted when it fails to start
START_ATTEMPTS = 3  # a free port can be taken between choosing it and the server binding it
TINYPROXY_CREDENTIAL = r"[-A-Za-z0-9._]+"  # tinyproxy's config grammar for BasicAuth user and password
PORT_TAKEN = "in use"  # each server's EADDRINUSE message contains this ("Address already in use")

# The SIP004 AEAD ciphers honk's Shadowsocks outbound supports; ss-server knows them by these names.
SS_METHODS = ("aes-128-gcm", "aes-256-gcm", "chacha20-ietf-poly1305")
TLS_NAMES = (LOOPBACK, "localhost")  # what the TLS front's certificate is issued for by default

# v2ray (Debian's 4.34) as a VMess/VLESS/Trojan peer.
V2RAY_PROTOCOLS = ("vmess", "vless", "trojan")
V2RAY_TRANSPORTS = ("tcp", "ws")
# VMess body ciphers a v2ray client may ask for ("auto" lets v2ray pick by CPU; "zero" is out of scope).
VMESS_SECURITIES = ("aes-128-gcm", "chacha20-poly1305", "none", "auto")
V2RAY_WS_PATH = "/honk-ws"  # the WebSocket path the server serves when none is given
V2RAY_MUX_CONCURRENCY = 8  # v2ray's own default: logical streams per Mux.Cool carrier

Probe = Callable[[], bool]


class PeerStartError(RuntimeError):
    """A peer server that exited or never became ready; the message ends with its log tail."""


# --- what a client gets -------------------------------------------------------------------


@dataclass(frozen=True)
class _Listening:
    """Where a peer listens."""

    host: str
    port: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass(frozen=True)
class SocksPeer(_Listening):
    """A SOCKS5 server; ``username``/``password`` are set when it demands RFC 1929 authentication."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.username is not None else None  # type: ignore[return-value]


@dataclass(frozen=True)
class ShadowsocksPeer(_Listening):
    """An ss-server: TCP on ``port``, and UDP on the same port when ``udp`` is set."""

    method: str
    password: str = field(repr=False)
    udp: bool


def _trusting(ca_pem: bytes) -> ssl.SSLContext:
    """A client TLS context that trusts ``ca_pem`` and nothing else."""
    return ssl.create_default_context(cadata=ca_pem.decode())  # with cadata, no system store is loaded


@dataclass(frozen=True)
class HttpProxyPeer(_Listening):
    """A plain HTTP proxy that allows CONNECT to any port; Basic credentials when ``username`` is set."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.username is not None else None  # type: ignore[return-value]


@dataclass(frozen=True)
class TlsProxyPeer(_Listening):
    """An HTTP proxy reached over TLS (``https://`` proxy): a TLS front before a plain proxy.

    The front's certificate is issued by ``ca`` for ``server_names``; ``ca_path`` holds the
    CA certificate as PEM for clients that take a file (curl's ``--proxy-cacert``).
    Credentials, when set, are the plain proxy's.
    """

    ca: trustme.CA
    ca_path: Path
    server_names: tuple[str, ...]
    backend_port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.username is not None else None  # type: ignore[return-value]

    def client_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts only this front's CA."""
        return _trusting(self.ca_pem)


@dataclass(frozen=True)
class V2rayPeer(_Listening):
    """A v2ray server taking one ``protocol`` inbound over ``transport`` (``tls`` on top when set).

    VMess authenticates by ``uuid`` (alterId 0, so only the AEAD header); VLESS by ``uuid``
    too (decryption none); Trojan by ``password``. ``security`` is the VMess body cipher a
    client asks for (the server takes whichever the client picks). ``ws_path`` is the
    WebSocket path when ``transport`` is ``ws``. With ``tls`` the certificate is issued by
    ``ca`` for ``server_names``; ``ca_path`` holds the CA as PEM. ``mux`` is what a
    :func:`v2ray_client` of this server does by default (the server accepts both).
    ``access_log`` lists every request the server accepted, one line each
    (``... accepted tcp:host:port``, a logical stream inside a Mux.Cool carrier too);
    :meth:`carriers` counts the physical connections open to it.
    """

    protocol: str
    transport: str
    tls: bool
    mux: bool
    security: str
    uuid: str = field(repr=False)
    password: str = field(repr=False)
    ws_path: str
    access_log: Path
    ca: trustme.CA | None = None
    ca_path: Path | None = None
    server_names: tuple[str, ...] = ()

    def share_link(
        self,
        *,
        uuid: str | None = None,
        password: str | None = None,
        sni: str = "localhost",
        security: str | None = None,
    ) -> str:
        """A node link for this server (the v2rayN JSON form for VMess); the arguments override
        the credentials, the TLS server name and the VMess cipher."""
        if self.protocol == "vmess":
            fields = {
                "v": "2",
                "ps": "node",
                "add": self.host,
                "port": str(self.port),
                "id": uuid or self.uuid,
                "aid": "0",
                "scy": security or self.security,
                "net": self.transport,
                "path": self.ws_path,
                "tls": "tls" if self.tls else "",
                "sni": sni if self.tls else "",
            }
            return "vmess://" + base64.b64encode(json.dumps(fields).encode()).decode()
        params = f"security=tls&sni={sni}&type={self.transport}"
        if self.transport == "ws":
            params += f"&path={self.ws_path}"
        if self.protocol == "trojan":
            return f"trojan://{password or self.password}@{self.host}:{self.port}?{params}#node"
        return f"vless://{uuid or self.uuid}@{self.host}:{self.port}?{params}&encryption=none#node"

    @property
    def ca_pem(self) -> bytes:
        if self.ca is None:
            raise ValueError("this v2ray server does not use TLS")
        return self.ca.cert_pem.bytes()

    def client_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts only this server's CA."""
        return _trusting(self.ca_pem)

    def accepted(self) -> list[str]:
        """The access log's ``accepted`` lines so far (v2ray writes each as the request arrives)."""
        try:
            text = self.access_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if " accepted " in line]

    def carriers(self) -> int:
        """How many TCP connections to this server are established right now (client ends, from /proc)."""
        return established_to(self.port)


# --- readiness probes ---------------------------------------------------------------------


def tcp_accepts(port: int, host: str = LOOPBACK) -> Probe:
    """True once a TCP connect to ``host:port`` succeeds."""

    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            return False

    return probe


def udp_bound(port: int) -> Probe:
    """True once some UDP socket is bound to ``port`` on loopback or the wildcard (from /proc/net/udp)."""
    wanted = {f"0100007F:{port:04X}", f"00000000:{port:04X}"}  # little-endian IPv4 and hex port

    def probe() -> bool:
        with open("/proc/net/udp") as table:
            next(table)  # header line
            return any(line.split()[1] in wanted for line in table)

    return probe


def established_to(port: int) -> int:
    """The number of established TCP connections whose remote end is loopback ``port`` (from /proc/net/tcp)."""
    remote = f"0100007F:{port:04X}"  # little-endian IPv4 and hex port
    established = "01"  # TCP_ESTABLISHED in the kernel's st column
    with open("/proc/net/tcp") as table:
        next(table)  # header line
        return sum(1 for line in table if (cols := line.split())[2] == remote and cols[3] == established)


# --- one server process -------------------------------------------------------------------


class PeerProcess:
    """One server process in a session of its own, its stdout and stderr going to ``log_path``.

    The exit is watched through a pidfd, which does not reap: until :meth:`stop` reaps the
    leader, its pid (and so its process-group id) cannot be reused, so signalling the group
    reaches only this server and any children it forked.
    """

    def __init__(self, name: str, argv: Sequence[str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                start_new_session=True,
            )
        self._pidfd = os.pidfd_open(self.proc.pid)

    def exited(self, timeout: float) -> bool:
        """Whether the server's main process has exited, waiting at most ``timeout`` seconds."""
        readable, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(readable)

    def wait_ready(self, probes: Sequence[Probe], timeout: float = READY_TIMEOUT) -> None:
        """Return once every probe passes; PeerStartError if the server exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not all(probe() for probe in probes):
            if self.exited(POLL_INTERVAL):
                raise PeerStartError(f"{self.name} exited while starting:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise PeerStartError(f"{self.name} was not serving within {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"<no log: {e}>"
        return "\n".join(text.splitlines()[-lines:]) or "<empty log>"

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL its process group after STOP_TIMEOUT, then reap."""
        if self.proc.returncode is not None:
            return
        # Only the main process: a forking server (Dante) stops and reaps its own children,
        # which would otherwise be left as zombies for an init that may not reap them.
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        if not self.exited(STOP_TIMEOUT):
            self._signal_group(signal.SIGKILL)
            self.exited(STOP_TIMEOUT)
        # The leader is exited but not reaped yet, so this reaches only children it left behind;
        # wait for them too, as one of them may still hold the listening socket.
        self._signal_group(signal.SIGKILL)
        self._wait_for_group(STOP_TIMEOUT)
        self.proc.wait(STOP_TIMEOUT)
        os.close(self._pidfd)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _wait_for_group(self, timeout: float) -> None:
        """Wait until no process of the server's group is still running (zombies have let go of everything)."""
        pending: list[int] = []
        for pid in _running_group_members(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                pending.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout
        try:
            while pending and (left := deadline - time.monotonic()) > 0:
                gone, _, _ = select.select(pending, [], [], left)
                for fd in gone:
                    pending.remove(fd)
                    os.close(fd)
        finally:
            for fd in pending:
                os.close(fd)


def _running_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies, read from /proc/PID/stat."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # Fields after the parenthesised command name: state, ppid, pgrp, ...
                state, _, pgrp = f.read().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue  # exited while we looked
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


Launch = Callable[[int], tuple[list[str], list[Probe]]]


@contextlib.contextmanager
def _serving(
    name: str, workdir: Path, launch: Launch, pick_port: Callable[[], int] = free_port
) -> Iterator[int]:
    """Start ``launch(port)``'s command on a fresh free port until it serves; yield the port, stop on exit.

    A start that fails because the port was taken meanwhile is retried on another port.
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        port = pick_port()
        argv, probes = launch(port)
        peer = PeerProcess(name, argv, workdir)
        try:
            peer.wait_ready(probes)
            break
        except PeerStartError as e:
            peer.stop()
            if attempt == START_ATTEMPTS or PORT_TAKEN not in str(e).lower():
                raise
    try:
        yield port
    finally:
        peer.stop()


def _workdir(name: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=f"honk-peer-{name}-")


def _check_credentials(user: str | None, password: str | None, allowed: str = "") -> None:
    """Both or neither, non-empty, and (when ``allowed`` is a regex) of the characters a config file can hold."""
    if (user is None) != (password is None):
        raise ValueError("give both user and password, or neither")
    for value in (user, password):
        if value is not None and not re.fullmatch(allowed or ".+", value):
            raise ValueError(f"credentials must match {allowed or '.+'} for this server")


# --- the servers --------------------------------------------------------------------------


@contextlib.contextmanager
def danted() -> Iterator[SocksPeer]:
    """Dante: SOCKS5 without authentication; CONNECT and UDP ASSOCIATE to and from loopback."""
    binary = require_binary("danted")
    with _workdir("danted") as tmp:
        work = Path(tmp)
        conf = work / "danted.conf"
        # Run as root, Dante insists on dropping privileges; as anyone else it must not try.
        users = "user.privileged: root\nuser.unprivileged: nobody\n" if os.geteuid() == 0 else ""

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            conf.write_text(
                "logoutput: stderr\n"
                f"internal: {LOOPBACK} port = {port}\n"
                f"external: {LOOPBACK}\n"
                "socksmethod: none\n"
                "clientmethod: none\n"
                f"{users}"
                "client pass { from: 127.0.0.0/8 to: 127.0.0.0/8 }\n"
                "socks pass { from: 127.0.0.0/8 to: 127.0.0.0/8 command: connect udpassociate }\n"
                # UDP replies: from the remote (loopback) back to the client (loopback).
                "socks pass { from: 127.0.0.0/8 to: 127.0.0.0/8 command: udpreply }\n"
            )
            # Without -D Dante stays in the foreground; -N 1: one server process (mother).
            argv = [binary, "-f", str(conf), "-N", "1", "-p", str(work / "danted.pid")]
            return argv, [tcp_accepts(port)]

        with _serving("danted", work, launch) as port:
            yield SocksPeer(LOOPBACK, port)


@contextlib.contextmanager
def microsocks(user: str | None = None, password: str | None = None) -> Iterator[SocksPeer]:
    """microsocks: SOCKS5 CONNECT, demanding username/password (RFC 1929) when both are given."""
    binary = require_binary("microsocks")
    _check_credentials(user, password)
    with _workdir("microsocks") as tmp:

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            argv = [binary, "-i", LOOPBACK, "-p", str(port)]
            if user is not None:
                argv += ["-u", user, "-P", password]  # type: ignore[list-item]
            return argv, [tcp_accepts(port)]

        with _serving("microsocks", Path(tmp), launch) as port:
            yield SocksPeer(LOOPBACK, port, user, password)


@contextlib.contextmanager
def ss_server(
    method: str, password: str, udp: bool = True, egress: str | None = None
) -> Iterator[ShadowsocksPeer]:
    """shadowsocks-libev's ss-server with one AEAD ``method``; relays UDP on the same port when ``udp``;
    ``egress``: the local address its connections to targets come from (``-b``)."""
    binary = require_binary("ss-server")
    with _workdir("ss-server") as tmp:

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            # No -f: ss-server daemonizes when given a pid file.
            argv = [binary, "-s", LOOPBACK, "-p", str(port), "-k", password, "-m", method]
            if egress is not None:
                argv += ["-b", egress]
            probes = [tcp_accepts(port)]
            if udp:
                argv.append("-u")
                probes.append(udp_bound(port))
            return argv, probes

        with _serving("ss-server", Path(tmp), launch, pick_port=free_tcp_udp_port) as port:
            yield ShadowsocksPeer(LOOPBACK, port, method, password, udp)


@contextlib.contextmanager
def ss_local(server: ShadowsocksPeer, udp: bool = False) -> Iterator[SocksPeer]:
    """shadowsocks-libev's ss-local: a SOCKS5 server (UDP ASSOCIATE too when ``udp``) into ``server``."""
    binary = require_binary("ss-local")
    with _workdir("ss-local") as tmp:

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            argv = [
                binary,
                "-s",
                server.host,
                "-p",
                str(server.port),
                "-b",
                LOOPBACK,
                "-l",
                str(port),
                "-k",
                server.password,
                "-m",
                server.method,
            ]
            probes = [tcp_accepts(port)]
            if udp:
                argv.append("-u")
                probes.append(udp_bound(port))
            return argv, probes

        with _serving("ss-local", Path(tmp), launch, pick_port=free_tcp_udp_port) as port:
            yield SocksPeer(LOOPBACK, port)


@contextlib.contextmanager
def tinyproxy(user: str | None = None, password: str | None = None) -> Iterator[HttpProxyPeer]:
    """tinyproxy: an HTTP proxy (CONNECT to any port) demanding Basic credentials when both are given.

    Its config holds only letters, digits and ``-._`` in credentials; others are a ValueError.
    A request without credentials gets 407; tinyproxy 1.11 answers wrong ones with 401.
    """
    binary = require_binary("tinyproxy")
    _check_credentials(user, password, TINYPROXY_CREDENTIAL)
    with _workdir("tinyproxy") as tmp:
        work = Path(tmp)
        conf = work / "tinyproxy.conf"

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            # With no ConnectPort line tinyproxy allows CONNECT to every port. With no
            # LogFile and no Syslog it logs to stdout, which goes to our log file.
            lines = [
                f"Port {port}",
                f"Listen {LOOPBACK}",
                f"Allow {LOOPBACK}",
                "Timeout 60",
                "MaxClients 32",
                "LogLevel Info",
                "DisableViaHeader Yes",
                f'PidFile "{work / "tinyproxy.pid"}"',
            ]
            if user is not None:
                lines.append(f"BasicAuth {user} {password}")
            conf.write_text("\n".join(lines) + "\n")
            return [binary, "-d", "-c", str(conf)], [tcp_accepts(port)]

        with _serving("tinyproxy", work, launch) as port:
            yield HttpProxyPeer(LOOPBACK, port, user, password)


@contextlib.contextmanager
def tls_front(
    backend_port: int,
    *,
    ca: trustme.CA | None = None,
    server_names: Sequence[str] = TLS_NAMES,
    leaf: trustme.LeafCert | None = None,
) -> Iterator[TlsProxyPeer]:
    """haproxy terminating TLS on a free port and passing the plain bytes to ``backend_port``.

    The certificate is issued by ``ca`` (a new trustme CA by default) for ``server_names``,
    or is ``leaf`` when given (an expired one, say).
    """
    binary = require_binary("haproxy")
    ca = ca or trustme.CA()
    with _workdir("haproxy") as tmp:
        work = Path(tmp)
        pem = work / "front.pem"  # key and chain in one file, as haproxy's `crt` wants
        (leaf or ca.issue_cert(*server_names)).private_key_and_cert_chain_pem.write_to_path(str(pem))
        ca_path = work / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_path))
        conf = work / "haproxy.cfg"

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            conf.write_text(
                "global\n"
                "    nbthread 1\n"  # two shared cores: one thread is plenty for tests
                "defaults\n"
                "    mode tcp\n"
                "    timeout connect 5s\n"
                "    timeout client 60s\n"
                "    timeout server 60s\n"
                "frontend tls_in\n"
                f"    bind {LOOPBACK}:{port} ssl crt {pem}\n"
                "    default_backend plain\n"
                "backend plain\n"
                f"    server proxy {LOOPBACK}:{backend_port}\n"
            )
            # -db: stay in the foreground; -p: our own pid file.
            return [binary, "-db", "-f", str(conf), "-p", str(work / "haproxy.pid")], [tcp_accepts(port)]

        with _serving("haproxy", work, launch) as port:
            yield TlsProxyPeer(LOOPBACK, port, ca, ca_path, tuple(server_names), backend_port)


@contextlib.contextmanager
def https_proxy(
    user: str | None = None, password: str | None = None, *, ca: trustme.CA | None = None
) -> Iterator[TlsProxyPeer]:
    """An ``https://`` HTTP proxy: :func:`tls_front` before :func:`tinyproxy`, credentials included."""
    with tinyproxy(user, password) as plain, tls_front(plain.port, ca=ca) as front:
        yield TlsProxyPeer(
            front.host, front.port, front.ca, front.ca_path, front.server_names, plain.port, user, password
        )


# --- v2ray: VMess, VLESS and Trojan -------------------------------------------------------


def _v2ray_stream(
    transport: str, tls: bool, ws_path: str, tls_settings: dict[str, object]
) -> dict[str, object]:
    """v2ray's ``streamSettings`` for one side of the connection."""
    stream: dict[str, object] = {"network": transport, "security": "tls" if tls else "none"}
    if transport == "ws":
        stream["wsSettings"] = {"path": ws_path}
    if tls:
        stream["tlsSettings"] = tls_settings
    return stream


def _v2ray_argv(binary: str, conf: Path, config: dict[str, object]) -> list[str]:
    conf.write_text(json.dumps(config, indent=1))
    # v2ray 4.x: -config takes a file; it stays in the foreground and logs to stdout.
    return [binary, "-config", str(conf)]


@contextlib.contextmanager
def v2ray_server(
    protocol: str,
    *,
    transport: str = "tcp",
    tls: bool = False,
    mux: bool = False,
    security: str = "aes-128-gcm",
    uuid: str | None = None,
    password: str | None = None,
    ws_path: str = V2RAY_WS_PATH,
    ca: trustme.CA | None = None,
    server_names: Sequence[str] = TLS_NAMES,
) -> Iterator[V2rayPeer]:
    """v2ray serving ``protocol`` (vmess, vless or trojan) over ``transport`` (tcp or ws), TLS when ``tls``.

    VLESS and Trojan always run over TLS (their only protection), so ``tls`` is forced on for
    them. A missing ``uuid``/``password`` is a fresh random one. Requests leave through a
    ``freedom`` outbound, UDP included (VMess, VLESS and Trojan all carry UDP in v2ray).
    The certificate is issued by ``ca`` (a new trustme CA by default) for ``server_names``.
    """
    if protocol not in V2RAY_PROTOCOLS:
        raise ValueError(f"protocol must be one of {V2RAY_PROTOCOLS}")
    if transport not in V2RAY_TRANSPORTS:
        raise ValueError(f"transport must be one of {V2RAY_TRANSPORTS}")
    if security not in VMESS_SECURITIES:
        raise ValueError(f"security must be one of {VMESS_SECURITIES}")
    binary = require_binary("v2ray")
    tls = tls or protocol in ("vless", "trojan")
    user_id = uuid or str(uuidlib.uuid4())
    secret = password or uuidlib.uuid4().hex
    with _workdir("v2ray-server") as tmp:
        work = Path(tmp)
        conf = work / "server.json"
        access_log = work / "access.log"
        tls_settings: dict[str, object] = {}
        ca_path: Path | None = None
        if tls:
            ca = ca or trustme.CA()
            cert = ca.issue_cert(*server_names)
            cert.private_key_pem.write_to_path(str(work / "key.pem"))
            cert.cert_chain_pems[0].write_to_path(str(work / "cert.pem"))
            ca_path = work / "ca.pem"
            ca.cert_pem.write_to_path(str(ca_path))
            tls_settings = {
                "certificates": [
                    {"certificateFile": str(work / "cert.pem"), "keyFile": str(work / "key.pem")}
                ]
            }
        else:
            ca = None
        clients: dict[str, list[dict[str, object]]] = {
            "vmess": [{"id": user_id, "alterId": 0}],
            "vless": [{"id": user_id}],
            "trojan": [{"password": secret}],
        }
        settings: dict[str, object] = {"clients": clients[protocol]}
        if protocol == "vless":
            settings["decryption"] = "none"

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            config = {
                "log": {"loglevel": "warning", "access": str(access_log)},
                "inbounds": [
                    {
                        "listen": LOOPBACK,
                        "port": port,
                        "protocol": protocol,
                        "settings": settings,
                        "streamSettings": _v2ray_stream(transport, tls, ws_path, tls_settings),
                    }
                ],
                "outbounds": [{"protocol": "freedom", "settings": {}}],
            }
            return _v2ray_argv(binary, conf, config), [tcp_accepts(port)]

        with _serving("v2ray-server", work, launch) as port:
            yield V2rayPeer(
                LOOPBACK,
                port,
                protocol,
                transport,
                tls,
                mux,
                security,
                user_id,
                secret,
                ws_path,
                access_log,
                ca,
                ca_path,
                tuple(server_names) if tls else (),
            )


@contextlib.contextmanager
def v2ray_client(
    server: V2rayPeer, *, mux: bool | None = None, server_name: str | None = None, security: str | None = None
) -> Iterator[SocksPeer]:
    """A v2ray client: a SOCKS5 server (no auth; CONNECT and UDP ASSOCIATE) whose traffic goes to ``server``.

    ``mux`` (default: the server's ``mux``) turns on Mux.Cool. Over TLS the client trusts only
    the server's CA and asks for ``server_name`` (default: the first of the server's names).
    ``security`` overrides the VMess cipher the server suggests.
    """
    binary = require_binary("v2ray")
    use_mux = server.mux if mux is None else mux
    with _workdir("v2ray-client") as tmp:
        work = Path(tmp)
        conf = work / "client.json"
        tls_settings: dict[str, object] = {}
        if server.tls:
            # "verify" certificates are CAs this client trusts in addition to the system's.
            tls_settings = {
                "serverName": server_name or server.server_names[0],
                "allowInsecure": False,
                "certificates": [{"usage": "verify", "certificateFile": str(server.ca_path)}],
            }
        if server.protocol == "trojan":
            settings: dict[str, object] = {
                "servers": [{"address": server.host, "port": server.port, "password": server.password}]
            }
        else:
            user: dict[str, object] = {"id": server.uuid}
            if server.protocol == "vmess":
                user.update(alterId=0, security=security or server.security)
            else:
                user["encryption"] = "none"
            settings = {"vnext": [{"address": server.host, "port": server.port, "users": [user]}]}
        outbound = {
            "protocol": server.protocol,
            "settings": settings,
            "streamSettings": _v2ray_stream(server.transport, server.tls, server.ws_path, tls_settings),
            "mux": {"enabled": use_mux, "concurrency": V2RAY_MUX_CONCURRENCY},
        }

        def launch(port: int) -> tuple[list[str], list[Probe]]:
            config = {
                "log": {"loglevel": "warning"},
                "inbounds": [
                    {
                        "listen": LOOPBACK,
                        "port": port,
                        "protocol": "socks",
                        "settings": {"auth": "noauth", "udp": True, "ip": LOOPBACK},
                    }
                ],
                "outbounds": [outbound],
            }
            # The SOCKS inbound relays UDP on the same port as TCP.
            return _v2ray_argv(binary, conf, config), [tcp_accepts(port), udp_bound(port)]

        with _serving("v2ray-client", work, launch, pick_port=free_tcp_udp_port) as port:
            yield SocksPeer(LOOPBACK, port)
