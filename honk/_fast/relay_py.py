"""The relay engine's pure-Python twin: the same API and events as ``relay_c.Engine``.

It moves bytes with ``os.splice`` through a pipe pair per direction (recv/send
through a buffer where splice answers ``EINVAL``, or when ``copy=True``), driven
by the loop's ``add_reader``/``add_writer`` instead of a worker thread: slower,
but the behaviour the conformance suite checks is the same.

Events reach ``listener.relay_event(kind, a, b, t)`` on the loop's thread, never
from inside ``add``/``cancel`` (they are queued and flushed by a loop callback,
as the compiled engine's are):

* ``EV_OPEN``: the engine took the flow over.
* ``EV_FIRST_BYTE``: the first byte from the upstream (``t`` = when it was read),
  with ``a``, ``b`` the byte totals at that moment (as ``EV_BYTES``).
* ``EV_BYTES``: ``a`` = bytes read from the client so far, ``b`` = from the
  upstream; at most once per second per flow, the first a second after
  ``EV_OPEN``, and always once with the final totals just before ``EV_END``.
* ``EV_HALF_CLOSE``: ``a`` = 0 when the client's EOF was forwarded upstream
  (``shutdown(SHUT_WR)``), 1 when the upstream's EOF was forwarded to the client;
  only for the first direction to end (the second one's EOF ends the flow, and
  ``EV_END`` says so), and with the flow's next byte report (at once when one is
  due): a flow that ends within a second of its last report is told only ``EV_END``.
* ``EV_END``: the last event; ``a`` = ``END_CLEAN`` (both directions finished),
  ``END_ERROR`` or ``END_CANCELLED``; for ``END_ERROR`` ``b`` = ``side << 16 | errno``
  with side ``SIDE_CLIENT``/``SIDE_UPSTREAM`` (the fd the error came from) or
  ``SIDE_LOCAL`` (no pipe, no memory).

Framed flows (``add(..., framing=)``, ``hs_relay(..., framing)``, a
``ShadowsocksFraming`` or a ``VmessFraming``) copy both ways through the codec
objects themselves: client bytes through ``framing.encryptor``, upstream bytes
through ``framing.decryptor``, and the client's EOF sends ``framing.end()``
first. A failure of what the upstream sent ends the flow with ``END_ERROR``,
side ``SIDE_UPSTREAM`` and errno ``FRAMING_AUTH`` (a tag or check did not
verify), ``FRAMING_PROTOCOL`` (broken framing: a length out of bounds),
``FRAMING_TRUNCATED`` (EOF inside the salt, header or a chunk) or
``FRAMING_SILENT`` (EOF before a VMess server answered at all), counted by
``framing_errors()``; ``framing.error_for(errno)`` is the codec's typed error
for each. A ``TlsFraming`` (Trojan, VLESS or VMess over TLS) goes through the same two objects
(``SSLObject.write``/``read`` over its memory BIOs, VMess's chunks inside); what reading made SSL want to send
goes upstream, the server's close_notify is its EOF, FIRST_BYTE waits for the first
plaintext byte, and the framing is given back (``framing.released()``) after its END is
delivered. See the compiled engine's docstring for the rest, which is the same.

``t`` is ``time.monotonic()`` seconds (CLOCK_MONOTONIC, as in the compiled
engine). The engine owns the two fds from ``add`` on and closes them when the
flow ends; ``close()`` ends every flow with ``END_CANCELLED`` (delivered before it
returns) and closes every fd it holds.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import select
import ssl
import time
from typing import Any, Protocol

__all__ = [
    "Engine",
    "EngineClosed",
    "RelayListener",
    "EV_OPEN",
    "EV_FIRST_BYTE",
    "EV_BYTES",
    "EV_HALF_CLOSE",
    "EV_END",
    "END_CLEAN",
    "END_ERROR",
    "END_CANCELLED",
    "SIDE_CLIENT",
    "SIDE_UPSTREAM",
    "SIDE_LOCAL",
    "FRAMING_AUTH",
    "FRAMING_PROTOCOL",
    "FRAMING_SILENT",
    "FRAMING_TRUNCATED",
    "decryptor_pending",
    "tls_supported",
]

EV_OPEN = 1
EV_FIRST_BYTE = 2
EV_BYTES = 3
EV_HALF_CLOSE = 4
EV_END = 5

END_CLEAN = 0
END_ERROR = 1
END_CANCELLED = 2

SIDE_CLIENT = 0
SIDE_UPSTREAM = 1
SIDE_LOCAL = 2

# Listener mode: events for a listener (``id`` is the listener id), not for a flow.
EV_REQUEST = 10  # a complete no-auth SOCKS5 CONNECT: answer with hs_connect/hs_relay/hs_reject
EV_HANDOVER = 11  # anything else: Python serves the client (fd and the bytes read so far)
EV_DROPPED = 12  # a client still in its handshake was closed (unlisten(drop=True), close())
EV_RESTED = 13  # accept found no descriptor, buffer or memory (payload: its errno): resting ACCEPT_BACKOFF

# Seconds (CLOCK_MONOTONIC) a client may take over its handshake in the engine before
# it is handed to Python, whose watchdog on the injected clock then applies.
HS_HANDOVER_AFTER = 1.0
HS_BUF = 1024  # bytes of one handshake the engine reads at most

TURN_BUDGET = 1024 * 1024  # bytes one direction moves per callback (fairness)
SPLICE_CHUNK = 1024 * 1024  # asked per splice into the pipe; the pipe's capacity bounds it
COPY_BUFFER = 64 * 1024  # recv size in copy mode (bytes)
POOL_PIPES = 32  # reusable empty pipe pairs (default-size pipes only)
DEFAULT_PIPE = 64 * 1024  # the kernel's default pipe capacity; a splice that fills it marks a bulk direction
BULK_PIPE_SIZE = 1024 * 1024  # a bulk direction's pipe grows to this (fewer splices per byte)
MAX_BIG_PIPES = 32  # grown pipes at once: half the default pipe-user-pages-soft (64 MiB)
REPORT_INTERVAL = 1.0  # seconds between coalesced EV_BYTES of one flow

# Framed flows (Shadowsocks AEAD, SIP004). An END_ERROR on SIDE_UPSTREAM of a framed flow with
# one of these errnos is the framing's verdict on what the upstream sent, not a socket error:
FRAMING_AUTH = _errno.EBADMSG  # a salt, length or payload tag did not verify (wrong key, altered bytes)
FRAMING_PROTOCOL = _errno.EPROTO  # a chunk length over SS_MAX_PAYLOAD
FRAMING_TRUNCATED = _errno.ENODATA  # EOF inside the salt, a response header or a chunk
FRAMING_SILENT = _errno.ENOMSG  # EOF before any byte of a response that must come (VMess: a refused id)
SS_MAX_PAYLOAD = 0x3FFF  # SIP004: a chunk's payload length is capped at 0x3FFF
FRAMED_READ = 16 * SS_MAX_PAYLOAD  # bytes one framed read asks for: 16 maximal chunks
# EV_OPEN's b for a TLS flow whose handshake the engine drove (hs_connect): what the handshake was
TLS_RESUMED = 1  # the session was resumed
TLS_13 = 2  # TLS 1.3 was spoken
VMESS_HEADER_MAX = 4 + 255  # a VMess response header: check, option, command id and length, a command body

_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_F_SETPIPE_SZ = 1031


class EngineClosed(RuntimeError):
    """``add`` after ``close``."""


class RelayListener(Protocol):
    def relay_event(self, kind: int, a: int, b: int, t: float) -> None: ...


class _Error(Exception):
    def __init__(self, side: int, err: int) -> None:
        self.side = side
        self.err = err


class _Dir:
    __slots__ = ("src", "dst", "pr", "pw", "in_pipe", "buf", "copy", "src_eof", "shut", "big", "grow_tried")

    def __init__(self, src: int, dst: int, copy: bool) -> None:
        self.src = src  # side index of the source fd
        self.dst = dst
        self.pr = -1
        self.pw = -1
        self.in_pipe = 0
        self.buf = b""  # user-space bytes owed to dst
        self.copy = copy
        self.src_eof = False
        self.shut = False
        self.big = False  # the pipe grew to the bulk size (not pooled)
        self.grow_tried = False


class _Flow:
    __slots__ = (
        "id",
        "fds",
        "dirs",
        "listener",
        "counts",
        "rep",
        "next_report",
        "first_down",
        "ended",
        "readers",
        "writers",
        "report_handle",
        "connecting",
        "fail_code",
        "framing",
        "shake",
        "half_pending",
    )

    def __init__(self, flow_id: int, fds: tuple[int, int], listener: Any, copy: bool) -> None:
        self.id = flow_id
        self.fds = list(fds)
        self.dirs = (_Dir(0, 1, copy), _Dir(1, 0, copy))
        self.listener = listener
        self.counts = [0, 0]
        self.rep = (0, 0)
        self.next_report = 0.0
        self.first_down = False
        self.ended = False
        self.readers = [False, False]  # add_reader active per fd
        self.writers = [False, False]
        self.report_handle: asyncio.TimerHandle | None = None
        self.connecting = False  # listener mode: upstream connect in progress, no reply sent yet
        self.fail_code = 1  # listener mode: the reply a cancel during the connect sends
        self.framing: Any = None  # a ShadowsocksFraming: client bytes are sealed, upstream bytes opened
        self.shake: _Shake | None = None  # hs_connect over TLS: the handshake this engine drives
        self.half_pending = 0  # the first EOF forwarded (side + 1), told with the next report; 0: none

    def frame(self, framing: Any, preamble: bytes, client_eof: bool = False) -> bytes:
        """Make this a framed flow (both directions copy through the codec); the sealed preamble."""
        _check_framing(framing)
        tls = framing.kind == "tls"
        if tls:
            framing.claim()  # ValueError when another relay owns it
        self.framing = framing
        for d in self.dirs:
            d.copy = True
        sealed = framing.encryptor.encrypt(preamble) if preamble or tls else b""
        if tls and client_eof:  # the client is already done: its close_notify follows the preamble
            sealed += framing.end()
        return sealed

    def framing_eof(self) -> int:
        """0 if the upstream's EOF now is clean, else the FRAMING_* errno it means."""
        if not self.framing.answered:
            return FRAMING_SILENT
        return FRAMING_TRUNCATED if decryptor_pending(self.framing.decryptor) else 0


class _Shake:
    """The TLS handshake of an hs_connect flow (the twin of the compiled TlsState's fields)."""

    __slots__ = ("error", "facts", "plain", "raw", "started", "task")

    def __init__(self, plain: bytes, raw: bytes = b"") -> None:
        self.raw = raw  # a head written as it is once it is done (VMess's sealed request header)
        self.plain = plain  # the head (unless raw) and the client's early bytes, sealed once it is done
        self.task: asyncio.Task[None] | None = None
        self.started = False
        self.facts = -1  # once finished: TLS_RESUMED | TLS_13
        self.error: ssl.SSLError | None = None


class _Lst:
    __slots__ = ("id", "sock", "listener", "accepted")

    def __init__(self, lid: int, sock: Any, listener: Any) -> None:
        self.id = lid
        self.sock = sock  # the engine's own dup of the listening socket; None once closed
        self.listener = listener
        self.accepted = 0


class _Hs:
    __slots__ = ("fd", "lid", "state", "answered", "buf", "req_off", "req_end", "peer", "err", "timer")

    def __init__(self, fd: int, lid: int, peer: tuple[str, int]) -> None:
        self.fd = fd
        self.lid = lid
        self.state = _HS_GREETING
        self.answered = 0
        self.buf = bytearray()
        self.req_off = 0
        self.req_end = 0
        self.peer = peer
        self.err = 0
        self.timer: asyncio.TimerHandle | None = None


_HS_GREETING, _HS_REQUEST, _HS_WAITING, _HS_DEAD = 1, 2, 3, 4
ACCEPT_BURST = 64  # accepts per listener readiness
ACCEPT_BACKOFF = 0.1  # seconds a listener rests after EMFILE/ENFILE/ENOBUFS/ENOMEM instead of spinning
_ACCEPT_EXHAUSTED = frozenset({_errno.EMFILE, _errno.ENFILE, _errno.ENOBUFS, _errno.ENOMEM})


class Engine:
    """Relay flows on the running loop; see the module docstring."""

    implementation = "python"

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, pipe_size: int = 0) -> None:
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._pipe_size = BULK_PIPE_SIZE if pipe_size == 0 else pipe_size
        self._n_big = 0
        self._flows: dict[int, _Flow] = {}
        self._next_id = 1
        self._pool: list[tuple[int, int]] = []
        self._events: list[tuple[_Flow, int, int, int, float]] = []
        self._flush_scheduled = False
        self._closed = False
        self._lsts: dict[int, _Lst] = {}
        self._hs: dict[int, _Hs] = {}  # handshakes being read, by token
        self._held: dict[int, _Hs] = {}  # REQUESTs the caller has not answered yet
        self._next_token = 1
        self._mark_denied = False
        self._framing_errors = [0, 0]  # framed flows ended by FRAMING_AUTH; FRAMING_PROTOCOL or _TRUNCATED
        self._released: list[Any] = []  # TLS framings whose flows ended, given back after their END
        self.wakeups = 0  # event deliveries to the loop's thread (each _flush)
        self.connects_at_once = 0  # upstream connects finished when connect_ex returned (see _connect)

    # -- API ---------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._flows)

    @property
    def closed(self) -> bool:
        return self._closed

    def add(
        self,
        client_fd: int,
        upstream_fd: int,
        listener: RelayListener,
        preamble: bytes = b"",
        client_eof: bool = False,
        copy: bool = False,
        *,
        framing: Any = None,
    ) -> int:
        if self._closed:
            raise EngineClosed("relay engine closed")
        flow = _Flow(self._next_id, (client_fd, upstream_fd), listener, copy)
        flow.dirs[0].buf = bytes(preamble)
        if framing is not None:
            flow.dirs[0].buf = flow.frame(framing, flow.dirs[0].buf, client_eof)
        flow_id = self._next_id
        self._next_id += 1
        flow.dirs[0].src_eof = client_eof
        self._flows[flow_id] = flow
        self._loop.call_soon(self._start, flow)
        return flow_id

    def cancel(self, flow_id: int, code: int = 0) -> bool:
        flow = self._flows.get(flow_id)
        if flow is None or flow.ended or self._closed:
            return False
        flow.fail_code = code
        self._end(flow, END_CANCELLED, 0)
        return True

    def framing_errors(self) -> tuple[int, int]:
        """(auth, protocol): framed flows ended with FRAMING_AUTH / FRAMING_PROTOCOL or
        FRAMING_TRUNCATED so far."""
        return (self._framing_errors[0], self._framing_errors[1])

    def counters(self, flow_id: int) -> tuple[int, int] | None:
        flow = self._flows.get(flow_id)
        return None if flow is None else (flow.counts[0], flow.counts[1])

    def close(self) -> None:
        if self._closed:
            return
        for lst in list(self._lsts.values()):
            self._unlisten(lst, True)
        self._closed = True
        for flow in list(self._flows.values()):
            if not flow.ended:
                self._end(flow, END_CANCELLED, 0)
        self._flush()
        for hs in list(self._held.values()):
            os.close(hs.fd)
        self._held.clear()
        for pr, pw in self._pool:
            os.close(pr)
            os.close(pw)
        self._pool.clear()

    # -- listener mode (see relay_c's module docstring) --------------------------------------

    def listen(self, fd: int, listener: Any) -> int:
        import socket

        if self._closed:
            raise EngineClosed("relay engine closed")
        sock = socket.socket(fileno=os.dup(fd))
        sock.setblocking(False)
        lid = len(self._lsts) + 1
        while lid in self._lsts:
            lid += 1
        lst = _Lst(lid, sock, listener)
        self._lsts[lid] = lst
        self._loop.add_reader(sock.fileno(), self._accept, lst)
        return lid

    def unlisten(self, lid: int, drop: bool = False) -> None:
        lst = self._lsts.get(lid)
        if lst is not None and not self._closed:
            self._unlisten(lst, drop)

    def _unlisten(self, lst: _Lst, drop: bool) -> None:
        if lst.sock is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(lst.sock.fileno())
            lst.sock.close()
            lst.sock = None
        if drop:
            for hs in [h for h in self._hs.values() if h.lid == lst.id]:
                self._hs_release(hs, EV_DROPPED)

    def accepted(self, lid: int) -> int:
        lst = self._lsts.get(lid)
        return 0 if lst is None else lst.accepted

    def _accept(self, lst: _Lst) -> None:
        for _ in range(ACCEPT_BURST):
            if lst.sock is None:
                return
            try:
                conn, addr = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == _errno.EINVAL:  # shut down under us: nothing more comes
                    self._unlisten(lst, False)
                elif exc.errno in _ACCEPT_EXHAUSTED:
                    # Out of descriptors or memory: rest, then listen again, rather than spin.
                    fd = lst.sock.fileno()
                    self._loop.remove_reader(fd)
                    self._loop.call_later(ACCEPT_BACKOFF, self._resume_accepting, lst)
                    self._queue_lst(lst.id, EV_RESTED, exc.errno)
                return
            conn.setblocking(False)
            hs = _Hs(conn.detach(), lst.id, (addr[0], addr[1]))
            token = self._next_token
            self._next_token += 1
            self._hs[token] = hs
            lst.accepted += 1
            hs.timer = self._loop.call_later(HS_HANDOVER_AFTER, self._hs_expired, token)
            self._loop.add_reader(hs.fd, self._hs_read, token)
            self._hs_read(token)

    def _resume_accepting(self, lst: _Lst) -> None:
        if lst.sock is not None and not self._closed:
            self._loop.add_reader(lst.sock.fileno(), self._accept, lst)

    def _hs_expired(self, token: int) -> None:
        hs = self._hs.get(token)
        if hs is not None:
            hs.timer = None
            self._hs_release(hs, EV_HANDOVER, token)

    def _hs_release(self, hs: _Hs, kind: int, token: int | None = None) -> None:
        if token is None:
            token = next(t for t, h in self._hs.items() if h is hs)
        del self._hs[token]
        if hs.timer is not None:
            hs.timer.cancel()
            hs.timer = None
        if not self._loop.is_closed():
            self._loop.remove_reader(hs.fd)
        if kind == EV_DROPPED:
            os.close(hs.fd)
            hs.fd = -1
        elif kind == EV_REQUEST:
            self._held[token] = hs
        hs.state = _HS_WAITING if kind == EV_REQUEST else _HS_DEAD
        self._queue_lst(hs.lid, kind, (token, hs))

    def _hs_read(self, token: int) -> None:
        hs = self._hs.get(token)
        if hs is None:
            return
        buf = hs.buf
        while True:
            if len(buf) >= HS_BUF:
                return self._hs_release(hs, EV_HANDOVER, token)
            try:
                data = os.read(hs.fd, HS_BUF - len(buf))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                hs.err = exc.errno or 0
                return self._hs_release(hs, EV_HANDOVER, token)
            if not data:
                return self._hs_release(hs, EV_HANDOVER, token)
            buf += data
            if hs.state == _HS_GREETING:
                if buf[0] != 5 or len(buf) < 2 or len(buf) < 2 + buf[1]:
                    return self._hs_release(hs, EV_HANDOVER, token)
                if 0 not in buf[2 : 2 + buf[1]]:
                    return self._hs_release(hs, EV_HANDOVER, token)
                try:
                    sent = os.write(hs.fd, b"\x05\x00")
                except OSError as exc:
                    hs.err = exc.errno or 0
                    sent = -1
                if sent != 2:
                    return self._hs_release(hs, EV_HANDOVER, token)
                hs.answered = 2
                hs.req_off = 2 + buf[1]
                hs.state = _HS_REQUEST
            off = hs.req_off
            if len(buf) == off:
                continue
            if len(buf) < off + 5 or buf[off] != 5 or buf[off + 1] != 1 or buf[off + 2] != 0:
                return self._hs_release(hs, EV_HANDOVER, token)
            atyp = buf[off + 3]
            if atyp == 1:
                end = off + 10
            elif atyp == 4:
                end = off + 22
            elif atyp == 3:
                alen = buf[off + 4]
                end = off + 5 + alen + 2
                if alen == 0 or len(buf) < end:
                    return self._hs_release(hs, EV_HANDOVER, token)
                if any(c <= 0x20 or c >= 0x7F for c in buf[off + 5 : off + 5 + alen]):
                    return self._hs_release(hs, EV_HANDOVER, token)
            else:
                return self._hs_release(hs, EV_HANDOVER, token)
            if len(buf) < end:
                return self._hs_release(hs, EV_HANDOVER, token)
            hs.req_end = end
            return self._hs_release(hs, EV_REQUEST, token)

    def _queue_lst(self, lid: int, kind: int, payload: Any) -> None:
        self._events.append((lid, kind, payload, 0, time.monotonic()))  # type: ignore[arg-type]
        if not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _listener_event(self, lid: Any, kind: int, payload: Any) -> None:
        import socket

        lst = self._lsts.get(lid)
        listener = lst.listener if lst is not None else None
        if kind == EV_DROPPED:
            if listener is not None:
                listener.socks_dropped()
            return
        if kind == EV_RESTED:
            if listener is not None:
                listener.socks_rested(payload)
            return
        token, hs = payload
        src_host, src_port = hs.peer
        if kind == EV_HANDOVER:
            if listener is None:
                os.close(hs.fd)
                return
            listener.socks_handover(hs.fd, bytes(hs.buf), hs.answered, hs.err, src_host, src_port)
            return
        buf, off = hs.buf, hs.req_off
        atyp = buf[off + 3]
        if atyp == 1:
            host = socket.inet_ntop(socket.AF_INET, bytes(buf[off + 4 : off + 8]))
            port = int.from_bytes(buf[off + 8 : off + 10], "big")
        elif atyp == 4:
            host = socket.inet_ntop(socket.AF_INET6, bytes(buf[off + 4 : off + 20]))
            port = int.from_bytes(buf[off + 20 : off + 22], "big")
        else:
            alen = buf[off + 4]
            host = bytes(buf[off + 5 : off + 5 + alen]).decode("ascii")
            port = int.from_bytes(buf[off + 5 + alen : off + 7 + alen], "big")
        if listener is None:
            self.hs_reject(token, 1)
            return
        listener.socks_request(token, src_host, src_port, host, port)

    def _take_token(self, token: int) -> _Hs:
        hs = self._held.pop(token, None)
        if hs is None:
            raise ValueError("unknown or already answered handshake token")
        return hs

    def hs_connect(
        self, token: int, ip: str, port: int, mark: int, listener: Any, framing: Any = None, head: bytes = b""
    ) -> int:
        import ipaddress

        if self._closed:
            raise EngineClosed("relay engine closed")
        address = ipaddress.ip_address(ip)  # ValueError for anything else, as the compiled engine
        if framing is not None and getattr(framing, "kind", None) == "tls":
            _check_framing(framing, handshake=True)
            hs = self._take_token(token)
            framing.claim()
            flow_id = self._start_fast(hs, listener, (address, port, mark), -1)
            flow = self._flows[flow_id]
            flow.framing = framing
            for d in flow.dirs:
                d.copy = True
            if framing.inner is not None:  # VMess's header is sealed already: only the body is chunked
                flow.shake = _Shake(flow.dirs[0].buf, head)
            else:
                flow.shake = _Shake(head + flow.dirs[0].buf)  # sealed once the handshake is done
            flow.dirs[0].buf = b""
            return flow_id
        if framing is not None:
            if _salt_unsent(framing):  # the salt and the sealed head go first, as the compiled engine
                _check_framing(framing, salted=False)
                head = framing.encryptor.encrypt(head)
            else:
                _check_framing(framing)
        hs = self._take_token(token)
        return self._start_fast(hs, listener, (address, port, mark), -1, framing, head)

    def hs_relay(self, token: int, upstream_fd: int, listener: Any, framing: Any = None) -> int:
        if self._closed:
            raise EngineClosed("relay engine closed")
        if framing is not None:
            _check_framing(framing)
        hs = self._take_token(token)
        return self._start_fast(hs, listener, None, upstream_fd, framing)

    def hs_reject(self, token: int, code: int) -> None:
        if self._closed:
            return
        hs = self._take_token(token)
        _send_quiet(hs.fd, _build_reply(code, -1))
        os.close(hs.fd)
        hs.fd = -1

    def _start_fast(
        self, hs: _Hs, listener: Any, dial: Any, upstream_fd: int, framing: Any = None, head: bytes = b""
    ) -> int:
        flow_id = self._next_id
        self._next_id += 1
        flow = _Flow(flow_id, (hs.fd, upstream_fd), listener, False)
        flow.dirs[0].buf = bytes(hs.buf[hs.req_end :])
        if framing is not None:
            flow.dirs[0].buf = flow.frame(framing, flow.dirs[0].buf)
        flow.dirs[0].buf = head + flow.dirs[0].buf
        flow.connecting = True
        hs.fd = -1
        self._flows[flow_id] = flow
        self._loop.call_soon(self._connect, flow, dial)
        return flow_id

    def _connect(self, flow: _Flow, dial: Any) -> None:
        import socket

        if flow.ended:
            return
        if dial is not None:
            address, port, mark = dial
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | (exc.errno or 0))
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if mark >= 0 and not self._mark_denied:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_MARK", 36), mark)
                except PermissionError:
                    self._mark_denied = True
            sockaddr = (str(address), port, 0, 0) if family == socket.AF_INET6 else (str(address), port)
            err = sock.connect_ex(sockaddr)
            flow.fds[1] = sock.detach()
            if err not in (0, _errno.EINPROGRESS):
                self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | err)
                return
            if _connect_done(
                flow.fds[1]
            ):  # as the compiled worker: opened now, not after a readiness callback
                self.connects_at_once += 1
                self._connected(flow)
                return
        else:
            try:
                os.set_blocking(flow.fds[1], False)
            except OSError as exc:
                self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | (exc.errno or 0))
                return
            self._connected(flow)
            return
        flow.writers[1] = True
        self._loop.add_writer(flow.fds[1], self._connected, flow)

    def _connected(self, flow: _Flow) -> None:
        import socket

        if flow.ended:
            return
        if flow.writers[1]:
            flow.writers[1] = False
            self._loop.remove_writer(flow.fds[1])
        sock = socket.socket(fileno=flow.fds[1])
        try:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        finally:
            sock.detach()
        if err:
            self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | err)
            return
        if flow.shake is not None and flow.shake.task is None:
            flow.shake.task = self._loop.create_task(self._shake_hands(flow, flow.shake))
            return
        self._open(flow)

    async def _shake_hands(self, flow: _Flow, shake: _Shake) -> None:
        """The TLS handshake of an hs_connect flow, then its head and early bytes sealed; as the
        compiled worker does it, with the same outcomes (see relay_c's "TLS handshakes")."""
        import socket

        framing = flow.framing
        sslobj = framing.sslobj
        loop = self._loop
        sock = socket.socket(fileno=os.dup(flow.fds[1]))
        try:
            sock.setblocking(False)
            while True:
                shake.started = True
                try:
                    sslobj.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                if out := framing.outgoing.read():
                    await loop.sock_sendall(sock, out)
                if done:
                    break
                data = await loop.sock_recv(sock, FRAMED_READ)
                if not data:
                    raise ConnectionResetError(_errno.ECONNRESET, "the server closed during the handshake")
                framing.incoming.write(data)
        except ssl.SSLError as exc:
            shake.error = exc
            self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | _errno.EPROTO)
            return
        except OSError as exc:
            self._end(flow, END_ERROR, (SIDE_UPSTREAM << 16) | (exc.errno or _errno.EIO))
            return
        except Exception as exc:  # a bug: this flow only, and said
            self._loop.call_exception_handler(
                {"message": "TLS handshake of a relay flow failed", "exception": exc}
            )
            self._end(flow, END_ERROR, (SIDE_LOCAL << 16) | _errno.EIO)
            return
        finally:
            sock.close()
        if flow.ended:
            return
        shake.facts = (TLS_RESUMED if sslobj.session_reused else 0) | (
            TLS_13 if sslobj.version() == "TLSv1.3" else 0
        )
        if shake.raw:
            sslobj.write(shake.raw)  # a memory BIO takes it all; encrypt() reads it out with the rest
        flow.dirs[0].buf = framing.encryptor.encrypt(shake.plain)
        self._open(flow)

    def _open(self, flow: _Flow) -> None:
        """The upstream is ready: reply success (ahead of the upstream's bytes) and relay."""
        flow.dirs[1].buf = _build_reply(0, flow.fds[1])
        flow.connecting = False
        flow.next_report = time.monotonic() + REPORT_INTERVAL  # the first BYTES waits its interval too
        self._emit(flow, EV_OPEN, 1, flow.shake.facts if flow.shake is not None else 0)
        for d in flow.dirs:
            if not d.copy:
                self._take_pipe(d)
        self._service(flow)

    # -- events --------------------------------------------------------------------------

    def queued_events(self) -> int:
        """Events emitted that the loop has not delivered yet."""
        return len(self._events)

    def _emit(self, flow: _Flow, kind: int, a: int, b: int) -> None:
        self._events.append((flow, kind, a, b, time.monotonic()))
        if not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.wakeups += 1
        events, self._events = self._events, []
        for flow, kind, a, b, t in events:
            if kind >= EV_REQUEST:
                try:
                    self._listener_event(flow, kind, a)
                except Exception as exc:
                    if not self._loop.is_closed():
                        self._loop.call_exception_handler(
                            {"message": "relay event listener failed", "exception": exc}
                        )
                continue
            if kind == EV_END:
                self._flows.pop(flow.id, None)
            try:
                flow.listener.relay_event(kind, a, b, t)
            except Exception as exc:  # a listener's bug must not stop the other flows' events
                if not self._loop.is_closed():
                    self._loop.call_exception_handler(
                        {"message": "relay event listener failed", "exception": exc}
                    )
        released, self._released = self._released, []
        for framing in released:
            framing.released()

    # -- one flow --------------------------------------------------------------------------

    def _start(self, flow: _Flow) -> None:
        if flow.ended:
            return
        flow.next_report = time.monotonic() + REPORT_INTERVAL
        self._emit(flow, EV_OPEN, 0, 0)
        try:
            for fd in flow.fds:
                os.set_blocking(fd, False)
        except OSError as exc:
            self._end(flow, END_ERROR, (SIDE_CLIENT << 16) | (exc.errno or 0))
            return
        for d in flow.dirs:
            if not d.copy:
                self._take_pipe(d)
        self._service(flow)

    def _take_pipe(self, d: _Dir) -> None:
        if self._pool:
            d.pr, d.pw = self._pool.pop()
            return
        try:
            d.pr, d.pw = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # no descriptor for a pipe: the direction copies rather than ends its flow
            d.copy = True

    def _grow(self, d: _Dir) -> None:
        """A splice filled the default pipe: a bulk direction. Grow its pipe once if allowed."""
        d.grow_tried = True
        if self._pipe_size <= DEFAULT_PIPE or self._n_big >= MAX_BIG_PIPES:
            return
        import fcntl

        try:
            fcntl.fcntl(d.pw, _F_SETPIPE_SZ, self._pipe_size)
        except OSError:  # pipe-user-pages-soft/-hard or pipe-max-size: keep the default
            return
        d.big = True
        self._n_big += 1

    def _drop_pipe(self, d: _Dir) -> None:
        if d.pr < 0:
            return
        if d.big:
            d.big = False
            self._n_big -= 1
            os.close(d.pr)
            os.close(d.pw)
        elif d.in_pipe == 0 and len(self._pool) < POOL_PIPES and not self._closed:
            self._pool.append((d.pr, d.pw))
        else:
            os.close(d.pr)
            os.close(d.pw)
        d.pr = d.pw = -1
        d.in_pipe = 0

    def _service(self, flow: _Flow) -> None:
        try:
            for d in flow.dirs:
                self._pump(flow, d)
        except _Error as exc:
            err = exc.err
            if exc.side == SIDE_UPSTREAM and err in _WRITE_GONE and _tls_refused(flow):
                err = FRAMING_SILENT  # the write only found out later: the server refused first
                self._framing_errors[1] += 1
            self._end(flow, END_ERROR, (exc.side << 16) | err)
            return
        if flow.dirs[0].shut and flow.dirs[1].shut:
            self._end(flow, END_CLEAN, 0)
            return
        self._interest(flow)
        self._report(flow)

    def _pump(self, flow: _Flow, d: _Dir) -> None:
        """Move what one direction can move now (at most TURN_BUDGET bytes from src)."""
        if d.shut:
            return
        src, dst = flow.fds[d.src], flow.fds[d.dst]
        moved = 0
        while True:
            while d.buf:
                try:
                    n = os.write(dst, d.buf)
                except BlockingIOError:
                    return
                except InterruptedError:
                    continue
                except OSError as exc:
                    raise _Error(d.dst, exc.errno or 0) from None
                d.buf = d.buf[n:]
            while d.in_pipe:
                try:
                    n = os.splice(d.pr, dst, d.in_pipe, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    return
                except InterruptedError:
                    continue
                except OSError as exc:
                    if exc.errno == _errno.EINVAL:  # dst cannot take spliced pages
                        try:
                            d.buf = os.read(d.pr, d.in_pipe)
                        except OSError as exc2:
                            raise _Error(SIDE_LOCAL, exc2.errno or 0) from None
                        d.in_pipe = 0
                        d.copy = True
                        self._drop_pipe(d)
                        break
                    raise _Error(d.dst, exc.errno or 0) from None
                d.in_pipe -= n
            if d.buf:
                continue
            if d.src_eof:
                # WebSocket inside TLS has no half-close: the upstream keeps its write side
                if (
                    d.src == SIDE_UPSTREAM
                    or flow.framing is None
                    or getattr(flow.framing, "half_close", True)
                ):
                    try:
                        _shutdown_wr(dst)
                    except OSError as exc:
                        raise _Error(d.dst, exc.errno or 0) from None
                d.shut = True
                self._drop_pipe(d)
                if not flow.dirs[d.dst].shut:  # the last direction's EOF ends the flow: its END says it
                    self._half_closed(flow, d.src)
                return
            if moved >= TURN_BUDGET:
                return  # level-triggered: the loop calls again
            try:
                if flow.framing is not None:
                    data = os.read(src, FRAMED_READ)
                    n = len(data)
                    if n:
                        flow.counts[d.src] += n  # before the codec, which may end the flow
                        # TLS: records may be only tickets; its first byte is the first plaintext
                        if d.src == SIDE_UPSTREAM and not flow.first_down and flow.framing.kind != "tls":
                            flow.first_down = True
                            self._emit(flow, EV_FIRST_BYTE, flow.counts[0], flow.counts[1])
                        d.buf = self._framed(flow, d, data)
                elif d.copy:
                    data = os.read(src, COPY_BUFFER)
                    n = len(data)
                    d.buf = data
                else:
                    n = os.splice(src, d.pw, SPLICE_CHUNK, flags=_SPLICE_FLAGS)
                    d.in_pipe = n
                    if n >= DEFAULT_PIPE and not d.grow_tried:
                        self._grow(d)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == _errno.EINVAL and not d.copy:
                    d.copy = True
                    self._drop_pipe(d)
                    continue
                raise _Error(d.src, exc.errno or 0) from None
            if n == 0:
                if flow.framing is not None and d.src == SIDE_UPSTREAM and (err := flow.framing_eof()):
                    self._framing_errors[1] += 1
                    raise _Error(SIDE_UPSTREAM, err)
                if flow.framing is not None and d.src == SIDE_CLIENT:
                    d.buf = flow.framing.end()  # goes out before the upstream's FIN
                d.src_eof = True
                continue
            moved += n
            if flow.framing is None:
                flow.counts[d.src] += n
            if (
                d.src == SIDE_UPSTREAM
                and not flow.first_down
                and (flow.framing is None or flow.framing.kind != "tls")
            ):
                flow.first_down = True
                self._emit(flow, EV_FIRST_BYTE, flow.counts[0], flow.counts[1])

    def _framed(self, flow: _Flow, d: _Dir, data: bytes) -> bytes:
        """Seal client bytes, or open upstream bytes (an auth or protocol error ends the flow)."""
        framing = flow.framing
        if d.src == SIDE_CLIENT:
            return framing.encryptor.encrypt(data)
        try:
            plain = framing.decryptor.feed(data)
        except framing.errors as exc:
            auth = isinstance(exc, framing.auth_errors)
            self._framing_errors[0 if auth else 1] += 1
            raise _Error(SIDE_UPSTREAM, FRAMING_AUTH if auth else FRAMING_PROTOCOL) from None
        if framing.kind == "tls":
            self._tls_opened(flow, d)
        return plain

    def _tls_opened(self, flow: _Flow, d: _Dir) -> None:
        """After the upstream's records were read: the first plaintext byte is announced, what
        SSL wants to send (a KeyUpdate reply) goes upstream, and the server's close_notify ends
        its side as an EOF would (an error when the inner protocol's answer is missing or cut)."""
        framing = flow.framing
        if framing.answered and not flow.first_down:
            flow.first_down = True
            self._emit(flow, EV_FIRST_BYTE, flow.counts[0], flow.counts[1])
        extra = framing.take_outgoing()
        up = flow.dirs[0]
        if extra and not up.src_eof:  # nothing may follow our close_notify
            up.buf += extra
        if framing.decryptor.closed:
            if err := flow.framing_eof():
                self._framing_errors[1] += 1
                raise _Error(SIDE_UPSTREAM, err)
            d.src_eof = True

    def _interest(self, flow: _Flow) -> None:
        """Read src while its direction holds nothing for dst; else wait for dst to drain."""
        want_r = [False, False]
        want_w = [False, False]
        for d in flow.dirs:
            if d.shut:
                continue
            if d.buf or d.in_pipe or d.src_eof:
                want_w[d.dst] = True
            else:
                want_r[d.src] = True
        loop = self._loop
        for side in (0, 1):
            fd = flow.fds[side]
            if want_r[side] != flow.readers[side]:
                flow.readers[side] = want_r[side]
                if want_r[side]:
                    loop.add_reader(fd, self._on_ready, flow)
                else:
                    loop.remove_reader(fd)
            if want_w[side] != flow.writers[side]:
                flow.writers[side] = want_w[side]
                if want_w[side]:
                    loop.add_writer(fd, self._on_ready, flow)
                else:
                    loop.remove_writer(fd)

    def _on_ready(self, flow: _Flow) -> None:
        if not flow.ended:
            self._service(flow)

    def _report(self, flow: _Flow) -> None:
        counts = (flow.counts[0], flow.counts[1])
        if counts == flow.rep:
            return
        now = time.monotonic()
        if now >= flow.next_report:
            flow.rep = counts
            flow.next_report = now + REPORT_INTERVAL
            self._emit(flow, EV_BYTES, counts[0], counts[1])
        else:
            self._report_later(flow, now)

    def _report_later(self, flow: _Flow, now: float) -> None:
        """Call :meth:`_report_due` when the flow's report is due (once)."""
        if flow.report_handle is None:
            flow.report_handle = self._loop.call_later(flow.next_report - now, self._report_due, flow)

    def _report_due(self, flow: _Flow) -> None:
        flow.report_handle = None
        if not flow.ended:
            self._report(flow)
            if flow.half_pending and flow.report_handle is None:
                self._emit(flow, EV_HALF_CLOSE, flow.half_pending - 1, 0)
                flow.half_pending = 0

    def _half_closed(self, flow: _Flow, side: int) -> None:
        """The first direction's EOF went through: HALF_CLOSE goes out with the flow's next
        report (at once when one is due), so a flow that ends within its report interval is
        told only its END, which says both."""
        now = time.monotonic()
        if now >= flow.next_report:
            self._emit(flow, EV_HALF_CLOSE, side, 0)
            return
        flow.half_pending = side + 1
        self._report_later(flow, now)

    def _end(self, flow: _Flow, cause: int, b: int) -> None:
        flow.ended = True
        shake = flow.shake
        if shake is not None:
            if shake.task is not None and not shake.task.done() and shake.task is not asyncio.current_task():
                shake.task.cancel()
            verify = getattr(shake.error, "verify_code", 0) or 0
            message = getattr(shake.error, "verify_message", "") or ""
            flow.framing.handshake_reported(shake.started, shake.facts >= 0, verify, message, shake.error)
        if flow.connecting and flow.fds[0] >= 0:  # listener mode: the client waits for its reply
            code = 0
            if cause == END_ERROR and shake is not None and shake.started:
                code = 1  # a failed TLS handshake, as Python's TlsFailed
            elif cause == END_ERROR:
                side = b >> 16
                code = _reply_code(b & 0xFFFF) if side == SIDE_UPSTREAM else (1 if side == SIDE_LOCAL else 0)
            elif cause == END_CANCELLED:
                code = flow.fail_code
            if code:
                _send_quiet(flow.fds[0], _build_reply(code, -1))
        if flow.report_handle is not None:
            flow.report_handle.cancel()
            flow.report_handle = None
        loop = self._loop
        loop_open = not loop.is_closed()
        for side in (0, 1):
            fd = flow.fds[side]
            if fd < 0:
                continue
            if flow.readers[side] and loop_open:
                loop.remove_reader(fd)
            if flow.writers[side] and loop_open:
                loop.remove_writer(fd)
            flow.readers[side] = flow.writers[side] = False
            os.close(fd)
            flow.fds[side] = -1
        for d in flow.dirs:
            self._drop_pipe(d)
            d.buf = b""
        self._emit(flow, EV_BYTES, flow.counts[0], flow.counts[1])
        self._emit(flow, EV_END, cause, b)
        if flow.framing is not None and flow.framing.kind == "tls":
            self._released.append(flow.framing)  # given back once its END is delivered


_ERRNO_CODES = {
    _errno.ECONNREFUSED: 5,
    _errno.ENETUNREACH: 3,
    _errno.ENETDOWN: 3,
    _errno.EHOSTUNREACH: 4,
    _errno.EHOSTDOWN: 4,
    _errno.ETIMEDOUT: 6,
}


def _reply_code(err: int) -> int:
    """The SOCKS5 reply code for a failed connect (honk.proto.socks5._ERRNO_REPLIES)."""
    return _ERRNO_CODES.get(err, 1)


def _build_reply(code: int, fd: int) -> bytes:
    """A SOCKS5 reply; BND is ``fd``'s local address when ``fd`` >= 0, else 0.0.0.0:0."""
    import socket
    import struct

    if fd >= 0:
        sock = socket.socket(fileno=fd)
        try:
            family = sock.family
            local = sock.getsockname()
        except OSError:
            local = None
        finally:
            sock.detach()
        if local is not None:
            if family == socket.AF_INET6:
                return (
                    bytes((5, code, 0, 4))
                    + socket.inet_pton(socket.AF_INET6, local[0])
                    + struct.pack("!H", local[1])
                )
            if family == socket.AF_INET:
                return bytes((5, code, 0, 1)) + socket.inet_aton(local[0]) + struct.pack("!H", local[1])
    return bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))


# Shadowsocks AEAD ciphers the engines frame (the compiled engine's _CIPHERS).
_FRAMED_CIPHERS = frozenset({"aes-128-gcm", "aes-256-gcm", "chacha20-ietf-poly1305"})


def tls_supported() -> bool:
    """Whether this engine can carry a ``TlsFraming`` (the twin drives the SSLObject itself)."""
    return True


def _salt_unsent(framing: Any) -> bool:
    """A Shadowsocks framing whose encryptor has sent nothing yet (``hs_connect`` seals its head)."""
    kind = getattr(framing, "kind", "shadowsocks")
    return kind == "shadowsocks" and not getattr(framing.encryptor, "salt_sent", True)


def _check_framing(framing: Any, *, salted: bool = True, handshake: bool = False) -> None:
    """ValueError for a framing the engines cannot carry (as the compiled engine's _aead_new);
    ``salted``: the client's salt must be sent already; ``handshake``: a TLS framing whose
    handshake has not begun (hs_connect drives it)."""
    kind = getattr(framing, "kind", None)
    if kind == "tls":
        if not isinstance(getattr(framing, "sslobj", None), ssl.SSLObject):
            raise ValueError("framing: no SSLObject to relay")
        if framing.claimed:
            raise ValueError("framing: this TLS connection is already relayed")
        # (Python shows no "begun" state: a finished handshake or an unsent ClientHello tell it)
        if handshake and (framing.outgoing.pending or framing.sslobj.version() is not None):
            raise ValueError("framing: the TLS handshake has already begun")
        if handshake and framing.websocket:
            raise ValueError("framing: a WebSocket connection is upgraded before the engine takes it")
        if framing.inner is not None:
            framing.inner.engine_keys()  # VMess inside: its body must not have begun either
        return
    if kind == "vmess":
        framing.engine_keys()  # ValueError for a body already begun, as the compiled engine
        return
    if getattr(framing, "cipher", None) not in _FRAMED_CIPHERS:
        raise ValueError("framing: unsupported cipher")
    if salted and not getattr(framing.encryptor, "salt_sent", True):
        raise ValueError("framing: the client's salt has not been sent")


_WRITE_GONE = frozenset({_errno.EPIPE, _errno.ECONNRESET})  # a write found the upstream gone


def _tls_refused(flow: _Flow) -> bool:
    """A write to a TLS flow's upstream failed before the server sent any plaintext: whether what
    it had sent was its close (close_notify, EOF, or a reset) and nothing else. Trojan and VLESS
    servers refuse a credential that way (a reset when bytes were left unread); the compiled
    engine's _tls_refused says the same."""
    framing = flow.framing
    if framing is None or framing.kind != "tls" or framing.answered or flow.fds[1] < 0:
        return False
    while True:
        try:
            data = os.read(flow.fds[1], FRAMED_READ)
        except OSError as exc:
            return exc.errno == _errno.ECONNRESET
        if not data:
            return True
        try:
            plain = framing.decryptor.feed(data)
        except framing.errors:
            return False
        if plain or framing.answered:
            return False
        if framing.decryptor.closed:
            return True


def decryptor_pending(decryptor: Any) -> bool:
    """Whether a stream decryptor holds part of a salt or chunk (so EOF now truncates it)."""
    pending = getattr(decryptor, "pending", None)
    if pending is not None:
        return bool(pending)
    # honk.proto.shadowsocks.StreamDecryptor keeps unread bytes and an opened length privately
    return bool(decryptor._buf) or decryptor._payload_len >= 0


def _connect_done(fd: int) -> bool:
    """Whether the connect started on ``fd`` has finished already (over loopback the kernel
    often finishes it within connect() itself); a failed one is left to the writer callback."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    ready = poller.poll(0)
    return bool(ready) and ready[0][1] & (select.POLLOUT | select.POLLERR | select.POLLHUP) == select.POLLOUT


def _send_quiet(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:
        pass


def _shutdown_wr(fd: int) -> None:
    import socket

    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_WR)
    finally:
        sock.detach()
