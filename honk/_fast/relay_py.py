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
import ssl
import time
from typing import Any, Protocol

from honk._fast import socks5hs_py as _socks5hs  # the twin engine judges handshakes with the twin kernel
from honk._fast.relay_listen_py import ListenerMode, _Hs, _Lst, _Shake

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
        return FRAMING_TRUNCATED if self.framing.decryptor.pending else 0


class Engine(ListenerMode):
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

    def _open(self, flow: _Flow) -> None:
        """The upstream is ready: reply success (ahead of the upstream's bytes) and relay."""
        flow.dirs[1].buf = _socks5hs.build_reply(0, flow.fds[1])
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
                code = (
                    _socks5hs.reply_code(b & 0xFFFF)
                    if side == SIDE_UPSTREAM
                    else (1 if side == SIDE_LOCAL else 0)
                )
            elif cause == END_CANCELLED:
                code = flow.fail_code
            if code:
                _send_quiet(flow.fds[0], _socks5hs.build_reply(code, -1))
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
